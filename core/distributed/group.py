"""One parallel dimension's group of ranks (seed §8.1): a CPU (gloo) process group for Python
objects and barriers, a device process group for tensors, and the collectives model code calls.

Every collective returns at once when the group has one rank, so a model calls
``get_tp_group().all_reduce(x)`` whether or not it is sharded. ``all_reduce`` first offers the
tensor to an optional fast path (``fast_all_reduce``, e.g. the same-host shared-memory
all-reduce of the CPU ranks); a fast path that returns ``None`` declines, and the device group
reduces instead (seed §8.2: "None means fall back").
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.distributed as dist

logger = logging.getLogger("host.distributed")

FastAllReduce = Callable[[torch.Tensor], "torch.Tensor | None"]


class GroupCoordinator:
    """The group holding this rank in one dimension (``name``: "tp", "pp", ...).

    Built by every rank with the same ``group_ranks`` (all groups of the dimension, from
    :func:`host.core.distributed.topology.rank_grid`): ``torch.distributed.new_group`` must be
    called for every group by every rank in the same order, or it hangs.
    """

    def __init__(
        self,
        group_ranks: list[list[int]],
        rank: int,
        local_rank: int,
        device_backend: str | None,
        name: str,
        device: torch.device | None = None,
    ) -> None:
        self.name = name
        self.rank = rank
        self.local_rank = local_rank
        self.device = device or torch.device("cpu")
        self.cpu_group: Any = None
        self.device_group: Any = None
        self.fast_all_reduce: FastAllReduce | None = None
        self._fast_close: Callable[[], None] | None = None
        self.ranks: list[int] = [rank]
        for ranks in group_ranks:
            if device_backend is not None:
                device_group = dist.new_group(ranks, backend=device_backend)
                cpu_group = dist.new_group(ranks, backend="gloo")
            else:
                device_group = cpu_group = None
            if rank in ranks:
                self.ranks = list(ranks)
                self.device_group, self.cpu_group = device_group, cpu_group
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(rank)

    @classmethod
    def single(cls, name: str, rank: int = 0) -> "GroupCoordinator":
        """A one-rank group with no process groups: what model code sees without distribution."""
        return cls([[rank]], rank, 0, None, name)

    # -- position ------------------------------------------------------------------------------
    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    @property
    def next_rank(self) -> int:
        """The group ordinal after this one (wrapping), e.g. the next pipeline stage."""
        return (self.rank_in_group + 1) % self.world_size

    @property
    def prev_rank(self) -> int:
        return (self.rank_in_group - 1) % self.world_size

    # -- tensor collectives (device group) -----------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the group's ranks (in place for the device-group path; use the result)."""
        if self.world_size == 1:
            return tensor
        if self.fast_all_reduce is not None:
            out = self.fast_all_reduce(tensor)
            if out is not None:
                return out
        dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim`` in group order."""
        if self.world_size == 1:
            return tensor
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor, group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``tensor`` of group ordinal ``src``, written into every rank's ``tensor``."""
        if self.world_size == 1:
            return tensor
        dist.broadcast(tensor, src=self.ranks[src], group=self.device_group)
        return tensor

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        """Send to group ordinal ``dst`` (default: the next rank)."""
        if self.world_size == 1:
            return
        dst = self.next_rank if dst is None else dst
        dist.send(tensor.contiguous(), dst=self.ranks[dst], group=self.device_group)

    def recv(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        """Receive a tensor of ``shape`` / ``dtype`` from group ordinal ``src`` (default: the previous rank)."""
        src = self.prev_rank if src is None else src
        out = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        if self.world_size == 1:
            return out
        dist.recv(out, src=self.ranks[src], group=self.device_group)
        return out

    # -- object collectives (CPU group) --------------------------------------------------------
    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` of group ordinal ``src``, on every rank (pickled over the gloo group)."""
        if self.world_size == 1:
            return obj
        box = [obj if self.rank_in_group == src else None]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def send_object(self, obj: Any, dst: int | None = None) -> None:
        if self.world_size == 1:
            return
        dst = self.next_rank if dst is None else dst
        dist.send_object_list([obj], dst=self.ranks[dst], group=self.cpu_group)

    def recv_object(self, src: int | None = None) -> Any:
        if self.world_size == 1:
            return None
        src = self.prev_rank if src is None else src
        box = [None]
        dist.recv_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def barrier(self) -> None:
        """Wait for every rank of the group; always on the CPU group (a device barrier can
        allocate on, and switch, the current device)."""
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)

    # -- life cycle ----------------------------------------------------------------------------
    def set_fast_all_reduce(self, fast: FastAllReduce | None, close: Callable[[], None] | None = None) -> None:
        """Install (or with ``None`` remove) the fast all-reduce path and how to release it."""
        self.fast_all_reduce, self._fast_close = fast, close

    def destroy(self) -> None:
        """Release in the seed's order: the fast communicator, the device group, the CPU group."""
        if self._fast_close is not None:
            self._fast_close()
        self.fast_all_reduce = self._fast_close = None
        if self.device_group is not None and self.device_group is not self.cpu_group:
            dist.destroy_process_group(self.device_group)
        self.device_group = None
        if self.cpu_group is not None:
            dist.destroy_process_group(self.cpu_group)
        self.cpu_group = None

    def __repr__(self) -> str:
        return f"GroupCoordinator({self.name}, ranks={self.ranks}, rank_in_group={self.rank_in_group})"
