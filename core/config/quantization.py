"""Which quantization method the weights use, and the layer patterns that refine it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from host.core.config.common import QUANTIZED_ACTIVATIONS


def compile_pattern(pattern: str) -> Any:
    """A ``re:`` pattern compiled (a bad regex is a ``ValueError`` naming it), else the string."""
    if pattern.startswith("re:"):
        try:
            return re.compile(pattern[3:])
        except re.error as exc:
            raise ValueError(f"quantization pattern {pattern!r} is not a valid regular expression: {exc}") from None
    return pattern


@dataclass
class QuantizationConfig:
    """Which quantization method the weights use (resolved per layer in the engine process into
    ``plan``, see :mod:`host.core.models.quant_plan`).

    ``quantization``: a registered method name, ``"none"`` (off; a GGUF is dequantized), or
    ``None`` (the checkpoint decides: its ``quantization_config``, a GGUF's blocks, else none).
    ``ignore``: layers left in float; ``targets``: layer pattern -> method for those layers.
    Patterns are exact names, ``re:<regex>`` or fnmatch patterns.
    ``activations``: ``"none"`` (activations stay in the model dtype) or ``"q8"`` (a method that
    supports it quantizes each activation row to int8 blocks of 32 on the fly; opt-in, the
    ``gguf`` method on CPU).
    """

    quantization: str | None = None
    ignore: list[str] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    activations: str = "none"
    # resolved at start-up (QuantPlan)
    plan: Any = None

    def __post_init__(self) -> None:
        if self.quantization is not None and (not isinstance(self.quantization, str) or not self.quantization):
            raise ValueError(f"quantization={self.quantization!r} must be a method name, 'none', or unset")
        if isinstance(self.ignore, str) or not all(isinstance(p, str) for p in self.ignore):
            raise ValueError(f"quantization ignore={self.ignore!r} must be a list of layer names or patterns")
        if not isinstance(self.targets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.targets.items()):
            raise ValueError(
                f"quantization targets={self.targets!r} must map layer patterns to method names, "
                "e.g. {\"re:.*mlp.*\": \"int8\"}"
            )
        for pattern in [*self.ignore, *self.targets]:
            compile_pattern(pattern)  # a bad re: pattern fails here, at config time
        if self.activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(
                f"quantized activations {self.activations!r} is not one of {', '.join(QUANTIZED_ACTIVATIONS)} "
                "(--quantized-activations q8)"
            )
