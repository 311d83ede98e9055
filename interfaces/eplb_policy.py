"""The rebalancing policy of the expert-parallel load balancer: given each MoE layer's load per
logical expert, where each physical expert slot should go.

A policy is registered by name through ``host_register_eplb_policies`` (a ``host.models``
plugin; the built-in ``greedy`` lives in ``host.core.moe.eplb.greedy``) and chosen with
``--eplb-config '{"policy": NAME}'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class EplbPolicy:
    """``rebalance(load, num_physical, num_ranks, current) -> physical_to_logical``.

    ``load``: float ``[num_layers, num_logical]`` tokens per logical expert over the load window;
    ``num_physical``: physical slots per layer (logical + redundant), split evenly, in order, over
    ``num_ranks`` ranks (rank ``r`` holds slots ``[r * P / R, (r + 1) * P / R)``); ``current``: the
    map in force ``[num_layers, num_physical]``. Returns int64 ``[num_layers, num_physical]``:
    every logical expert served by at least one slot, every slot serving one logical expert. The
    same inputs must give the same map on every rank (no randomness)."""

    name: str = ""

    def rebalance(self, load: "torch.Tensor", num_physical: int, num_ranks: int, current: "torch.Tensor") -> "torch.Tensor":
        raise NotImplementedError
