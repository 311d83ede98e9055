"""Entry point ``host.platforms: cuda``."""

from __future__ import annotations

from typing import Any, Callable

from host.sdk import hookimpl


@hookimpl
def host_register_platforms(register: Callable[..., None]) -> None:
    from host.plugins.builtin_cuda.platform import CudaPlatform

    register(CudaPlatform)


@hookimpl
def host_offer_kernels(register: Callable[..., None], platform: Any, config: Any) -> None:
    """The Triton quantized-linear and LoRA kernels when this process runs on this platform
    (:meth:`host.plugins.builtin_cuda.platform.CudaPlatform.offer_kernels`)."""
    from host.plugins.builtin_cuda.platform import CudaPlatform

    if isinstance(platform, CudaPlatform) and not platform.is_rocm():
        platform.offer_kernels(register)
