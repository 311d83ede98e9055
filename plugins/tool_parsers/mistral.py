"""``mistral``: Mistral's ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` and the newer
``[TOOL_CALLS]name[ARGS]{...}`` (repeated per call); text before the first marker is content.
The markers are special tokens, so the route generates with ``skip_special_tokens=False``."""

from __future__ import annotations

from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import arguments_json, call_from_object, decode_sequence, hold_back_prefix

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
EOS = "</s>"


def _calls(body: str, final: bool) -> tuple[list[tuple[str, str | None]], bool]:
    """The calls after the first marker, and whether all of ``body`` was read as calls."""
    calls: list[tuple[str, str | None]] = []
    if final and body.rstrip().endswith(EOS):
        body = body.rstrip()[: -len(EOS)]
    for piece in body.split(TOOL_CALLS):
        piece = piece.strip()
        if not piece:
            continue
        if piece.startswith("["):  # a JSON array of calls
            values, rest = decode_sequence(piece)
            if len(values) == 1 and isinstance(values[0], list) and not rest.strip():
                for value in values[0]:
                    call = call_from_object(value)
                    if call is None:
                        return calls, False
                    calls.append((call.name, call.arguments))
                continue
            if not final:
                calls.extend(_complete_items(piece))
            return calls, False
        elif ARGS in piece:  # name[ARGS]{...}
            name, _, args = piece.partition(ARGS)
            values, rest = decode_sequence(args)
            if len(values) != 1 or not isinstance(values[0], dict) or rest.strip() or not name.strip():
                return calls, False
            calls.append((name.strip(), arguments_json(values[0])))
        else:
            return calls, False
    return calls, True


def _complete_items(piece: str) -> list[tuple[str, str | None]]:
    """The complete call objects at the start of an unfinished JSON array."""
    values, _ = decode_sequence(piece[1:], ",")
    out: list[tuple[str, str | None]] = []
    for value in values:
        call = call_from_object(value)
        if call is None:
            break
        out.append((call.name, call.arguments))
    return out


class MistralToolParser(ToolParser):
    name = "mistral"
    keep_special_tokens = True

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        start = text.find(TOOL_CALLS)
        if start < 0:
            return ExtractedToolCalls(text, [])
        calls, whole = _calls(text[start + len(TOOL_CALLS):], final=True)
        if not whole or not calls or any(args is None for _, args in calls):
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(text[:start] or None, [ToolCall(n, a) for n, a in calls if a is not None])

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start = text.find(TOOL_CALLS)
        if start < 0:
            return PartialToolCalls(hold_back_prefix(text, TOOL_CALLS))
        calls, _ = _calls(text[start + len(TOOL_CALLS):], final=False)
        return PartialToolCalls(text[:start], calls)
