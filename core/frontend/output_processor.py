"""Turning engine-core outputs (token ids, logprobs) into user-facing results.

The :class:`OutputProcessor` runs on the front end (the offline ``LLM`` and the API server's
``AsyncLLM`` alike). It fans a prompt with ``n > 1`` out into ``n`` engine requests and merges
their sequences back into one :class:`RequestOutput`; it owns one
:class:`~host.core.frontend.detokenizer.IncrementalDetokenizer` per sequence, turns logprobs
into ``{token_id: Logprob}`` dicts, finds stop strings (and reports which engine requests they
ended, so the caller aborts them in the engine core), and keeps each prompt's latency timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from host.contracts.messages import (
    EVENT_PREEMPTED,
    EVENT_QUEUED,
    EVENT_SCHEDULED,
    EngineCoreEvent,
    EngineCoreOutput,
    EngineCoreRequest,
    TokenLogprobs,
)
from host.contracts.sampling_params import SamplingParams
from host.core.frontend.detokenizer import IncrementalDetokenizer


@dataclass
class Logprob:
    """The logprob of one token at one position, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One generated sequence of a request."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The result of one prompt: the prompt as given and its completions (``n`` of them)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    # the engine's KV connector's answer (a producer's hand-off for a decode instance), or None
    kv_transfer_params: dict[str, Any] | None = None
    # a pooling request's vector (docs/pooling.md), once its one engine output arrived
    pooling_output: list[float] | None = None


class _Sequence:
    """Front-end state of one engine request (one of the ``n`` samples of a prompt)."""

    def __init__(self, parent: "_Parent", index: int, params: SamplingParams, detok: IncrementalDetokenizer | None) -> None:
        self.parent = parent
        self.params = params
        self.detok = detok
        self.output = CompletionOutput(index, "", [])
        self.last_token: float | None = None  # when its latest tokens arrived (inter-token latency)
        if params.logprobs is not None:
            self.output.logprobs = []
            self.output.cumulative_logprob = 0.0


@dataclass
class RequestTiming:
    """One prompt's timestamps for the latency metrics (``time.monotonic`` seconds; one clock
    for every process of the host, so the engine's event times compare with the front end's).

    ``arrival``, ``first_token`` and ``last_token`` are taken here, when the prompt was added and
    when outputs with tokens arrived; ``queued`` (its first sample entered the engine's waiting
    queue) and ``scheduled`` (a sample first left it) come from the engine's events, as does
    ``num_preemptions`` (summed over its samples). ``finished_at`` is set when every sample
    finished in the engine (the prompt is then reported in :attr:`ProcessedOutputs.finished`);
    a prompt ended otherwise (aborted, failed) never gets it."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    num_output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    queued: float | None = None
    scheduled: float | None = None
    num_preemptions: int = 0
    finished_at: float | None = None

    def on_tokens(self, now: float, count: int) -> None:
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.itls.append(now - self.last_token)
        self.last_token = now
        self.num_output_tokens += count

    def on_events(self, events: list[EngineCoreEvent]) -> None:
        for event in events:
            if event.type == EVENT_QUEUED:
                if self.queued is None or event.timestamp < self.queued:
                    self.queued = event.timestamp
            elif event.type == EVENT_SCHEDULED:
                if self.scheduled is None or event.timestamp < self.scheduled:
                    self.scheduled = event.timestamp
            elif event.type == EVENT_PREEMPTED:
                self.num_preemptions += 1


class _Parent:
    """Front-end state of one prompt: its result, its ``n`` sequences and its timings."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.result = RequestOutput(request_id, prompt, list(prompt_token_ids))
        if params.prompt_logprobs is not None:
            self.result.prompt_logprobs = [None]
        self.params = params
        self.sequences: list[_Sequence] = []
        self.engine_ids: list[str] = []
        self.timing = RequestTiming(time.monotonic())

    def refresh(self) -> None:
        self.result.outputs = [s.output for s in self.sequences]
        self.result.finished = all(s.output.finished for s in self.sequences)


