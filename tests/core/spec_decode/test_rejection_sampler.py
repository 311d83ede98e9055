"""The rejection sampler against its definition (vLLM's three cases, plus masking):

- greedy: drafts accepted while they equal the argmax, the argmax at the first mismatch, the
  bonus token when all are accepted, empty drafts, a mixed batch;
- seeded requests reproduce, whatever the batch around them;
- the emitted tokens follow the target distribution (chi-square on a vocabulary of 10), with
  one-hot drafts (ngram) and with a draft distribution q (min(1, p/q) and the residual);
- top-k / top-p / allowed tokens: a masked token is never emitted, a masked draft is always
  rejected; the penalties see the drafts before each position;
- logprobs are those of the raw logits at each emitted position.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from host import SamplingParams
from host.core.spec_decode.worker.rejection_sampler import DraftRow, RejectionSampler, target_probs
from host.core.worker.input_batch import CachedRequestState
from host.core.worker.sampler import make_metadata

V = 10


def state(i: int = 0, outputs: list[int] | None = None, **params) -> CachedRequestState:
    return CachedRequestState(req_id=f"r{i}", prompt_token_ids=[1, 2, 3], sampling_params=SamplingParams(**params),
                              block_ids=[], num_computed_tokens=0, output_token_ids=list(outputs or []))


def onehot_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """Rows whose argmax is each token."""
    x = torch.zeros(len(tokens), vocab)
    x[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return x


@pytest.mark.parametrize(
    "drafts, argmax, want, accepted",
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),  # all accepted: bonus 4
        ([1, 5, 3], [1, 2, 3, 4], [1, 2], 1),  # first mismatch at 1: its argmax
        ([7, 2], [1, 2, 3], [1], 0),  # the first draft rejected
        ([], [6], [6], 0),  # no drafts: the plain token
    ],
)
def test_greedy(drafts, argmax, want, accepted):
    out = RejectionSampler()(onehot_logits(argmax), [state(temperature=0.0)], [drafts], [True])
    assert out.token_ids == [want]
    assert out.num_accepted == [accepted]


def test_greedy_mixed_batch_and_a_non_final_row():
    drafts = [[1, 2], [], [4, 4, 4], [9]]
    argmax = [[1, 2, 8], [5], [4, 3, 0, 0], [0, 0]]
    states = [state(i, temperature=0.0) for i in range(4)]
    logits = onehot_logits([t for a in argmax for t in a])
    out = RejectionSampler()(logits, states, drafts, [True, True, True, False])
    assert out.token_ids == [[1, 2, 8], [5], [4, 3], []]
    assert out.num_accepted == [2, 0, 1, 0]


def test_seeded_requests_reproduce_whatever_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, V)
    sampler = RejectionSampler()
    one = [sampler(logits, [state(0, temperature=1.0, seed=42)], [[3, 4]], [True]).token_ids[0] for _ in range(3)]
    assert one[0] == one[1] == one[2]
    other = torch.randn(2, V)
    mixed = sampler(torch.cat([other, logits]), [state(1, temperature=1.0), state(0, temperature=1.0, seed=42)],
                    [[5], [3, 4]], [True, True])
    assert mixed.token_ids[1] == one[0]
    seeds = {tuple(sampler(logits, [state(0, temperature=1.0, seed=s)], [[3, 4]], [True]).token_ids[0]) for s in range(40)}
    assert len(seeds) > 1  # the seed matters


def chi2_fits(counts: np.ndarray, probs: np.ndarray, z: float = 3.09) -> bool:
    """Pearson's chi-square test at p = 0.001 (z = 3.09; the Wilson-Hilferty quantile of the
    chi-square distribution): whether ``counts`` may come from ``probs``."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was emitted"
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    statistic = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    critical = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
    return statistic < critical


