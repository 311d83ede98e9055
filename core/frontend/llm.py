"""The offline API: ``from host import LLM, SamplingParams``.

Shaped like vLLM's so code can switch: ``LLM(model=..., **engine_args)`` takes the engine flags
as keywords; ``generate`` accepts strings or ``{"prompt_token_ids": [...]}`` and returns one
:class:`RequestOutput` per prompt, in order; ``chat`` applies the tokenizer's chat template.

The request path is the API server's: the input processor validates and builds engine
requests, an engine-core client carries them, the output processor fans out ``n``, finds stop
strings and detokenizes. By default the engine core runs in this process
(:class:`~host.core.engine.client.InprocClient`); ``multiprocess=True`` runs it in its own
process like ``host serve`` does (:class:`~host.core.engine.client.SyncMPClient`);
``data_parallel_size=N`` runs N engine processes, requests balanced between them
(:class:`~host.core.engine.dp_client.DPSyncMPClient`).

Giving back: :meth:`LLM.shutdown` stops the engine core and its workers and frees what they hold
(worker processes or Ray actors and their placement group, shared memory); so does deleting the
last reference to the LLM (a ``weakref.finalize``, not ``__del__``), and so does the interpreter's
exit. Either way it happens once; a later ``shutdown()`` does nothing. A second engine made after
``del llm`` gets the devices, CPUs or Ray bundles of the first at once. The engine core freezes the
objects alive at start-up out of the cycle collector (``freeze_startup_objects``), so an LLM is
freed by its reference count alone: keep it free of reference cycles.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from typing import Any, Iterator, Sequence

import msgspec

from host.contracts.messages import SchedulerStats
from host.contracts.sampling_params import SamplingParams
from host.core.engine.client import InprocClient, SyncMPClient, prestart_engine
from host.core.engine.dp_client import DPSyncMPClient
from host.core.engine_args import EngineArgs
from host.core.frontend.beam_search import BeamCompletion, BeamSearch, BeamSearchParams, check_step_logprobs
from host.core.frontend.input_processor import InputProcessor
from host.core.frontend.output_processor import CompletionOutput, Logprob, OutputProcessor, RequestOutput
from host.core.models.tokenizer import get_tokenizer
from host.core.plugins.manager import plugin_host_for

logger = logging.getLogger("host.llm")

__all__ = ["LLM", "BeamCompletion", "BeamSearchParams", "CompletionOutput", "Logprob", "RequestOutput", "SamplingParams"]


class LLM:
    """An engine for batch generation from Python (its engine core in this process, or in a
    child process with ``multiprocess=True``)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        multiprocess: bool = False,
        plugins: str | None = None,
        block_plugins: str | None = None,
        strict_plugins: bool | None = None,
        platform: str | None = None,
        **engine_args: Any,
    ) -> None:
        host = plugin_host_for(plugins, block_plugins, strict_plugins, platform)
        self.engine_args = EngineArgs.from_kwargs(model=model, **engine_args)
        data_parallel = self.engine_args.data_parallel_size > 1  # N engine processes (DPSyncMPClient)
        # the engine and worker roles run here unless the engine core has its own process
        for role in ("api",) if multiprocess or data_parallel else ("api", "engine", "worker"):
            host.bootstrap(role)
        # an engine process starts its imports while the configuration is made (cancelled when unused)
        early = prestart_engine() if multiprocess and not data_parallel else None
        try:
            self.config = self.engine_args.create_engine_config()
            # skip_tokenizer_init: token ids in, token ids out (text fields stay empty)
            self.tokenizer = None if self.engine_args.skip_tokenizer_init else get_tokenizer(self.config.model.tokenizer)
            self.input_processor = InputProcessor(self.config, self.tokenizer)
            self.engine_core: InprocClient | SyncMPClient | DPSyncMPClient
            if data_parallel:
                self.engine_core = DPSyncMPClient(self.config)
            elif multiprocess:
                self.engine_core = SyncMPClient(self.config, early=early)
            else:
                self.engine_core = InprocClient(self.config)
        finally:
            if early is not None:
                early.cancel()
        # deleting the LLM shuts its engine down (the callback holds the client, never the LLM)
        self._finalizer = weakref.finalize(self, self.engine_core.shutdown)
        self._ids = itertools.count()
        self.last_finish_order: list[str] = []

    @property
    def engine(self) -> Any:
        """The in-process :class:`~host.core.engine.core.EngineCore` (for inspection)."""
        if not isinstance(self.engine_core, InprocClient):
            raise AttributeError("this LLM runs its engine core in another process (multiprocess=True); use LLM.stats()")
        return self.engine_core.engine

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self.input_processor.eos_token_id

    def next_request_id(self) -> str:
        return str(next(self._ids))

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
        lora_request: Any = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (batched by the scheduler); outputs in prompt order.

        ``priority`` (one int per prompt, lower is served first) applies with
        ``scheduling_policy="priority"``. ``lora_request``: one :class:`host.LoRARequest` for
        every prompt, a list with one per prompt (``None`` entries: the base model), or
        ``None`` (needs ``enable_lora=True``; docs/lora.md).
        """
        items = self.input_processor.normalize_prompts(prompts)
        loras = _per_prompt_loras(lora_request, len(items))
        if priority is not None and len(priority) != len(items):
            raise ValueError(f"got {len(priority)} priorities for {len(items)} prompts; pass one per prompt")
        priorities = list(priority) if priority is not None else [0] * len(items)
        if sampling_params is None:
            params_list = [SamplingParams() for _ in items]
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(items)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(items):
                raise ValueError(
                    f"got {len(params_list)} sampling_params for {len(items)} prompts; pass one, or one per prompt"
                )
        processor = OutputProcessor(self.tokenizer)
        results: list[RequestOutput] = []
        sent: list[str] = []
        self.last_finish_order = []
        try:
            for (text, ids), params, prio, lora in zip(items, params_list, priorities, loras):
                results.append(self._add(processor, text, ids, params, prio, sent, lora))
            while processor.has_unfinished_requests():
                self._step(processor)
        except BaseException:
            # never leave blocks behind: abort whatever this call added and has not finished
            self.engine_core.abort_requests(sent)
            raise
        return results

    def encode(self, prompts: Any, pooling_params: Any = None, use_tqdm: bool = False) -> list[Any]:
        """Pool every prompt with a pooling model (``--runner pooling``, ``--convert embed``):
        one :class:`host.PoolingRequestOutput` per prompt, in order (``.outputs.data``).
        ``pooling_params``: one :class:`host.PoolingParams` for all, one per prompt, or ``None``
        (``task="embed"``). docs/pooling.md"""
        from host.core.pooling.frontend import encode_offline

        return encode_offline(self, prompts, pooling_params)

    def embed(self, prompts: Any, pooling_params: Any = None, use_tqdm: bool = False) -> list[Any]:
        """Embed every prompt: one :class:`host.EmbeddingRequestOutput` per prompt, in order
        (``.outputs.embedding``, normalized as the model's pooler says unless
        ``PoolingParams(normalize=...)``). docs/pooling.md"""
        from host.core.pooling.frontend import embed_offline

        return embed_offline(self, prompts, pooling_params)

    def stream(
        self, prompt: Any, sampling_params: SamplingParams | None = None, lora_request: Any = None
    ) -> Iterator[RequestOutput]:
        """Generate for one prompt, yielding its result (updated in place) after every step that
        changed it; closing the iterator early aborts the request and frees its blocks."""
        ((text, ids),) = self.input_processor.normalize_prompts(prompt)
        processor = OutputProcessor(self.tokenizer)
        sent: list[str] = []
        result = self._add(processor, text, ids, sampling_params or SamplingParams(), 0, sent, lora_request)
        try:
            while processor.has_unfinished_requests():
                if self._step(processor):
                    yield result
        finally:
            if not result.finished:
                self.engine_core.abort_requests(sent)

    def _add(
        self, processor: OutputProcessor, text: str | None, ids: list[int], params: SamplingParams, priority: int,
        sent: list[str], lora_request: Any = None,
    ) -> RequestOutput:
        request = self.input_processor.process(self.next_request_id(), ids, params, priority=priority, lora_request=lora_request)
        result, engine_requests = processor.add_request(request, text)
        for engine_request in engine_requests:
            self.engine_core.add_request(engine_request)
            sent.append(engine_request.request_id)
        return result

    def _step(self, processor: OutputProcessor) -> bool:
        """One engine step through ``processor``; whether any result changed."""
        done = processor.process_outputs(self.engine_core.get_output().outputs)
        if done.failed:
            request_id, error = done.failed[0]
            raise ValueError(f"request {request_id}: {error}")
        self.last_finish_order.extend(done.finished_engine_ids)
        if done.reqs_to_abort:
            self.engine_core.abort_requests(done.reqs_to_abort)
        return bool(done.request_outputs)

    def beam_search(self, prompts: Any, params: BeamSearchParams) -> list[RequestOutput]:
        """Beam search for every prompt (transformers' ``num_beams`` semantics, see
        :mod:`host.core.frontend.beam_search`); one finished :class:`RequestOutput` per prompt,
        in order, its outputs the best beams (:class:`BeamCompletion`, best first). Each step
        batches one request per live beam of every prompt; the prefix cache shares their blocks."""
        items = self.input_processor.normalize_prompts(prompts)
        searches = [BeamSearch(ids, params, self.eos_token_id, self.input_processor.max_model_len) for _, ids in items]
        check_step_logprobs(searches[0], self.input_processor.max_logprobs)
        step_params = searches[0].step_params()
        while True:
            pending = [(search, ids) for search in searches for ids in search.pending()]
            if not pending:
                break
            outs = self.generate([{"prompt_token_ids": ids} for _, ids in pending], step_params)
            start = 0
            for search in searches:
                count = len(search.pending())
                mine = outs[start:start + count]
                search.advance([out.outputs[0].logprobs[0] for out in mine], mine[0].num_cached_tokens)
                start += count
        return [search.result(self.next_request_id(), text, self.tokenizer) for (text, _), search in zip(items, searches)]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation (or a list) and generate."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {})
            )
            prompts.append({"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params)

    def stats(self) -> SchedulerStats:
        stats = self.engine_core.utility("stats")
        return stats if isinstance(stats, SchedulerStats) else msgspec.convert(stats, SchedulerStats)

    def shutdown(self) -> None:
        """Stop the engine core and its workers, and free everything they hold (processes, Ray
        actors and placement group, shared memory) before returning. Idempotent; deleting the LLM
        does the same."""
        self._finalizer()


def _per_prompt_loras(lora_request: Any, n: int) -> list[Any]:
    """``generate``'s ``lora_request`` as one entry per prompt (vLLM's rule: one for all, or a
    list of one per prompt)."""
    if lora_request is None or not isinstance(lora_request, (list, tuple)):
        return [lora_request] * n
    if len(lora_request) != n:
        raise ValueError(f"got {len(lora_request)} lora_requests for {n} prompts; pass one, or one per prompt")
    return list(lora_request)

