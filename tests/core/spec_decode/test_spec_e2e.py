"""Speculative decoding (ngram) through the whole engine on tiny llama checkpoints, against the
same engine without speculation (itself equal to transformers, tests/core/frontend) and
transformers directly:

- greedy: 32 prompts with repetitive token patterns (so ngram proposes and most drafts are
  accepted): identical tokens to the plain engine and to transformers, with prefix caching and
  chunked prefill on, and under preemption; the pool is all free afterwards;
- stop conditions inside an accepted run: max_tokens, EOS and stop token ids end at the right
  token (the same tokens and finish reasons as the plain engine);
- logprobs of the emitted tokens equal the plain engine's;
- seeded sampling reproduces, and its tokens follow the target distribution (chi-square
  against transformers' exact marginals on a vocabulary of 16);
- bad configurations are refused at start with the reason.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
# chunked prefill (48-token budget: long prompts take several steps, drafts get trimmed) and the prefix cache
ENGINE = dict(skip_tokenizer_init=True, max_model_len=128, max_num_batched_tokens=48, max_num_seqs=16)
MAX_NEW = 16


def repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 512) for _ in range(16)]  # a full shared block: prefix-cache hits
    out = []
    for i in range(n):
        pattern = [rng.randrange(3, 512) for _ in range(rng.randrange(2, 7))]
        body = (pattern * 12)[: rng.randrange(8, 48)]
        out.append((shared if i % 4 == 0 else []) + body)
    return out


PROMPTS = repetitive_prompts(32)


def assert_pool_free(llm: LLM) -> None:
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
    assert not manager.req_to_blocks


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Any]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert_pool_free(llm)
    return [o.outputs[0] for o in outs]


def spec_totals(llm: LLM) -> dict[str, Any]:
    return llm.engine.scheduler.feature("spec_decode").totals()


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return str(tiny_checkpoint("llama", seed=1234, **TINY))


@pytest.fixture(scope="module")
def base(checkpoint):
    return LLM(checkpoint, **ENGINE)


@pytest.fixture(scope="module")
def spec(checkpoint):
    return LLM(checkpoint, speculative_config=NGRAM, **ENGINE)


@pytest.fixture(scope="module")
def greedy_base(base):
    return generate(base, PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True))


def test_greedy_tokens_equal_the_plain_engine_and_transformers(spec, greedy_base, checkpoint):
    before = spec_totals(spec)
    got = generate(spec, PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in got] == [o.token_ids for o in greedy_base]
    hf = hf_model(checkpoint)
    for p, o in list(zip(PROMPTS, got))[:4]:
        assert o.token_ids == hf_greedy(hf, p, MAX_NEW)
    after = spec_totals(spec)
    drafted = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    assert drafted > 150 and accepted > 0.5 * drafted, (drafted, accepted)  # speculation really ran
    assert spec.engine.kv_cache_manager.prefix_cache_stats.hits > 0


def test_greedy_under_preemption(checkpoint, greedy_base):
    # 24 usable blocks of 4 tokens: eight requests of up to ~80 tokens cannot all fit
    llm = LLM(checkpoint, speculative_config=NGRAM, **{**ENGINE, "block_size": 4, "num_gpu_blocks_override": 25, "max_num_seqs": 8})
    got = generate(llm, PROMPTS[:12], SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in got] == [o.token_ids for o in greedy_base[:12]]
    assert llm.engine.scheduler.num_preemptions > 0


def test_max_tokens_and_stop_token_ids_inside_an_accepted_run(spec, base, greedy_base):
    lengths = [3 + i % 11 for i in range(len(PROMPTS))]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    got = generate(spec, PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids[:n] for o, n in zip(greedy_base, lengths)]
    assert all(o.finish_reason == "length" for o in got)
    # each request's stop token is its 7th greedy token (inside the runs ngram repeats)
    params = [SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, stop_token_ids=[o.token_ids[6]])
              for o in greedy_base]
    want = generate(base, PROMPTS, params)
    got = generate(spec, PROMPTS, params)
    assert [(o.token_ids, o.finish_reason, o.stop_reason) for o in got] == [
        (o.token_ids, o.finish_reason, o.stop_reason) for o in want]
    assert all(o.finish_reason == "stop" and len(o.token_ids) <= 7 for o in got)


def test_eos_inside_an_accepted_run(tiny_checkpoint, base, greedy_base):
    eos = Counter(t for o in greedy_base for t in o.token_ids[4:]).most_common(1)[0][0]
    path = tiny_checkpoint("llama", seed=1234, eos_token_id=eos, **TINY)  # the same weights, another EOS
    llm = LLM(str(path), speculative_config=NGRAM, **ENGINE)
    got = generate(llm, PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
    want = generate(base, PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, stop_token_ids=[eos]))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    assert sum(o.token_ids[-1] == eos and o.finish_reason == "stop" for o in got) >= 2


def test_logprobs_of_the_emitted_tokens_equal_the_plain_engines(spec, base):
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)
    want = generate(base, PROMPTS[:8], params)
    got = generate(spec, PROMPTS[:8], params)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for gp, wp in zip(g.logprobs, w.logprobs):
            assert gp.keys() == wp.keys()
            for t in gp:
                assert gp[t].rank == wp[t].rank
                assert gp[t].logprob == pytest.approx(wp[t].logprob, abs=1e-4)


def test_seeded_sampling_reproduces(spec):
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=100 + i) for i in range(8)]
    a = generate(spec, PROMPTS[:8], params)
    b = generate(spec, PROMPTS[:8][::-1], params[::-1])[::-1]  # another batch order
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def _marginals(hf: Any, prompt: list[int], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact distributions of the 2nd and 3rd sampled tokens (temperature 1), by enumeration."""
    with torch.inference_mode():
        p0 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1)
        one = torch.tensor([prompt + [x] for x in range(vocab)])
        p1 = torch.softmax(hf(one).logits[:, -1].double(), -1)  # [x0, x1]
        two = torch.tensor([prompt + [x, y] for x in range(vocab) for y in range(vocab)])
        p2 = torch.softmax(hf(two).logits[:, -1].double(), -1).view(vocab, vocab, vocab)
    joint01 = p0[:, None] * p1
    m1 = joint01.sum(0)
    m2 = (joint01[:, :, None] * p2).sum((0, 1))
    return m1.numpy(), m2.numpy()


