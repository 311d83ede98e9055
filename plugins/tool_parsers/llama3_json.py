"""``llama3_json``: Llama 3.x JSON calls, ``{"name": ..., "parameters": {...}}`` (or
``"arguments"``), optionally after ``<|python_tag|>``; several are separated by ``;``. An output
that does not start with a call is content."""

from __future__ import annotations

from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolParser
from host.sdk.tool_parser import call_from_object, decode_sequence

PYTHON_TAG = "<|python_tag|>"


def _body(text: str) -> str | None:
    """The text after the optional tag when it starts a call, else ``None``."""
    body = text.lstrip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    return body if body.startswith("{") else None


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    keep_special_tokens = True  # <|python_tag|> is a special token

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        body = _body(text)
        if body is None:
            return ExtractedToolCalls(text, [])
        values, rest = decode_sequence(body, ";")
        calls = [call_from_object(v) for v in values]
        if rest.strip() or not calls or any(c is None for c in calls):
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(None, calls)  # type: ignore[arg-type]

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        stripped = text.lstrip()
        if not stripped or PYTHON_TAG.startswith(stripped):
            return PartialToolCalls()  # could still become a call
        body = _body(text)
        if body is None:
            return PartialToolCalls(text)
        values, rest = decode_sequence(body, ";")
        if not rest.strip():
            values = values[:-1]  # the last one may still be followed by text that makes it all content
        elif not rest.lstrip().startswith("{"):
            return PartialToolCalls()
        calls: list[tuple[str, str | None]] = []
        for value in values:
            call = call_from_object(value)
            if call is None:
                return PartialToolCalls()
            calls.append((call.name, call.arguments))
        return PartialToolCalls(calls=calls)