@pytest.mark.parametrize("with_q", [False, True])
def test_emitted_tokens_follow_the_target_distribution(with_q):
    """Every emitted position is distributed as p, whatever q drew the drafts; a wrong rule
    (accepting with q, or resampling from p on rejection) fails this (the distance-ratio check
    below shows the test has the power to see it)."""
    gen = torch.Generator().manual_seed(1)
    n, k = 2000, 2
    target_logits = torch.randn(V, generator=gen) * 1.5
    p = torch.softmax(target_logits, dim=-1)
    q = torch.softmax(torch.randn(V, generator=gen) * 1.5, dim=-1)  # the draft distribution
    drafts = torch.multinomial(q, n * k, replacement=True, generator=gen).view(n, k).tolist()
    logits = target_logits.repeat(n * (k + 1), 1)
    states = [state(i, temperature=1.0) for i in range(n)]
    qs = [q.repeat(k, 1) for _ in range(n)] if with_q else None
    torch.manual_seed(2)
    out = RejectionSampler()(logits, states, drafts, [True] * n, draft_probs=qs)
    first = np.bincount([t[0] for t in out.token_ids], minlength=V)
    second = np.bincount([t[1] for t in out.token_ids if len(t) > 1], minlength=V)
    pn = p.numpy().astype(np.float64)
    assert chi2_fits(first, pn)
    assert second.sum() > 100 and chi2_fits(second, pn)
    # power: the empirical distribution is much closer to p than to q
    emp = first / first.sum()
    assert np.abs(emp - pn).sum() < 0.25 * np.abs(emp - q.numpy()).sum()
    assert 0 < sum(out.num_accepted) < n * k  # both acceptance and rejection happened


def test_top_k_top_p_and_allowed_tokens_are_never_emitted():
    torch.manual_seed(3)
    logits = torch.randn(1, V).repeat(4, 1)
    order = logits[0].argsort(descending=True).tolist()
    st = state(temperature=1.0, top_k=3)
    probs = target_probs(logits[:1], torch.ones(1), torch.tensor([3]), None, None)[0]
    assert set(torch.nonzero(probs).squeeze(1).tolist()) == set(order[:3])
    probs = target_probs(logits[:1], torch.ones(1), None, torch.tensor([0.5]), None)[0]
    kept = torch.nonzero(probs).squeeze(1).tolist()
    assert order[0] in kept and len(kept) < V
    sampler = RejectionSampler()
    masked = order[5]  # outside the top 3: always rejected, never emitted
    for _ in range(50):
        out = sampler(logits, [st], [[masked, masked, masked]], [True])
        assert out.num_accepted == [0] and out.token_ids[0][0] in order[:3]
    st_allowed = state(temperature=1.0, allowed_token_ids=[order[-1], order[-2]])
    for _ in range(20):
        out = sampler(logits[:2], [st_allowed], [[order[0]]], [True])
        assert out.num_accepted == [0] and out.token_ids[0][0] in (order[-1], order[-2])


def test_penalties_see_the_drafts_before_each_position():
    st = state(outputs=[4], temperature=0.0, frequency_penalty=2.0)
    rows = [DraftRow(st, [5, 6][:j]) for j in range(3)]
    md = make_metadata(rows, V)
    assert md.output_token_ids == [[4], [4, 5], [4, 5, 6]]
    # greedy: every row prefers token 5 slightly, the penalty on an accepted 5 moves row 1 to 7
    logits = torch.zeros(3, V)
    logits[:, 5] = 1.0
    logits[:, 7] = 0.5
    out = RejectionSampler()(logits, [st], [[5, 5]], [True])
    assert out.token_ids == [[5, 7]]


def test_logprobs_of_each_emitted_token_are_the_raw_ones():
    torch.manual_seed(4)
    logits = torch.randn(3, V)
    argmax = logits.argmax(dim=-1).tolist()
    st = state(temperature=0.0, logprobs=2)
    out = RejectionSampler()(logits, [st], [[argmax[0], (argmax[1] + 1) % V]], [True])
    assert out.token_ids == [[argmax[0], argmax[1]]]
    raw = logits.log_softmax(dim=-1)
    for j, lp in enumerate(out.logprobs[0]):
        assert lp.token_ids[0] == argmax[j] and lp.rank == 1
        assert lp.logprobs[0] == pytest.approx(float(raw[j, argmax[j]]), abs=1e-6)
        assert len(lp.token_ids) == 3
