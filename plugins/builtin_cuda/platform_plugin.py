"""Entry point ``host.platforms: cuda``."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_platforms(register: Callable[..., None]) -> None:
    from host.plugins.builtin_cuda.platform import CudaPlatform

    register(CudaPlatform)
