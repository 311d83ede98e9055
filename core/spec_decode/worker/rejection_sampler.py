"""The rejection sampler: verifies a request's drafts against the target model's distribution
at every drafted position, and emits the accepted drafts plus one token.

Request ``i`` with ``d`` drafts has ``d + 1`` rows of logits: row ``j`` scores the token after
the request's tokens plus drafts ``0..j-1``. Each row is processed exactly as the
:class:`~host.core.worker.sampler.Sampler` processes a plain row (allowed / bad words,
``min_tokens``, ``logit_bias``, penalties over the outputs *including the earlier drafts*, then
temperature, ``min_p``, ``top_k``, ``top_p``), so ``p_j`` is the distribution the plain path
would sample that token from.

- **Greedy** rows: draft ``j`` is accepted while it equals the argmax of row ``j``; at the first
  mismatch the argmax is emitted instead; when every draft is accepted the argmax of row ``d``
  (the bonus token) is emitted too. The tokens equal the plain path's.
- **Random** rows: draft ``x_j`` is accepted with probability ``min(1, p_j(x_j) / q_j(x_j))``.
  A proposer without a distribution (ngram, or any deterministic draft) has the one-hot
  ``q_j`` of its token, so the rule is "accept with probability ``p_j(x_j)``". At the first
  rejection a token is drawn from ``normalize(max(p_j - q_j, 0))``; when every draft is
  accepted the bonus token is drawn from ``p_d``. Whatever the drafts, each emitted token is
  distributed as the target's ``p`` (Leviathan et al., 2023).

Seeded requests draw from their own generator per position, seeded from (seed, the number of
tokens before that position) like the plain path's, so a seeded run reproduces whatever the
batch. Logprobs are those of the raw logits (as the plain path's), for each emitted token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from host.contracts.messages import TokenLogprobs
from host.core.worker.sampler import (
    LogprobsTensors,
    Sampler,
    SamplingMetadata,
    _inverse_cdf,
    apply_logits_processors,
    apply_min_p,
    gather_logprobs,
    make_metadata,
    seeded_generator,
)

_GREEDY_EPS = 1e-5


class DraftRow:
    """One row of logits of a drafted request as the sampler's metadata sees it: the request's
    state with the drafts before this position counted as outputs (penalties, bad words and
    ``min_tokens`` see them, as they would once accepted)."""

    __slots__ = ("state", "sampling_params", "output_token_ids", "prompt_token_ids", "eos_token_id")

    def __init__(self, state: Any, drafts_before: list[int]) -> None:
        self.state = state
        self.sampling_params = state.sampling_params
        self.output_token_ids = list(state.output_token_ids) + drafts_before if drafts_before else state.output_token_ids
        self.prompt_token_ids = state.prompt_token_ids
        self.eos_token_id = getattr(state, "eos_token_id", None)

    def allowed_mask(self, vocab: int) -> torch.Tensor:
        return self.state.allowed_mask(vocab)


@dataclass
class VerifyOutput:
    """Per request: the emitted tokens (accepted drafts + one; ``[]`` for a row that samples
    nothing), how many drafts were accepted, and the emitted tokens' logprobs (or None)."""

    token_ids: list[list[int]]
    num_accepted: list[int]
    logprobs: list[list[TokenLogprobs] | None]


def expand_rows(states: list[Any], drafts: list[list[int]]) -> list[DraftRow]:
    """``len(drafts[i]) + 1`` rows per request, in order."""
    rows: list[DraftRow] = []
    for state, d in zip(states, drafts):
        for j in range(len(d) + 1):
            rows.append(DraftRow(state, list(d[:j])))
    return rows


def row_generators(states: list[Any], drafts: list[list[int]], final: list[bool]) -> dict[int, torch.Generator]:
    """A generator per row of a seeded, random, final request, seeded from (seed, tokens
    generated before that row's token): the plain path's rule, per drafted position."""
    gens: dict[int, torch.Generator] = {}
    row = 0
    for state, d, is_final in zip(states, drafts, final):
        sp = state.sampling_params
        n_out = len(state.output_token_ids)
        for j in range(len(d) + 1):
            if is_final and sp.seed is not None and not sp.is_greedy:
                gens[row + j] = seeded_generator(hash((sp.seed, n_out + j)))
        row += len(d) + 1
    return gens


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                 top_p: torch.Tensor | None, min_p: torch.Tensor | None) -> torch.Tensor:
    """float32 [R, V]: the distribution the plain sampler draws each row from, given processed
    logits (:func:`apply_logits_processors` applied): softmax of ``logits / temperature`` after
    ``min_p``, ``top_k`` and then ``top_p`` of the top-k distribution (``host.core.worker.sampler.draw``)."""
    x = logits.float() / temperature[:, None].clamp(min=_GREEDY_EPS)
    if min_p is not None and bool((min_p > 0).any()):
        x = apply_min_p(x, min_p)
    if top_k is not None and bool((top_k > 0).any()):
        vocab = x.shape[-1]
        k = top_k.clamp(min=0, max=vocab)
        kth = x.topk(int(k.max()), dim=-1).values.gather(1, (k.clamp(min=1) - 1)[:, None])
        x = torch.where((k[:, None] > 0) & (x < kth), torch.full_like(x, float("-inf")), x)
    probs = torch.softmax(x, dim=-1)
    if top_p is not None and bool((top_p < 1.0).any()):
        values, ids = probs.sort(dim=-1, descending=True)
        before = values.cumsum(dim=-1) - values
        keep = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
        values = values.masked_fill(~keep, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, ids, values)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _uniform(gen: torch.Generator | None) -> float:
    return float(torch.rand(1, dtype=torch.float64, generator=gen))


