"""The ``<think>...</think>`` reasoning formats; the splitting itself is
:meth:`host.sdk.ReasoningParser.split`, these classes choose its options."""

from __future__ import annotations

from host.sdk import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1: generation begins inside the reasoning."""

    name = "deepseek_r1"
    starts_in_reasoning = True


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: reasoning only when the output opens it with ``<think>``."""

    name = "qwen3"
