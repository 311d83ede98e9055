"""``fp8``: W8A8 float8 (e4m3): weights per output channel, activations per token, both dynamic.

Quantized at load from a float checkpoint: each weight row becomes e4m3 with ``s = max|w| / 448``;
each forward quantizes every activation row the same way and multiplies in fp8 (``torch._scaled_mm``
on GPUs with compute capability >= 8.9, registered by the CUDA platform). On the CPU the torch
reference runs (the same rounding, float matmuls): correct, for tests and accuracy checks, not fast.
ROCm is refused: MI300-class GPUs compute fp8 as e4m3fnuz, which this method does not produce.
Checkpoints stored in fp8 are not read yet (quantize a bf16 checkpoint at load instead).
"""

from __future__ import annotations

from typing import Any

import torch

from host.plugins.quantization import ops
from host.plugins.quantization.per_channel import PerChannelLinearMethod, scale_rows
from host.sdk.quantization import QuantizationMethod


def quantize_fp8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q float8_e4m3fn [N, K], scales float32 [N])`` with ``weight ~= q * scales[:, None]``."""
    scaled, scales = scale_rows(weight, ops.FP8_MAX)
    return scaled.to(torch.float8_e4m3fn), scales


class Fp8LinearMethod(PerChannelLinearMethod):
    scheme = "fp8"
    qdtype = torch.float8_e4m3fn
    quantize_rows = staticmethod(quantize_fp8_rows)
    op = staticmethod(ops.fp8_linear)


class Fp8Method(QuantizationMethod):
    name = "fp8"
    online = True
    min_capability = 89
    device_types = ("cuda", "cpu")
    summary = "W8A8 e4m3: per-channel weights, dynamic per-token activations (CPU: torch reference)"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8Method":
        if config:
            raise ValueError(
                "this checkpoint stores fp8 weights (quantization_config quant_method 'fp8'), which host does not "
                "read yet; load the bfloat16 checkpoint with --quantization fp8 (quantized at load) instead"
            )
        return cls()

    @classmethod
    def unsupported_reason(cls, platform: Any, dtype: str) -> str | None:
        if platform.name == "rocm":
            return "ROCm GPUs of the MI300 class compute fp8 as e4m3fnuz, which this method does not produce"
        return super().unsupported_reason(platform, dtype)

    def get_linear_method(self, layer_name: str) -> Fp8LinearMethod | None:
        return None if layer_name == "lm_head" else Fp8LinearMethod()
