"""Entry point ``host.attention_backends: triton_paged``: the shared Triton paged attention
(:mod:`host.plugins.triton_ops.attention`). The plain-torch fallback the CUDA platform lists
second, ``torch_paged``, has an entry point of its own (:mod:`host.plugins.torch_paged`)."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_attention_backends(register: Callable[..., None]) -> None:
    from host.plugins.triton_ops.attention import TritonPagedAttentionBackend

    register(TritonPagedAttentionBackend)
