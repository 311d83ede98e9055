"""The rank grid (seed §8.1): which global ranks form each tensor-, pipeline- and data-parallel
group. A pure function, so every rank computes the same groups without talking to the others.

Ranks are laid out as ``arange(world).reshape(DP, PP, TP)`` with the tensor-parallel index
varying fastest: with TP = 2 and PP = 4 the TP groups are ``[0, 1], [2, 3], ...`` and the PP
groups ``[0, 2, 4, 6], [1, 3, 5, 7]``. Expert-parallel groups (for MoE models, later) span
DP x TP at one pipeline stage.
"""

from __future__ import annotations

import torch

DIMENSIONS = ("tp", "pp", "dp")


def rank_grid(world_size: int, tp: int, pp: int = 1, dp: int = 1, *, moe: bool = False) -> dict[str, list[list[int]]]:
    """The groups of every parallel dimension: ``{"tp": [[0, 1], ...], "pp": [...], "dp": [...]}``
    (plus ``"ep"`` when ``moe``). Each dimension's groups partition ``range(world_size)``.

    Raises ``ValueError`` when ``world_size != dp * pp * tp``."""
    for name, size in (("tp", tp), ("pp", pp), ("dp", dp)):
        if size < 1:
            raise ValueError(f"{name} size {size} must be >= 1")
    if world_size != dp * pp * tp:
        raise ValueError(
            f"world_size={world_size} must equal data x pipeline x tensor parallel size = {dp} x {pp} x {tp} = {dp * pp * tp}"
        )
    grid = torch.arange(world_size).reshape(dp, pp, tp)
    groups = {
        "tp": grid.reshape(-1, tp),
        "pp": grid.transpose(1, 2).reshape(-1, pp),
        "dp": grid.permute(1, 2, 0).reshape(-1, dp),
    }
    if moe:
        groups["ep"] = grid.transpose(0, 1).reshape(pp, dp * tp)
    return {name: [row.tolist() for row in g] for name, g in groups.items()}


def group_of(groups: list[list[int]], rank: int) -> list[int]:
    """The one group of ``groups`` that holds ``rank``."""
    for ranks in groups:
        if rank in ranks:
            return ranks
    raise ValueError(f"rank {rank} is in none of the groups {groups}")
