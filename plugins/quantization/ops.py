"""The quantized-linear kernel ops: ``torch.library`` custom ops with fake implementations, each
dispatching through the kernel table (:mod:`host.sdk.kernels`).

``host_quant::gguf_linear``, ``host_quant::gguf_linear_q8`` (the opt-in Q8 activations),
``host_quant::int8_linear`` and ``host_quant::fp8_linear`` are what the methods call. Their body asks the table for the implementation registered for the input's
device type (a platform plugin registers a faster one; the torch references below are offered
for every device under ``"*"`` by the plugin's ``host_offer_kernels``), and their fake implementation gives the output's shape and dtype
so ``torch.compile`` and ``opcheck`` trace them without running a kernel. Each op returns a new
tensor (nothing is written in place, so ``mutates_args=()``).
"""

from __future__ import annotations

from typing import Callable, Optional

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


Q8_BLOCK = 32  # activation values per Q8 block


def quantize_q8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8 activation blocks of ``x [M, K]`` (K a multiple of 32), as llama.cpp's Q8_0 with a
    float32 scale: per block of 32 values ``d = amax(|x|) / 127`` and ``q = round(x / d)``
    (``x * (1 / d)``, round half to even; all-zero blocks give ``d = 0``, ``q = 0``). Returns
    ``(q int8 [M, K], d float32 [M, K / 32])``, bit for bit what the CPU kernels compute."""
    x32 = x.reshape(-1, x.shape[-1]).float()
    m, k = x32.shape
    if k % Q8_BLOCK:
        raise ValueError(f"Q8 activations come in blocks of {Q8_BLOCK} values; K = {k} is not a multiple")
    blocks = x32.reshape(m, k // Q8_BLOCK, Q8_BLOCK)
    d = blocks.abs().amax(dim=-1) / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    q = torch.round(blocks * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q.reshape(m, k), d


def dequantize_q8_reference(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The float32 values ``q * d`` of Q8 blocks (``quantize_q8_reference``'s output)."""
    m, k = q.shape
    return (q.float().reshape(m, k // Q8_BLOCK, Q8_BLOCK) * d.unsqueeze(-1)).reshape(m, k)


def gguf_linear_q8_reference(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``gguf_linear`` with Q8 activations: ``dequantize_q8(quantize_q8(x)) @ dequantize(W)^T + bias``
    in float32 (what an integer-dot kernel computes, up to summation order); result in x's dtype."""
    q, d = quantize_q8_reference(x)
    y = linear_reference(dequantize_q8_reference(q, d), qweight, qtype, bias)
    return y.to(x.dtype).reshape(*x.shape[:-1], qweight.shape[0])


@torch.library.custom_op("host_quant::gguf_linear", mutates_args=())
def gguf_linear(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight [N, row_bytes])^T + bias`` -> ``[M, N]`` in x's dtype."""
    return kernel_for("gguf_linear", x.device.type)(x, qweight, qtype, bias)


@gguf_linear.register_fake
def _gguf_linear_fake(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


@torch.library.custom_op("host_quant::gguf_linear_q8", mutates_args=())
def gguf_linear_q8(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``gguf_linear`` with the activations quantized on the fly to Q8 blocks of 32 (opt-in:
    ``--quantized-activations q8``) -> ``[M, N]`` in x's dtype."""
    return kernel_for("gguf_linear_q8", x.device.type)(x, qweight, qtype, bias)


@gguf_linear_q8.register_fake
def _gguf_linear_q8_fake(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
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


def register_reference_kernels(register: Callable[..., None] = register_kernel) -> None:
    """The torch references, for every device type (idempotent); ``register`` is the
    ``host_offer_kernels`` hook's callback (the plugin's hook calls this, nothing at import)."""
    register("gguf_linear", "*", _gguf_reference, name="torch_reference",
             reason="torch: dequantize the GGUF blocks, then a float matmul")
    register("gguf_linear_q8", "*", gguf_linear_q8_reference, name="torch_reference",
             reason="torch: Q8 activation blocks, dequantized weights, float32 matmul")
    register("int8_linear", "*", int8_linear_reference, name="torch_reference",
             reason="torch: dequantize the int8 rows, then a float matmul")
    register("fp8_linear", "*", fp8_linear_reference, name="torch_reference",
             reason="torch: per-token e4m3 activations, float32 matmul")
