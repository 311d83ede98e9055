"""Tensor parallelism for real: the whole engine with ``-tp 2`` over the ``mp`` executor (two
worker processes joined by gloo), prefix caching and chunked prefill on, against the ``-tp 1``
engine (logprobs of the greedy tokens within 1e-4 in fp32) and Hugging Face greedy decoding.

The cases cover kv heads split (Qwen3, 2 kv heads for 2 ranks, q/k norms, an untied LM head over
a vocabulary 2 does not divide: padded logits, trimmed) and replicated (Llama, 1 kv head for 2
ranks, attention and MLP biases, tied embeddings). The sharding math itself is checked rank by
rank in one process in ``test_parallel_layers.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import hf_model

# -- the whole engine: -tp 2 over the mp executor ------------------------------------------------

E2E = {
    # GQA with the kv heads split (Qwen3: q/k norms) and replicated (Llama: 1 kv head for 2 ranks)
    "qwen3": dict(num_key_value_heads=2, tie_word_embeddings=False, vocab_size=301),
    "llama": dict(num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
}
# a shared 20-token prefix (block size 16: one full block served from the prefix cache the
# second time), prompts longer than the 8-token step budget (chunked prefill)
PREFIX = [11, 23, 5, 78, 140, 9, 33, 61, 2, 250, 17, 88, 4, 120, 45, 6, 99, 210, 31, 7]
PROMPTS = [PREFIX + [12, 13], PREFIX + [40], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]


def _generate(path: Path, **engine_kw) -> tuple[list[tuple[list[int], list[float]]], int]:
    """Greedy tokens and their logprobs for PROMPTS[:1] then PROMPTS, and the prefix-cache hits (tokens)."""
    from host import LLM, SamplingParams

    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=8, max_num_seqs=4,
              enable_prefix_caching=True, enable_chunked_prefill=True, **engine_kw)
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        outs = []
        for batch in (PROMPTS[:1], PROMPTS):  # the second batch reuses the first's cached prefix block
            for out in llm.generate([{"prompt_token_ids": p} for p in batch], params):
                comp = out.outputs[0]
                outs.append((list(comp.token_ids), [pos[t].logprob for t, pos in zip(comp.token_ids, comp.logprobs)]))
        return outs, llm.engine.kv_cache_manager.prefix_cache_stats.hits
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", list(E2E))
def test_tp2_engine_matches_tp1_and_hf_greedy(tiny_checkpoint, arch: str) -> None:
    from helpers import hf_greedy

    path = tiny_checkpoint(arch, seed=3, norm_std=0.1, bias_std=0.1, lm_head_scale=4.0, **E2E[arch])
    tp1, _ = _generate(path)
    tp2, hits = _generate(path, tensor_parallel_size=2, distributed_executor_backend="mp")
    assert hits >= 16  # the second batch found the first prompt's full block
    hf = hf_model(path)
    for prompt, (tokens1, lps1), (tokens2, lps2) in zip(PROMPTS[:1] + PROMPTS, tp1, tp2):
        assert tokens2 == tokens1 == hf_greedy(hf, prompt, len(tokens1))
        assert lps2 == pytest.approx(lps1, abs=1e-4)
