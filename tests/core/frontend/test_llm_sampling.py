"""Sampling features through the whole engine: logprobs and prompt logprobs against Hugging Face
transformers, seeded reproducibility across batch mixes, n > 1 sharing the prompt's blocks."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import hf_model
from host import LLM, SamplingParams

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=400, max_position_embeddings=256, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", seed=99, lm_head_scale=4, **TINY)  # a peakier distribution than the default init
    return str(path), hf_model(path)


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 400) for _ in range(n)] for n in lengths]


def blocks_free(llm):
    m = llm.engine.kv_cache_manager
    return m.block_pool.get_num_free_blocks() == m.num_blocks - 1 and not m.req_to_blocks


def test_logprobs_and_prompt_logprobs_match_transformers(tiny):
    path, hf = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, max_num_batched_tokens=8, max_num_seqs=4)
    ps = prompts([13, 5, 20])
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=4, prompt_logprobs=3)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params)  # chunked: 8 tokens per step
    for p, out in zip(ps, outs):
        comp = out.outputs[0]
        full = p + comp.token_ids
        with torch.inference_mode():
            ref = hf(torch.tensor([full])).logits[0].float().log_softmax(-1)
        # sampled tokens: position len(p) - 1 + j predicts output token j
        assert len(comp.logprobs) == len(comp.token_ids)
        total = 0.0
        for j, (tok, pos) in enumerate(zip(comp.token_ids, comp.logprobs)):
            row = ref[len(p) - 1 + j]
            assert pos[tok].logprob == pytest.approx(float(row[tok]), abs=1e-3)
            assert pos[tok].rank == int((row > row[tok]).sum()) + 1
            assert set(pos) >= set(row.topk(4).indices.tolist())
            for t, lp in pos.items():
                assert lp.logprob == pytest.approx(float(row[t]), abs=1e-3)
            total += pos[tok].logprob
        assert comp.cumulative_logprob == pytest.approx(total, abs=1e-3)
        # prompt: None for the first token, then position i - 1 scores prompt token i
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(p)
        for i in range(1, len(p)):
            pos = out.prompt_logprobs[i]
            row = ref[i - 1]
            assert pos[p[i]].logprob == pytest.approx(float(row[p[i]]), abs=1e-3)
            assert pos[p[i]].rank == int((row > row[p[i]]).sum()) + 1
            top = row.topk(3).indices.tolist()
            assert set(pos) == set(top) | {p[i]}
    assert blocks_free(llm)


def test_prompt_logprobs_skip_the_prefix_cache(tiny):
    path, _ = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=4)
    p = prompts([17])[0]
    llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=1))
    out = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert out[0].num_cached_tokens == 0 and len(out[0].prompt_logprobs) == len(p)


def test_seeded_requests_reproduce_across_batch_mixes(tiny):
    path, _ = tiny
    target = prompts([9], seed=5)[0]
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = LLM(path, skip_tokenizer_init=True, max_model_len=128).generate([{"prompt_token_ids": target}], seeded)
    # other random requests, a different batch size and chunked prefill this time
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, max_num_batched_tokens=8, max_num_seqs=3)
    others = [{"prompt_token_ids": p} for p in prompts([15, 3, 11], seed=8)]
    params = [SamplingParams(max_tokens=7, temperature=0.8, ignore_eos=True)] * 3
    mixed = llm.generate(others[:2] + [{"prompt_token_ids": target}] + others[2:], params[:2] + [seeded] + params[2:])
    assert mixed[2].outputs[0].token_ids == alone[0].outputs[0].token_ids
    unseeded = [llm.generate([{"prompt_token_ids": target}], SamplingParams(max_tokens=12, ignore_eos=True))[0].outputs[0].token_ids for _ in range(3)]
    assert len({tuple(u) for u in unseeded}) > 1, "without a seed, samples differ"


def test_parallel_sampling_shares_the_prompt_blocks(tiny):
    path, _ = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=4)
    p = prompts([21], seed=3)[0]  # 5 full blocks
    params = SamplingParams(n=4, max_tokens=10, temperature=1.0, seed=7, ignore_eos=True, logprobs=0)
    out = llm.generate([{"prompt_token_ids": p}], params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 10 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "the samples differ"
    # samples 1..3 found the 5 full prompt blocks sample 0 computed in the same step
    assert llm.engine.kv_cache_manager.prefix_cache_stats.hits == 3 * 20
    again = llm.generate([{"prompt_token_ids": p}], params)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert all(len(c.logprobs) == 10 and all(len(pos) == 1 for pos in c.logprobs) for c in out.outputs)
    assert blocks_free(llm)


def test_bad_request_is_refused_before_it_runs(tiny):
    path, _ = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64)
    with pytest.raises(ValueError, match="logit_bias.*vocabulary"):
        llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(logit_bias={4000: 3.0}))
    with pytest.raises(ValueError, match="bad_words needs a tokenizer"):
        llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(bad_words=["x"]))
    assert blocks_free(llm) and not llm.engine.scheduler.requests


def test_min_tokens_holds_back_a_stop_token_the_model_wants(tiny):
    path, _ = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64)
    p = prompts([6], seed=11)[0]
    free = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    first = free[0].outputs[0].token_ids[0]
    stopped = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[first]))
    assert stopped[0].outputs[0].token_ids == [first] and stopped[0].outputs[0].finish_reason == "stop"
    assert stopped[0].outputs[0].stop_reason == first
    held = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[first], min_tokens=3))
    ids = held[0].outputs[0].token_ids
    assert len(ids) >= 3 and first not in ids[:3]
    assert blocks_free(llm)
