"""The mixture-of-experts pieces a kernel or quantization plugin builds on: the fused experts op
and its contract (:mod:`host.core.moe.fused_experts`: ``host_moe::fused_experts``, kernel table op
``fused_moe``, the torch reference :func:`fused_experts_sorted`, the activations it computes, the
token-choices grouped by expert) and the router (:func:`select_experts`).

Stable re-exports of :mod:`host.core.moe`; plugins import them from here, never from the core. Not
imported by ``host.sdk`` itself (this module imports the core).
"""

from host.core.moe.fused_experts import (
    ACTIVATIONS,
    OP,
    apply_activation,
    check_activation,
    expert_groups,
    fused_experts,
    fused_experts_sorted,
    run_sorted_experts,
)
from host.core.moe.router import select_experts

__all__ = [
    "ACTIVATIONS",
    "OP",
    "apply_activation",
    "check_activation",
    "expert_groups",
    "fused_experts",
    "fused_experts_sorted",
    "run_sorted_experts",
    "select_experts",
]
