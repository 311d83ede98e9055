"""Entry point ``host.attention_backends: torch_paged``: the device-neutral paged attention in
plain torch. Its own entry point, so blocking a platform's kernels (``triton_paged``,
``triton_rocm``, ``cpu_paged``) keeps the fallback the platforms list after them."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_attention_backends(register: Callable[..., None]) -> None:
    from host.plugins.torch_paged.attention import TorchPagedAttentionBackend

    register(TorchPagedAttentionBackend)
