"""The CPU platform's one-call decode path gives the layer-by-layer results.

Every qualifying decode step of a generation is run both ways in the same forward context
(writing the same K/V to the same slots twice is harmless) and the hidden states compared; the
greedy tokens are checked against Hugging Face transformers as well.
"""

from __future__ import annotations

import random

import pytest
import torch

from helpers import check_fused_decode, hf_greedy, hf_model
from host import LLM, SamplingParams

TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6,
)
ARCHS = {
    "llama": ("llama", dict(tie_word_embeddings=True)),
    "qwen2-bias-window": (
        "qwen2",
        dict(tie_word_embeddings=False, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    ),
    "qwen3-qk-norm": ("qwen3", dict(head_dim=32, tie_word_embeddings=True)),
}


def _checkpoint(tiny_checkpoint, arch):
    family, overrides = ARCHS[arch]
    # norms and biases away from 1 / 0, so a swapped tensor shows
    path = tiny_checkpoint(family, seed=7, norm_std=0.2, bias_std=0.2, **{**TINY, **overrides})
    return str(path), hf_model(path)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fused_decode_matches_layer_by_layer_and_transformers(tiny_checkpoint, arch):
    path, hf = _checkpoint(tiny_checkpoint, arch)
    # one KV cache group: the fused kernel runs every layer with one block table, so a model
    # mixing window and full layers takes it only without hybrid groups (docs/hybrid_kv_cache.md)
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=4, disable_hybrid_kv_cache_manager=True)
    decoder = llm.engine.executor.worker.model_runner.model.model
    fused = decoder.decode_kernel
    assert fused is not None, "float32 Llama-family models get the fused decode path on CPU"
    compared = check_fused_decode(decoder, fused, tol=1e-4)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (3, 11, 1, 17)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert compared and max(compared) == 4, "decode steps of the whole batch went through the fused path"
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 10)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_steps_of_several_tokens_per_request_take_the_fused_path(tiny_checkpoint, arch):
    """A speculative verify step (the request's last token and its drafts) and a short prompt run
    as one row per token, each attending its causal prefix (the sliding window included)."""
    path, hf = _checkpoint(tiny_checkpoint, arch)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, block_size=4, speculative_config=spec)
    decoder = llm.engine.executor.worker.model_runner.model.model
    compared = check_fused_decode(decoder, decoder.decode_kernel, tol=1e-4)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    short = [9, 41, 77, 120, 5]
    out = llm.generate([{"prompt_token_ids": short}], greedy)[0]
    assert compared[0] == len(short), "a 5-token prompt is one fused step of 5 rows"
    assert out.outputs[0].token_ids == hf_greedy(hf, short, 12)
    compared.clear()
    repetitive = [5, 6, 7, 8] * 3  # every 2-gram recurs: the n-gram proposer drafts from the start
    out = llm.generate([{"prompt_token_ids": repetitive}], greedy)[0]
    assert compared and max(compared) > 1, "verify steps (1 + drafts tokens of one request) ran fused"
    assert out.outputs[0].token_ids == hf_greedy(hf, repetitive, 12)


def test_fused_decode_declines_batches_it_does_not_take(tiny_checkpoint):
    path, _ = _checkpoint(tiny_checkpoint, "llama")
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, max_num_seqs=16)
    decoder = llm.engine.executor.worker.model_runner.model.model
    fused = decoder.decode_kernel
    taken = []

    def spy(input_ids, positions, hidden):
        out = fused(input_ids, positions, hidden)
        if out is not None:
            taken.append(input_ids.shape[0])
        return out

    decoder.decode_kernel = spy
    prompts = [[5 + i, 6, 7] for i in range(12)]
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert not taken, "prefills and decode batches over 8 rows run layer by layer"
    assert fused(torch.tensor([1]), torch.tensor([0]), torch.zeros(1, 64)) is None  # no forward context


def test_fused_decode_is_off_for_bfloat16_and_without_kernels(tiny_checkpoint, monkeypatch):
    path, _ = _checkpoint(tiny_checkpoint, "llama")
    bf16 = LLM(path, skip_tokenizer_init=True, max_model_len=64, dtype="bfloat16")
    assert bf16.engine.executor.worker.model_runner.model.model.decode_kernel is None
    import host.plugins.builtin_cpu.kernels as kernels

    monkeypatch.setattr(kernels, "_MODULE", [None])  # as when the build failed or HOST_CPU_KERNELS=0
    plain = LLM(path, skip_tokenizer_init=True, max_model_len=64)
    model = plain.engine.executor.worker.model_runner.model
    assert model.model.decode_kernel is None
    assert model.model.layers[0].input_layernorm.kernel is None
    out = plain.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_fused_decode_refuses_attention_with_sinks() -> None:
    """The compiled step computes attention without sinks: a decoder whose attention has them runs
    layer by layer."""
    import transformers

    from host.core.models.llama import LlamaForCausalLM
    from host.plugins.builtin_cpu.fused_decode import FusedDecode

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)
    model = LlamaForCausalLM(config)
    assert FusedDecode.supports(model.model) != "the attention has sinks (the compiled step does not add them)"
    model.model.layers[0].self_attn.attn.sinks = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    assert FusedDecode.supports(model.model) == "the attention has sinks (the compiled step does not add them)"
