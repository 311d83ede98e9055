"""``deepseek_v3`` (and ``deepseek_v31``, the same parser): DeepSeek's calls between
``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``, one
``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` per call, in either form:

- V3 / R1: ``function<｜tool▁sep｜>NAME`` then the arguments in a fenced block,
  ``\\n```json\\n{...}\\n```\\n``;
- V3.1 and later: ``NAME<｜tool▁sep｜>{...}``, the arguments straight after the separator.

The markers use the full-width ``｜`` and ``▁`` of DeepSeek's vocabulary. Text before the calls is
content; text after ``<｜tool▁calls▁end｜>`` is dropped. An output whose calls do not all parse
(arguments that are not one JSON object, a missing marker, a cut-off block) is all content."""

from __future__ import annotations

import json
from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import arguments_json, hold_back_prefix

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
EOS = "<｜end▁of▁sentence｜>"


def _arguments(text: str) -> str | None:
    """The JSON object ``text`` holds, bare or in a ```json fence, as JSON text; ``None`` if not one."""
    body = text.strip()
    if body.startswith("```"):
        if not body.endswith("```") or len(body) < 6:
            return None
        body = body[3:-3]
        if body.startswith("json"):
            body = body[4:]
        body = body.strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    return arguments_json(value) if isinstance(value, dict) else None


def _call(block: str) -> ToolCall | None:
    """One call from the text between ``<｜tool▁call▁begin｜>`` and ``<｜tool▁call▁end｜>``."""
    head, sep, rest = block.partition(SEP)
    if not sep:
        return None
    head = head.strip()
    if rest.lstrip().startswith("{"):  # V3.1: NAME<｜tool▁sep｜>{...}
        name, args = head, rest
    else:  # V3: TYPE<｜tool▁sep｜>NAME\n```json ... ```
        name, newline, args = rest.partition("\n")
        name = name.strip()
        if not newline or head != "function":
            return None
    arguments = _arguments(args)
    if not name or arguments is None:
        return None
    return ToolCall(name, arguments)


def _calls(body: str, final: bool) -> tuple[list[ToolCall], bool]:
    """The complete calls of the text after ``<｜tool▁calls▁begin｜>``, and whether it all parsed
    (in an unfinished output, a marker or call still being written counts as parsed so far)."""
    calls: list[ToolCall] = []
    pos = 0
    while True:
        while pos < len(body) and body[pos].isspace():
            pos += 1
        rest = body[pos:]
        if not rest or rest.startswith(CALLS_END):  # closed, or the output stopped after its last call
            return calls, True
        if not rest.startswith(CALL_BEGIN):
            return calls, not final and (CALL_BEGIN.startswith(rest) or CALLS_END.startswith(rest))
        end = body.find(CALL_END, pos)
        if end < 0:
            return calls, not final
        call = _call(body[pos + len(CALL_BEGIN): end])
        if call is None:
            return calls, False
        calls.append(call)
        pos = end + len(CALL_END)


class DeepSeekV3ToolParser(ToolParser):
    name = "deepseek_v3"
    keep_special_tokens = True

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        start = text.find(CALLS_BEGIN)
        if start < 0:
            return ExtractedToolCalls(text, [])
        body = text[start + len(CALLS_BEGIN):]
        if body.rstrip().endswith(EOS):
            body = body.rstrip()[: -len(EOS)]
        calls, whole = _calls(body, final=True)
        if not whole or not calls:
            return ExtractedToolCalls(text, [])  # malformed: all of it is content
        return ExtractedToolCalls(text[:start] or None, calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start = text.find(CALLS_BEGIN)
        if start < 0:
            return PartialToolCalls(hold_back_prefix(text, CALLS_BEGIN))
        calls, whole = _calls(text[start + len(CALLS_BEGIN):], final=False)
        # a call is announced once its <｜tool▁call▁end｜> is there, and only while all parsed
        return PartialToolCalls(text[:start], [(c.name, c.arguments) for c in calls] if whole else [])


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    """vLLM's name for the V3.1 form; both forms are read by either name."""

    name = "deepseek_v31"
