"""Entry point ``host.attention_backends: cpu_paged``."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_attention_backends(register: Callable[..., None]) -> None:
    from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend

    register(CpuPagedAttentionBackend)
