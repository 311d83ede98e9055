"""The engine-core client: the one seam between a front end and an engine core.

A front end (the offline :class:`~host.core.frontend.llm.LLM`, or the API server's
:class:`~host.core.frontend.async_llm.AsyncLLM`) talks to its engine core only through one of
these, in messages of :mod:`host.contracts.messages`:

- :class:`InprocClient` drives an :class:`~host.core.engine.core.EngineCore` in this process:
  ``get_output()`` is one engine step.
- :class:`SyncMPClient` runs the engine core in its own process (the loop of
  :mod:`host.core.engine.process`) and talks ZMQ to it, blocking.
- :class:`AsyncMPClient` is the same for asyncio (the API server).

Each has ``add_request``, ``abort_requests``, ``get_output`` and ``utility`` (``_async`` for the
asyncio one). A client whose engine process died raises :class:`EngineDeadError` from every
call instead of hanging.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import shutil
import tempfile
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from host.contracts.messages import (
    AbortRequests,
    EngineCoreOutputs,
    EngineCoreRequest,
    Shutdown,
    UtilityCall,
    UtilityResult,
    encoder,
    from_engine_decoder,
)

if TYPE_CHECKING:
    from host.core.plugins.processes import EarlyProcess

logger = logging.getLogger("host.engine_client")

# what the engine process imports before it can build an engine (about 5 s on a small CPU):
# an engine started with prestart_engine imports them while the front end makes the configuration
ENGINE_PRELOAD = ("torch", "transformers", "host.core.engine.core", "host.core.worker.worker")


def prestart_engine() -> "EarlyProcess":
    """Spawn the engine-core process now, before its configuration exists: it bootstraps the
    ``engine`` plugin groups and imports :data:`ENGINE_PRELOAD` while this process resolves the
    configuration, then waits. Hand it to :class:`SyncMPClient` / :meth:`AsyncMPClient.start`
    (``early=``) to run the engine in it, or call its ``cancel()``. Call it after this process
    bootstrapped its plugin host and set the environment the engine should inherit."""
    from host.core.engine.process import run_engine_core
    from host.core.plugins.processes import spawn_early

    return spawn_early("engine", run_engine_core, ENGINE_PRELOAD, name="host-engine-core")


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; no request can be served."""


class EngineStartupError(RuntimeError):
    """The engine-core process failed to start (the message carries its error)."""


class InprocClient:
    """The engine core in this process: every call is a direct method call."""

    def __init__(self, config: Any) -> None:
        from host.core.engine.core import EngineCore

        self.engine = EngineCore(config)
        self.engine_info = self.engine.utility_describe()
        self._closed = False

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        """One engine step (an empty one when nothing is left to run)."""
        if not (self.engine.has_unfinished_requests() or self.engine.scheduler.has_finished_requests()):
            return EngineCoreOutputs(scheduler_stats=self.engine.scheduler.make_stats())
        return self.engine.step()

    def utility(self, method: str, *args: Any) -> Any:
        return getattr(self.engine, f"utility_{method}")(*args)

    def shutdown(self) -> None:
        """Shut the engine core down (its executor frees its workers); idempotent."""
        if self._closed:
            return
        self._closed = True
        self.engine.shutdown()


