"""bf16 on a real GPU: host against transformers on a tiny random Qwen3, at -O0, -O2 and -O3.

Skipped without a GPU (CI has none; ``bench/gpu_check.sh`` runs it on one). Two bf16
implementations round differently (fused kernels, other GEMM tilings), so greedy paths may part
where the two best tokens are within rounding of each other. The test therefore checks, per
prompt (tolerances in nats, for logits of this model's scale):

- *teacher-forced logprobs*: transformers scores host's own generated sequence in one forward;
  every generated token's logprob as host reported it is within ``LOGPROB_TOL`` of that, and
  the mean difference is below ``MEAN_LOGPROB_TOL``;
- *divergence only at near-ties*: where host's greedy tokens first differ from transformers',
  transformers' own logprobs of the two tokens differ by less than ``TIE_TOL``;
- the first generated token is identical.

``HOST_BF16_TEST_DEVICE=cpu`` runs the same checks on the CPU platform (slow; for checking the
test itself).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

DEVICE = os.environ.get("HOST_BF16_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")

LOGPROB_TOL = 0.25  # any one token (bf16 logits of magnitude ~20 round by ~0.08 on their own)
MEAN_LOGPROB_TOL = 0.05  # averaged over every generated token of every prompt
TIE_TOL = 0.25


@pytest.mark.parametrize("level", [0, 2, 3])
def test_bf16_qwen3_matches_transformers(tiny_checkpoint, level):
    from helpers import hf_model
    from host import LLM, SamplingParams

    path = tiny_checkpoint("qwen3", dtype="bfloat16", hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=4, head_dim=32, vocab_size=1000,
                           max_position_embeddings=2048, tie_word_embeddings=True, initializer_range=0.05)
    hf = hf_model(path).to(DEVICE)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (5, 37, 130, 700, 12, 64, 300, 1)]
    n_out = 32
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024, optimization_level=level,
              max_num_seqs=8, gpu_memory_utilization=0.3)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=n_out, temperature=0, ignore_eos=True, logprobs=1))
    worst_lp = worst_tie = 0.0
    diffs: list[float] = []
    for prompt, out in zip(prompts, outs):
        ours = out.outputs[0].token_ids
        with torch.inference_mode():
            seq = torch.tensor([prompt + ours], device=DEVICE)
            logp = hf(seq).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)  # scores of ours[j]
            ref = hf.generate(seq[:, : len(prompt)], attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=DEVICE),
                              max_new_tokens=n_out, min_new_tokens=n_out, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert ours[0] == ref[0], (len(prompt), ours[:4], ref[:4])
        for j, tok in enumerate(ours):
            diff = abs(out.outputs[0].logprobs[j][tok].logprob - float(logp[j, tok]))
            worst_lp = max(worst_lp, diff)
            diffs.append(diff)
            assert diff < LOGPROB_TOL, (len(prompt), j, diff)
        k = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        if k is not None:
            with torch.inference_mode():
                ctx = torch.tensor([prompt + ref[:k]], device=DEVICE)
                lp = hf(ctx).logits[0, -1].float().log_softmax(-1)
            margin = float(lp[ref[k]] - lp[ours[k]])
            worst_tie = max(worst_tie, margin)
            assert margin < TIE_TOL, f"prompt of {len(prompt)}: parted at step {k} where transformers prefers its token by {margin:.3f} nats"
    mean = sum(diffs) / len(diffs)
    print(f"-O{level}: logprob difference mean {mean:.4f} / worst {worst_lp:.4f} nats, widest margin at a parting {worst_tie:.4f} nats")
    assert mean < MEAN_LOGPROB_TOL
    llm.shutdown()
