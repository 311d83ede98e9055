"""Turning engine-core outputs (token ids, logprob tensors as lists) into user-facing results.

The :class:`OutputProcessor` runs on the front end (the offline ``LLM`` now, the API server
later): it owns one :class:`~host.core.frontend.detokenizer.IncrementalDetokenizer` per sequence, turns
logprobs into ``{token_id: Logprob}`` dicts, finds stop strings (and reports which requests
they ended, so the caller aborts them in the engine core), and merges the ``n`` sequences of
a parallel-sampling request into one :class:`RequestOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from host.core.frontend.detokenizer import IncrementalDetokenizer
from host.core.engine.outputs import EngineCoreOutput, TokenLogprobs
from host.core.sampling_params import SamplingParams


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


class _Sequence:
    """Front-end state of one engine request (one of the ``n`` samples of a prompt)."""

    def __init__(self, parent: "_Parent", index: int, params: SamplingParams, detok: IncrementalDetokenizer | None) -> None:
        self.parent = parent
        self.params = params
        self.detok = detok
        self.output = CompletionOutput(index, "", [])
        if params.logprobs is not None:
            self.output.logprobs = []
            self.output.cumulative_logprob = 0.0


class _Parent:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.result = RequestOutput(request_id, prompt, list(prompt_token_ids))
        if params.prompt_logprobs is not None:
            self.result.prompt_logprobs = [None]
        self.params = params
        self.sequences: list[_Sequence] = []

    def refresh(self) -> None:
        self.result.outputs = [s.output for s in self.sequences]
        self.result.finished = all(s.output.finished for s in self.sequences)


def prepare_params(tokenizer: Any | None, params: SamplingParams) -> SamplingParams:
    """Front-end preparation of a request's params: ``bad_words`` become token id sequences
    (each word with and without a leading space, as a word inside a sentence is tokenized
    differently). Returns a copy when something changed."""
    if not params.bad_words:
        return params
    if tokenizer is None:
        raise ValueError("bad_words needs a tokenizer; this engine was built with skip_tokenizer_init=True")
    import copy

    params = copy.copy(params)
    seqs: list[list[int]] = []
    for word in params.bad_words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in seqs:
                seqs.append(ids)
    params.bad_words_token_ids = seqs
    return params


class OutputProcessor:
    """Front-end bookkeeping for every request in flight."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._sequences: dict[str, _Sequence] = {}
        self._token_text: dict[int, str] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        child_ids: list[str],
        child_params: list[SamplingParams],
    ) -> RequestOutput:
        """Track a prompt whose ``n`` samples run as engine requests ``child_ids``."""
        parent = _Parent(request_id, prompt, prompt_token_ids, params)
        for index, (cid, cparams) in enumerate(zip(child_ids, child_params)):
            detok = None
            if self.tokenizer is not None and cparams.detokenize:
                detok = IncrementalDetokenizer(self.tokenizer, cparams, prompt_token_ids)
            seq = _Sequence(parent, index, cparams, detok)
            parent.sequences.append(seq)
            self._sequences[cid] = seq
        parent.refresh()
        return parent.result

    def has(self, engine_request_id: str) -> bool:
        return engine_request_id in self._sequences

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

    def abort(self, engine_request_id: str) -> None:
        seq = self._sequences.pop(engine_request_id, None)
        if seq is not None and seq.output.finish_reason is None:
            seq.output.finish_reason = "abort"
            seq.parent.refresh()
