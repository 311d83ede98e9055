"""The core's own kernel references, offered to the kernel table (:mod:`host.interfaces.kernels`)
by the code that calls the ``host_offer_kernels`` hook (:meth:`PluginHost.offer_kernels
<host.core.plugins.manager.PluginHost.offer_kernels>`), right before it: the table has them
with no plugin loaded, and nothing registers at import time."""

from __future__ import annotations

from typing import Callable

CORE_SOURCE = "host.core"  # the source the table shows for these entries


def offer_core_kernels(register: Callable[..., None]) -> None:
    """Register the core's references for every device: the batched LoRA product's torch path and
    the fused MoE experts' sorted reference."""
    from host.core.lora.punica import offer_kernels as offer_lora_kernels
    from host.core.moe.fused_experts import offer_kernels as offer_moe_kernels

    offer_lora_kernels(register)
    offer_moe_kernels(register)
