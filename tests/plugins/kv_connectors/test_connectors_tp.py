"""KV connectors under ``-tp 2`` (mp workers): each worker moves its own shard of the heads and
the engine counts a request's transfer done only once both ranks report it. ``shared_storage``
saved by one ``-tp 2`` engine and loaded by a new one gives the greedy tokens of a one-process
engine without a connector (itself equal to transformers)."""

from __future__ import annotations

import os
import random

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams

COMMON = dict(skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=32, max_num_seqs=4, block_size=8)
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def test_shared_storage_with_two_tensor_parallel_ranks(tiny_checkpoint, tmp_path):
    model = str(tiny_checkpoint("llama", initializer_range=0.1, tie_word_embeddings=True))
    rng = random.Random(5)
    ps = [[rng.randrange(3, 300) for _ in range(n)] for n in (9, 24, 41)]
    want = [hf_greedy(hf_model(model), p, 4) for p in ps]
    config = {"kv_connector": "shared_storage", "kv_connector_extra_config": {"path": str(tmp_path)}}
    for attempt in ("save", "load"):
        llm = LLM(model, tensor_parallel_size=2, distributed_executor_backend="mp", kv_transfer_config=config, **COMMON)
        try:
            out = llm.generate([{"prompt_token_ids": p} for p in ps], GREEDY)
            assert [o.outputs[0].token_ids for o in out] == want, attempt
            stats = llm.engine.scheduler.make_stats().kv_connector_stats
            if attempt == "load":
                # every stored full block; a prompt stored whole recomputes its last token
                assert [o.num_cached_tokens for o in out] == [min(len(p) // 8 * 8, len(p) - 1) for p in ps]
                assert stats["external_hit_tokens"] == sum(len(p) // 8 * 8 for p in ps)
                assert stats["load_bytes"] > 0
            manager = llm.engine.kv_cache_manager
            assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
        finally:
            llm.shutdown()
    names = [n for _, _, files in os.walk(tmp_path) for n in files]
    ranks = {n.rsplit(".", 2)[-2] for n in names}
    assert ranks == {"r0", "r1"}, names  # each rank stored its own shard
    assert sum(n.endswith(".r0.pt") for n in names) == sum(n.endswith(".r1.pt") for n in names)
