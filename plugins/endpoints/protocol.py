"""OpenAI request bodies (pydantic) and their translation to :class:`SamplingParams`.

Unknown fields are ignored, as OpenAI clients send more than we use, but the fields we read are
strict about types (``"max_tokens": "10"`` or ``"stream": "yes"`` is a 400, not coerced; an
integer is accepted where a number is; chat's ``logprobs`` alone is lax, as vLLM's: ``1`` is true), and no string anywhere in a body may hold a lone UTF-16
surrogate (``"\\ud800"``: valid JSON, but not Unicode text a tokenizer can read). The vLLM extensions
(``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``structured_outputs``, ``prompt_logprobs``, ...) travel in the body too
(the OpenAI client's ``extra_body``).
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from host.sdk.sampling_params import SamplingParams, StructuredOutputsParams

_INT64 = 2**63  # priority crosses to the engine as a 64-bit integer


def _surrogate_path(body: Any) -> str | None:
    """The dotted path of the first string in ``body`` (parsed JSON) holding a lone surrogate,
    or ``None``. Iterative, so a large body costs one pass and no recursion."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((f"{path}.{key}" if path else str(key), item))
                if isinstance(key, str):
                    stack.append((f"{path}.{key} (key)" if path else f"{key} (key)", key))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


class _Body(BaseModel):
    """A request body: strict types on the fields read, unknown fields ignored, valid Unicode."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        bad = _surrogate_path(data)
        if bad is not None:
            raise ValueError(
                f"{bad} holds a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text; "
                "send well-formed UTF-8"
            )
        return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage on every chunk (vLLM)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)
    name: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredOutputsBody(BaseModel):
    """``structured_outputs`` as the body gives it (unknown keys are an error)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    json_: Optional[Union[dict[str, Any], str]] = Field(default=None, alias="json")
    json_object: Optional[bool] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None

    def to_params(self) -> StructuredOutputsParams:
        return StructuredOutputsParams(
            json=self.json_, json_object=bool(self.json_object), regex=self.regex, choice=self.choice, grammar=self.grammar
        )


class _SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: Optional[str] = None
    n: int = 1
    # vLLM's KV transfer hand-off (a PD proxy passes the prefill instance's answer to the decode
    # instance); read by the engine's KV connector, ignored without one
    kv_transfer_params: Optional[dict[str, Any]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: Optional[dict[str, float]] = None
    allowed_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputsBody] = None
    guided_json: Optional[Union[dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    priority: int = Field(0, ge=-_INT64, le=_INT64 - 1)
    user: Optional[str] = None
    # host's extension: seconds this request may run; then it ends with finish_reason "abort"
    timeout: Optional[float] = Field(None, gt=0, le=86400.0)
    # vLLM's response extensions: token ids in the body; logprob tokens as "token_id:<id>"
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    # keep N prompt tokens (-1: max_model_len); "left" (default) drops the start, "right" the end
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: Optional[Literal["left", "right"]] = None
    # beam search (vLLM's fields; the route decides whether it runs)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool = False

    def deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def structured(self) -> StructuredOutputsParams | None:
        if self.structured_outputs is not None:
            return self.structured_outputs.to_params()
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "grammar")):
            value = getattr(self, name)
            if value is not None:
                return StructuredOutputsParams(**{key: value})
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if rf.json_schema is None or rf.json_schema.json_schema is None:
            raise ValueError("response_format.json_schema.schema is required for type json_schema")
        return StructuredOutputsParams(json=rf.json_schema.json_schema)

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, default_max_tokens: int) -> SamplingParams:
        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        return SamplingParams(
            n=self.n,
            temperature=pick(self.temperature, 1.0),
            top_p=pick(self.top_p, 1.0),
            top_k=pick(self.top_k, 0),
            min_p=pick(self.min_p, 0.0),
            presence_penalty=pick(self.presence_penalty, 0.0),
            frequency_penalty=pick(self.frequency_penalty, 0.0),
            repetition_penalty=pick(self.repetition_penalty, 1.0),
            seed=self.seed,
            max_tokens=pick(max_tokens, default_max_tokens),
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs,
            logit_bias=self.logit_bias,
            allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=self.structured(),
        )


class CompletionRequest(_SamplingFields):
    # None: checked by the route, which answers vLLM's 400 for a missing or empty prompt
    prompt: Optional[Union[str, list[str], list[int], list[list[int]]]] = None
    prompt_embeds: Any = None  # refused by the route (prompts are text or token ids); read to say so
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[dict[str, Any]]
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    # lax, as vLLM's (pydantic's non-strict bool): 1/0, 1.0/0.0 and "true"/"false", "yes"/"no",
    # "on"/"off", "t"/"f", "y"/"n", "1"/"0" are taken; null is false; 2 or "x" is a 400
    logprobs: Optional[bool] = Field(False, strict=False)
    top_logprobs: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None  # checked in .tool_calls
    parallel_tool_calls: Optional[bool] = None  # False: only the first call is returned
    include_reasoning: bool = True  # False: no reasoning_content (with --reasoning-parser)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    echo: bool = False  # with continue_final_message: the final message's content leads the reply


class TokenizeRequest(_Body):
    """``/tokenize``: a ``prompt``, or chat ``messages`` rendered as the chat route renders them."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    add_special_tokens: Optional[bool] = None  # None: True for a prompt, False for messages (vLLM's defaults)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # messages: the last one is continued, no generation prompt
    tools: Optional[list[dict[str, Any]]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    return_token_strs: Optional[bool] = False  # also answer token_strs (convert_ids_to_tokens)


class DetokenizeRequest(_Body):
    model: Optional[str] = None
    tokens: list[int]
