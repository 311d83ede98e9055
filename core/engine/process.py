"""The engine-core process: an :class:`EngineCore` driven by messages over ZMQ.

Started by the API server with :func:`start_engine_process` (a spawned process that bootstraps
the ``engine`` plugin groups, and ``worker`` too, since the uniproc executor runs the worker in
this process). It pulls requests from the input socket, steps the engine while any request is
unfinished, and pushes each step's outputs. When idle it blocks on the input socket. Busy
steps poll the input without blocking, so new requests join the running batch at the next step.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from typing import Any

import zmq

from host.core.engine.protocol import (
    AbortRequests,
    EngineCoreOutputsMsg,
    EngineCoreRequest,
    Shutdown,
    UtilityCall,
    UtilityResult,
    encoder,
    params_from_dict,
    stats_msg,
    to_engine_decoder,
    to_msg,
)

logger = logging.getLogger("host.engine")


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
        self.running = True

    # -- messages -------------------------------------------------------------------------------
    def _handle(self, raw: bytes) -> None:
        msg = to_engine_decoder.decode(raw)
        if isinstance(msg, EngineCoreRequest):
            self._add(msg)
        elif isinstance(msg, AbortRequests):
            self.engine.abort_requests(msg.request_ids)
        elif isinstance(msg, UtilityCall):
            self._utility(msg)
        elif isinstance(msg, Shutdown):
            self.running = False

    def _add(self, msg: EngineCoreRequest) -> None:
        from host.core.engine.outputs import EngineCoreOutput
        from host.core.scheduler.request import Request

        try:
            params = params_from_dict(msg.sampling_params)
            request = Request(
                msg.request_id, msg.prompt_token_ids, params, eos_token_id=msg.eos_token_id,
                arrival_time=msg.arrival_time or None, priority=msg.priority, cache_salt=msg.cache_salt,
            )
            self.engine.add_request(request)
        except ValueError as exc:
            # the front end validates first; whatever still fails here fails only this request
            out = EngineCoreOutput(req_id=msg.request_id, new_token_ids=[], finish_reason="abort", error=str(exc))
            self._send(EngineCoreOutputsMsg(outputs=[to_msg(out)]))

    def _utility(self, call: UtilityCall) -> None:
        try:
            result = getattr(self, f"utility_{call.method}")(*call.args)
            reply = UtilityResult(call.call_id, result=result)
        except Exception as exc:  # noqa: BLE001 - the caller gets the error
            reply = UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}")
        self._send(EngineCoreOutputsMsg(utility=reply))

    def utility_plugins(self) -> list[dict[str, Any]]:
        """This process's plugin records (what ``host plugins list --json`` shows)."""
        from host.core.plugins.manager import get_plugin_host

        return [dict(r.to_dict(), process_pid=os.getpid()) for r in get_plugin_host().list_records()]

    def utility_describe(self) -> dict[str, Any]:
        runner = self.engine.executor.worker.model_runner
        return {
            "pid": os.getpid(),
            "platform": getattr(self.engine.executor.worker.platform, "name", None),
            "attention_backend": getattr(runner.attn_backend, "name", None),
            "num_gpu_blocks": self.engine.kv_cache_manager.num_blocks,
            "block_size": self.engine.kv_cache_config.block_size,
        }

    def utility_reset_prefix_cache(self) -> bool:
        return self.engine.scheduler.reset_prefix_cache()

    def _send(self, msg: EngineCoreOutputsMsg) -> None:
        msg.timestamp = time.time()
        self.output.send(encoder.encode(msg), copy=False)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.input, zmq.POLLIN)
        while self.running:
            busy = self.engine.has_unfinished_requests() or self.engine.scheduler.has_finished_requests()
            events = dict(poller.poll(0 if busy else 1000))
            while self.input in events:
                self._handle(self.input.recv())
                events = dict(poller.poll(0))
            if not self.running:
                break
            if self.engine.has_unfinished_requests() or self.engine.scheduler.has_finished_requests():
                step = self.engine.step()
                # sent every step, outputs or not: the stats feed the server's metrics
                self._send(EngineCoreOutputsMsg(outputs=[to_msg(o) for o in step.outputs], stats=stats_msg(step.scheduler_stats)))

    def close(self) -> None:
        self.engine.shutdown()
        self.input.close(linger=0)
        self.output.close(linger=2000)
        self.ctx.term()


def run_engine_core(config: Any, input_addr: str, output_addr: str, ready_addr: str) -> None:
    """Entry point of the spawned engine process; reports readiness (or the startup error) on
    ``ready_addr`` before serving."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server decides when we stop
    ctx = zmq.Context()
    ready = ctx.socket(zmq.PUSH)
    ready.connect(ready_addr)
    try:
        proc = EngineCoreProc(config, input_addr, output_addr)
    except BaseException as exc:  # noqa: BLE001 - tell the parent why, then die
        ready.send_json({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        ready.close(linger=2000)
        raise
    ready.send_json({"ok": True, **proc.utility_describe()})
    ready.close(linger=2000)
    signal.signal(signal.SIGTERM, lambda *_: setattr(proc, "running", False))
    try:
        proc.run()
    finally:
        proc.close()
