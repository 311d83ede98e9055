"""The main of one worker process: build the platform's worker, then serve the engine's calls.

Whatever starts the process (the ``mp`` executor's spawned processes, a Ray actor) hands it two
pickled handles (:mod:`host.core.distributed.message_queue`): the engine's step broadcast, which
every worker reads, and the response queue back to the engine. The loop is the same everywhere:

1. build ``platform.worker_cls(config, rank, local_rank, platform)`` (as the uniproc executor
   does), ``init_device()`` (joins the ``torch.distributed`` world when the engine has more than
   one rank) and ``load_model()``; report ``ready`` (with a short description) or the start-up
   error on the response queue;
2. read ``(method, args, kwargs, reply_ranks)`` messages; run ``getattr(worker, method)`` (or one
   of the loop-level calls: ``plugin_records``, ``broadcast_stats``,
   ``ping``); when this rank is in ``reply_ranks`` send the result, or the exception's text —
   an exception fails that call, not the worker;
3. stop on :data:`SHUTDOWN` (or when the engine process goes away: the process that spawned this
   one arranges that, see :mod:`host.core.plugins.processes`).

Nothing here knows how the process was started, so the Ray executor runs the same code in its
actors (:class:`WorkerProc` for the two phases apart, :func:`run_worker` for both).
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Any, Callable

logger = logging.getLogger("host.worker")

SHUTDOWN = "__shutdown__"  # the method name that ends the loop
READY = -1  # the sequence number of the start-up report on the response queue


def plugin_records(rank: int) -> list[dict[str, Any]]:
    """This worker process's plugin records (``host plugins list`` rows), stamped with the process."""
    from host.core.plugins.manager import get_plugin_host

    return [
        dict(r.to_dict(), process="worker", rank=rank, process_pid=os.getpid())
        for r in get_plugin_host().list_records()
    ]


class WorkerProc:
    """One worker rank: the platform's worker plus the loop serving the engine's broadcast."""

    def __init__(self, config: Any, rank: int, local_rank: int, broadcast_handle: Any, response_handle: Any) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.worker: Any = None
        self.responses = response_handle.attach()
        try:
            self.broadcast = broadcast_handle.attach(rank)
            from host.core.plugins.platform import current_platform
            from host.core.utils import freeze_startup_objects, resolve_qualname

            platform = current_platform()
            worker_cls = resolve_qualname(platform.worker_cls)
            self.worker = worker_cls(config, rank=rank, local_rank=local_rank, platform=platform)
            self.worker.init_device()
            self.worker.load_model()
            freeze_startup_objects()
        except BaseException as exc:  # noqa: BLE001 - the engine gets the reason, then we exit
            self.responses.send(READY, rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            self.close()
            raise
        self.loop_calls: dict[str, Callable[..., Any]] = {
            "plugin_records": lambda: plugin_records(self.rank),
            "broadcast_stats": lambda: dict(self.broadcast.stats),
            "ping": lambda: os.getpid(),
        }
        self.responses.send(READY, rank, True, {"pid": os.getpid(), **self.worker.describe_worker()})

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        """Run one call: a loop-level call by that name, else the worker's method. A step
        handle (``non_blocking``) is waited on here: the engine gets outputs, not handles."""
        fn = self.loop_calls.get(method) or getattr(self.worker, method)
        result = fn(*args, **kwargs)
        if method == "execute_model" and result is not None and hasattr(result, "get_output"):
            result = result.get_output()
        return result

    def serve(self) -> None:
        """Read and answer broadcast messages until :data:`SHUTDOWN`."""
        while True:
            seq, (method, args, kwargs, reply_ranks) = self.broadcast.read()
            if method == SHUTDOWN:
                return
            reply = reply_ranks is None or self.rank in reply_ranks
            try:
                result = self.call(method, args, kwargs or {})
            except Exception as exc:  # noqa: BLE001 - the engine raises it from collective_rpc
                logger.exception("worker rank %d: %s failed", self.rank, method)
                if reply:
                    self.responses.send(seq, self.rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                continue
            if reply:
                self.responses.send(seq, self.rank, True, result)

    def close(self) -> None:
        if self.worker is not None:
            try:
                self.worker.shutdown()
            except Exception:  # noqa: BLE001 - shutting down anyway
                logger.exception("worker rank %d: shutdown failed", self.rank)
            self.worker = None
        for queue in (getattr(self, "broadcast", None), self.responses):
            if queue is not None:
                queue.close()


def run_worker(config: Any, rank: int, local_rank: int, broadcast_handle: Any, response_handle: Any) -> None:
    """The whole life of one worker rank: start, serve, close."""
    proc = WorkerProc(config, rank, local_rank, broadcast_handle, response_handle)
    try:
        proc.serve()
    finally:
        proc.close()
