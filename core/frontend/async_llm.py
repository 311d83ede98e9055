"""The API server's engine front end: the same request path as :class:`LLM`, for asyncio.

``AsyncLLM.start(config)`` starts the engine core in its own process (through the
multiprocess engine-core client, which spawns it with the ``engine`` plugin groups) and waits
until it reports ready. ``generate(...)`` is an async iterator of :class:`RequestOutput`
snapshots for one prompt (its ``n`` samples merged); every snapshot's text is what may be shown
(stop-string hold-back applied). Prompts and parameters are checked by the shared input
processor, outputs handled by the shared output processor; one task reads the engine's outputs
and feeds one asyncio queue per request. If the engine process dies, every in-flight and later
request fails with :class:`EngineDeadError` and ``is_healthy`` turns false — nothing hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from typing import Any, AsyncIterator

from host.contracts.messages import SchedulerStats
from host.contracts.sampling_params import SamplingParams
from host.core.engine.client import AsyncMPClient, EngineDeadError, EngineStartupError
from host.core.engine.dp_client import DPAsyncMPClient
from host.core.frontend.beam_search import BeamSearch, BeamSearchParams, check_step_logprobs
from host.core.frontend.input_processor import InputProcessor
from host.core.frontend.output_processor import OutputProcessor, ProcessedOutputs, RequestOutput, RequestTiming
from host.core.frontend.stat_loggers import StatLoggerManager
from host.interfaces.errors import APIError

logger = logging.getLogger("host.async_llm")

__all__ = ["AsyncLLM", "EngineDeadError", "EngineStartupError", "RequestTiming"]


class _Stream:
    """The queue one ``generate`` call reads from."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False
        self.result: RequestOutput | None = None  # the live result, for abort_all


