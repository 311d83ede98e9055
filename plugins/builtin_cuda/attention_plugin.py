"""Entry point ``host.attention_backends: triton_paged``: the Triton backend, and the plain-torch
``torch_paged`` fallback (the CPU plugin's algorithm without its compiled kernel)."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_attention_backends(register: Callable[..., None]) -> None:
    from host.plugins.builtin_cpu.attention import TorchPagedAttentionBackend
    from host.plugins.builtin_cuda.attention import TritonPagedAttentionBackend

    register(TritonPagedAttentionBackend)
    register(TorchPagedAttentionBackend)
