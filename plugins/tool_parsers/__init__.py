"""Built-in tool-call parsers (entry point ``host.tool_parsers: builtin_tool_parsers``), loaded in
the API process and selected with ``--tool-call-parser NAME``:

- ``hermes``: Hermes / Qwen ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, one block per call;
- ``llama3_json``: Llama 3.x ``{"name": ..., "parameters": ...}`` (after ``<|python_tag|>`` or not),
  several separated by ``;``;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]`` (and the newer
  ``[TOOL_CALLS]name[ARGS]{...}``);
- ``pythonic``: ``[get_weather(city='Paris'), f(x=1)]``, read with ``ast`` (never evaluated);
- ``llama4_pythonic``: Llama 4's pythonic calls in ``<|python_start|>...<|python_end|>``, after
  content or not;
- ``qwen3_coder``: Qwen3-Coder's XML, ``<tool_call><function=NAME><parameter=P>value</parameter>
  </function></tool_call>``, values typed by the tool's JSON schema;
- ``openai``: gpt-oss's harmony messages, ``<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}<|call|>``; the ``final`` channel is content, ``analysis`` is not;
- ``deepseek_v3`` / ``deepseek_v31``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...`` in V3's
  fenced-JSON form and V3.1's bare form;
- ``granite``: Granite 3.x ``<|tool_call|>[{"name": ..., "arguments": ...}]`` (or ``<tool_call>[...]``).
"""

from __future__ import annotations

from typing import Callable

from host.plugins.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from host.plugins.tool_parsers.granite import GraniteToolParser
from host.plugins.tool_parsers.harmony import HarmonyToolParser
from host.plugins.tool_parsers.hermes import HermesToolParser
from host.plugins.tool_parsers.llama3_json import Llama3JsonToolParser
from host.plugins.tool_parsers.llama4_pythonic import Llama4PythonicToolParser
from host.plugins.tool_parsers.mistral import MistralToolParser
from host.plugins.tool_parsers.pythonic import PythonicToolParser
from host.plugins.tool_parsers.qwen3_coder import Qwen3CoderToolParser
from host.sdk import hookimpl

__all__ = [
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "GraniteToolParser",
    "HarmonyToolParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "Llama4PythonicToolParser",
    "MistralToolParser",
    "PythonicToolParser",
    "Qwen3CoderToolParser",
]


@hookimpl
def host_register_tool_parsers(register: Callable[..., None]) -> None:
    register(HermesToolParser)
    register(Llama3JsonToolParser)
    register(MistralToolParser)
    register(PythonicToolParser)
    register(Llama4PythonicToolParser)
    register(Qwen3CoderToolParser)
    register(HarmonyToolParser)
    register(DeepSeekV3ToolParser)
    register(DeepSeekV31ToolParser)
    register(GraniteToolParser)
