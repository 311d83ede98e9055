"""The engine side of an executor whose workers run host's worker loop (``host.sdk.distributed``).

:class:`BroadcastExecutor` owns the step broadcast (one shared-memory :class:`MessageQueue` every
worker reads) and the response queue (every worker pushes its replies to it), and builds the
executor's calls on them:

- ``collective_rpc(method, args, kwargs, unique_reply_rank=None, timeout=None, non_blocking=False)`` broadcasts
  ``(method, args, kwargs, reply_ranks)`` once and waits for the replies of ``reply_ranks`` (every
  rank, or only ``unique_reply_rank``); a worker's exception is raised here as a ``RuntimeError``
  naming the rank and the method;
- ``execute_model`` is answered by the output rank only (the first tensor-parallel rank of the last
  pipeline stage); with ``non_blocking`` it returns a handle whose ``get_output()`` waits for that
  reply, so several steps may be in flight; replies are matched to their step by sequence number;
- :meth:`fail` (from a subclass's death monitor, any thread) marks the executor failed: every
  waiting and later call, and :meth:`check_health`, raise ``RuntimeError(reason)`` at once instead
  of hanging, and ``failure_callback(reason)`` runs if the engine set one.

A subclass starts the workers in :meth:`_start_workers` (given the two handles to pass them),
waits for them to leave after the shutdown message in :meth:`_stop_workers`, and names in
:meth:`_releaser` how to force whatever is left to go; the Ray executor is one, and so is the
``mp`` executor.

Giving back: :meth:`shutdown` sends the shutdown message, waits a little for the workers to leave,
then releases everything at once: the workers still there are stopped (processes killed, Ray
actors killed and their placement group removed), and the broadcast's shared memory is unlinked
and both queues closed. The same release is a ``weakref.finalize`` of the executor, so an executor
dropped without :meth:`shutdown` (its engine deleted and collected) gives everything back too; no
thread of the executor holds it strongly (its monitors keep a weak reference), so dropping it is
enough. Both are idempotent and never wait on a worker that died.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from typing import Any, Callable

from host.sdk import Executor
from host.sdk.distributed import READY, SHUTDOWN, BroadcastHandle, MessageQueue, ResponseHandle, ResponseQueue

logger = logging.getLogger("host.executor")

DEFAULT_READY_TIMEOUT_S = 600.0  # loading a large model on every rank takes a while
_POLL_S = 0.05


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for ``distributed_init_method``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class StepHandle:
    """A call in flight: :meth:`results` waits for its reply ranks' results (once), in rank
    order; :meth:`get_output` is the first of them (a step's output, from the output rank)."""

    def __init__(self, executor: "BroadcastExecutor", seq: int, ranks: list[int], method: str, timeout: float | None) -> None:
        self._executor, self._seq, self._ranks, self._method, self._timeout = executor, seq, ranks, method, timeout
        self._results: list[Any] | None = None

    def results(self) -> list[Any]:
        if self._results is None:
            replies = self._executor._gather(self._seq, self._ranks, self._method, self._timeout)
            self._results = [replies[r] for r in self._ranks]
        return self._results

    def get_output(self) -> Any:
        return self.results()[0]


class GatheredStepHandle(StepHandle):
    """A step every rank answers (a KV connector is on: each rank reports the transfers of its
    own shard): the output rank's output, carrying every rank's connector report as a list."""

    def __init__(self, executor: "BroadcastExecutor", seq: int, method: str, timeout: float | None) -> None:
        super().__init__(executor, seq, list(range(executor.world_size)), method, timeout)

    def get_output(self) -> Any:
        results = self.results()
        output = results[self._executor.output_rank]
        output.kv_connector_output = [r.kv_connector_output for r in results]
        return output


class BroadcastExecutor(Executor):
    """Workers that read one shared-memory step broadcast and reply on one response queue."""

    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    def _init_executor(self) -> None:
        parallel = self.config.parallel
        self.world_size = parallel.world_size
        self.output_rank = self.world_size - parallel.tensor_parallel_size
        self.max_concurrent_batches = parallel.pipeline_parallel_size  # steps in flight (pipeline)
        self.failure: str | None = None
        self.failure_callback: Callable[[str], None] | None = None
        self.worker_info: dict[int, Any] = {}
        self._replies: dict[int, dict[int, tuple[bool, Any]]] = {}
        self._recv_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closed = False
        if not parallel.distributed_init_method:
            parallel.distributed_init_method = f"tcp://127.0.0.1:{free_port()}"
        self.broadcast = MessageQueue(self.world_size, reader_names=[f"worker rank {r}" for r in range(self.world_size)])
        self.responses = ResponseQueue()
        # the release references no executor: it runs when the executor is collected, or from shutdown
        self._release = weakref.finalize(self, _release, self._releaser(), self.broadcast, self.responses)
        try:
            self._start_workers(self.broadcast.handle(), self.responses.handle())
            self.worker_info = self._gather(READY, list(range(self.world_size)), "start-up", self.ready_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    # -- for subclasses ----------------------------------------------------------------------------

    def _start_workers(self, broadcast: BroadcastHandle, responses: ResponseHandle) -> None:
        """Start ``world_size`` workers, each running ``run_worker(config, rank, local_rank,
        broadcast, responses)``; return without waiting for them to be ready."""
        raise NotImplementedError

    def _releaser(self) -> Callable[[], None]:
        """A callable that stops every worker still running, at once (no message, no grace) and
        frees what they hold outside this process. It must not reference the executor (it runs
        from the executor's finalizer), and must see the workers that :meth:`_start_workers`
        starts later (hold them in a container made here). Safe to call twice."""
        raise NotImplementedError

    def _stop_workers(self) -> None:
        """After the shutdown message (when it went out): give the workers a moment to leave by
        themselves, and stop the subclass's monitor; whatever is left, :meth:`_releaser` stops."""

    def fail(self, reason: str) -> None:
        """Mark the executor failed (a worker died): every waiting and later call raises
        ``RuntimeError(reason)``. The first reason wins; safe from any thread."""
        first = self.failure is None
        if first:
            self.failure = reason
            logger.error("%s", reason)
        self.broadcast.abort(self.failure)
        if first and self.failure_callback is not None:
            self.failure_callback(reason)

    # -- calls -------------------------------------------------------------------------------------

    def _enqueue(self, method: str, args: tuple, kwargs: dict | None, reply_ranks: list[int] | None) -> int:
        if self.failure is not None:
            raise RuntimeError(self.failure)
        if self._closed:
            raise RuntimeError(f"the {self.name} executor is shut down; {method} cannot run")
        with self._send_lock:
            return self.broadcast.enqueue((method, tuple(args), kwargs or {}, reply_ranks), label=method)

    def _gather(self, seq: int, ranks: list[int], method: str, timeout: float | None) -> dict[int, Any]:
        """Wait for the replies of ``ranks`` to message ``seq``; raise the first failed one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = set(ranks)
        while True:
            got = self._replies.get(seq, {})
            if wanted <= got.keys():
                self._replies.pop(seq, None)
                for rank in sorted(wanted):
                    ok, value = got[rank]
                    if not ok:
                        what = "failed to start" if seq == READY else f"{method} failed"
                        raise RuntimeError(f"worker rank {rank} {what}: {value}")
                return {rank: got[rank][1] for rank in sorted(wanted)}
            if self.failure is not None:
                raise RuntimeError(self.failure)
            if deadline is not None and time.monotonic() > deadline:
                missing = sorted(wanted - got.keys())
                raise TimeoutError(f"worker rank(s) {missing} did not answer {method} within {timeout:.0f} s")
            if self._recv_lock.acquire(timeout=_POLL_S):
                try:
                    reply = self.responses.recv(_POLL_S)
                    while reply is not None:
                        r_seq, rank, ok, value = reply
                        self._replies.setdefault(r_seq, {})[rank] = (ok, value)
                        reply = self.responses.recv(0)
                finally:
                    self._recv_lock.release()

    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict | None = None,
        unique_reply_rank: int | None = None,
        timeout: float | None = None,
        non_blocking: bool = False,
    ) -> Any:
        """Run ``method`` on every worker; the replies in rank order (only ``unique_reply_rank``'s,
        as a one-item list, when given); with ``non_blocking`` a handle whose ``results()`` waits
        for them. ``timeout`` bounds the wait (``None``: a dead worker still ends it, through
        :meth:`fail`)."""
        ranks = list(range(self.world_size)) if unique_reply_rank is None else [unique_reply_rank]
        seq = self._enqueue(method, args, kwargs, ranks)
        handle = StepHandle(self, seq, ranks, method, timeout)
        return handle if non_blocking else handle.results()

    def execute_model(self, scheduler_output: Any, non_blocking: bool = False) -> Any:
        # the workers wait for their own step handles: the reply is the step's output
        if getattr(self.config, "kv_transfer", None) is not None:
            seq = self._enqueue("execute_model", (scheduler_output,), {"non_blocking": non_blocking}, None)
            gathered = GatheredStepHandle(self, seq, "execute_model", None)
            return gathered if non_blocking else gathered.get_output()
        handle = self.collective_rpc(
            "execute_model", (scheduler_output,), {"non_blocking": non_blocking},
            unique_reply_rank=self.output_rank, non_blocking=True,
        )
        return handle if non_blocking else handle.get_output()

    def check_health(self) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def shutdown(self) -> None:
        """Stop the workers and free everything the executor holds (see the module docstring);
        idempotent, and bounded when a worker is dead or stuck."""
        if self._closed:
            return
        self._closed = True
        if not self._release.alive:  # released already (the finalizer ran at interpreter exit)
            return
        if self.failure is None and self.worker_info:  # every worker is up and reading
            try:
                with self._send_lock:
                    self.broadcast.enqueue((SHUTDOWN, (), {}, []), label=SHUTDOWN, timeout=5.0)
            except Exception as exc:  # noqa: BLE001 - the workers are stopped below anyway
                logger.warning("%s executor: the shutdown message did not go out (%s); stopping the workers", self.name, exc)
        try:
            self._stop_workers()
        finally:
            self._release()


def _release(stop_workers: Callable[[], None], broadcast: MessageQueue, responses: ResponseQueue) -> None:
    """An executor's final release: its workers stopped, its queues closed (the broadcast's shared
    memory unlinked), even when stopping the workers fails."""
    try:
        stop_workers()
    except Exception:  # noqa: BLE001 - the queues are closed anyway; a finalizer must not raise
        logger.exception("stopping the workers failed")
    finally:
        broadcast.close()
        responses.close()
