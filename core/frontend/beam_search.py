"""Beam search in the front end, step by step over the ordinary request path (vLLM v1's design).

One :class:`BeamSearch` holds the state of one prompt's search; a driver (``LLM.beam_search``,
``AsyncLLM.beam_search``) runs it: each step it submits one engine request per live beam (the
prompt plus the beam's tokens, ``max_tokens=1``, greedy, ``logprobs`` = the candidates it
needs) and hands the per-beam logprob dicts to :meth:`BeamSearch.advance`. With prefix caching
on (the default) the beams share the KV blocks of their common prefix through the block pool's
hash-based reuse: every full block of the prompt and of a shared beam history is found in the
cache, only the last, partial block is recomputed (that recomputation is the copy-on-write of
the last block).

The scoring and stopping rules are Hugging Face transformers' ``generate(num_beams=k,
do_sample=False)`` (``GenerationMixin._beam_search``), so the same weights give the same
sequences in the same order:

- each step keeps the best ``K = max(2, 1 + #stop tokens) * beam_width`` continuations over
  all live beams by cumulative logprob (the raw model distribution: ``temperature`` and the other
  sampling knobs play no part);
- a continuation that ends (an EOS / stop token, or ``max_tokens`` reached) among the top
  ``beam_width`` of those enters the finished hypotheses with score
  ``cumulative_logprob / generated_len ** length_penalty`` (the length counts the final token);
  the ``beam_width`` best hypotheses are kept; the best ``beam_width`` continuations that did not
  end are the next step's beams;
- the search stops when every continuation ended (``max_tokens``); with
  ``early_stopping=True`` as soon as ``beam_width`` hypotheses are finished; otherwise when all
  ``beam_width`` hypotheses are finished and the best live beam cannot beat the worst of them:
  its cumulative logprob over ``len ** length_penalty`` with ``len`` its current length
  (``early_stopping=False``) or, with ``early_stopping="never"`` and ``length_penalty > 0``,
  ``max_tokens`` (the best it could still reach).

The result is one :class:`~host.core.frontend.output_processor.RequestOutput` whose outputs
are :class:`BeamCompletion` (a ``CompletionOutput`` with the beam's ``score``), best first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from host.contracts.sampling_params import SamplingParams, check_finite, check_int
from host.core.frontend.output_processor import CompletionOutput, Logprob, PositionLogprobs, RequestOutput

__all__ = ["BeamCompletion", "BeamSearch", "BeamSearchParams"]

# SamplingParams fields that would change how tokens are picked, with their neutral value:
# beam search scores the raw model distribution, so a request that sets one is refused
_UNSUPPORTED = {
    "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "repetition_penalty": 1.0, "min_tokens": 0, "logit_bias": None, "allowed_token_ids": None,
    "bad_words": None, "structured_outputs": None, "prompt_logprobs": None,
}


@dataclass
class BeamSearchParams:
    """How one prompt's beam search runs.

    ``beam_width`` beams are kept; the ``num_return_sequences`` best finished ones (default:
    ``beam_width``) are returned. ``length_penalty`` is the exponent of the length that divides
    a finished beam's cumulative logprob (> 0 favours longer beams). ``early_stopping`` is
    transformers': ``False``, ``True`` or ``"never"``. ``max_tokens=None`` runs to
    ``max_model_len``. EOS ends a beam unless ``ignore_eos``; ``stop_token_ids`` always do.
    ``logprobs`` (``k``) reports, per generated token, its logprob and the top ``k``.
    """

    beam_width: int
    max_tokens: int | None = 16
    ignore_eos: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        check_int("beam_width", self.beam_width, 1, hint=" (beam search keeps that many beams)")
        if self.num_return_sequences is None:
            self.num_return_sequences = self.beam_width
        check_int("num_return_sequences", self.num_return_sequences, 1, self.beam_width,
                  hint=f" (at most beam_width={self.beam_width}; raise best_of / the beam width for more)")
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, 1, hint=" (or None to run to max_model_len)")
        check_finite("length_penalty", self.length_penalty)
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping={self.early_stopping!r} must be true, false or \"never\"")
        self.stop_token_ids = list(self.stop_token_ids or [])
        for tok in self.stop_token_ids:
            check_int("stop_token_ids entry", tok, 0)
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, 0, hint=" with beam search (the whole vocabulary, -1, is not offered)")

    @classmethod
    def from_sampling_params(
        cls, params: SamplingParams, *, length_penalty: float = 1.0, early_stopping: bool | str = False,
        best_of: int | None = None,
    ) -> "BeamSearchParams":
        """The beam search a request with ``use_beam_search`` asks for: ``best_of`` beams (or
        ``n``), the ``n`` best returned. Sampling settings beam search cannot honour (top-p,
        penalties, stop strings, ...) raise ``ValueError`` naming them; ``temperature`` and
        ``seed`` are ignored (the scores are the raw model logprobs)."""
        set_fields = [name for name, neutral in _UNSUPPORTED.items() if getattr(params, name) not in (neutral, [], {})]
        if params.stop:
            set_fields.append("stop")
        if set_fields:
            raise ValueError(
                f"use_beam_search does not support {', '.join(set_fields)}; leave them unset "
                "(beam search scores the raw model distribution; stop_token_ids may end a beam)"
            )
        width = params.n if best_of is None else best_of
        if best_of is not None:
            check_int("best_of", best_of, params.n, hint=f" (at least n={params.n}: the n best of best_of beams are returned)")
        return cls(
            beam_width=width, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
            length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=params.n,
            stop_token_ids=list(params.stop_token_ids or []), logprobs=params.logprobs,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )


@dataclass
class BeamCompletion(CompletionOutput):
    """One returned beam: a ``CompletionOutput`` (``token_ids`` end with the EOS / stop token
    that finished it, ``finish_reason`` ``"stop"``, ``"length"``, or ``"abort"`` for a live
    beam of a search :meth:`BeamSearch.abort` ended) plus its beam ``score``,
    ``cumulative_logprob / len(token_ids) ** length_penalty``; ``logprobs`` is set when
    :attr:`BeamSearchParams.logprobs` is."""

    score: float = 0.0


@dataclass
class _Beam:
    tokens: list[int]
    cum: float
    logprobs: list[PositionLogprobs] | None


class BeamSearch:
    """The search state of one prompt. ``pending()`` is what to score next (one token list per
    live beam, prompt included); ``advance()`` takes, per live beam in that order, the
    ``{token_id: Logprob}`` dict of the next position (at least :attr:`step_logprobs` entries);
    ``done`` says when to stop and ``result()`` builds the output."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_id: int | None,
                 max_model_len: int) -> None:
        self.prompt = list(prompt_token_ids)
        self.params = params
        self.width = params.beam_width
        self.stop_ids = set(params.stop_token_ids)
        self.eos_token_id = eos_token_id
        if eos_token_id is not None and not params.ignore_eos:
            self.stop_ids.add(eos_token_id)
        room = max_model_len - len(self.prompt)
        if room < 1:
            raise ValueError(
                f"the prompt has {len(self.prompt)} tokens but max_model_len is {max_model_len}; "
                "shorten the prompt (one position must remain for the output)"
            )
        self.max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        # transformers keeps (1 + #EOS) * width candidates, so that width of them can go on
        self.keep = max(2, 1 + len(self.stop_ids)) * self.width
        self.step_logprobs = max(self.keep, params.logprobs or 0)
        self.running: list[_Beam] = [_Beam([], 0.0, [] if params.logprobs is not None else None)]
        self.finished: list[tuple[float, _Beam]] = []  # (score, beam), best first, at most width
        self.done = False
        self.aborted: set[int] = set()  # ids of the live beams an abort() ended
        self.num_cached_tokens = 0  # the prompt's tokens the first step found in the prefix cache

    def pending(self) -> list[list[int]]:
        return [] if self.done else [self.prompt + beam.tokens for beam in self.running]

    def advance(self, next_logprobs: list[PositionLogprobs], num_cached_tokens: int = 0) -> None:
        """One step: ``next_logprobs`` per live beam; ``num_cached_tokens`` of the first step's
        request is reported as the prompt's cached tokens."""
        if not self.running[0].tokens:
            self.num_cached_tokens = num_cached_tokens
        if len(next_logprobs) != len(self.running):
            raise ValueError(f"advance got {len(next_logprobs)} logprob dicts for {len(self.running)} live beams")
        candidates = [
            (beam.cum + lp.logprob, b, tok, lp)
            for b, (beam, dist) in enumerate(zip(self.running, next_logprobs))
            for tok, lp in dist.items()
        ]
        candidates.sort(key=lambda c: -c[0])  # stable: ties keep beam order, then rank order
        gen_len = len(self.running[0].tokens) + 1
        at_max = gen_len >= self.max_new
        penalty = self.params.length_penalty
        early = self.params.early_stopping
        full_before = len(self.finished) >= self.width
        live: list[_Beam] = []
        for pos, (cum, b, tok, lp) in enumerate(candidates[: self.keep]):
            ends = at_max or tok in self.stop_ids
            if ends and (pos >= self.width or (full_before and early is True)):
                continue  # only the top width continuations may finish
            if not ends and len(live) >= self.width:
                continue
            parent = self.running[b]
            beam = _Beam(parent.tokens + [tok], cum, None)
            if parent.logprobs is not None:
                beam.logprobs = parent.logprobs + [self._position(tok, next_logprobs[b])]
            if ends:
                self.finished.append((cum / gen_len**penalty, beam))
            else:
                live.append(beam)
        self.finished.sort(key=lambda f: -f[0])
        del self.finished[self.width:]
        self.running = live
        if at_max or not live:
            self.done = True
        elif len(self.finished) >= self.width:
            if early is True:
                self.done = True
            else:
                length = self.max_new if early == "never" and penalty > 0.0 else gen_len
                best_possible = live[0].cum / length**penalty
                self.done = not best_possible > self.finished[-1][0]

    def _position(self, token: int, dist: PositionLogprobs) -> PositionLogprobs:
        """The chosen token's logprob and the top ``params.logprobs`` of its position."""
        k = self.params.logprobs or 0
        top = sorted(dist.items(), key=lambda item: -item[1].logprob)
        out: PositionLogprobs = {token: dist[token]}
        for rank, (tid, lp) in enumerate(top[:k], start=1):
            out.setdefault(tid, Logprob(lp.logprob, rank, lp.decoded_token))
        chosen = dist[token]
        rank = next(i for i, (tid, _) in enumerate(top, start=1) if tid == token)
        out[token] = Logprob(chosen.logprob, rank, chosen.decoded_token)
        return out

    def abort(self) -> None:
        """End the search early (a deadline passed): :meth:`result` then ranks the live beams
        with the finished ones, the live ones ending with ``finish_reason="abort"``."""
        penalty = self.params.length_penalty
        self.finished += [(beam.cum / len(beam.tokens) ** penalty, beam) for beam in self.running if beam.tokens]
        self.finished.sort(key=lambda f: -f[0])
        self.aborted = {id(beam) for beam in self.running}
        self.running = []
        self.done = True

    def result(self, request_id: str, prompt: str | None, tokenizer: Any | None) -> RequestOutput:
        """The ``num_return_sequences`` best finished beams, best first."""
        outputs: list[CompletionOutput] = []
        aborted = self.aborted
        for index, (score, beam) in enumerate(self.finished[: self.params.num_return_sequences]):
            last = beam.tokens[-1]
            stopped = last in self.stop_ids and id(beam) not in aborted
            text = ""
            if tokenizer is not None:
                text = tokenizer.decode(
                    beam.tokens, skip_special_tokens=self.params.skip_special_tokens,
                    spaces_between_special_tokens=self.params.spaces_between_special_tokens,
                )
            outputs.append(BeamCompletion(
                index=index, text=text, token_ids=list(beam.tokens),
                finish_reason="abort" if id(beam) in aborted else "stop" if stopped else "length",
                stop_reason=last if stopped and last != self.eos_token_id else None,
                cumulative_logprob=beam.cum, logprobs=beam.logprobs, score=score,
            ))
        return RequestOutput(request_id, prompt, list(self.prompt), outputs, finished=True,
                             num_cached_tokens=self.num_cached_tokens)

    def step_params(self) -> SamplingParams:
        """The parameters of each step's engine requests."""
        return SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.step_logprobs, ignore_eos=True,
                              detokenize=False)


def check_step_logprobs(search: BeamSearch, max_logprobs: int) -> None:
    """``ValueError`` when the engine's ``--max-logprobs`` is below what each step must see."""
    if max_logprobs != -1 and search.step_logprobs > max_logprobs:
        raise ValueError(
            f"beam search with beam_width={search.width} needs {search.step_logprobs} logprobs per step "
            f"({search.keep // search.width} x the width), more than --max-logprobs={max_logprobs}; "
            f"use a beam width of at most {max(max_logprobs // (search.keep // search.width), 1)} or raise --max-logprobs"
        )
