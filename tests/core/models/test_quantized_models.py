"""Quantized models end to end on tiny checkpoints, each against a reference on the same weights:

- GGUF blocks kept as stored vs the same file dequantized to float32 (``--quantization none``):
  the same greedy tokens and prompt logprobs up to summation order;
- int8 vs transformers running the int8-rounded weights (``q * scale`` written back into the
  float model): the same greedy tokens, logprobs within 1e-4.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.core.models.quant_linear import QuantEmbedding, QuantLinear
from host.plugins.quantization.gguf_blocks import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0
from host.plugins.quantization.int8 import quantize_int8_rows

PROMPTS = [[1, 5, 9, 14, 3], [7] * 3 + [100, 200, 299], [42], list(range(20, 60))]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=1)


def _run(llm: LLM) -> list:
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)


def _model(llm: LLM):
    return llm.engine.executor.worker.model_runner.model


def _max_logprob_diff(a, b) -> float:
    """The largest difference of a logprob both runs report, relative where it is below -1."""
    worst = 0.0
    for x, y in zip(a, b):
        for px, py in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:]):
            common = set(px) & set(py)
            worst = max([worst] + [abs(px[t].logprob - py[t].logprob) / max(1.0, abs(py[t].logprob)) for t in common])
        for px, py in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            common = set(px) & set(py)
            worst = max([worst] + [abs(px[t].logprob - py[t].logprob) / max(1.0, abs(py[t].logprob)) for t in common])
    return worst


@pytest.mark.parametrize(
    "qtype, embed, mixed",
    [(Q4_0, Q8_0, None), (Q4_1, None, None), (Q4_K, Q6_K, Q6_K)],
    ids=["q4_0+q8_0-embed", "q4_1", "q4_k+q6_k-mixed"],
)
def test_gguf_kept_quantized_equals_dequantized(tmp_path, qtype, embed, mixed):
    path = str(write_tiny_gguf(tmp_path / "tiny.gguf", qtype, embed_qtype=embed, mixed_v=mixed))
    kw = dict(skip_tokenizer_init=True, num_gpu_blocks_override=64, max_num_seqs=8)
    kept = LLM(path, **kw)
    try:
        model = _model(kept)
        layers = [m for m in model.modules() if isinstance(m, (QuantLinear, QuantEmbedding))]
        assert len(layers) == 2 * 4 + 1 and {m.scheme for m in layers} == {"gguf"}
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert qkv.qtypes == ([qtype] if mixed is None else [qtype, mixed])  # q+k one run, v another
        runner = kept.engine.executor.worker.model_runner
        ours = _run(kept)
        kept_bytes = runner.weight_bytes
    finally:
        kept.shutdown()
    dense = LLM(path, quantization="none", **kw)
    try:
        assert not any(isinstance(m, (QuantLinear, QuantEmbedding)) for m in _model(dense).modules())
        ref = _run(dense)
        dense_bytes = dense.engine.executor.worker.model_runner.weight_bytes
    finally:
        dense.shutdown()
    assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in ref]
    assert _max_logprob_diff(ours, ref) < 1e-3
    assert kept_bytes < dense_bytes / 3


def _int8_rounded_reference(path):
    """transformers' model with each decoder projection replaced by its int8 rounding (q * s)."""
    model = hf_model(path)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                q, s = quantize_int8_rows(module.weight)
                module.weight.copy_(q.float() * s[:, None])
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_matches_transformers_on_the_rounded_weights(tiny_checkpoint, arch):
    path = tiny_checkpoint(arch, bias_std=0.1, norm_std=0.1, lm_head_scale=4.0)
    llm = LLM(str(path), skip_tokenizer_init=True, quantization="int8", num_gpu_blocks_override=64, max_num_seqs=8)
    try:
        model = _model(llm)
        assert isinstance(model.model.layers[0].mlp.down_proj, QuantLinear)
        assert model.model.layers[0].mlp.down_proj.qweight.dtype == torch.int8
        outs = _run(llm)
    finally:
        llm.shutdown()
    ref = _int8_rounded_reference(path)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 12)
        with torch.no_grad():
            logp = torch.log_softmax(ref(torch.tensor([prompt])).logits[0].double(), -1)
        for pos, tok in enumerate(prompt[1:], start=0):
            ours = out.prompt_logprobs[pos + 1][tok].logprob
            assert math.isclose(ours, logp[pos, tok].item(), abs_tol=1e-4)


def test_ignore_keeps_those_layers_in_float(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    llm = LLM(str(path), skip_tokenizer_init=True, quantization="int8", quantization_config={"ignore": ["re:.*mlp.*"]},
              num_gpu_blocks_override=16)
    try:
        layer = _model(llm).model.layers[1]
        assert isinstance(layer.self_attn.o_proj, QuantLinear)
        assert not isinstance(layer.mlp.gate_up_proj, QuantLinear)
    finally:
        llm.shutdown()
