"""The API server's engine client: requests go to the engine-core process over ZMQ, outputs
come back and are detokenized here, one asyncio queue per request.

``AsyncLLM.start(engine_args)`` resolves the config, spawns the engine-core process (which
loads its own plugin groups) and waits until it reports ready. ``generate(...)`` is an async
iterator of :class:`RequestOutput` snapshots for one prompt (its ``n`` samples merged); every
snapshot's text is what may be shown (stop-string hold-back applied). If the engine process
dies, every in-flight and later request fails with :class:`EngineDeadError` and ``is_healthy``
turns false — nothing hangs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import zmq
import zmq.asyncio

from host.core.engine.protocol import (
    AbortRequests,
    EngineCoreRequest,
    SchedulerStatsMsg,
    Shutdown,
    UtilityCall,
    encoder,
    from_engine_decoder,
    from_msg,
    params_dict,
)
from host.core.frontend.output_processor import OutputProcessor, RequestOutput, prepare_params
from host.core.sampling_params import SamplingParams

logger = logging.getLogger("host.async_llm")


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; no request can be served."""


class EngineStartupError(RuntimeError):
    """The engine-core process failed to start (the message carries its error)."""


@dataclass
class RequestTiming:
    """Per-request timestamps for the latency metrics."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    num_output_tokens: int = 0
    itls: list[float] = field(default_factory=list)


class _Stream:
    """The queue a ``generate`` call reads from, and what it needs to clean up."""

    def __init__(self, request_id: str, engine_ids: list[str]) -> None:
        self.request_id = request_id
        self.engine_ids = engine_ids
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.timing = RequestTiming(time.monotonic())
        self.finished = False


class AsyncLLM:
    """Front-end engine client for the API server (process 0)."""

    def __init__(self, config: Any, tokenizer: Any, process: Any, ctx: zmq.asyncio.Context, to_engine: Any, from_engine: Any, ipc_dir: str) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.process = process
        self._ctx = ctx
        self._to_engine = to_engine
        self._from_engine = from_engine
        self._ipc_dir = ipc_dir
        self.processor = OutputProcessor(tokenizer)
        self._streams: dict[str, _Stream] = {}  # engine request id -> stream
        self._utility_waiters: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.dead_reason: str | None = None
        self.stats = SchedulerStatsMsg()
        self.engine_info: dict[str, Any] = {}
        self.metrics: Any = None  # set by the server (host.core.entrypoints.metrics.ServerMetrics)
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    # -- start-up / shut-down -------------------------------------------------------------------
    @classmethod
    async def start(cls, config: Any, startup_timeout: float = 600.0) -> "AsyncLLM":
        """Spawn the engine-core process for ``config`` and connect to it."""
        from host.core.engine.process import run_engine_core
        from host.core.plugins.processes import spawn_process
        from host.core.models.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(config.model.tokenizer)
        ipc_dir = tempfile.mkdtemp(prefix="host-ipc-")
        tag = uuid.uuid4().hex[:8]
        addrs = {k: f"ipc://{ipc_dir}/{k}-{tag}" for k in ("in", "out", "ready")}
        ctx = zmq.asyncio.Context()
        to_engine = ctx.socket(zmq.PUSH)
        to_engine.bind(addrs["in"])
        from_engine = ctx.socket(zmq.PULL)
        from_engine.bind(addrs["out"])
        ready = ctx.socket(zmq.PULL)
        ready.bind(addrs["ready"])
        process = spawn_process("engine", run_engine_core, config, addrs["in"], addrs["out"], addrs["ready"], name="host-engine-core")
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                if await ready.poll(500):
                    info = await ready.recv_json()
                    break
                if not process.is_alive():
                    raise EngineStartupError(f"the engine process exited during start-up (exit code {process.exitcode})")
                if time.monotonic() > deadline:
                    process.kill()
                    raise EngineStartupError(f"the engine process did not start within {startup_timeout:.0f} s")
            if not info.get("ok"):
                process.join(5)
                raise EngineStartupError(f"the engine process failed to start: {info.get('error')}")
        except BaseException:
            ready.close(0)
            to_engine.close(0)
            from_engine.close(0)
            ctx.term()
            raise
        ready.close(0)
        llm = cls(config, tokenizer, process, ctx, to_engine, from_engine, ipc_dir)
        llm.engine_info = info
        llm._tasks = [asyncio.create_task(llm._output_loop()), asyncio.create_task(llm._watch_process())]
        return llm

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.process.is_alive():
            try:
                await self._to_engine.send(encoder.encode(Shutdown()))
            except zmq.ZMQError:
                pass
            for _ in range(50):
                if not self.process.is_alive():
                    break
                await asyncio.sleep(0.1)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(5)
        for task in self._tasks:
            task.cancel()
        self._to_engine.close(0)
        self._from_engine.close(0)
        self._ctx.term()
        try:
            for name in os.listdir(self._ipc_dir):
                os.unlink(os.path.join(self._ipc_dir, name))
            os.rmdir(self._ipc_dir)
        except OSError:
            pass

    # -- health ---------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self.dead_reason is None and self.process.is_alive()

    def _fail_all(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
            logger.error("engine failed: %s", reason)
        err = EngineDeadError(reason)
        for stream in set(self._streams.values()):
            stream.queue.put_nowait(err)
        self._streams.clear()
        for fut in self._utility_waiters.values():
            if not fut.done():
                fut.set_exception(err)
        self._utility_waiters.clear()

    async def _watch_process(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            if not self.process.is_alive():
                if not self._closed:
                    self._fail_all(f"the engine process died (exit code {self.process.exitcode})")
                return

    # -- requests -------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ``ValueError`` (HTTP 400) for what the engine would refuse."""
        max_len = self.config.model.max_model_len
        vocab = self.config.model.hf_config.vocab_size
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty; send at least one token")
        if n >= max_len:
            raise ValueError(
                f"the prompt has {n} tokens but this server's max_model_len is {max_len}; "
                "shorten the prompt (one position must remain for the output)"
            )
        if params.max_tokens is not None and n + params.max_tokens > max_len:
            raise ValueError(
                f"max_tokens={params.max_tokens} plus the prompt's {n} tokens exceeds max_model_len={max_len}; "
                f"ask for at most {max_len - n} tokens"
            )
        max_seqs = self.config.scheduler.max_num_seqs
        if params.n > max_seqs:
            raise ValueError(f"n={params.n} exceeds this server's max_num_seqs={max_seqs}; the samples run side by side")
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"the prompt has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        params.verify(vocab)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        prompt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Stream snapshots of one prompt's result until it finishes. Cancelling the consumer
        (a client that disconnected) aborts the request in the engine and frees its blocks."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        params = prepare_params(self.tokenizer, params)
        self.validate(prompt_token_ids, params)
        request_id = request_id or uuid.uuid4().hex
        if params.n == 1:
            children, child_ids = [params], [request_id]
        else:
            children = [params.clone_for_sample(i) for i in range(params.n)]
            child_ids = [f"{request_id}-{i}" for i in range(params.n)]
        result = self.processor.add_request(request_id, prompt, prompt_token_ids, params, child_ids, children)
        stream = _Stream(request_id, child_ids)
        for cid in child_ids:
            self._streams[cid] = stream
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        for cid, cparams in zip(child_ids, children):
            req = EngineCoreRequest(cid, list(prompt_token_ids), params_dict(cparams), eos, time.time(), priority)
            await self._to_engine.send(encoder.encode(req))
        if self.metrics is not None:
            self.metrics.on_request_start()
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    stream.finished = True
                    break
        finally:
            if not stream.finished:
                await self.abort(child_ids)
            if self.metrics is not None:
                self.metrics.on_request_end(stream.timing, result, finished=stream.finished)

    async def abort(self, engine_request_ids: list[str]) -> None:
        """Abort engine requests (a disconnected client); frees their blocks in the engine."""
        for cid in engine_request_ids:
            self._streams.pop(cid, None)
            self.processor.abort(cid)
        if self.dead_reason is None and not self._closed:
            await self._to_engine.send(encoder.encode(AbortRequests(list(engine_request_ids))))

    async def utility(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """Call ``utility_<method>`` in the engine process and return its result."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        call_id = next(self._call_ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._utility_waiters[call_id] = fut
        await self._to_engine.send(encoder.encode(UtilityCall(call_id, method, list(args))))
        return await asyncio.wait_for(fut, timeout)

    # -- outputs --------------------------------------------------------------------------------
    async def _output_loop(self) -> None:
        try:
            while True:
                raw = await self._from_engine.recv()
                msg = from_engine_decoder.decode(raw)
                if msg.stats is not None:
                    self.stats = msg.stats
                    if self.metrics is not None:
                        self.metrics.on_stats(msg.stats)
                if msg.utility is not None:
                    fut = self._utility_waiters.pop(msg.utility.call_id, None)
                    if fut is not None and not fut.done():
                        if msg.utility.error is not None:
                            fut.set_exception(RuntimeError(msg.utility.error))
                        else:
                            fut.set_result(msg.utility.result)
                if msg.outputs:
                    await self._process(msg.outputs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken output path fails every request loudly
            logger.exception("output loop failed")
            self._fail_all(f"output handling failed: {exc}")

    async def _process(self, msgs: list[Any]) -> None:
        now = time.monotonic()
        to_abort: list[str] = []
        touched: dict[int, tuple[_Stream, RequestOutput]] = {}
        for m in msgs:
            stream = self._streams.get(m.req_id)
            if stream is None:
                continue
            out = from_msg(m)
            if out.error is not None:
                stream.queue.put_nowait(ValueError(out.error))
                for cid in stream.engine_ids:
                    self._streams.pop(cid, None)
                continue
            if out.new_token_ids:
                t = stream.timing
                if t.first_token is None:
                    t.first_token = now
                elif t.last_token is not None:
                    t.itls.append(now - t.last_token)
                t.last_token = now
                t.num_output_tokens += len(out.new_token_ids)
            result, stop_str = self.processor.process(out)
            if stop_str is not None and not out.finished:
                to_abort.append(m.req_id)  # a stop string ended it: free its blocks
            if out.finished or stop_str is not None:
                self._streams.pop(m.req_id, None)
            if result is not None:
                touched[id(stream)] = (stream, result)
        for stream, result in touched.values():
            stream.queue.put_nowait(result)
        if to_abort:
            await self._to_engine.send(encoder.encode(AbortRequests(to_abort)))
