"""The batch sampler: greedy rows, seeded random rows, top-k / top-p truncation, mixed batches."""

from __future__ import annotations

import torch

from host.core.sampler import Sampler
from host.core.sampling_params import SamplingParams


def logits_batch(rows: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = logits_batch()
    out = Sampler()(logits, [SamplingParams(temperature=0.0)] * 4, [[]] * 4)
    assert out.tolist() == logits.argmax(-1).tolist()


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = logits_batch()
    params = [SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.0, top_p=1e-6)] * 2
    for _ in range(5):
        assert Sampler()(logits, params, [[]] * 4).tolist() == logits.argmax(-1).tolist()


def test_seeded_rows_reproduce_whatever_the_batch():
    logits = logits_batch(rows=3)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler()(logits[1:2], [seeded], [[]])
    mixed = Sampler()(logits, [SamplingParams(temperature=0.7), seeded, SamplingParams(temperature=0.0)], [[]] * 3)
    assert mixed[1] == alone[0]
    assert mixed[2] == logits[2].argmax()


def test_top_k_keeps_samples_inside_the_k_best():
    logits = logits_batch(rows=1, vocab=20)
    top3 = set(logits[0].topk(3).indices.tolist())
    params = [SamplingParams(temperature=2.0, top_k=3)]
    draws = {int(Sampler()(logits, params, [[]])[0]) for _ in range(200)}
    assert draws <= top3 and len(draws) > 1


def test_temperature_sampling_follows_the_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    probs = torch.softmax(logits[0], -1)
    counts = torch.zeros(3)
    sampler = Sampler()
    torch.manual_seed(0)
    n = 4000
    for _ in range(n):
        counts[int(sampler(logits, [SamplingParams(temperature=1.0)], [[]])[0])] += 1
    chi2 = float((((counts - n * probs) ** 2) / (n * probs)).sum())
    assert chi2 < 13.8  # 2 degrees of freedom, p = 0.001
