"""``json_schema_extract``: pull structured data out of a text with a generative model.

Payload: ``{"text": str, "schema": {JSON schema}, "instruction": str (optional), "max_tokens":
int = 256}``. The prompt asks the model to extract what the schema describes from the text (in
the model's chat template when it has one); generation is greedy and constrained to the schema
(structured outputs), so the answer parses. Response: ``{"data": <the parsed JSON>, "text": <the
raw output>, "finish_reason"}``. An answer cut short by ``max_tokens`` is a ``ValueError`` (400)
naming ``max_tokens``.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from host.sdk import IOProcessor

DEFAULT_INSTRUCTION = "Extract the information the JSON schema describes from the text. Answer with JSON only."


class JSONSchemaExtractProcessor(IOProcessor):
    name = "json_schema_extract"
    runner = "generate"

    def parse_data(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ValueError(f'json_schema_extract: the payload must be an object {{"text", "schema"}}, not {type(data).__name__}')
        unknown = sorted(set(data) - {"text", "schema", "instruction", "max_tokens"})
        if unknown:
            raise ValueError(f"json_schema_extract: unknown field(s) {', '.join(unknown)}; valid: text, schema, instruction, max_tokens")
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError('json_schema_extract: "text" must be a non-empty string')
        schema = data.get("schema")
        if not isinstance(schema, dict) or not schema:
            raise ValueError('json_schema_extract: "schema" must be a non-empty JSON schema object, e.g. {"type": "object", ...}')
        instruction = data.get("instruction", DEFAULT_INSTRUCTION)
        if not isinstance(instruction, str):
            raise ValueError('json_schema_extract: "instruction" must be a string')
        max_tokens = data.get("max_tokens", 256)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"json_schema_extract: max_tokens={max_tokens!r} must be a positive integer")
        return {"text": text, "schema": schema, "instruction": instruction, "max_tokens": max_tokens}

    def merge_sampling_params(self, params: Any = None, data: Any = None) -> Any:
        from host.sdk.sampling_params import SamplingParams, StructuredOutputsParams

        if params is not None:
            return params
        if data is None:  # no payload: plain greedy decoding
            return SamplingParams(temperature=0.0)
        return SamplingParams(
            temperature=0.0, max_tokens=data["max_tokens"], structured_outputs=StructuredOutputsParams(json=data["schema"]),
        )

    def prompt_text(self, data: dict[str, Any]) -> str:
        """The prompt: the instruction, the schema and the text (the chat template's user turn
        when the tokenizer has one)."""
        content = f"{data['instruction']}\n\nJSON schema:\n{json.dumps(data['schema'])}\n\nText:\n{data['text']}"
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True,
            )
        return content + "\n\nJSON:\n"

    def pre_process(self, prompt: Any, request_id: str | None = None, **kwargs: Any) -> Any:
        text = self.prompt_text(prompt)
        if self.tokenizer is None:
            return text
        templated = getattr(self.tokenizer, "chat_template", None)  # the template wrote the special tokens itself
        return list(self.tokenizer.encode(text, add_special_tokens=not templated))

    def post_process(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        if len(model_output) != 1:
            raise ValueError(f"json_schema_extract: expected one generated output, got {len(model_output)}")
        choice = model_output[0].outputs[0]
        finish = getattr(choice, "finish_reason", None)
        try:
            parsed = json.loads(choice.text)
        except ValueError:
            raise ValueError(
                f"json_schema_extract: the answer is not complete JSON (finish_reason={finish!r}); "
                "raise max_tokens or simplify the schema"
            ) from None
        return {"data": parsed, "text": choice.text, "finish_reason": finish}
