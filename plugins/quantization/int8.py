"""``int8``: weight-only int8 with one scale per output channel, quantized at load (online).

Any float checkpoint (fp32, bf16, fp16, or a GGUF dequantized first): each weight row ``w`` becomes
``round(w / s)`` clamped to [-127, 127] with ``s = max|w| / 127``. Activations stay in the model
dtype; the kernel computes ``x @ (q * s)^T``. Every decoder linear is quantized; the LM head and
the embedding stay in float (as vLLM's weight-only methods do).
"""

from __future__ import annotations

from typing import Any

import torch

from host.plugins.quantization import ops
from host.plugins.quantization.per_channel import PerChannelLinearMethod, scale_rows
from host.sdk.quantization import QuantizationMethod

INT8_MAX = 127.0


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q int8 [N, K], scales float32 [N])`` with ``weight ~= q * scales[:, None]`` (zero rows: scale 1)."""
    scaled, scales = scale_rows(weight, INT8_MAX)
    return torch.round(scaled).to(torch.int8), scales


class Int8LinearMethod(PerChannelLinearMethod):
    scheme = "int8"
    qdtype = torch.int8
    quantize_rows = staticmethod(quantize_int8_rows)
    op = staticmethod(ops.int8_linear)


class Int8Method(QuantizationMethod):
    name = "int8"
    online = True
    summary = "int8 weights, per-output-channel scales, quantized at load"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Int8Method":
        return cls()

    def get_linear_method(self, layer_name: str) -> Int8LinearMethod | None:
        return None if layer_name == "lm_head" else Int8LinearMethod()
