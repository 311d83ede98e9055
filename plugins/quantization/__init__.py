"""Built-in quantization methods (entry point ``host.quantization: builtin_quantization``), loaded in
the engine process (which resolves the plan) and the workers (which load and run the weights):

- ``gguf``: GGUF blocks kept as stored (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), the default for a GGUF source
  (a mixture-of-experts model's experts included);
- ``int8``: weight-only int8, per-output-channel scales, quantized at load;
- ``fp8``: W8A8 e4m3 with dynamic per-token activation scales (GPUs with capability >= 8.9; a
  torch reference on the CPU).

The kernels are the ops of :mod:`.ops`, dispatched through :mod:`host.sdk.kernels` (torch
references offered here by ``host_offer_kernels``; the CPU and CUDA platforms offer faster ones).
"""

from __future__ import annotations

from typing import Any, Callable

from host.plugins.quantization.fp8 import Fp8Method
from host.plugins.quantization.gguf import GGUFMethod
from host.plugins.quantization.int8 import Int8Method
from host.sdk import hookimpl

__all__ = ["Fp8Method", "GGUFMethod", "Int8Method"]


@hookimpl
def host_register_quantization_methods(register: Callable[..., None]) -> None:
    register(GGUFMethod)
    register(Int8Method)
    register(Fp8Method)


@hookimpl
def host_offer_kernels(register: Callable[..., None], platform: Any, config: Any) -> None:
    from host.plugins.quantization import gguf_moe
    from host.plugins.quantization.ops import register_reference_kernels

    register_reference_kernels(register)
    gguf_moe.register_reference_kernels(register)
