"""The mp executor (entry point ``host.executors: mp``): one worker process per rank on this
machine, the default when an engine has more than one rank (``-tp`` x ``-pp`` > 1).

Start-up: the engine's ``torch.distributed`` address (``tcp://127.0.0.1:PORT``, a free port
unless ``parallel.distributed_init_method`` is set), a shared-memory broadcast queue and a reply
queue; then ``world_size`` workers spawned with :func:`~host.sdk.distributed.spawn_process` (each
bootstraps exactly the ``worker`` plugin groups and dies with this process), each running
:func:`~host.sdk.distributed.run_worker`. It waits until every rank reports ready, or names the
rank that failed and why.

Calls: :meth:`collective_rpc` writes ``(method, args, kwargs, reply_ranks)`` once into the
broadcast queue, every worker runs it, the reply ranks answer. ``execute_model`` is answered only
by the output rank (tensor rank 0 of the last pipeline stage, ``world_size - tp_size``);
``non_blocking=True`` returns a handle at once, so up to :attr:`max_concurrent_batches`
(= ``pipeline_parallel_size``) steps can be in flight, their outputs taken in order.

Death: a monitor thread waits on the workers' process sentinels. When one dies (outside
shutdown) the executor is marked failed within a moment: a waiting or later call raises
``RuntimeError("worker rank R (pid P) died with exit code C; ...")``, the other workers are
stopped, and :meth:`check_health` raises, which the engine-core process turns into an error for
every request and its own exit (``/health`` then answers 503).

Shutdown: a shutdown message (workers leave their loop and tear down their process groups), up to
``STOP_GRACE_S`` for them to exit, then SIGTERM, then SIGKILL for whatever is still alive; the
queues close last (the broadcast's shared memory unlinked). The same stop runs when the executor
is collected without :meth:`shutdown` (the engine was deleted): see
:mod:`host.plugins.executors.common`.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable

from host.plugins.executors.common import BroadcastExecutor
from host.sdk import hookimpl
from host.sdk.distributed import READY, run_worker, spawn_process

logger = logging.getLogger("host.executors.mp")

STOP_GRACE_S = 5.0  # after the shutdown message, before SIGTERM


def _worker_main(*args: Any) -> None:
    """A worker process: Ctrl-C in the terminal reaches the whole process group, but the engine
    decides when its workers stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run_worker(*args)
    # the worker is closed (process groups destroyed, queues closed): skip the interpreter's
    # teardown, which can sit for seconds in the native libraries' exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class MultiprocExecutor(BroadcastExecutor):
    """One spawned worker process per rank, driven over a shared-memory broadcast (the engine
    side of the protocol is :class:`~host.plugins.executors.common.BroadcastExecutor`)."""

    name = "mp"

    def _releaser(self) -> Callable[[], None]:
        self.workers: list[multiprocessing.Process] = []  # filled by _start_workers
        return functools.partial(_stop_processes, self.workers)

    def _start_workers(self, broadcast: Any, responses: Any) -> None:
        for rank in range(self.world_size):
            self.workers.append(spawn_process(
                "worker", _worker_main, self.config, rank, rank, broadcast, responses, name=f"host-worker-{rank}",
            ))
        self._stop_monitor_r, self._stop_monitor_w = multiprocessing.Pipe(duplex=False)
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self.workers)}
        self._monitor = threading.Thread(
            target=_watch_workers, args=(weakref.ref(self), sentinels, self._stop_monitor_r), name="host-mp-monitor", daemon=True,
        )
        self._monitor.start()
        logger.info(
            "mp executor: %d worker processes (pids %s), output rank %d, %s", self.world_size,
            ", ".join(str(p.pid) for p in self.workers), self.output_rank, self.config.parallel.distributed_init_method,
        )

    def _worker_exited(self, rank: int) -> None:
        """From the death monitor: worker ``rank`` exited outside shutdown."""
        proc = self.workers[rank]
        proc.join(1)
        error = self._start_up_error(rank) if not self.worker_info else None
        if error is not None:
            self.fail(f"worker rank {rank} failed to start: {error}")
        else:
            self.fail(
                f"worker rank {rank} (pid {proc.pid}) died with exit code {proc.exitcode}; the engine's other "
                f"workers are stopped and its requests fail (see the worker's log above; restart the engine)"
            )
        self._terminate(grace=0.0)

    def _start_up_error(self, rank: int, wait: float = 1.0) -> str | None:
        """The error a worker reported before it exited during start-up, if it sent one (it may
        arrive just after the exit is seen)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            reported = self._replies.get(READY, {}).get(rank)
            if reported is not None:
                return None if reported[0] else str(reported[1])
            if self._recv_lock.acquire(timeout=0.05):
                try:
                    reply = self.responses.recv(0.05)
                    if reply is not None:
                        self._replies.setdefault(reply[0], {})[reply[1]] = (reply[2], reply[3])
                finally:
                    self._recv_lock.release()
        return None

    def _terminate(self, grace: float) -> None:
        """Wait ``grace`` seconds for the workers to exit, then SIGTERM, then SIGKILL."""
        _terminate(self.workers, grace)

    def _stop_workers(self) -> None:
        monitor = getattr(self, "_monitor", None)
        if monitor is not None and monitor.is_alive():
            self._stop_monitor_w.send(b"")
            if monitor is not threading.current_thread():
                monitor.join(5)
        graceful = self.failure is None and bool(self.worker_info)  # they got the shutdown message
        if graceful:
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in self.workers:
                proc.join(max(0.0, deadline - time.monotonic()))
        for conn in (getattr(self, "_stop_monitor_r", None), getattr(self, "_stop_monitor_w", None)):
            if conn is not None:
                conn.close()


def _watch_workers(executor_ref: "weakref.ref[MultiprocExecutor]", sentinels: dict[int, int], stop: Any) -> None:
    """The death monitor: the first worker to exit outside shutdown fails the executor (a worker
    that exits during start-up fails the start the same way). It holds the executor weakly, so an
    executor nobody else holds is collected (and its finalizer stops the workers, which ends this)."""
    try:
        ready = multiprocessing.connection.wait([*sentinels, stop])
    except OSError:  # the stop pipe was closed under us: the executor is shutting down
        return
    executor = executor_ref()
    if executor is None or stop in ready or executor._closed:
        return
    executor._worker_exited(next(sentinels[s] for s in ready if s in sentinels))


def _terminate(workers: list[multiprocessing.Process], grace: float) -> None:
    """Wait ``grace`` seconds for ``workers`` to exit, then SIGTERM, then SIGKILL (bounded: a few
    seconds at most past ``grace``)."""
    deadline = time.monotonic() + grace
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 2.0
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in workers:
        if proc.is_alive():
            proc.kill()
            proc.join(2.0)


def _stop_processes(workers: list[multiprocessing.Process]) -> None:
    """The mp executor's release: every worker process still alive is stopped now, and its death
    pipe closed (a worker also exits by itself when that pipe closes). Idempotent."""
    _terminate(workers, grace=0.0)
    for proc in workers:
        pipe = getattr(proc, "_host_death_pipe", None)
        if pipe is not None and not pipe.closed:
            pipe.close()


@hookimpl
def host_register_executors(register: Callable[..., None]) -> None:
    register(MultiprocExecutor)
