"""Accuracy of each quantization on real weights, against transformers on the same weights.

The default model (SmolLM2-135M, a Q4_1 GGUF) scores the shipped text (tests/fixtures/
perplexity_text.txt, 4 windows of 512 tokens cut as tests/perplexity.py cuts them). The reference is
transformers in float32 on the GGUF dequantized (the default model's converted directory):

- GGUF blocks kept as stored (the default): mean |Δ logprob| per token <= 0.01 against it;
- int8 and fp8, quantized at load from those float32 weights: perplexity within +2% / +3%;
- the fp8 KV cache (with the GGUF weights): perplexity within +2% of the same weights' own.
"""

from __future__ import annotations

import math

import pytest
import torch
from perplexity import load_text_ids, windows

from host import LLM, SamplingParams
from host.core.models.default_model import resolve_model_path

WINDOW = 512
TOKENS = 4 * WINDOW


@pytest.fixture(scope="module")
def text_ids():
    from transformers import AutoTokenizer

    ids = load_text_ids(AutoTokenizer.from_pretrained(resolve_model_path(None)), limit=TOKENS)
    assert len(ids) == TOKENS
    return ids


@pytest.fixture(scope="module")
def reference(text_ids):
    """transformers' per-token logprobs (float32) of the text, window by window, and its perplexity."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(None), dtype=torch.float32).eval()
    per_token = []
    with torch.inference_mode():
        for chunk in windows(text_ids, WINDOW):
            ids = torch.tensor([chunk])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            per_token += logp.gather(1, ids[0, 1:, None])[:, 0].tolist()
    return per_token, math.exp(-sum(per_token) / len(per_token))


def _score(text_ids, **engine) -> tuple[list[float], float]:
    llm = LLM(max_model_len=WINDOW + 8, **engine)
    try:
        params = SamplingParams(prompt_logprobs=0, max_tokens=1, temperature=0.0)
        chunks = windows(text_ids, WINDOW)
        outs = llm.generate([{"prompt_token_ids": c} for c in chunks], params)
        per_token = [pos[tok].logprob for chunk, out in zip(chunks, outs) for tok, pos in zip(chunk[1:], out.prompt_logprobs[1:])]
        return per_token, math.exp(-sum(per_token) / len(per_token))
    finally:
        llm.shutdown()


def test_quantization_accuracy(text_ids, reference, capsys):
    ref_tokens, ref_ppl = reference
    gguf_tokens, gguf_ppl = _score(text_ids)  # the default: the GGUF's Q4_1 blocks kept as stored
    mean_delta = sum(abs(a - b) for a, b in zip(gguf_tokens, ref_tokens)) / len(ref_tokens)
    _, int8_ppl = _score(text_ids, quantization="int8")
    _, fp8_ppl = _score(text_ids, quantization="fp8")
    _, fp8kv_ppl = _score(text_ids, kv_cache_dtype="fp8")
    with capsys.disabled():
        print(
            f"\nSmolLM2-135M perplexity over {len(ref_tokens)} tokens: transformers fp32 {ref_ppl:.4f}, "
            f"gguf kept {gguf_ppl:.4f} (mean |dlogprob| {mean_delta:.2e}), int8 {int8_ppl:.4f} "
            f"({int8_ppl / ref_ppl - 1:+.2%}), fp8 {fp8_ppl:.4f} ({fp8_ppl / ref_ppl - 1:+.2%}), "
            f"fp8 KV {fp8kv_ppl:.4f} ({fp8kv_ppl / gguf_ppl - 1:+.2%})"
        )
    assert mean_delta <= 0.01
    assert int8_ppl <= 1.02 * ref_ppl
    assert fp8_ppl <= 1.03 * ref_ppl
    assert fp8kv_ppl <= 1.02 * gguf_ppl
