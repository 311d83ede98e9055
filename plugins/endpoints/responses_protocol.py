"""The body of ``POST /v1/responses`` (OpenAI's Responses API), as pydantic models.

The fields are the official ``openai`` client's (``ResponseCreateParams``), strict about types
like every body here (:class:`host.plugins.endpoints.protocol._Body`): unknown fields are
ignored, a wrong type is a 400 naming the field. ``input`` items are checked one by one in
:mod:`.responses_input`, which names the bad item (``input[2].call_id``).

Fields the server cannot honour are refused rather than ignored: ``background: true``,
``truncation: "auto"``, ``conversation``, ``prompt``, ``top_logprobs`` above 0 (see
:meth:`ResponsesRequest.refused`).
The vLLM sampling extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``seed``, ``stop``,
...) travel in the body as on the chat route (the client's ``extra_body``) and are handed to it
unchanged (:data:`CHAT_EXTENSIONS`).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from host.plugins.endpoints.protocol import _INT64, _Body


class TextFormat(BaseModel):
    """``text.format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or ``{"type":
    "json_schema", "name", "schema", "strict", "description"}``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None
    description: Optional[str] = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError('a "json_schema" format needs its JSON schema in text.format.schema')
        return self

    def echo(self) -> dict[str, Any]:
        """The format as the response object repeats it."""
        if self.type != "json_schema":
            return {"type": self.type}
        out: dict[str, Any] = {"type": "json_schema", "name": self.name or "response", "schema": self.schema_,
                               "strict": self.strict}
        if self.description is not None:
            out["description"] = self.description
        return out


class TextConfig(BaseModel):
    """``text``: the output format; ``verbosity`` is accepted and changes nothing."""

    model_config = ConfigDict(extra="ignore", strict=True)
    format: Optional[TextFormat] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


CHAT_EXTENSIONS = (
    "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
    "ignore_eos", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words", "skip_special_tokens",
    "include_stop_str_in_output", "priority", "timeout", "chat_template_kwargs",
)
"""The fields passed to the chat machinery as they are (vLLM's extensions, and OpenAI's
penalties, which the Responses API does not list but vLLM's route takes)."""


class ResponsesRequest(_Body):
    """``POST /v1/responses``. ``input`` is a string (one user message) or a list of items
    (messages, ``function_call``, ``function_call_output``, ``reasoning``); ``store`` defaults
    to true, as OpenAI's."""

    model: Optional[str] = None
    input: Union[str, list[Any]]
    instructions: Optional[str] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    text: Optional[TextConfig] = None
    reasoning: Optional[dict[str, Any]] = None  # effort / summary: the model reasons as its template makes it
    store: Optional[bool] = None
    previous_response_id: Optional[str] = None
    stream: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    include: Optional[list[str]] = None  # accepted; nothing extra is included
    top_logprobs: Optional[int] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    background: Optional[bool] = None
    max_tool_calls: Optional[int] = Field(None, ge=1)
    service_tier: Optional[str] = None  # accepted, no effect
    conversation: Optional[Any] = None  # refused: no server-side conversations
    prompt: Optional[Any] = None  # refused: no stored prompt templates
    # the vLLM extensions (CHAT_EXTENSIONS), typed as on the chat route
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
    include_stop_str_in_output: bool = False
    priority: int = Field(0, ge=-_INT64, le=_INT64 - 1)
    timeout: Optional[float] = Field(None, gt=0, le=86400.0)
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @property
    def stores(self) -> bool:
        return self.store is not False

    @property
    def format(self) -> TextFormat | None:
        return self.text.format if self.text is not None else None

    def refused(self) -> tuple[str, str] | None:
        """``(field, reason)`` of the first field this server cannot honour, else ``None``."""
        if self.background:
            return "background", "background=true is not supported: responses run while the request is open; drop it"
        if self.truncation == "auto":
            return "truncation", 'truncation="auto" is not supported: a prompt over the context is a 400; use "disabled"'
        if self.conversation is not None:
            return "conversation", ("conversations are not stored on this server; send the items in input, or continue a "
                                    "stored response with previous_response_id")
        if self.prompt is not None:
            return "prompt", "stored prompt templates are not supported; send the instructions and input themselves"
        if self.top_logprobs:
            return "top_logprobs", "top_logprobs is not supported on /v1/responses; use /v1/chat/completions with logprobs"
        return None
