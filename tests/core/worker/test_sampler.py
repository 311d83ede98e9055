"""The batch sampler against exact distributions and reference formulas.

Statistical tests draw many rows in one batched call and compare the counts with the
distribution computed straight from the logits (chi-square at p = 0.001). Each also checks
that the same counts are rejected against a plausible wrong distribution, so the sample is
big enough to catch a wrong implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from host.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from host.core.worker.sampler import Sampler, apply_logits_processors, make_metadata

VOCAB = 12


@dataclass
class Row:
    """What the model runner keeps per request, as far as the sampler reads it."""

    sampling_params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2])
    eos_token_id: int | None = 0

    def allowed_mask(self, vocab: int) -> torch.Tensor:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[self.sampling_params.allowed_token_ids] = True
        return mask


def sample(logits: torch.Tensor, rows: list[Row]):
    return Sampler()(logits, make_metadata(rows, logits.shape[-1]))


def base_logits(seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper p = 0.001 point of chi-square (Wilson-Hilferty approximation)."""
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    n = counts.sum()
    support = probs > 0
    assert int(counts[~support].sum()) == 0, "a token outside the allowed set was drawn"
    expected = n * probs[support]
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


# reference distributions, written the obvious way (full sort, no shortcuts)
def ref_probs(logits: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> torch.Tensor:
    x = logits.double() / temperature
    p = x.softmax(-1)
    if min_p > 0:
        x = torch.where(p < min_p * p.max(), torch.tensor(-math.inf, dtype=x.dtype), x)
    order = x.argsort(descending=True)
    keep = torch.zeros_like(x, dtype=torch.bool)
    kk = top_k if top_k > 0 else x.numel()
    keep[order[:kk]] = True
    x = torch.where(keep, x, torch.tensor(-math.inf, dtype=x.dtype))
    if top_p < 1.0:
        p = x.softmax(-1)
        sp = p[order]
        before = sp.cumsum(0) - sp
        drop = order[before >= top_p]
        x[drop] = -math.inf
    return x.softmax(-1)


CASES = {
    "temperature": (dict(temperature=0.7), dict(temperature=1.0)),
    "top_k": (dict(temperature=1.3, top_k=4), dict(temperature=1.3, top_k=5)),
    "top_p": (dict(top_p=0.75), dict(top_p=0.9)),
    "min_p": (dict(temperature=0.9, min_p=0.1), dict(temperature=0.9, min_p=0.02)),
    "top_k_top_p": (dict(temperature=1.1, top_k=6, top_p=0.8), dict(temperature=1.1, top_p=0.8)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sampling_follows_the_exact_distribution(case):
    params, wrong = CASES[case]
    logits = base_logits(seed=len(case))
    n = 30000
    torch.manual_seed(123)
    out = sample(logits.repeat(n, 1), [Row(SamplingParams(**params))] * n).sampled_token_ids
    counts = torch.bincount(out, minlength=VOCAB).double()
    stat, df = chi2(counts, ref_probs(logits, **params))
    assert stat < chi2_critical(df), f"{case}: chi2={stat:.1f} with {df} dof"
    wrong_probs = ref_probs(logits, **wrong)
    if bool((counts[wrong_probs == 0] > 0).any()):
        return  # the wrong distribution cannot even produce these samples
    stat_wrong, df_wrong = chi2(counts, wrong_probs)
    assert stat_wrong > chi2_critical(df_wrong), "the sample is too small to tell a wrong implementation"


def test_top_p_nucleus_larger_than_the_candidate_set_falls_back_to_a_full_sort():
    vocab = 5000  # flat rows: the 0.9 nucleus holds ~4500 tokens, more than the 1024 candidates
    flat = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 0.05
    peaked = torch.randn(vocab, generator=torch.Generator().manual_seed(2)) * 6
    logits = torch.stack([flat, peaked] * 200)
    torch.manual_seed(0)
    out = sample(logits, [Row(SamplingParams(top_p=0.9))] * 400).sampled_token_ids
    flat_ok, peaked_ok = ref_probs(flat, top_p=0.9) > 0, ref_probs(peaked, top_p=0.9) > 0
    assert bool(flat_ok[out[0::2]].all()) and bool(peaked_ok[out[1::2]].all())
    top1024 = set(flat.topk(1024).indices.tolist())
    assert sum(t not in top1024 for t in out[0::2].tolist()) > 100  # most draws lie beyond them
    assert int(peaked_ok.sum()) < 1024


def test_greedy_and_random_rows_mix():
    logits = torch.stack([base_logits(i) for i in range(4)])
    rows = [Row(SamplingParams(temperature=0.0)), Row(SamplingParams(temperature=1.0)),
            Row(SamplingParams(temperature=1e-6)), Row(SamplingParams(temperature=2.0, top_k=3))]
    for seed in range(5):
        torch.manual_seed(seed)
        out = sample(logits, rows).sampled_token_ids
        assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
        assert int(out[3]) in logits[3].topk(3).indices.tolist()


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.stack([base_logits(i) for i in range(4)])
    rows = [Row(SamplingParams(top_k=1)), Row(SamplingParams(top_p=1e-6))] * 2
    for _ in range(5):
        assert sample(logits, rows).sampled_token_ids.tolist() == logits.argmax(-1).tolist()


def test_seeded_rows_reproduce_whatever_the_batch():
    from host.core.worker.sampler import seeded_generator

    logits = torch.stack([base_logits(i) for i in range(3)])
    seeded = Row(SamplingParams(temperature=1.0, seed=42))
    md_alone = make_metadata([seeded], VOCAB, generators={0: seeded_generator(42)})
    alone = Sampler()(logits[1:2], md_alone).sampled_token_ids
    rows = [Row(SamplingParams(temperature=0.7)), seeded, Row(SamplingParams(temperature=0.0))]
    for _ in range(3):
        md = make_metadata(rows, VOCAB, generators={1: seeded_generator(42)})
        assert Sampler()(logits, md).sampled_token_ids[1] == alone[0]


# -- processors --------------------------------------------------------------------------------


def test_penalties_match_the_reference_formula():
    logits = torch.stack([base_logits(7), base_logits(8)])
    sp = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.4)
    rows = [Row(sp, output_token_ids=[3, 3, 5], prompt_token_ids=[1, 5, 9]), Row(SamplingParams())]
    got = apply_logits_processors(logits.clone(), make_metadata(rows, VOCAB))
    want = logits.clone()
    for tok in {1, 5, 9, 3}:  # repetition: prompt and output tokens
        v = want[0, tok]
        want[0, tok] = v / 1.4 if v > 0 else v * 1.4
    counts = {3: 2, 5: 1}
    for tok, c in counts.items():
        want[0, tok] -= 0.3 * c + 0.5
    torch.testing.assert_close(got, want)


def test_penalties_come_before_temperature():
    logits = base_logits(3).unsqueeze(0)
    a = apply_logits_processors(logits.clone(), make_metadata([Row(SamplingParams(frequency_penalty=1.0, temperature=0.5), [4])], VOCAB))
    b = apply_logits_processors(logits.clone(), make_metadata([Row(SamplingParams(frequency_penalty=1.0, temperature=2.0), [4])], VOCAB))
    torch.testing.assert_close(a, b)  # the same penalty whatever the temperature


def test_logit_bias_min_tokens_allowed_ids_and_bad_words_act_before_greedy():
    logits = base_logits(5).unsqueeze(0)
    top = int(logits.argmax())
    other = (top + 1) % VOCAB
    biased = sample(logits, [Row(SamplingParams(temperature=0, logit_bias={other: 100}))]).sampled_token_ids
    assert int(biased[0]) == other
    # min_tokens: EOS (id 0 here) and stop ids masked while fewer outputs exist
    eos_logits = logits.clone()
    eos_logits[0, 0] = 50
    eos_logits[0, 1] = 49
    row = Row(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1]), output_token_ids=[7])
    assert int(sample(eos_logits, [row]).sampled_token_ids[0]) not in (0, 1)
    row_done = Row(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1]), output_token_ids=[7, 7])
    assert int(sample(eos_logits, [row_done]).sampled_token_ids[0]) == 0
    # whitelist
    allowed = [2, 6]
    for _ in range(20):
        assert int(sample(logits, [Row(SamplingParams(allowed_token_ids=allowed))]).sampled_token_ids[0]) in allowed
    # bad words: a one-token word is always banned; a two-token word only after its prefix
    sp = SamplingParams(temperature=0)
    sp.bad_words_token_ids = [[top], [9, other]]
    out = sample(logits, [Row(sp, output_token_ids=[3])]).sampled_token_ids
    assert int(out[0]) != top
    logits2 = logits.clone()
    logits2[0, other] = 80
    assert int(sample(logits2, [Row(sp, output_token_ids=[3])]).sampled_token_ids[0]) == other
    assert int(sample(logits2, [Row(sp, output_token_ids=[3, 9])]).sampled_token_ids[0]) != other


