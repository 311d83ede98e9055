"""The shared shape of the online per-output-channel methods (``int8``, ``fp8``): one quantized
``[N, K]`` weight ``layer.qweight`` and one float32 scale per row ``layer.scales``, each checkpoint
shard quantized into its rows as it loads, computed by one ``host_quant`` op."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from host.sdk.quantization import LinearMethod


def as_float(tensor: Any) -> torch.Tensor:
    """A checkpoint tensor as float32 (a GGUF block tensor is dequantized first)."""
    if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
        return tensor.dequantize(torch.float32)
    return tensor


def scale_rows(weight: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight / scales[:, None] in float32, scales)`` with ``scales = max|row| / qmax`` (zero rows:
    scale 1), clamped to [-qmax, qmax]: what a per-channel format then rounds to its type."""
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return (w / scales.unsqueeze(1)).clamp(-qmax, qmax), scales


class PerChannelLinearMethod(LinearMethod):
    """Subclasses set ``qdtype``, ``quantize_rows(weight) -> (q, scales)`` and ``op(x, q, scales, bias)``."""

    qdtype: ClassVar[torch.dtype]
    quantize_rows: ClassVar[Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]
    op: ClassVar[Callable[..., torch.Tensor]]

    def create_weights(self, layer: Any, input_size: int, output_sizes: list[int], params_dtype: torch.dtype) -> None:
        n = sum(output_sizes)
        layer.register_buffer("qweight", torch.zeros(n, input_size, dtype=self.qdtype), persistent=False)
        layer.register_buffer("scales", torch.ones(n, dtype=torch.float32), persistent=False)

    def load_weight(self, layer: Any, shard: int, tensor: Any) -> None:
        rows = layer.shard_slice(shard)
        q, scales = type(self).quantize_rows(as_float(tensor).to(layer.qweight.device))
        layer.qweight[rows] = q
        layer.scales[rows] = scales

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = type(self).op(x2, layer.qweight, layer.scales, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])
