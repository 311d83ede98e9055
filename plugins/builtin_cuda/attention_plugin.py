"""Entry point ``host.attention_backends: triton_paged``."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_attention_backends(register: Callable[..., None]) -> None:
    from host.plugins.builtin_cuda.attention import TritonPagedAttentionBackend

    register(TritonPagedAttentionBackend)
