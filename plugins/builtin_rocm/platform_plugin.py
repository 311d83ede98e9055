"""Entry point ``host.platforms: rocm``."""

from __future__ import annotations

from typing import Any, Callable

from host.sdk import hookimpl


@hookimpl
def host_register_platforms(register: Callable[..., None]) -> None:
    from host.plugins.builtin_rocm.platform import RocmPlatform

    register(RocmPlatform)


@hookimpl
def host_offer_kernels(register: Callable[..., None], platform: Any, config: Any) -> None:
    """The Triton quantized-linear and LoRA kernels when this process runs on this platform
    (:meth:`host.plugins.builtin_cuda.platform.CudaPlatform.offer_kernels`)."""
    from host.plugins.builtin_rocm.platform import RocmPlatform

    if isinstance(platform, RocmPlatform):
        platform.offer_kernels(register)
