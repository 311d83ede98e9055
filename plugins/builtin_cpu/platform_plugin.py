"""Entry point ``host.platforms: cpu``."""

from __future__ import annotations

from typing import Any, Callable

from host.sdk import hookimpl


@hookimpl
def host_register_platforms(register: Callable[..., None]) -> None:
    from host.plugins.builtin_cpu.platform import CpuPlatform

    register(CpuPlatform)


@hookimpl
def host_offer_kernels(register: Callable[..., None], platform: Any, config: Any) -> None:
    """The compiled quantized-linear, layer (norm, rotary, SiLU-and-mul) and fused MoE kernels for ``"cpu"`` when this process runs on the CPU
    platform and they build here, unless ``config`` keeps the model on torch (``-O0``: no custom
    ops; ``-O3``: torch.compile generates the code) or ``HOST_CPU_KERNELS=0``."""
    from host.plugins.builtin_cpu.platform import CpuPlatform

    if not isinstance(platform, CpuPlatform):
        return
    if config is not None and (config.compilation.torch_compile or not config.compilation.custom_ops):
        return
    from host.plugins.builtin_cpu.kernels import cpu_kernels

    kernels = cpu_kernels()
    if kernels is not None:
        from host.plugins.builtin_cpu.fused_ops import offer_layer_kernels
        from host.plugins.builtin_cpu.moe_kernel import offer_moe_kernel
        from host.plugins.builtin_cpu.quant_kernels import PRIORITY, kernel_name_and_reason, register_cpu_quant_kernels

        register_cpu_quant_kernels(kernels, register)
        offer_layer_kernels(kernels, register, *kernel_name_and_reason(kernels), priority=PRIORITY)
        offer_moe_kernel(kernels, register, *kernel_name_and_reason(kernels), priority=PRIORITY)