def _chi2_fits(counts: np.ndarray, probs: np.ndarray, z: float = 3.09) -> bool:
    """Pearson's chi-square at p = 0.001 (Wilson-Hilferty quantile), cells of small expectation merged."""
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    statistic = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return statistic < df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def test_sampling_follows_the_target_distribution(tiny_checkpoint):
    vocab, n = 16, 1200
    path = tiny_checkpoint("llama", seed=7, lm_head_scale=3.0, **{**TINY, "vocab_size": vocab})
    config = {**NGRAM, "num_speculative_tokens": 3, "auto_off_threshold": 0.0}
    llm = LLM(str(path), speculative_config=config, skip_tokenizer_init=True, max_model_len=64, max_num_seqs=256,
              max_num_batched_tokens=2048)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]
    params = [SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True, seed=s) for s in range(n)]
    got = generate(llm, [prompt] * n, params)
    totals = spec_totals(llm)
    assert totals.num_accepted_tokens > 100 and totals.num_draft_tokens > totals.num_accepted_tokens
    m1, m2 = _marginals(hf_model(path), prompt, vocab)
    c1 = np.bincount([o.token_ids[1] for o in got], minlength=vocab)
    c2 = np.bincount([o.token_ids[2] for o in got], minlength=vocab)
    assert _chi2_fits(c1, m1) and _chi2_fits(c2, m2)


def test_bad_configurations_are_refused(checkpoint):
    with pytest.raises(ValueError, match="unknown keys.*known keys"):
        LLM(checkpoint, skip_tokenizer_init=True, speculative_config={"method": "ngram", "k": 4})
    with pytest.raises(ValueError, match="is not one of ngram, draft_model, eagle"):
        LLM(checkpoint, skip_tokenizer_init=True, speculative_config={"method": "medusa"})
    with pytest.raises(ValueError, match="--async-scheduling"):
        LLM(checkpoint, skip_tokenizer_init=True, speculative_config=NGRAM, async_scheduling=True)


def test_auto_off_threshold_default_and_override(spec, checkpoint):
    assert spec.engine.config.speculative.auto_off_threshold == 0.2
    llm = LLM(checkpoint, skip_tokenizer_init=True, speculative_config={**NGRAM, "auto_off_threshold": 0.1})
    assert llm.engine.config.speculative.auto_off_threshold == 0.1