class _EngineProcess:
    """A spawned engine-core process and the IPC addresses of its three sockets (in a
    ``host-ipc-*`` temporary directory that no start, failed or not, leaves behind).

    The client binds ``input`` and ``output`` before :meth:`wait_ready`; the engine connects to
    them and reports on ``ready`` once its model and KV cache are up (or why it failed)."""

    def __init__(self, config: Any, early: "EarlyProcess | None" = None) -> None:
        from host.core.engine.process import run_engine_core
        from host.core.plugins.processes import spawn_process

        self.ipc_dir = tempfile.mkdtemp(prefix="host-ipc-")
        # removed by stop(), on a failed start, and at the latest when this process exits
        self._remove_ipc_dir = weakref.finalize(self, shutil.rmtree, self.ipc_dir, ignore_errors=True)
        tag = uuid.uuid4().hex[:8]
        self.input, self.output, self._ready = (f"ipc://{self.ipc_dir}/{k}-{tag}" for k in ("in", "out", "ready"))
        self._ready_ctx = zmq.Context()
        try:
            self._ready_socket = self._ready_ctx.socket(zmq.PULL)
            self._ready_socket.bind(self._ready)
            if early is not None:  # spawned by prestart_engine while the configuration was made
                self.process = early.start(config, self.input, self.output, self._ready)
            else:
                self.process = spawn_process(
                    "engine", run_engine_core, config, self.input, self.output, self._ready, name="host-engine-core"
                )
        except BaseException:
            if early is not None:
                early.cancel(timeout=0)
            self._ready_ctx.destroy(linger=0)
            self._remove_ipc_dir()
            raise

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Block until the engine reports; returns its description or raises
        :class:`EngineStartupError` (the process exited, failed, or took longer than ``timeout``)."""
        try:
            deadline = time.monotonic() + timeout
            while not self._ready_socket.poll(500):
                if not self.process.is_alive():
                    raise EngineStartupError(f"the engine process exited during start-up (exit code {self.process.exitcode})")
                if time.monotonic() > deadline:
                    self.process.kill()
                    raise EngineStartupError(f"the engine process did not start within {timeout:.0f} s")
            info = self._ready_socket.recv_json()
            if not info.get("ok"):
                self.process.join(5)
                raise EngineStartupError(f"the engine process failed to start: {info.get('error')}")
            return info
        finally:
            self._ready_socket.close(0)
            self._ready_ctx.term()

    def dead_reason(self) -> str | None:
        if self.process.is_alive():
            return None
        return f"the engine process died (exit code {self.process.exitcode})"

    def stop(self, grace: float = 5.0) -> None:
        """After a :class:`Shutdown` was sent: wait ``grace`` seconds, then terminate."""
        self.process.join(grace)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        self._remove_ipc_dir()


class SyncMPClient:
    """The engine core in its own process, driven with blocking ZMQ calls (``LLM(...,
    multiprocess=True)``)."""

    def __init__(self, config: Any, startup_timeout: float = 600.0, early: "EarlyProcess | None" = None) -> None:
        self._ctx = zmq.Context()
        self._proc: _EngineProcess | None = None
        try:
            self._proc = _EngineProcess(config, early)
            self._to_engine = self._ctx.socket(zmq.PUSH)
            self._to_engine.bind(self._proc.input)
            self._from_engine = self._ctx.socket(zmq.PULL)
            self._from_engine.bind(self._proc.output)
            self.engine_info = self._proc.wait_ready(startup_timeout)
        except BaseException:
            if self._proc is not None:
                self._proc.stop(grace=0)
            self._ctx.destroy(linger=0)
            raise
        self._pending: collections.deque[EngineCoreOutputs] = collections.deque()
        self._call_ids = itertools.count()
        self._closed = False

    def _send(self, msg: Any) -> None:
        self._check_alive()
        self._to_engine.send(encoder.encode(msg))

    def _check_alive(self) -> None:
        reason = self._proc.dead_reason()
        if reason is not None:
            raise EngineDeadError(reason)

    def _recv(self) -> EngineCoreOutputs:
        while True:
            while not self._from_engine.poll(200):
                self._check_alive()
            msg = from_engine_decoder.decode(self._from_engine.recv())
            if msg.fatal_error is not None:
                raise EngineDeadError(msg.fatal_error)
            if not msg.heartbeat:
                return msg

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self._send(AbortRequests(list(request_ids)))

    def get_output(self) -> EngineCoreOutputs:
        """The next step's outputs from the engine process (blocks until one arrives)."""
        if self._pending:
            return self._pending.popleft()
        while True:
            msg = self._recv()
            if msg.utility is None:
                return msg

    def utility(self, method: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        self._send(UtilityCall(call_id, method, list(args)))
        while True:
            msg = self._recv()
            if msg.utility is None:
                self._pending.append(msg)  # a step's outputs, read later by get_output
            elif msg.utility.call_id == call_id:
                return _utility_result(msg.utility)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._proc.dead_reason() is None:
            try:  # never blocks: an engine that already left (-dp engines stop together) takes nothing
                self._to_engine.send(encoder.encode(Shutdown()), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self._proc.stop()
        self._ctx.destroy(linger=0)


class AsyncMPClient:
    """The engine core in its own process, for asyncio (the API server).

    A reader task takes every message from the engine: step outputs go to a queue read by
    :meth:`get_output_async`, utility results resolve their waiting call. A watcher task turns
    the engine process's death into :class:`EngineDeadError` for every waiter."""

    def __init__(self, proc: _EngineProcess, ctx: zmq.asyncio.Context, to_engine: Any, from_engine: Any) -> None:
        self._proc = proc
        self._ctx = ctx
        self._to_engine = to_engine
        self._from_engine = from_engine
        self._outputs: asyncio.Queue[EngineCoreOutputs | BaseException] = asyncio.Queue()
        self._utility_waiters: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.engine_info: dict[str, Any] = {}
        self.dead_reason: str | None = None
        self._closed = False
        self._last_message = time.monotonic()
        self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._watch_process())]

    @classmethod
    async def start(cls, config: Any, startup_timeout: float = 600.0, early: "EarlyProcess | None" = None) -> "AsyncMPClient":
        """Spawn the engine process for ``config`` (or run it in ``early``, see
        :func:`prestart_engine`) and wait (off the event loop) until it is up."""
        ctx = zmq.asyncio.Context()
        proc = None
        try:
            proc = _EngineProcess(config, early)
            to_engine = ctx.socket(zmq.PUSH)
            to_engine.bind(proc.input)
            from_engine = ctx.socket(zmq.PULL)
            from_engine.bind(proc.output)
            info = await asyncio.to_thread(proc.wait_ready, startup_timeout)
        except BaseException:
            if proc is not None:
                proc.stop(grace=0)
            ctx.destroy(linger=0)
            raise
        client = cls(proc, ctx, to_engine, from_engine)
        client.engine_info = info
        return client

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self._proc.process.is_alive()

    @property
    def engine_pid(self) -> int:
        return self._proc.process.pid

    @property
    def silent_for(self) -> float:
        """Seconds since the last message from the engine (it sends one at least every second
        between steps; a stopped or wedged engine falls silent)."""
        return time.monotonic() - self._last_message

    def _fail(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
            logger.error("engine failed: %s", reason)
        err = EngineDeadError(reason)
        self._outputs.put_nowait(err)
        for fut in self._utility_waiters.values():
            if not fut.done():
                fut.set_exception(err)
        self._utility_waiters.clear()

    async def _watch_process(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            reason = self._proc.dead_reason()
            if reason is not None:
                if not self._closed:
                    self._fail(reason)
                return

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = from_engine_decoder.decode(await self._from_engine.recv())
                self._last_message = time.monotonic()
                if msg.heartbeat:
                    continue
                if msg.fatal_error is not None:
                    self._fail(msg.fatal_error)
                    return
                if msg.utility is not None:
                    fut = self._utility_waiters.pop(msg.utility.call_id, None)
                    if fut is not None and not fut.done():
                        try:
                            fut.set_result(_utility_result(msg.utility))
                        except RuntimeError as exc:
                            fut.set_exception(exc)
                    continue
                self._outputs.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken channel fails every waiter loudly
            logger.exception("reading engine outputs failed")
            self._fail(f"reading engine outputs failed: {exc}")

    async def _send(self, msg: Any) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        await self._to_engine.send(encoder.encode(msg))

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        await self._send(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if self.dead_reason is None and not self._closed:
            await self._send(AbortRequests(list(request_ids)))

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next step's outputs; raises :class:`EngineDeadError` once the engine is gone."""
        return await next_output(self._outputs)

    async def utility_async(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """Call ``EngineCore.utility_<method>(*args)`` in the engine process."""
        call_id = next(self._call_ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._utility_waiters[call_id] = fut
        await self._send(UtilityCall(call_id, method, list(args)))
        return await asyncio.wait_for(fut, timeout)

    async def shutdown_async(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._proc.dead_reason() is None:
            try:  # never blocks: an engine that already left (-dp engines stop together) takes nothing
                await self._to_engine.send(encoder.encode(Shutdown()), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        await asyncio.to_thread(self._proc.stop)
        for task in self._tasks:
            task.cancel()
        self._ctx.destroy(linger=0)


async def next_output(queue: asyncio.Queue) -> Any:
    """The next item of an engine client's output queue; an exception there (the engine is gone)
    is raised, and left in the queue so every later reader fails the same way."""
    item = await queue.get()
    if isinstance(item, BaseException):
        queue.put_nowait(item)
        raise item
    return item


def _utility_result(result: UtilityResult) -> Any:
    if result.error is not None:
        raise RuntimeError(result.error)
    return result.result


__all__ = ["AsyncMPClient", "EngineDeadError", "EngineStartupError", "InprocClient", "SyncMPClient"]
