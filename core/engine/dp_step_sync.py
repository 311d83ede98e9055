"""Data-parallel engines that step together (engine-core process): ``-dp N
--enable-expert-parallel`` spreads one model's experts over every engine's workers, so each MoE
layer's collectives need every engine's ranks — and an engine with nothing to run must still
run a forward (a one-token dummy batch) whenever another engine runs one.

:class:`DataParallelStepSync` is the engines' agreement: a gloo process group of the N engine-core
processes (its own TCP store at ``parallel.data_parallel_sync_addr``, chosen by the front end;
the workers' world is separate). The engine loop calls :meth:`turn` once per turn (does any
engine have requests? is any stopping?), and a step calls :meth:`any_forward` once (does any
engine run a forward now?). Every engine makes the same calls in the same order, so none waits forever; an idle loop
turns every :data:`IDLE_POLL_S` to hear whether another engine got work.
"""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

IDLE_POLL_S = 0.005  # how often idle engines agree that they still are
TIMEOUT = datetime.timedelta(minutes=10)


class DataParallelStepSync:
    def __init__(self, parallel: Any) -> None:
        addr = urlparse(parallel.data_parallel_sync_addr or "")
        if not addr.hostname or not addr.port:
            raise ValueError("parallel.data_parallel_sync_addr must be tcp://HOST:PORT (the front end chooses it for -dp N)")
        self.rank, self.size = parallel.data_parallel_rank, parallel.data_parallel_size
        self.store = dist.TCPStore(addr.hostname, addr.port, self.size, is_master=self.rank == 0, timeout=TIMEOUT)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("host_dp_steps", self.store), self.rank, self.size, TIMEOUT)

    def _sum(self, *flags: bool) -> list[int]:
        box = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        self.group.allreduce([box]).wait()
        return box.tolist()

    def turn(self, busy: bool, stopping: bool) -> tuple[bool, bool]:
        """One loop turn of every engine: ``(any engine busy, any engine stopping)``. When one
        stops, all stop in the same turn (none is left waiting on a peer that left)."""
        any_busy, any_stopping = self._sum(busy, stopping)
        return any_busy > 0, any_stopping > 0

    def any_forward(self, forward: bool) -> bool:
        """Whether any engine runs a forward this step (an engine that does not runs a dummy one)."""
        return self._sum(forward)[0] > 0
