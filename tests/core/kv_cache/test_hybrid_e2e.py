"""The hybrid KV cache end to end: a tiny Qwen2 with two full-attention and two sliding-window
layers (window 8) through ``LLM(...)``, prompts longer than the window, prefix caching and
chunked prefill on, several requests at once. Greedy tokens must equal transformers' (which
applies the window itself), with the hybrid allocator and with
``--disable-hybrid-kv-cache-manager`` alike, and every block must come back."""

from __future__ import annotations

import random

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.core.kv_cache.coordinator import HybridKVCacheManager
from host.core.kv_cache.manager import KVCacheManager
from host.core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec

MAX_NEW = 10
WINDOW = 8

QWEN2_SLIDING = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=300, max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=False,
    # layers 0-1 full attention, 2-3 a window of 8 tokens (transformers' layer_types)
    use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    path = tiny_checkpoint("qwen2", seed=7, **QWEN2_SLIDING)
    hf = hf_model(path)
    assert hf.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    return str(path), hf


def prompts() -> list[list[int]]:
    rng = random.Random(3)
    shared = [rng.randrange(3, 300) for _ in range(24)]
    out = [[rng.randrange(3, 300) for _ in range(n)] for n in (41, 9, 27, 63)]
    out += [shared + [rng.randrange(3, 300) for _ in range(n)] for n in (6, 13)]  # prefix-cache hits
    return out


def generate(llm: LLM, batch: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1  # no leaked block
    return [o.outputs[0].token_ids for o in outs]


SETTINGS = {
    "hybrid": dict(),
    "hybrid-preempting": dict(num_gpu_blocks_override=40, max_num_seqs=6),
    # freed blocks go to the front of the free queue (no hash to keep): the next allocation
    # reuses them at once, so a window freeing a block it still reads shows in the tokens
    "hybrid-no-prefix-cache": dict(enable_prefix_caching=False),
    # each step planned (and windows freed) while the previous one runs
    "hybrid-async": dict(enable_prefix_caching=False, async_scheduling=True),
    "disabled": dict(disable_hybrid_kv_cache_manager=True),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_greedy_tokens_equal_transformers(model, setting):
    path, hf = model
    batch = prompts()
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=4, max_num_batched_tokens=16,
              enable_chunked_prefill=True, **{"enable_prefix_caching": True, **SETTINGS[setting]})
    manager = llm.engine.kv_cache_manager
    if setting == "disabled":
        assert type(manager) is KVCacheManager
    else:
        assert isinstance(manager, HybridKVCacheManager) and manager.num_groups == 2
        assert manager.layout.group_size == 2
        assert [g.layers for g in manager.layout.groups] == [(0, 1), (2, 3)]
    # the first request alone primes the cache; the rest run together and hit its prefix
    got = generate(llm, batch[4:5]) + generate(llm, batch[:4] + batch[5:])
    got = got[1:5] + got[:1] + got[5:]
    want = [hf_greedy(hf, p, MAX_NEW) for p in batch]
    assert got == want
    if setting == "hybrid-preempting":
        assert llm.engine.scheduler.num_preemptions > 0, "the KV budget was meant to force preemption"
    elif setting not in ("hybrid-no-prefix-cache", "hybrid-async"):
        assert manager.prefix_cache_stats.hits >= 24


def test_hybrid_holds_fewer_blocks_than_one_group(model):
    """Mid-decode, a long request holds its full blocks plus the window's in the hybrid layout,
    versus its full blocks for every layer with one group."""
    path, _ = model
    held = {}
    for hybrid in (True, False):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=4,
                  disable_hybrid_kv_cache_manager=not hybrid)
        from host.contracts.request import Request

        engine = llm.engine
        engine.add_request(Request("r", list(range(3, 67)), SamplingParams(max_tokens=20, ignore_eos=True)))
        for _ in range(6):
            engine.step()
        manager = engine.kv_cache_manager
        computed = engine.scheduler.requests["r"].num_computed_tokens
        held[hybrid] = (manager.num_blocks_held("r"), computed)
        engine.abort_requests(["r"])
    (hyb, computed), (single, computed_single) = held[True], held[False]
    assert computed == computed_single
    # one group: one block per 4 tokens (each block 4 layers' pages); hybrid: the full group's
    # blocks plus the sliding group's from the window of the last step's first token on
    n = -(-computed // 4)
    first_needed = (computed - 1 - WINDOW + 1) // 4
    assert single == n
    assert hyb == n + (n - first_needed)
    # in layer pages: 2 per hybrid block, 4 per single-group block
    assert 2 * hyb < 4 * single


def test_every_layer_with_one_window_frees_blocks_and_keeps_one_table(tiny_checkpoint):
    """A model whose layers all have the same window: one sliding-window group (the worker's one
    block table, the fused decode kernel still on), blocks freed as the window slides."""
    path = tiny_checkpoint("qwen2", seed=7, **{**QWEN2_SLIDING, "max_window_layers": 0})
    hf = hf_model(path)
    assert hf.config.layer_types == ["sliding_attention"] * 4
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, block_size=4, max_num_batched_tokens=16)
    manager = llm.engine.kv_cache_manager
    assert isinstance(manager, HybridKVCacheManager) and manager.num_groups == 1
    runner = llm.engine.executor.worker.model_runner
    assert not runner.input_batch.group_block_tables
    assert runner.model.model.decode_kernel is not None
    batch = prompts()
    want = [hf_greedy(hf, p, MAX_NEW) for p in batch]
    assert generate(llm, batch) == want
    # freed blocks reused at once (no prefix cache): a window freeing too early would show
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=128, block_size=4, max_num_batched_tokens=16,
              enable_prefix_caching=False)
    assert generate(llm, batch) == want


def test_fallback_to_one_group_says_why(model, caplog):
    """Features assuming one block table per request keep one group, with one log line saying why."""
    import logging

    from host.core.engine_args import EngineArgs
    from host.core.kv_cache.hybrid_policy import hybrid_unsupported_reason, kv_cache_layout

    path, hf = model
    base = dict(model=path, skip_tokenizer_init=True, max_model_len=128, block_size=4)
    assert hybrid_unsupported_reason(EngineArgs(**base).create_engine_config()) is None
    cases = {
        "--disable-hybrid-kv-cache-manager": dict(disable_hybrid_kv_cache_manager=True),
        "KV connector": dict(kv_transfer_config={"kv_connector": "p2p", "kv_role": "kv_producer"}),
        "speculative decoding": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
    }
    specs = [FullAttentionSpec(4, 2, 16, "float32")] * 2 + [SlidingWindowSpec(4, 2, 16, "float32", sliding_window=WINDOW)] * 2
    for why, extra in cases.items():
        config = EngineArgs(**base, **extra).create_engine_config()
        assert why in hybrid_unsupported_reason(config)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="host.kv_cache"):
            layout = kv_cache_layout(config, specs, log=True)
        assert layout.num_groups == 1
        lines = [r.getMessage() for r in caplog.records if r.name == "host.kv_cache"]
        assert len(lines) == 1 and why in lines[0] and "allocated like full attention" in lines[0]
    # end to end: ngram drafts over the conservative one-group cache still give transformers' tokens
    llm = LLM(**base, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert type(llm.engine.kv_cache_manager) is KVCacheManager
    batch = prompts()[:3]
    assert generate(llm, batch) == [hf_greedy(hf, p, MAX_NEW) for p in batch]