class AsyncLLM:
    """Front-end engine client for the API server (process 0)."""

    def __init__(self, config: Any, tokenizer: Any, engine_core: AsyncMPClient | DPAsyncMPClient) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.engine_core = engine_core
        self.engine_info: dict[str, Any] = engine_core.engine_info
        self.input_processor = InputProcessor(config, tokenizer)
        self.processor = OutputProcessor(tokenizer)
        self._streams: dict[str, _Stream] = {}  # prompt request id -> its stream
        self.stats = SchedulerStats()
        self.max_queued_requests: int | None = None  # set by the server (--max-queued-requests)
        # set by the server: fed after every engine step (host.core.frontend.stat_loggers)
        self.stat_loggers: StatLoggerManager | None = None
        self._output_task = asyncio.create_task(self._output_loop())
        self._closed = False

    # -- start-up / shut-down -------------------------------------------------------------------
    @classmethod
    async def start(cls, config: Any, startup_timeout: float = 600.0, early: Any = None) -> "AsyncLLM":
        """Spawn the engine-core process for ``config`` (or run the engine in ``early``, a
        :func:`~host.core.engine.client.prestart_engine` process) and connect to it; the
        tokenizer loads while the engine starts."""
        from host.core.models.tokenizer import get_tokenizer

        if config.parallel.data_parallel_size > 1:  # -dp N: N engine processes, requests balanced
            if early is not None:
                early.cancel()
            starting = asyncio.ensure_future(DPAsyncMPClient.start(config, startup_timeout))
        else:
            starting = asyncio.ensure_future(AsyncMPClient.start(config, startup_timeout, early))
        try:
            tokenizer = await asyncio.to_thread(get_tokenizer, config.model.tokenizer)
        except BaseException:
            starting.cancel()
            with contextlib.suppress(BaseException):
                engine_core = await starting
                await engine_core.shutdown_async()
            raise
        engine_core = await starting
        return cls(config, tokenizer, engine_core)

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.engine_core.shutdown_async()
        self._output_task.cancel()

    # -- health ---------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self.engine_core.is_alive

    @property
    def engine_pid(self) -> int:
        """The engine-core process's pid."""
        return self.engine_core.engine_pid

    @property
    def dead_reason(self) -> str | None:
        return self.engine_core.dead_reason

    def _fail_all(self, err: BaseException) -> None:
        for stream in self._streams.values():
            stream.queue.put_nowait(err)
        self._streams.clear()

    # -- requests -------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ``ValueError`` (HTTP 400) for what the engine would refuse."""
        self.input_processor.validate(prompt_token_ids, params, whole_request_fits=True)

    def check_prompt_length(self, n: int) -> None:
        """Raise ``ValueError`` (HTTP 400) when a prompt of ``n`` tokens is refused for its length
        alone (callable from any thread)."""
        self.input_processor.check_prompt_length(n, whole_request_fits=True)

    def num_queued(self) -> int:
        """Prompts admitted here that have not produced a token yet (waiting in the engine's
        queue, or in their first prefill)."""
        return sum(1 for s in self._streams.values() if s.result is not None and not any(c.token_ids for c in s.result.outputs))

    def admit(self) -> None:
        """Raise :class:`~host.sdk.APIError` 429 (with ``Retry-After``) when
        ``max_queued_requests`` prompts already wait for their first token. Routes call it before
        they answer, so a stream is refused with a status, not mid-body."""
        limit = self.max_queued_requests
        if limit is not None and self.num_queued() >= limit:
            raise APIError(
                429, f"the server's queue is full: {limit} requests wait for their first token "
                "(--max-queued-requests); retry later", "RateLimitError", headers={"Retry-After": "1"},
            )

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        prompt: str | None = None,
        priority: int = 0,
        deadline: float | None = None,
        check_queue: bool = True,
        kv_transfer_params: dict[str, Any] | None = None,
        lora_request: Any = None,
        pooling_params: Any = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream snapshots of one prompt's result until it finishes. Cancelling the consumer
        (a client that disconnected) aborts the request in the engine and frees its blocks.

        ``deadline`` (``time.monotonic()`` seconds): when it passes, the request is aborted in
        the engine and its last snapshot ends it with ``finish_reason="abort"``.
        ``check_queue=False`` skips :meth:`admit` (a beam search's steps, admitted once).
        ``kv_transfer_params`` go to the engine's KV connector; its answer comes back on the
        result's ``kv_transfer_params``. ``lora_request``: the :class:`host.LoRARequest` to run
        with (``None``: the base model), validated here (docs/lora.md)."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if check_queue:
            self.admit()
        process = functools.partial(
            self.input_processor.process,
            request_id or uuid.uuid4().hex, prompt_token_ids, params, priority=priority, whole_request_fits=True,
            lora_request=lora_request, pooling_params=pooling_params,
        )
        # bad_words are tokenized here, and a LoRA adapter's files read: work that would stall the
        # event loop, so a thread does it
        request = await asyncio.to_thread(process) if params.bad_words or lora_request is not None else process()
        request.kv_transfer_params = kv_transfer_params
        rid = request.request_id
        result, engine_requests = self.processor.add_request(request, prompt)
        timing = self.processor.timing(rid)
        stream = self._streams[rid] = _Stream()
        stream.result = result
        try:
            for engine_request in engine_requests:
                await self.engine_core.add_request_async(engine_request)
            if self.dead_reason is not None:  # died before the output loop could see this stream
                raise EngineDeadError(self.dead_reason)
        except BaseException:
            self._streams.pop(rid, None)
            await self.abort(rid)
            self._report_ended(result, timing, params)
            raise
        try:
            while True:
                try:
                    item = await (stream.queue.get() if deadline is None else
                                  asyncio.wait_for(stream.queue.get(), max(0.0, deadline - time.monotonic())))
                except TimeoutError:
                    await self.abort(rid)  # its sequences end with "abort", its blocks are freed
                    stream.finished = True
                    yield result
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    stream.finished = True
                    break
        finally:
            self._streams.pop(rid, None)
            if not stream.finished:
                await self.abort(rid)
            self._report_ended(result, timing, params)

    def encode(
        self, prompt: Any, pooling_params: Any = None, request_id: str | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Pool one prompt (token ids, a string, or ``{"prompt_token_ids": [...]}``) with a
        pooling model: yields one finished :class:`host.PoolingRequestOutput`. ``kwargs`` are
        :meth:`generate`'s (``priority``, ``deadline``, ``check_queue``). docs/pooling.md"""
        from host.core.pooling.frontend import encode_async

        return encode_async(self, prompt, pooling_params, request_id, **kwargs)

    async def beam_search(
        self,
        prompt_token_ids: list[int],
        params: BeamSearchParams,
        request_id: str | None = None,
        prompt: str | None = None,
        priority: int = 0,
        deadline: float | None = None,
    ) -> RequestOutput:
        """Beam search for one prompt (transformers' ``num_beams`` rules, see
        :mod:`host.core.frontend.beam_search`): the finished :class:`RequestOutput`, its outputs
        the ``num_return_sequences`` best beams (:class:`BeamCompletion`, best first). Bad
        values raise ``ValueError`` before anything runs; a full queue raises the 429 of
        :meth:`admit`. Each step runs one engine request per live beam (``<id>-b<step>-<i>``);
        cancelling the caller aborts them. When ``deadline`` passes the search ends with what
        it has, its live beams ending with ``finish_reason="abort"``."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        search = BeamSearch(prompt_token_ids, params, self.input_processor.eos_token_id, self.input_processor.max_model_len)
        # the server's admission rule for the prompt, max_tokens and stop_token_ids
        self.validate(prompt_token_ids, SamplingParams(max_tokens=params.max_tokens, stop_token_ids=params.stop_token_ids))
        check_step_logprobs(search, self.input_processor.max_logprobs)
        self.admit()
        rid = request_id or uuid.uuid4().hex
        step_params = search.step_params()

        async def last(ids: list[int], step_id: str) -> RequestOutput:
            out = None
            async with contextlib.aclosing(self.generate(ids, step_params, step_id, None, priority, deadline, check_queue=False)) as stream:
                async for out in stream:
                    pass
            assert out is not None
            return out

        step = 0
        while not search.done:
            try:
                async with asyncio.TaskGroup() as group:  # one failing step cancels (and aborts) the others
                    tasks = [group.create_task(last(ids, f"{rid}-b{step}-{i}")) for i, ids in enumerate(search.pending())]
            except BaseExceptionGroup as failed:  # the caller sees the error itself (a ValueError is a 400)
                raise failed.exceptions[0] from None
            outs = [task.result() for task in tasks]
            if any(out.outputs[0].finish_reason == "abort" or not out.outputs[0].logprobs for out in outs):
                search.abort()
                break
            search.advance([out.outputs[0].logprobs[0] for out in outs], outs[0].num_cached_tokens)
            step += 1
        return search.result(rid, prompt, self.tokenizer)

    def _report_ended(self, result: RequestOutput, timing: RequestTiming | None, params: SamplingParams) -> None:
        """Tell the stat loggers about a prompt the front end ended (aborted, failed): one the
        engine finished was reported with its step (``timing.finished_at`` is set)."""
        if self.stat_loggers is not None and (timing is None or timing.finished_at is None):
            self.stat_loggers.on_ended(result, timing, params, len(self._streams))

    async def abort(self, request_id: str) -> None:
        """Abort one prompt (a disconnected client): its engine requests free their blocks."""
        running = self.processor.abort_request(request_id)
        if running:
            await self.engine_core.abort_requests_async(running)

    async def abort_all(self) -> int:
        """Abort every request in flight (a drain's timeout): each stream gets a last snapshot
        whose unfinished samples end with ``finish_reason="abort"``. Returns how many."""
        running: list[str] = []
        streams = list(self._streams.items())
        for rid, stream in streams:
            running += self.processor.abort_request(rid)
            if stream.result is not None:
                stream.result.finished = True
                stream.queue.put_nowait(stream.result)
        if running:
            await self.engine_core.abort_requests_async(running)
        return len(streams)

    @property
    def engine_silent_for(self) -> float:
        """Seconds since the engine process last sent anything (steps, or its idle heartbeat)."""
        return self.engine_core.silent_for

    async def utility(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """Call ``EngineCore.utility_<method>`` in the engine process and return its result."""
        return await self.engine_core.utility_async(method, *args, timeout=timeout)

    # -- outputs --------------------------------------------------------------------------------
    async def _output_loop(self) -> None:
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                if outputs.scheduler_stats is not None:
                    self.stats = outputs.scheduler_stats
                done = self._dispatch(outputs.outputs) if outputs.outputs else None
                if self.stat_loggers is not None and (done is not None or outputs.scheduler_stats is not None):
                    # before any await: the gauges are current when a client sees its last chunk
                    self.stat_loggers.on_step(outputs.scheduler_stats, done, len(self._streams), outputs.engine_index)
                if done is not None and done.reqs_to_abort:
                    await self.engine_core.abort_requests_async(done.reqs_to_abort)
        except asyncio.CancelledError:
            raise
        except EngineDeadError as exc:
            self._fail_all(exc)
        except Exception as exc:  # noqa: BLE001 - a broken output path fails every request loudly
            logger.exception("output loop failed")
            self._fail_all(EngineDeadError(f"output handling failed: {exc}"))

    def _dispatch(self, outputs: list[Any]) -> ProcessedOutputs:
        """Apply one step's outputs and queue each prompt's snapshot; the caller aborts
        ``reqs_to_abort`` in the engine."""
        done = self.processor.process_outputs(outputs)
        for request_id, error in done.failed:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.queue.put_nowait(ValueError(error))
        for result in done.request_outputs:
            stream = self._streams.get(result.request_id)
            if stream is not None:
                stream.queue.put_nowait(result)
        return done