class OutputProcessor:
    """Front-end bookkeeping for every request in flight."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._sequences: dict[str, _Sequence] = {}  # engine request id -> its sequence
        self._parents: dict[str, _Parent] = {}  # prompt request id -> its state, until finished
        self._token_text: dict[int, str] = {}

    def add_request(self, request: EngineCoreRequest, prompt: str | None = None) -> tuple[RequestOutput, list[EngineCoreRequest]]:
        """Track one prompt; returns its (live, updated in place) result and the engine
        requests to send: the request itself, or for ``n > 1`` one per sample (ids
        ``<id>-<i>``, each with its own seed offset)."""
        params = request.sampling_params
        if params.n == 1:
            children = [request]
        else:
            children = [
                EngineCoreRequest(
                    f"{request.request_id}-{i}", request.prompt_token_ids, params.clone_for_sample(i),
                    request.eos_token_id, request.arrival_time, request.priority, request.cache_salt,
                    request.kv_transfer_params, request.lora_request,
                )
                for i in range(params.n)
            ]
        parent = _Parent(request.request_id, prompt, request.prompt_token_ids, params)
        for index, child in enumerate(children):
            cparams = child.sampling_params
            detok = None
            if self.tokenizer is not None and cparams.detokenize:
                detok = IncrementalDetokenizer(self.tokenizer, cparams, request.prompt_token_ids)
            seq = _Sequence(parent, index, cparams, detok)
            parent.sequences.append(seq)
            parent.engine_ids.append(child.request_id)
            self._sequences[child.request_id] = seq
        self._parents[request.request_id] = parent
        parent.refresh()
        return parent.result, children

    def has(self, engine_request_id: str) -> bool:
        return engine_request_id in self._sequences

    def has_unfinished_requests(self) -> bool:
        return bool(self._parents)

    def engine_ids(self, request_id: str) -> list[str]:
        """The engine requests of prompt ``request_id`` (empty once it is finished)."""
        parent = self._parents.get(request_id)
        return list(parent.engine_ids) if parent is not None else []

    def timing(self, request_id: str) -> RequestTiming | None:
        parent = self._parents.get(request_id)
        return parent.timing if parent is not None else None

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        """Apply one step's engine outputs; see :class:`ProcessedOutputs` for what comes back."""
        now = time.monotonic()
        done = ProcessedOutputs()
        touched: dict[str, RequestOutput] = {}
        for out in outputs:
            seq = self._sequences.get(out.req_id)
            if seq is None:
                continue  # aborted or finished here already
            parent = seq.parent
            rid = parent.result.request_id
            if out.error is not None:
                done.failed.append((rid, out.error))
                self._drop(parent, abort_others=done.reqs_to_abort, failed_id=out.req_id)
                touched.pop(rid, None)
                continue
            timing = parent.timing
            if out.events:
                timing.on_events(out.events)
            if out.new_token_ids:
                if timing.first_token is None:
                    done.time_to_first_tokens.append(now - timing.arrival)
                if seq.last_token is None:
                    done.num_prompt_tokens += len(parent.result.prompt_token_ids)  # its prefill is done
                else:
                    done.inter_token_latencies.append(now - seq.last_token)
                seq.last_token = now
                done.num_generation_tokens += len(out.new_token_ids)
                timing.on_tokens(now, len(out.new_token_ids))
            elif out.pooling_output is not None:  # a pooling request: its prompt ran, nothing was generated
                done.num_prompt_tokens += len(parent.result.prompt_token_ids)
            result, stop_str = self.process(out)
            if stop_str is not None and not out.finished:
                done.reqs_to_abort.append(out.req_id)  # a stop string ended it: free its blocks
            if out.finished or stop_str is not None:
                done.finished_engine_ids.append(out.req_id)
            touched[rid] = result
            if result.finished and self._parents.pop(rid, None) is not None:
                timing.finished_at = now
                done.finished.append(FinishedPrompt(parent.result, parent.timing, parent.params))
        done.request_outputs = list(touched.values())
        return done

    def _drop(self, parent: _Parent, abort_others: list[str], failed_id: str) -> None:
        """Forget a failed prompt; its other samples still running must be aborted."""
        for cid in parent.engine_ids:
            if self._sequences.pop(cid, None) is not None and cid != failed_id:
                abort_others.append(cid)
        self._parents.pop(parent.result.request_id, None)

    def _text(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _position(self, lp: TokenLogprobs, width: int | None) -> PositionLogprobs:
        """``{token: Logprob}`` for the chosen token plus the top ``width`` tokens."""
        out: PositionLogprobs = {}
        ids = lp.token_ids if width is None else lp.token_ids[: 1 + width]
        vals = lp.logprobs if width is None else lp.logprobs[: 1 + width]
        for j, (tid, value) in enumerate(zip(ids, vals)):
            if tid in out:
                continue
            out[tid] = Logprob(value, lp.rank if j == 0 else j, self._text(tid))
        return out

    def process(self, out: EngineCoreOutput) -> tuple[RequestOutput | None, str | None]:
        """Apply one engine output. Returns the parent's updated result (``None`` for an
        unknown request) and the stop string that ended this sequence, if one did — the
        caller must then finish the engine request (it is still running there)."""
        seq = self._sequences.get(out.req_id)
        if seq is None:
            return None, None
        parent, comp = seq.parent, seq.output
        if out.new_prompt_logprobs and parent.result.prompt_logprobs is not None and seq.output.index == 0:
            k = parent.params.prompt_logprobs
            parent.result.prompt_logprobs.extend(
                self._position(lp, None if k == -1 else k) for lp in out.new_prompt_logprobs
            )
        stop_str = None
        if out.new_token_ids:
            comp.token_ids.extend(out.new_token_ids)
            if out.new_logprobs and comp.logprobs is not None:
                k = seq.params.logprobs
                for lp in out.new_logprobs:
                    comp.logprobs.append(self._position(lp, None if k == -1 else k))
                    comp.cumulative_logprob = (comp.cumulative_logprob or 0.0) + lp.logprobs[0]
            if seq.detok is not None:
                # the engine finishes with "stop" only on EOS or a stop token id (stop strings
                # are found here, after detokenizing)
                stop_str = seq.detok.update(out.new_token_ids, out.finish_reason == "stop")
                if stop_str is not None:
                    comp.finish_reason, comp.stop_reason = "stop", stop_str
                    self._drop_after_stop(comp, out, seq.detok.num_dropped)
        if out.kv_transfer_params is not None:
            parent.result.kv_transfer_params = out.kv_transfer_params
        if out.pooling_output is not None:
            parent.result.pooling_output = out.pooling_output
        res_cached = max(parent.result.num_cached_tokens, out.num_cached_tokens)
        parent.result.num_cached_tokens = res_cached
        if comp.finish_reason is None and out.finish_reason is not None:
            comp.finish_reason, comp.stop_reason = out.finish_reason, out.stop_reason
        if seq.detok is not None:
            comp.text = seq.detok.get_next_output_text(comp.finished, delta=False)
        if comp.finished:
            del self._sequences[out.req_id]
            parent.refresh()  # the outputs are updated in place; only "finished" can change
        return parent.result, stop_str

    @staticmethod
    def _drop_after_stop(comp: CompletionOutput, out: Any, dropped: int) -> None:
        """Several tokens arrived at once (speculative decoding) and a stop string ended the
        sequence before the last: the tokens after it (and their logprobs) are not output."""
        if dropped <= 0:
            return
        del comp.token_ids[len(comp.token_ids) - dropped:]
        if out.new_logprobs and comp.logprobs is not None:
            for lp in out.new_logprobs[len(out.new_logprobs) - dropped:]:
                comp.cumulative_logprob = (comp.cumulative_logprob or 0.0) - lp.logprobs[0]
            del comp.logprobs[len(comp.logprobs) - dropped:]

    def abort_request(self, request_id: str) -> list[str]:
        """Stop tracking prompt ``request_id`` (its sequences finish with ``"abort"``); returns
        its engine requests that were still running, for the caller to abort in the engine."""
        parent = self._parents.pop(request_id, None)
        if parent is None:
            return []
        running = []
        for cid, seq in zip(parent.engine_ids, parent.sequences):
            if self._sequences.pop(cid, None) is not None:
                running.append(cid)
                if seq.output.finish_reason is None:
                    seq.output.finish_reason = "abort"
        parent.refresh()
        return running


@dataclass
class FinishedPrompt:
    """A prompt whose samples all finished: its result, timings and parameters (the metrics)."""

    result: RequestOutput
    timing: RequestTiming
    params: SamplingParams


@dataclass
class ProcessedOutputs:
    """What one step's outputs did: the prompts' updated results (once each), the engine
    requests a stop string ended (still running in the engine: abort them), the engine
    requests that finished (in order), and the prompts the engine failed, with its error.

    For the metrics: the prompts that finished, the prompt tokens whose prefill ended (a
    sample's first token arrived), the tokens generated, each prompt's time to first token and
    each sample's gaps between token arrivals (``time.monotonic`` seconds)."""

    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_abort: list[str] = field(default_factory=list)
    finished_engine_ids: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    finished: list[FinishedPrompt] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
