"""The engine-core process: an :class:`EngineCore` driven by messages over ZMQ.

Started by the multiprocess engine-core client (:mod:`host.core.engine.client`) as a spawned
process that bootstraps the ``engine`` plugin groups (and ``worker`` too: the uniproc executor
runs the worker in this process). It pulls :data:`~host.contracts.messages.ToEngine` messages
from the input socket, steps the engine while any request is unfinished, and pushes each step's
:class:`~host.contracts.messages.EngineCoreOutputs`. Idle, it blocks on the input socket;
busy, it polls without blocking, so new requests join the running batch at the next step.
Whatever it does, it sends something at least every :data:`HEARTBEAT_INTERVAL_S` seconds
between steps (an empty heartbeat when idle), so the front end can tell a stopped engine.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from typing import Any

import msgspec
import zmq

from host.contracts.messages import (
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    Shutdown,
    UtilityCall,
    UtilityResult,
    encoder,
    to_engine_decoder,
)
from host.core.engine.dp_step_sync import IDLE_POLL_S

logger = logging.getLogger("host.engine")

HEARTBEAT_INTERVAL_S = 1.0  # an idle engine says it is alive this often (the API's /health)


class EngineCoreProc:
    """The loop around one :class:`EngineCore`, talking ZMQ to the front end."""

    def __init__(self, config: Any, input_addr: str, output_addr: str) -> None:
        from host.core.engine.core import EngineCore
        from host.core.plugins.manager import get_plugin_host

        get_plugin_host().bootstrap("worker")  # the uniproc executor runs the worker here
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PULL)
        self.input.connect(input_addr)
        self.output = self.ctx.socket(zmq.PUSH)
        self.output.connect(output_addr)
        self.engine = EngineCore(config)
        self.engine_index = config.parallel.data_parallel_rank  # -dp: stamped on every message
        self.running = True

    # -- messages -------------------------------------------------------------------------------
    def _handle(self, raw: bytes) -> None:
        try:
            msg = to_engine_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            self._refuse(raw, exc)
            return
        if isinstance(msg, EngineCoreRequest):
            self._add(msg)
        elif isinstance(msg, AbortRequests):
            self.engine.abort_requests(msg.request_ids)
        elif isinstance(msg, UtilityCall):
            self._utility(msg)
        elif isinstance(msg, Shutdown):
            self.running = False

    def _add(self, msg: EngineCoreRequest) -> None:
        try:
            self.engine.add_request(msg)
        except ValueError as exc:
            # what only the engine can refuse fails only this request
            out = EngineCoreOutput(req_id=msg.request_id, new_token_ids=[], finish_reason="abort", error=str(exc))
            self._send(EngineCoreOutputs(outputs=[out]))

    def _refuse(self, raw: bytes, exc: Exception) -> None:
        """A message that does not decode (e.g. params that fail validation here): fail that
        request if it names one, and keep serving the others."""
        logger.error("undecodable message from the front end: %s", exc)
        fields = msgspec.msgpack.decode(raw)
        if isinstance(fields, dict) and fields.get("type") == "add" and isinstance(fields.get("request_id"), str):
            out = EngineCoreOutput(req_id=fields["request_id"], new_token_ids=[], finish_reason="abort", error=str(exc))
            self._send(EngineCoreOutputs(outputs=[out]))

    def _utility(self, call: UtilityCall) -> None:
        try:
            result = getattr(self.engine, f"utility_{call.method}")(*call.args)
            reply = UtilityResult(call.call_id, result=result)
        except Exception as exc:  # noqa: BLE001 - the caller gets the error
            reply = UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}")
        self._send(EngineCoreOutputs(utility=reply))

    def _send(self, msg: EngineCoreOutputs) -> None:
        self._last_send = time.monotonic()
        msg.timestamp = time.time()
        msg.engine_index = self.engine_index
        self.output.send(encoder.encode(msg), copy=False)

    # -- the loop -------------------------------------------------------------------------------
    def _busy(self) -> bool:
        return self.engine.has_unfinished_requests() or self.engine.scheduler.has_finished_requests()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.input, zmq.POLLIN)
        self._last_send = time.monotonic()
        sync = self.engine.dp_step_sync
        wait_s = IDLE_POLL_S if sync is not None else HEARTBEAT_INTERVAL_S  # in step: idle engines poll
        while self.running or sync is not None:
            if time.monotonic() - self._last_send >= HEARTBEAT_INTERVAL_S:
                self._send(EngineCoreOutputs(heartbeat=True))  # idle (or between long steps)
            events = dict(poller.poll(0 if self.running and self._busy() else int(wait_s * 1000)))
            while self.input in events:
                self._handle(self.input.recv())
                events = dict(poller.poll(0))
            try:
                self.engine.executor.check_health()  # a dead worker process (mp, ray) ends the engine
                busy = self.running and self._busy()
                if sync is not None:
                    # the engines' turn: all stop together (none waits on one gone), and one with
                    # nothing to run joins the forward of one that steps
                    any_busy, any_stopping = sync.turn(busy, stopping=not self.running)
                    if any_stopping:
                        self.running = False
                        break
                    if any_busy and not busy:
                        self.engine.idle_turn()
                        continue
                if busy:
                    # sent every step, outputs or not: the stats feed the server's metrics
                    self._send(self.engine.step())
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                logger.exception("the engine stops, failing its %d requests: %s", len(self.engine.scheduler.requests), reason)
                self._fail_requests(reason)
                self.close()
                # exit at once: the interpreter's teardown (torch, transformers) takes seconds, tens
                # on a busy machine, and the front end reports the engine dead only once it is gone
                os._exit(1)

    def _fail_requests(self, reason: str) -> None:
        """The engine cannot go on (e.g. a worker died): its last message says why, and the front
        end fails every request it sent here with that reason (an engine failure: HTTP 503)
        before it sees the process gone."""
        self._send(EngineCoreOutputs(fatal_error=reason))

    def close(self) -> None:
        self.engine.shutdown()
        self.input.close(linger=0)
        self.output.close(linger=2000)
        self.ctx.term()


def _data_parallel_setup(parallel: Any) -> None:
    """One of ``-dp N`` engines: its log records say ``(engine i)``, and on the CPU it takes its
    share of the machine's cores (``os.cpu_count() // N`` torch threads) unless
    ``OMP_NUM_THREADS`` is set."""
    rank, size = parallel.data_parallel_rank, parallel.data_parallel_size
    if size <= 1:
        return

    def label(record: logging.LogRecord) -> bool:
        record.name = f"{record.name} (engine {rank})"
        return True

    for handler in logging.getLogger("host").handlers:
        handler.addFilter(label)
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    logger.info("data-parallel engine %d of %d: pid %d", rank, size, os.getpid())


def run_engine_core(config: Any, input_addr: str, output_addr: str, ready_addr: str) -> None:
    """Entry point of the spawned engine process; reports readiness (or the startup error) on
    ``ready_addr`` before serving."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end decides when we stop
    _data_parallel_setup(config.parallel)
    ctx = zmq.Context()
    ready = ctx.socket(zmq.PUSH)
    ready.connect(ready_addr)
    try:
        proc = EngineCoreProc(config, input_addr, output_addr)
    except BaseException as exc:  # noqa: BLE001 - tell the parent why, then die
        ready.send_json({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        ready.close(linger=2000)
        raise
    ready.send_json({"ok": True, **proc.engine.utility_describe()})
    ready.close(linger=2000)
    signal.signal(signal.SIGTERM, lambda *_: setattr(proc, "running", False))
    try:
        proc.run()
    finally:
        proc.close()
