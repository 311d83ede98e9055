"""Entry point ``host.attention_backends: triton_rocm``: the shared Triton kernels under ROCm's
capability flags. The ``torch_paged`` fallback the ROCm platform lists second has an entry
point of its own (:mod:`host.plugins.torch_paged`), so blocking ``triton_paged`` keeps it."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_attention_backends(register: Callable[..., None]) -> None:
    from host.plugins.builtin_rocm.attention import RocmTritonAttentionBackend

    register(RocmTritonAttentionBackend)
