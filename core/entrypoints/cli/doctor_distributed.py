"""``host doctor``'s collective sanity check: two ranks on this machine all-reduce one tensor.

The check the troubleshooting guide starts with: if ``torch.distributed`` cannot all-reduce
between two local processes, nothing multi-process will work either, and the backend that
fails says where to look (gloo: the network interface / ``GLOO_SOCKET_IFNAME``; NCCL: the driver,
the GPUs, ``/dev/shm`` and the ``IPC_LOCK`` capability in containers).

Each rank is started like a worker (``spawn_process("worker", ...)``: it bootstraps the worker's
plugin groups and dies with its parent), joins a TCP rendezvous on ``127.0.0.1`` at a free port,
all-reduces ``rank + 1`` and reports the sum; with two ranks the sum must be 3. Runs in the CLI
process (process 0) and the two ranks it spawns.
"""

from __future__ import annotations

import multiprocessing
import queue
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

WORLD_SIZE = 2
EXPECTED_SUM = float(WORLD_SIZE * (WORLD_SIZE + 1) // 2)  # ranks contribute 1 and 2


@dataclass
class AllReduceResult:
    """What the two ranks reported: ``ok`` only when both returned :data:`EXPECTED_SUM`."""

    backend: str
    ok: bool
    detail: str
    port: int
    seconds: float
    ranks: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "ok": self.ok,
            "world_size": WORLD_SIZE,
            "expected_sum": EXPECTED_SUM,
            "port": self.port,
            "seconds": round(self.seconds, 3),
            "ranks": self.ranks,
        }


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _rank_main(backend: str, rank: int, port: int, timeout_s: float, results: Any) -> None:
    """One rank: join the group, all-reduce ``rank + 1``, put ``{rank, sum | error}`` on ``results``."""
    try:
        import torch
        import torch.distributed as dist

        device = torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            value = torch.tensor([float(rank + 1)], device=device)
            dist.all_reduce(value)
            results.put({"rank": rank, "sum": float(value.item())})
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which shows it with the fix
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})


def all_reduce_check(backend: str, timeout_s: float = 60.0) -> AllReduceResult:
    """Run the two-rank all-reduce with ``backend`` (``"gloo"`` or ``"nccl"``); never raises.
    Ranks still running after ``timeout_s`` seconds are killed and the check fails."""
    from host.core.plugins.processes import spawn_process

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    start = time.monotonic()
    procs = [
        spawn_process("worker", _rank_main, backend, rank, port, timeout_s, results, name=f"host-doctor-{backend}-{rank}")
        for rank in range(WORLD_SIZE)
    ]
    ranks: list[dict[str, Any]] = []
    deadline = start + timeout_s
    while len(ranks) < WORLD_SIZE:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            ranks.append(results.get(timeout=min(left, 1.0)))
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break  # every rank exited without reporting (killed, crashed in start-up)
    for p in procs:
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    seconds = time.monotonic() - start
    ranks.sort(key=lambda r: r["rank"])
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if "error" in r]
    sums = [r["sum"] for r in ranks if "sum" in r]
    if errors:
        return AllReduceResult(backend, False, "; ".join(errors), port, seconds, ranks)
    if len(sums) < WORLD_SIZE:
        missing = sorted(set(range(WORLD_SIZE)) - {r["rank"] for r in ranks})
        codes = ", ".join(f"rank {i} exit code {procs[i].exitcode}" for i in missing)
        return AllReduceResult(
            backend, False, f"no answer from rank(s) {missing} within {timeout_s:g} s ({codes})", port, seconds, ranks
        )
    if any(s != EXPECTED_SUM for s in sums):
        return AllReduceResult(backend, False, f"wrong sums {sums}, expected {EXPECTED_SUM:g}", port, seconds, ranks)
    return AllReduceResult(
        backend, True, f"{WORLD_SIZE} ranks all-reduced to {EXPECTED_SUM:g} in {seconds:.1f} s (tcp://127.0.0.1:{port})",
        port, seconds, ranks,
    )
