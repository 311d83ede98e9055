"""The physical-expert maps of one MoE model and their invariants (seed §8.3).

``physical_to_logical [L, P]``: the logical expert each physical slot serves (``-1``: none);
``logical_to_physical [L, E, R]``: each logical expert's slots, ``-1`` past its replica count;
``replica_count [L, E]``. :func:`check_maps` states the invariants; :func:`logical_load` folds a
physical load into logical experts; :func:`balancedness` is mean over max of the per-rank load.
"""

from __future__ import annotations

import torch


def check_maps(physical_to_logical: torch.Tensor, logical_to_physical: torch.Tensor, replica_count: torch.Tensor) -> None:
    """Raise ``ValueError`` unless the three maps agree: every slot ``p`` serving ``l >= 0``
    appears in ``logical_to_physical[l, :replica_count[l]]``, entries past the count are ``-1``,
    and the replica counts sum to the number of serving slots (every logical expert served once
    or more)."""
    layers, num_physical = physical_to_logical.shape
    for layer in range(layers):
        p2l, l2p, count = physical_to_logical[layer], logical_to_physical[layer], replica_count[layer]
        if int(count.sum()) != int((p2l >= 0).sum()):
            raise ValueError(f"layer {layer}: replica counts sum to {int(count.sum())}, but {int((p2l >= 0).sum())} slots serve experts")
        if bool((count < 1).any()):
            raise ValueError(f"layer {layer}: logical experts {torch.nonzero(count < 1).flatten().tolist()} have no slot")
        for logical in range(l2p.shape[0]):
            c = int(count[logical])
            slots = l2p[logical, :c].tolist()
            if any(int(p2l[s]) != logical for s in slots) or bool((l2p[logical, c:] != -1).any()):
                raise ValueError(f"layer {layer}: logical expert {logical}'s slots {l2p[logical].tolist()} disagree with physical_to_logical")


def logical_load(physical_load: torch.Tensor, physical_to_logical: torch.Tensor, num_logical: int) -> torch.Tensor:
    """``[L, E]`` load per logical expert from ``physical_load [L, P]`` (slots mapped to ``-1`` are
    dropped through an extra bucket)."""
    index = torch.where(physical_to_logical >= 0, physical_to_logical, torch.full_like(physical_to_logical, num_logical))
    out = torch.zeros(physical_load.shape[0], num_logical + 1, dtype=torch.float64)
    out.scatter_add_(1, index, physical_load.to(torch.float64))
    return out[:, :num_logical]


def rank_loads(load: torch.Tensor, physical_to_logical: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """``[L, num_ranks]`` the load each rank carries when each logical expert's ``load [L, E]`` is
    spread evenly over its replicas in ``physical_to_logical [L, P]``."""
    layers, num_physical = physical_to_logical.shape
    counts = torch.zeros(layers, load.shape[1], dtype=torch.float64)
    counts.scatter_add_(1, physical_to_logical.clamp(min=0), (physical_to_logical >= 0).to(torch.float64))
    per_slot = load.to(torch.float64).gather(1, physical_to_logical.clamp(min=0)) / counts.gather(1, physical_to_logical.clamp(min=0)).clamp(min=1)
    per_slot = per_slot * (physical_to_logical >= 0)
    return per_slot.view(layers, num_ranks, num_physical // num_ranks).sum(-1)


def balancedness(load: torch.Tensor, physical_to_logical: torch.Tensor, num_ranks: int) -> float:
    """Mean over max of the per-rank load, averaged over layers (1.0: perfectly even; a layer
    with no load counts as 1.0)."""
    ranks = rank_loads(load, physical_to_logical, num_ranks)
    peak = ranks.max(dim=1).values
    ratio = torch.where(peak > 0, ranks.mean(dim=1) / peak.clamp(min=1e-12), torch.ones_like(peak))
    return float(ratio.mean())
