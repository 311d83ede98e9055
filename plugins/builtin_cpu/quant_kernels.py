"""The CPU platform's quantized-linear kernels in the kernel table (:mod:`host.sdk.kernels`).

When the compiled CPU kernels build, :func:`register_cpu_quant_kernels` (called by the CPU
platform plugin's ``host_offer_kernels`` with the hook's ``register``) offers their
``gguf_linear`` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K blocks), ``gguf_linear_q8`` (the same blocks with
the activations quantized to Q8 blocks of 32 on the fly: integer dot products with AVX2
``maddubs``/``madd``, or AVX-512 VNNI ``dpbusd`` when the build probe ran it) and ``int8_linear`` for device type
``"cpu"`` at priority 10, above the quantization plugin's torch references (registered under
``"*"``), with the calling conventions of those ops: ``gguf_linear(x, qweight, qtype, bias)`` and
``gguf_linear_q8`` alike, ``int8_linear(x, qweight, scales, bias)``, each returning a new ``[M, N]`` tensor in ``x``'s
dtype (float32 or bfloat16 ``x``, any leading dimensions flattened to rows; the weights
dequantized in registers, the products in float32).
A GGUF type the compiled kernel does not read, or a shape it does not take (K not a multiple of
the block size), goes to the torch reference registered under ``"*"`` instead of failing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from host.sdk.kernels import ANY_DEVICE, kernel_entry, register_kernel

logger = logging.getLogger("host.cpu")

PRIORITY = 10
# int(gguf.GGMLQuantizationType) -> values per block, for the types the compiled kernel reads
GGUF_BLOCK_VALUES = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 12: 256, 14: 256}


def _fallback(op: str) -> Callable[..., Any]:
    """The device-independent implementation of ``op`` (the quantization plugin's torch reference)."""
    return kernel_entry(op, ANY_DEVICE).impl


def kernel_name_and_reason(kernels: Any) -> tuple[str, str]:
    """The table name of the compiled kernels (``cpu_avx2`` or ``cpu_scalar``, by the instruction
    set built) and the reason they serve."""
    isa = kernels.kernels_isa()
    return ("cpu_avx2" if "avx2" in isa else "cpu_scalar"), f"compiled C++ kernels, {isa} build"


def register_cpu_quant_kernels(kernels: Any, register: Callable[..., None] = register_kernel) -> str:
    """Register the compiled ``gguf_linear``, ``gguf_linear_q8`` and ``int8_linear`` for ``"cpu"``
    through ``register`` (the ``host_offer_kernels`` callback); returns the name they were
    registered under (``cpu_avx2`` or ``cpu_scalar``, by the instruction set built)."""
    name, reason = kernel_name_and_reason(kernels)

    def gguf_linear(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None) -> torch.Tensor:
        values = GGUF_BLOCK_VALUES.get(int(qtype))
        if values is None or x.shape[-1] % values or x.dtype not in (torch.float32, torch.bfloat16):
            return _fallback("gguf_linear")(x, qweight, qtype, bias)
        y = kernels.gguf_linear(x.reshape(-1, x.shape[-1]), qweight, int(qtype), bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.bfloat16):
            return _fallback("int8_linear")(x, qweight, scales, bias)
        y = kernels.int8_linear(x.reshape(-1, x.shape[-1]), qweight, scales, bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def gguf_linear_q8(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None) -> torch.Tensor:
        values = GGUF_BLOCK_VALUES.get(int(qtype))
        if values is None or x.shape[-1] % values or x.dtype not in (torch.float32, torch.bfloat16):
            return _fallback("gguf_linear_q8")(x, qweight, qtype, bias)
        y = kernels.gguf_linear_q8(x.reshape(-1, x.shape[-1]), qweight, int(qtype), bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    register("gguf_linear", "cpu", gguf_linear, name=name, priority=PRIORITY, reason=reason)
    register("gguf_linear_q8", "cpu", gguf_linear_q8, name=name, priority=PRIORITY, reason=reason)
    register("int8_linear", "cpu", int8_linear, name=name, priority=PRIORITY, reason=reason)
    logger.info("Quantized linear kernels for cpu: %s (%s)", name, kernels.kernels_isa())
    return name
