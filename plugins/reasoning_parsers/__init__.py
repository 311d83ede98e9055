"""Built-in reasoning parsers (entry point ``host.reasoning_parsers: builtin_reasoning_parsers``),
loaded in the API process and selected with ``--reasoning-parser NAME``:

- ``deepseek_r1``: the output starts inside the reasoning (DeepSeek-R1's template opens
  ``<think>`` in the prompt; a generated ``<think>`` is dropped); ``</think>`` ends it, and an
  output without it is all reasoning;
- ``qwen3``: reasoning only when the output starts with ``<think>``; up to ``</think>``.
"""

from __future__ import annotations

from typing import Callable

from host.plugins.reasoning_parsers.think_tags import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from host.sdk import hookimpl

__all__ = ["DeepSeekR1ReasoningParser", "Qwen3ReasoningParser"]


@hookimpl
def host_register_reasoning_parsers(register: Callable[..., None]) -> None:
    register(DeepSeekR1ReasoningParser)
    register(Qwen3ReasoningParser)
