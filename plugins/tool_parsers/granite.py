"""``granite``: IBM Granite 3.x calls, a JSON list of ``{"name": ..., "arguments": {...}}``
after ``<|tool_call|>`` (Granite 3.0, a special token) or ``<tool_call>`` (Granite 3.1 and later,
plain text)::

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

Text before the marker is content; text after the list is dropped. An output whose marker is not
followed by a list of calls (a single object, a cut-off list, an entry without a ``name`` or with
arguments that are not an object) is all content. Granite 4's ``<tool_call>{...}</tool_call>``
blocks are ``hermes``."""

from __future__ import annotations

from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import call_from_object, decode_sequence, hold_back_prefix

MARKERS = ("<|tool_call|>", "<tool_call>")
EOS = "<|end_of_text|>"


def _marker(text: str) -> tuple[int, int]:
    """Where the first marker starts and where the list after it starts; ``(-1, -1)`` if none."""
    found = [(text.find(m), len(m)) for m in MARKERS if m in text]
    if not found:
        return -1, -1
    start, length = min(found)
    return start, start + length


def _list_calls(body: str) -> list[ToolCall] | None:
    """The calls of the list at the start of ``body`` (after the marker), or ``None`` when it is
    not a finished list of calls."""
    body = body.strip()
    if body.endswith(EOS):
        body = body[: -len(EOS)]
    if not body.startswith("["):
        return None
    values, _ = decode_sequence(body)
    if not values or not isinstance(values[0], list) or not values[0]:
        return None
    calls = [call_from_object(v) for v in values[0]]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


class GraniteToolParser(ToolParser):
    name = "granite"
    keep_special_tokens = True

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        start, body_at = _marker(text)
        calls = _list_calls(text[body_at:]) if start >= 0 else None
        if not calls:
            return ExtractedToolCalls(text, [])  # malformed: all of it is content
        return ExtractedToolCalls(text[:start] or None, calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start, body_at = _marker(text)
        if start < 0:
            held = text
            for marker in MARKERS:
                held = hold_back_prefix(held, marker)
            return PartialToolCalls(held)
        # the calls are announced once the list is closed: a later malformed entry makes it all content
        calls = _list_calls(text[body_at:]) or []
        return PartialToolCalls(text[:start], [(c.name, c.arguments) for c in calls])
