"""Moving expert weights to their new physical slots (worker; seed §8.3 "rearrange").

Every rank computes the same transfer plan from the old and new ``physical_to_logical`` maps:
each slot whose expert changes copies it from a slot that held that expert before — one on its
own rank when there is one (a local copy), else the lowest such slot (a point-to-point receive
over the EPLB process group, matched by a tag per layer, slot and tensor). Every transfer reads
the OLD weights, so nothing is overwritten before it is sent: :func:`gather_new_weights` returns
the new slots' tensors and :func:`commit` writes them and the maps. The async mode runs the
gather on a background thread and commits at a later step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from host.core.moe.layer import FusedMoE, maps_from_physical

Transfers = list[tuple[int, int]]  # (destination physical slot, source physical slot)


def transfer_plan(old: list[int], new: list[int], num_ranks: int) -> Transfers:
    """The copies one layer needs: for every slot whose logical expert changes, a source slot
    that served that expert under ``old`` (same rank preferred, else the lowest)."""
    per_rank = len(old) // num_ranks
    holders: dict[int, list[int]] = {}
    for slot, logical in enumerate(old):
        holders.setdefault(logical, []).append(slot)
    plan = []
    for slot, (was, now) in enumerate(zip(old, new)):
        if was == now or now < 0:
            continue
        sources = holders.get(now)
        if not sources:
            raise ValueError(f"logical expert {now} is in the new map but no slot holds it now; the policy lost an expert")
        same_rank = [s for s in sources if s // per_rank == slot // per_rank]
        plan.append((slot, (same_rank or sources)[0]))
    return plan


def gather_new_weights(
    layers: list[FusedMoE], new_maps: torch.Tensor, group: Any
) -> dict[tuple[int, int], list[torch.Tensor]]:
    """``{(layer index, local slot): [tensor per slot parameter]}`` for this rank's slots whose
    expert changes under ``new_maps [L, P]``, read from the old weights (sent and received over
    ``group``, a :class:`GroupCoordinator`; one rank: local copies only)."""
    out: dict[tuple[int, int], list[torch.Tensor]] = {}
    ops = []
    rank, num_ranks = group.rank_in_group, group.world_size
    for li, layer in enumerate(layers):
        tensors = layer.slot_tensors()
        per_rank = layer.num_local
        plan = transfer_plan(layer.physical_to_logical.tolist(), new_maps[li].tolist(), num_ranks)
        for dst, src in plan:
            dst_rank, src_rank = dst // per_rank, src // per_rank
            if dst_rank == rank:
                if src_rank == rank:
                    out[(li, dst - layer.local_start)] = [t[src - layer.local_start].clone() for t in tensors]
                else:
                    bufs = [torch.empty_like(t[0]) for t in tensors]
                    out[(li, dst - layer.local_start)] = bufs
                    for k, buf in enumerate(bufs):
                        ops.append(dist.P2POp(dist.irecv, buf, group.ranks[src_rank], group.device_group,
                                              _tag(li, dst, k, layer.num_physical)))
            elif src_rank == rank:
                for k, t in enumerate(tensors):
                    ops.append(dist.P2POp(dist.isend, t[src - layer.local_start].contiguous(), group.ranks[dst_rank],
                                          group.device_group, _tag(li, dst, k, layer.num_physical)))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return out


def _tag(layer: int, dst: int, k: int, num_physical: int) -> int:
    return ((layer * num_physical) + dst) * 8 + k


def commit(layers: list[FusedMoE], new_maps: torch.Tensor, weights: dict[tuple[int, int], list[torch.Tensor]]) -> None:
    """Write the gathered slots and make ``new_maps`` the maps in force (all three)."""
    for (li, slot), values in weights.items():
        for target, value in zip(layers[li].slot_tensors(), values):
            target[slot].copy_(value)
    for li, layer in enumerate(layers):
        layer.physical_to_logical.copy_(new_maps[li])
        l2p, counts = maps_from_physical(new_maps[li], layer.num_logical, layer.logical_to_physical.shape[-1])
        layer.logical_to_physical.copy_(l2p)
        layer.replica_count.copy_(counts)
