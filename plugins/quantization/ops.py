"""The quantized-linear kernel ops: ``torch.library`` custom ops with fake implementations, each
dispatching through the kernel table (:mod:`host.sdk.kernels`).

``host_quant::gguf_linear``, ``host_quant::int8_linear`` and ``host_quant::fp8_linear`` are what
the methods call. Their body asks the table for the implementation registered for the input's
device type (a platform plugin registers a faster one; the torch references below are registered
for every device under ``"*"``), and their fake implementation gives the output's shape and dtype
so ``torch.compile`` and ``opcheck`` trace them without running a kernel. Each op returns a new
tensor (nothing is written in place, so ``mutates_args=()``).
"""

from __future__ import annotations

from typing import Optional

import torch

from host.plugins.quantization.gguf_blocks import linear_reference
from host.sdk.kernels import kernel_for, register_kernel

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def int8_linear_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x @ (qweight * scales[:, None])^T + bias`` with the weight dequantized in x's compute dtype."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    w = qweight.to(compute) * scales.to(compute).unsqueeze(1)
    y = torch.nn.functional.linear(x.to(compute), w, None if bias is None else bias.to(compute))
    return y.to(x.dtype)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token (row) e4m3 quantization: ``(xq, scale)`` with ``x ~= xq * scale`` and
    ``scale = amax(|row|) / 448`` (rows of zeros get scale 1)."""
    x32 = x.float()
    amax = x32.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    xq = (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return xq, scale


def fp8_linear_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """W8A8: activations quantized per token to e4m3, then ``(xq*sx) @ (wq*sw)^T + bias`` in float32.
    The same rounding a ``torch._scaled_mm`` kernel sees, computed with float matmuls (any device)."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, sx = quantize_fp8_per_token(x2)
    w = qweight.to(torch.float32) * scales.to(torch.float32).unsqueeze(1)
    y = (xq.to(torch.float32) * sx) @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], qweight.shape[0])


@torch.library.custom_op("host_quant::gguf_linear", mutates_args=())
def gguf_linear(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight [N, row_bytes])^T + bias`` -> ``[M, N]`` in x's dtype."""
    return kernel_for("gguf_linear", x.device.type)(x, qweight, qtype, bias)


@gguf_linear.register_fake
def _gguf_linear_fake(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


@torch.library.custom_op("host_quant::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x [M, K] @ (qweight [N, K] int8 * scales [N])^T + bias`` -> ``[M, N]`` in x's dtype."""
    return kernel_for("int8_linear", x.device.type)(x, qweight, scales, bias)


@int8_linear.register_fake
def _int8_linear_fake(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


@torch.library.custom_op("host_quant::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """W8A8 fp8: ``x [M, K]`` quantized per token, ``qweight [N, K]`` e4m3 with per-row ``scales``."""
    return kernel_for("fp8_linear", x.device.type)(x, qweight, scales, bias)


@fp8_linear.register_fake
def _fp8_linear_fake(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


def _gguf_reference(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return linear_reference(x, qweight, qtype, bias)


def register_reference_kernels() -> None:
    """The torch references, for every device type (idempotent)."""
    register_kernel("gguf_linear", "*", _gguf_reference, name="torch_reference")
    register_kernel("int8_linear", "*", int8_linear_reference, name="torch_reference")
    register_kernel("fp8_linear", "*", fp8_linear_reference, name="torch_reference")


register_reference_kernels()
