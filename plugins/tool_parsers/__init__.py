"""Built-in tool-call parsers (entry point ``host.tool_parsers: builtin_tool_parsers``), loaded in
the API process and selected with ``--tool-call-parser NAME``:

- ``hermes``: Hermes / Qwen ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, one block per call;
- ``llama3_json``: Llama 3.x ``{"name": ..., "parameters": ...}`` (after ``<|python_tag|>`` or not),
  several separated by ``;``;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]`` (and the newer
  ``[TOOL_CALLS]name[ARGS]{...}``);
- ``pythonic``: ``[get_weather(city='Paris'), f(x=1)]``, read with ``ast`` (never evaluated).
"""

from __future__ import annotations

from typing import Callable

from host.plugins.tool_parsers.hermes import HermesToolParser
from host.plugins.tool_parsers.llama3_json import Llama3JsonToolParser
from host.plugins.tool_parsers.mistral import MistralToolParser
from host.plugins.tool_parsers.pythonic import PythonicToolParser
from host.sdk import hookimpl

__all__ = ["HermesToolParser", "Llama3JsonToolParser", "MistralToolParser", "PythonicToolParser"]


@hookimpl
def host_register_tool_parsers(register: Callable[..., None]) -> None:
    register(HermesToolParser)
    register(Llama3JsonToolParser)
    register(MistralToolParser)
    register(PythonicToolParser)
