"""``--convert embed``: a tiny random Llama as an embedding model against transformers' own
``LlamaModel`` last hidden state (after the final norm), pooled by hand (last token and mean)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from host import LLM, PoolingParams

PROMPTS = [[5, 17, 42, 8, 99, 3, 250], [7], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", seed=11, norm_std=0.1)
    import transformers

    hf = transformers.AutoModel.from_pretrained(path, dtype="auto").eval()
    with torch.inference_mode():
        states = [hf(input_ids=torch.tensor([p])).last_hidden_state[0] for p in PROMPTS]
    return str(path), states


@pytest.mark.parametrize("pooling_type, by_hand", [("LAST", lambda h: h[-1]), ("MEAN", lambda h: h.mean(0))])
def test_convert_embed_pools_the_last_hidden_state(tiny, pooling_type, by_hand):
    path, states = tiny
    pooler = None if pooling_type == "LAST" else {"pooling_type": "MEAN"}  # LAST is a converted decoder's default
    llm = LLM(path, skip_tokenizer_init=True, convert="embed", pooler_config=pooler, max_model_len=64, block_size=4)
    try:
        assert llm.config.model.runner == "pooling" and llm.config.model.pooler.pooling_type == pooling_type
        prompts = [{"prompt_token_ids": p} for p in PROMPTS]
        raw = llm.embed(prompts, PoolingParams(normalize=False))
        normed = llm.embed(prompts)  # normalized by default
        for out, norm_out, h in zip(raw, normed, states):
            expected = by_hand(h)
            np.testing.assert_allclose(out.outputs.embedding, expected.numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(norm_out.outputs.embedding, (expected / expected.norm()).numpy(), rtol=1e-4, atol=1e-5)
        kv = llm.engine.scheduler.kv_cache_manager
        assert kv.num_free_blocks == kv.block_pool.num_blocks - 1  # every block back after the steps
        with pytest.raises(ValueError, match=r"--runner generate"):
            llm.generate(prompts[:1])
    finally:
        llm.shutdown()


def test_embeddings_on_a_generating_model_name_convert_embed(tiny):
    path, _ = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64)
    try:
        with pytest.raises(ValueError, match=r"--convert embed"):
            llm.embed([{"prompt_token_ids": PROMPTS[0]}])
        assert llm.engine.scheduler.kv_cache_manager.usage == 0.0
    finally:
        llm.shutdown()
