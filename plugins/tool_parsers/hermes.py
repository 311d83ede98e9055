"""``hermes``: the Hermes / Qwen format, one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
block per call (several blocks are parallel calls); text before the first block is content."""

from __future__ import annotations

import json
import re
from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolParser
from host.sdk.tool_parser import call_from_object, hold_back_prefix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    name = "hermes"

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        start = text.find(OPEN)
        if start < 0:
            return ExtractedToolCalls(text, [])
        calls = []
        for block in _BLOCK.findall(text, start):
            try:
                call = call_from_object(json.loads(block))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return ExtractedToolCalls(text, [])  # malformed: all of it is content
            calls.append(call)
        return ExtractedToolCalls(text[:start] or None, calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start = text.find(OPEN)
        if start < 0:
            return PartialToolCalls(hold_back_prefix(text, OPEN))
        calls: list[tuple[str, str | None]] = []
        pos = start
        while True:
            begin = text.find(OPEN, pos)
            if begin < 0:
                break
            end = text.find(CLOSE, begin)
            body = text[begin + len(OPEN): end if end >= 0 else len(text)]
            if end < 0:
                break  # a call is announced once its block is complete, so a malformed one stays content
            try:
                call = call_from_object(json.loads(body))
            except json.JSONDecodeError:
                call = None
            if call is None:
                break
            calls.append((call.name, call.arguments))
            pos = end + len(CLOSE)
        return PartialToolCalls(text[:start], calls)
