"""End-to-end greedy generation through the whole engine (scheduler, KV cache manager, model
runner, CPU paged attention) against Hugging Face transformers on the same weights.

Every case must give token-identical output, whatever the batching: prefix caching on or off,
chunked prefill forced to 16 tokens, and a KV cache so small that requests get preempted.
After each generation the block pool must be entirely free again.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams

MAX_NEW = 12

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
)

ARCHS = {
    "llama": dict(tie_word_embeddings=True),
    "qwen2": dict(tie_word_embeddings=False, rope_theta=1000000.0),
    "qwen3": dict(head_dim=32, tie_word_embeddings=True),
}


@pytest.fixture(scope="module")
def tiny_models(tiny_checkpoint) -> dict[str, tuple[str, Any]]:
    """One tiny random checkpoint per architecture, with the HF model as the reference."""
    made = {}
    for arch, overrides in ARCHS.items():
        path = tiny_checkpoint(arch, seed=1234, **{**TINY, **overrides})
        made[arch] = (str(path), hf_model(path))
    return made


def prompts_of(lengths: list[int], seed: int = 0, shared_prefix: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(3, 512) for _ in range(n)] for n in lengths]


def assert_no_leaked_blocks(llm: LLM) -> None:
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
    assert not manager.req_to_blocks


def run(llm: LLM, prompts: list[list[int]], n: int = MAX_NEW) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for o in outs:
        assert o.outputs[0].finish_reason == "length"
    assert_no_leaked_blocks(llm)
    return [o.outputs[0].token_ids for o in outs]


SETTINGS = {
    "default": dict(),
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "chunked-16": dict(max_num_batched_tokens=16, max_num_seqs=4),
    # 12 usable blocks of 4 tokens: five requests of up to ~50 tokens cannot all fit
    "preempting": dict(block_size=4, num_gpu_blocks_override=13, max_num_seqs=5, max_num_batched_tokens=64),
    # asynchronous scheduling: each step planned before the previous step's tokens reach the host
    "async": dict(async_scheduling=True),
    "async-chunked-16": dict(async_scheduling=True, max_num_batched_tokens=16, max_num_seqs=4),
    "async-preempting": dict(async_scheduling=True, block_size=4, num_gpu_blocks_override=13, max_num_seqs=5,
                             max_num_batched_tokens=64),
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_greedy_matches_transformers(tiny_models, arch, setting):
    path, hf = tiny_models[arch]
    prompts = prompts_of([5, 37, 1, 20, 9], seed=hash(arch) % 100, shared_prefix=0)
    if setting in ("default", "async"):
        prompts += prompts_of([8, 30], seed=7, shared_prefix=32)  # prefix-cache hits in one batch
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, **SETTINGS[setting])
    got = run(llm, prompts)
    want = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    assert got == want
    if setting.endswith("preempting"):
        assert llm.engine.scheduler.num_preemptions > 0, "the KV budget was meant to force preemption"
    runner = llm.engine.executor.worker.model_runner
    assert (runner.num_in_flight_tokens > 0) == setting.startswith("async")


def test_prefix_cache_computes_a_shared_prefix_once(tiny_models):
    path, hf = tiny_models["llama"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, block_size=16)
    shared = prompts_of([0], seed=3, shared_prefix=64)[0]
    first = llm.generate([{"prompt_token_ids": shared + [11, 12, 13]}], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    stats0 = llm.engine.kv_cache_manager.prefix_cache_stats
    hits0 = stats0.hits
    second = llm.generate(
        [{"prompt_token_ids": shared + [21, 22]}, {"prompt_token_ids": shared + [31]}],
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
    )
    assert first[0].num_cached_tokens == 0
    assert [o.num_cached_tokens for o in second] == [64, 64]
    stats = llm.engine.kv_cache_manager.prefix_cache_stats
    assert stats.hits - hits0 == 128
    assert 0 < stats.hit_rate < 1
    assert llm.stats().prefix_cache_hit_rate == pytest.approx(stats.hit_rate)
    for o, p in zip(second, [shared + [21, 22], shared + [31]]):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 4)
    assert_no_leaked_blocks(llm)


def test_fully_cached_prompt_recomputes_its_last_token(tiny_models):
    path, hf = tiny_models["qwen2"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=16)
    prompt = prompts_of([32], seed=5)[0]  # exactly two blocks
    a = run(llm, [prompt], 5)
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert out[0].num_cached_tokens == 16  # capped at num_tokens - 1, so one whole block less
    assert out[0].outputs[0].token_ids == a[0] == hf_greedy(hf, prompt, 5)


def test_abort_and_bad_input_free_blocks(tiny_models):
    path, _ = tiny_models["llama"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64)
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([{"prompt_token_ids": [1, 2, 99999]}])
    with pytest.raises(ValueError, match="max_model_len"):
        # the first prompt is fine and already queued when the second is rejected
        llm.generate([{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": list(range(3, 100))}])
    assert_no_leaked_blocks(llm)
    from host.contracts.request import Request

    llm.engine.add_request(Request("x", [5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True)))
    llm.engine.step()
    assert llm.engine.kv_cache_manager.num_free_blocks < llm.engine.kv_cache_manager.num_blocks - 1
    llm.engine.abort_requests(["x"])
    assert_no_leaked_blocks(llm)


def test_engine_arguments_are_validated():
    with pytest.raises(ValueError, match="unknown engine argument.*max_num_seq\\b"):
        LLM(skip_tokenizer_init=True, max_num_seq=4)


def test_kv_cache_is_sized_from_the_memory_budget(tiny_models, caplog):
    import logging

    path, _ = tiny_models["llama"]
    # per block: 2 (K,V) x 2 layers x 2 kv heads x 16 head size x 16 tokens x 4 bytes = 8 KiB
    with caplog.at_level(logging.INFO, logger="host.engine"):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, kv_cache_memory=100 * 8192 + 100)
    assert llm.engine.kv_cache_manager.num_blocks == 100
    assert llm.engine.kv_cache_config.page_size_bytes == 8192
    assert any("KV cache: 100 blocks" in r.getMessage() for r in caplog.records)
    assert len(llm.engine.executor.worker.model_runner.kv_caches) == 2  # one view per layer
    buffer = llm.engine.executor.worker.model_runner.kv_buffer
    assert all(c.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() for c in llm.engine.executor.worker.model_runner.kv_caches)
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        LLM(path, skip_tokenizer_init=True, max_model_len=128, kv_cache_memory=4 * 8192)


def test_dummy_weights_run_without_reading_files(tiny_models, tmp_path):
    import shutil

    path, _ = tiny_models["qwen3"]
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(f"{path}/config.json", config_only / "config.json")
    llm = LLM(str(config_only), load_format="dummy", skip_tokenizer_init=True, max_model_len=64)
    a = run(llm, [[5, 6, 7]], 4)
    b = run(LLM(str(config_only), load_format="dummy", skip_tokenizer_init=True, max_model_len=64), [[5, 6, 7]], 4)
    assert a == b and len(a[0]) == 4  # seeded: reproducible


def test_priority_policy_serves_urgent_requests_first(tiny_models):
    path, hf = tiny_models["llama"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, max_num_seqs=1, scheduling_policy="priority")
    prompts = prompts_of([4, 4, 4], seed=9)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), priority=[5, 0, 1])
    finish = llm.last_finish_order
    assert finish == [outs[1].request_id, outs[2].request_id, outs[0].request_id]
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 3) for p in prompts]