class RejectionSampler:
    """Verifies drafts (see the module docstring) with the plain :class:`Sampler` for the
    draws (its device kernel included)."""

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.sampler = sampler or Sampler()

    def __call__(
        self,
        logits: torch.Tensor,
        states: list[Any],
        drafts: list[list[int]],
        final: list[bool],
        allowed: dict[int, torch.Tensor] | None = None,
        draft_probs: list[torch.Tensor | None] | None = None,
    ) -> VerifyOutput:
        """``logits``: ``sum(len(d) + 1)`` rows, request by request. ``final[i]``: whether
        request ``i``'s rows produce tokens (a prefill chunk short of the prompt's end does
        not). ``allowed``: a bool ``[rows, V]`` mask per request index, for its first ``rows``
        rows (the structured-output grammar at each drafted position). ``draft_probs[i]``: the
        proposer's q, float [len(drafts[i]), V], or None for one-hot drafts."""
        vocab = logits.shape[-1]
        rows = expand_rows(states, drafts)
        gens = row_generators(states, drafts, final)
        md = make_metadata(rows, vocab, generators=gens)
        counts = [len(d) + 1 for d in drafts]
        starts = [0] * len(drafts)
        for i in range(1, len(drafts)):
            starts[i] = starts[i - 1] + counts[i - 1]
        if allowed:
            mask = md.allowed_mask if md.allowed_mask is not None else torch.ones(len(rows), vocab, dtype=torch.bool)
            for i, m in allowed.items():
                mask[starts[i]: starts[i] + m.shape[0]] &= m
            md.allowed_mask = mask
        want_logprobs = md.max_num_logprobs
        md.max_num_logprobs = None
        if logits.device.type != "cpu":
            md = md.to(logits.device)
        logits = logits.float()
        raw = logits.log_softmax(dim=-1) if want_logprobs is not None else None
        processed = apply_logits_processors(logits, md)
        sampled = self.sampler.sample(processed, md).tolist()  # the plain draw of every row

        out_tokens: list[list[int]] = []
        num_accepted: list[int] = []
        random_req = [i for i, d in enumerate(drafts) if d and final[i] and not states[i].sampling_params.is_greedy]
        p_rows: dict[int, torch.Tensor] = {}
        if random_req:
            idx = [starts[i] + j for i in random_req for j in range(len(drafts[i]))]
            sel = torch.tensor(idx, dtype=torch.int64, device=processed.device)
            pick = lambda t: None if t is None else t.index_select(0, sel)  # noqa: E731
            probs = target_probs(processed.index_select(0, sel), md.temperature.to(processed.device).index_select(0, sel),
                                 pick(md.top_k), pick(md.top_p), pick(md.min_p)).cpu()
            p_rows = {r: probs[n] for n, r in enumerate(idx)}
        for i, d in enumerate(drafts):
            if not final[i]:
                out_tokens.append([])
                num_accepted.append(0)
                continue
            s = starts[i]
            if not d:
                out_tokens.append([sampled[s]])
                num_accepted.append(0)
                continue
            if states[i].sampling_params.is_greedy:
                a = 0
                while a < len(d) and d[a] == sampled[s + a]:
                    a += 1
                out_tokens.append(list(d[:a]) + [sampled[s + a]])
                num_accepted.append(a)
                continue
            q = draft_probs[i] if draft_probs is not None else None
            a, last = len(d), None
            for j, x in enumerate(d):
                p = p_rows[s + j]
                qx = float(q[j, x]) if q is not None else 1.0
                ratio = 1.0 if qx <= 0 else min(1.0, float(p[x]) / qx)
                if _uniform(gens.get(s + j)) < ratio:
                    continue
                residual = (p - q[j].to(p)).clamp(min=0) if q is not None else p.clone()
                if q is None:
                    residual[x] = 0.0
                if float(residual.sum()) <= 0:
                    residual = p.clone()  # p == q: any draw from p is exact
                u = torch.tensor([_uniform(gens.get(s + j))], dtype=torch.float64)
                last = int(_inverse_cdf(residual[None, :], u)[0])
                a = j
                break
            if last is None:
                last = sampled[s + len(d)]  # every draft accepted: the bonus token, drawn from p_d
            out_tokens.append(list(d[:a]) + [last])
            num_accepted.append(a)

        logprobs: list[list[TokenLogprobs] | None] = [None] * len(drafts)
        if raw is not None:
            want = [i for i, toks in enumerate(out_tokens) if toks and states[i].sampling_params.logprobs is not None]
            if want:
                idx = [starts[i] + j for i in want for j in range(len(out_tokens[i]))]
                tok = [t for i in want for t in out_tokens[i]]
                sel = torch.tensor(idx, dtype=torch.int64, device=raw.device)
                lp = gather_logprobs(raw.index_select(0, sel), want_logprobs, torch.tensor(tok, device=raw.device))
                lp = LogprobsTensors(lp.token_ids.cpu(), lp.logprobs.cpu(), lp.ranks.cpu())
                n = 0
                for i in want:
                    k = states[i].sampling_params.logprobs
                    logprobs[i] = [lp.row(n + j, k) for j in range(len(out_tokens[i]))]
                    n += len(out_tokens[i])
        return VerifyOutput(out_tokens, num_accepted, logprobs)


__all__ = ["DraftRow", "RejectionSampler", "SamplingMetadata", "VerifyOutput", "expand_rows", "target_probs"]