def test_logprobs_are_of_the_raw_distribution_with_ranks():
    logits = base_logits(11).unsqueeze(0)
    raw = logits.log_softmax(-1)
    top = int(logits.argmax())
    other = int(logits.argsort(descending=True)[0, 4])
    out = sample(logits, [Row(SamplingParams(temperature=0, logprobs=3, logit_bias={other: 100}))])
    assert int(out.sampled_token_ids[0]) == other
    lp = out.logprobs
    assert lp.token_ids[0, 0] == other and int(lp.ranks[0]) == 5
    torch.testing.assert_close(lp.logprobs[0, 0], raw[0, other])
    assert lp.token_ids[0, 1:].tolist() == raw[0].topk(3).indices.tolist()
    assert int(lp.token_ids[0, 1]) == top
    torch.testing.assert_close(lp.logprobs[0, 1:], raw[0].topk(3).values)


# -- parameter validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field_name",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(n=0), "n"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
        (dict(logprobs=-2), "logprobs"),  # above --max-logprobs: tests/core/test_sampling_params_limits.py
        (dict(prompt_logprobs=-2), "prompt_logprobs"),
        (dict(logit_bias={"x": 1}), "logit_bias"),
        (dict(logit_bias={3: 101}), "logit_bias"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(bad_words=[""]), "bad_words"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(seed="x"), "seed"),
        (dict(structured_outputs={"json": {}, "regex": "a"}), "structured_outputs"),
        (dict(structured_outputs={"choice": []}), "structured_outputs"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field_name):
    with pytest.raises(ValueError, match=field_name):
        SamplingParams(**kwargs)


def test_token_ids_are_checked_against_the_vocabulary():
    for kwargs, name in [(dict(logit_bias={500: 1.0}), "logit_bias"), (dict(allowed_token_ids=[1, 999]), "allowed_token_ids"),
                         (dict(stop_token_ids=[400]), "stop_token_ids")]:
        with pytest.raises(ValueError, match=f"{name}.*vocabulary"):
            SamplingParams(**kwargs).verify(300)
    SamplingParams(logit_bias={"12": -5}).verify(300)  # JSON keys are strings


def test_structured_outputs_params():
    assert StructuredOutputsParams(json='{"type": "object"}').json == {"type": "object"}
    assert StructuredOutputsParams(choice=["a", "b"]).kind == "choice"
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    with pytest.raises(ValueError, match="not valid JSON"):
        StructuredOutputsParams(json="{nope")
