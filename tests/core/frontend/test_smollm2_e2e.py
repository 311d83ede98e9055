"""The real SmolLM2-135M-Instruct through the whole engine, against Hugging Face transformers on
the same converted weights: greedy tokens must be identical for a batch of prompts of different
lengths under every batching regime (prefix caching on/off, 16-token prefill chunks, and a KV
cache small enough to force preemption)."""

from __future__ import annotations

import pytest
import torch

from host import LLM, SamplingParams
from host.core.models.default_model import default_model_path

PROMPTS = [
    "The capital of France is",
    "Here is a short story about a robot who learns to paint. Once upon a time, in a small workshop",
    "1, 2, 3, 4,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
NEW = 8

SETTINGS = {
    "prefix-cache": dict(),
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "chunked-16": dict(max_num_batched_tokens=16),
    # 10 usable blocks of 8 tokens = 80 tokens for four requests needing ~100: preemption
    "preempting": dict(block_size=8, num_gpu_blocks_override=11, max_num_batched_tokens=64),
}


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], list[list[int]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=2, eos_token_id=None)
            outs.append(out[0, len(ids):].tolist())
    return prompts, outs


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_smollm2_greedy_matches_transformers(reference, setting):
    prompts, want = reference
    llm = LLM(max_model_len=256, max_num_seqs=4, **SETTINGS[setting])
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [o.outputs[0].token_ids for o in outs] == want
    assert outs[0].outputs[0].text == llm.get_tokenizer().decode(want[0])
    if setting == "preempting":
        assert llm.engine.scheduler.num_preemptions > 0
    pool = llm.engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == llm.engine.kv_cache_manager.num_blocks - 1


def test_chat_answers_with_the_chat_template():
    llm = LLM(max_model_len=512)
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(max_tokens=16, temperature=0))
    assert "Paris" in out[0].outputs[0].text
    assert out[0].outputs[0].finish_reason == "stop"  # ended by <|im_end|>, the EOS token
    assert out[0].prompt.startswith("<|im_start|>system")
