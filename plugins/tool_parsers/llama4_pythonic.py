"""``llama4_pythonic``: Llama 4's calls, the ``pythonic`` list of calls
``[get_weather(city="Paris"), f(x=1)]``, which Llama 4 writes inside
``<|python_start|>...<|python_end|>``, possibly after some text: the text before
``<|python_start|>`` is content. Without the tags the whole output must be the list, as with
``pythonic``. The tags are special tokens, so the route keeps them; the reading of the list
(``ast``, never evaluated) is ``pythonic``'s."""

from __future__ import annotations

from typing import Any

from host.plugins.tool_parsers.pythonic import END, START, PythonicToolParser
from host.sdk import ExtractedToolCalls, PartialToolCalls
from host.sdk.tool_parser import hold_back_prefix


class Llama4PythonicToolParser(PythonicToolParser):
    name = "llama4_pythonic"
    keep_special_tokens = True

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        start = text.find(START)
        if start <= 0 or not text[:start].strip():
            return super().extract(text, tools)
        end = text.find(END, start)
        block = text[start: end + len(END) if end >= 0 else len(text)]
        result = super().extract(block, tools)
        if not result.calls:
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(text[:start], result.calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start = text.find(START)
        if start < 0:
            if text.lstrip().startswith("["):
                return super().parse_partial(text, tools)
            return PartialToolCalls(hold_back_prefix(text, START) if text.strip() else "")
        if not text[:start].strip():
            return super().parse_partial(text, tools)
        part = super().parse_partial(text[start:], tools)
        return PartialToolCalls(text[:start], part.calls)
