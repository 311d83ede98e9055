"""The transformers fallback (``--model-impl transformers``) against transformers itself.

Tiny random checkpoints of architectures host has no native code for, built with the installed
transformers' own config and model classes and ``save_pretrained``, run through the whole engine
(paged KV cache, chunked prefill of 16 tokens, prefix caching, several requests per step): the
greedy tokens must equal transformers' ``generate`` on the same weights and the sampled tokens'
logprobs its full forward's within 1e-4 (float32). Then the choice of implementation
(``auto`` / ``host`` / ``transformers``) and the refusals.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.core.engine_args import EngineArgs

VOCAB = 256
MAX_NEW = 8
COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
    max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1,
)
# architecture -> config overrides: each exercises something of its own
ARCHS: dict[str, dict[str, Any]] = {
    "Olmo2": dict(num_key_value_heads=2),  # q/k norms over all heads, post-norms
    "GPTNeoX": dict(rotary_pct=0.25, use_parallel_residual=True),  # partial rotary, fused qkv, parallel residual
    "StableLm": dict(num_key_value_heads=2, partial_rotary_factor=0.5, use_qkv_bias=True),
    "Granite": dict(num_key_value_heads=2, attention_multiplier=0.3, embedding_multiplier=2.0,
                    residual_multiplier=0.5, logits_scaling=4.0),  # a custom scaling; logits divided after the head
    "Cohere": dict(num_key_value_heads=2, logit_scale=0.5, use_qk_norm=False),  # logits scaled after the head
    "Starcoder2": dict(num_key_value_heads=2, sliding_window=None),  # LayerNorm, biases, GELU MLP
    # sliding window 8 on alternate layers (layer_types), attention and final logit soft-capping, head_dim 32
    "Gemma2": dict(num_key_value_heads=2, head_dim=32, sliding_window=8, attn_logit_softcapping=2.0,
                   final_logit_softcapping=5.0, query_pre_attn_scalar=24),
}
EXPLICIT = {"Gemma2"}  # native too: run with model_impl="transformers" (the others with the default, auto)


def save_tiny(root: Path, arch: str, seed: int = 0, **overrides: Any) -> str:
    config = getattr(transformers, f"{arch}Config")(**{**COMMON, **overrides})
    config.architectures = [f"{arch}ForCausalLM"]
    torch.manual_seed(seed)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    path = root / arch
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fallback")
    return {arch: save_tiny(root, arch, seed=i, **overrides) for i, (arch, overrides) in enumerate(ARCHS.items())}


def prompts_of(lengths: list[int], seed: int, prefix: list[int] = ()) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def sampled_logprob_diff(hf: Any, prompt: list[int], completion: Any) -> float:
    """Largest |host - transformers| over the sampled tokens' logprobs (transformers' full
    forward over prompt + completion)."""
    full = prompt + list(completion.token_ids)
    with torch.inference_mode():
        ref = hf(torch.tensor([full])).logits[0].float().log_softmax(-1)
    diffs = [abs(pos[tok].logprob - float(ref[len(prompt) - 1 + j, tok]))
             for j, (tok, pos) in enumerate(zip(completion.token_ids, completion.logprobs))]
    return max(diffs)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_tokens_and_logprobs_match_transformers(checkpoints, arch):
    path = checkpoints[arch]
    hf = hf_model(path)
    impl = "transformers" if arch in EXPLICIT else "auto"
    # chunked prefill (16 tokens per step), four requests at once, blocks of 4 tokens
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", max_model_len=128, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=4, model_impl=impl)
    assert llm.engine.config.model.model_impl_used == "transformers"
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, logprobs=1)
    shared = prompts_of([24], seed=100)[0]
    first = prompts_of([30, 5, 1, 19], seed=1) + [shared + [7, 8]]
    second = prompts_of([3, 11], seed=2, prefix=shared)  # the shared 24 tokens are cached by now
    worst = 0.0
    for batch in (first, second):
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
        for p, out in zip(batch, outs):
            assert out.outputs[0].token_ids == hf_greedy(hf, p, MAX_NEW), f"{arch}: prompt of {len(p)} tokens"
            worst = max(worst, sampled_logprob_diff(hf, p, out.outputs[0]))
        if batch is second:
            assert [o.num_cached_tokens for o in outs] == [24, 24]
    print(f"{arch}: greedy tokens equal; max |logprob diff| {worst:.2e}")
    assert worst < 1e-4


def test_outside_the_engine_the_dense_path_matches_and_no_mask_is_built(checkpoints):
    """Loaded through host's loader and run without a forward context (the attention layers'
    dense causal path), Gemma 2's logits equal transformers' over one sequence longer than its
    window; transformers builds no causal or sliding-window mask for host_paged."""
    from transformers import masking_utils

    from host.core.config import LoadConfig, ModelConfig
    from host.core.models.loader import load_model

    path = checkpoints["Gemma2"]
    model_config = ModelConfig(model=path, dtype="float32", model_impl="transformers")
    model, _ = load_model(model_config, LoadConfig(), None)
    assert model_config.model_impl_used == "transformers"
    assert model.sliding_windows == {0: 8, 1: None}  # layer_types: sliding, full
    ids = torch.tensor(prompts_of([20], seed=9)[0])
    with torch.inference_mode():
        got = model.compute_logits(model(ids, torch.arange(len(ids))))
        want = hf_model(path)(ids[None]).logits[0]
    assert (got - want).abs().max() < 1e-4
    embeds = torch.zeros(1, len(ids), 64)
    for make in (masking_utils.create_causal_mask, masking_utils.create_sliding_window_causal_mask):
        assert make(model.hf_model.config, embeds, None, None, position_ids=torch.arange(len(ids))[None]) is None


def config_of(path: str, **kwargs: Any) -> Any:
    return EngineArgs(model=path, skip_tokenizer_init=True, max_model_len=64, **kwargs).create_engine_config()


def test_auto_picks_native_else_transformers_and_says_so(checkpoints, tiny_checkpoint, caplog):
    llama = str(tiny_checkpoint("llama", weights=False))
    with caplog.at_level("INFO", logger="host.models"):
        assert config_of(llama).model.model_impl_used == "host"
        assert config_of(llama, model_impl="transformers").model.model_impl_used == "transformers"
        assert config_of(checkpoints["Olmo2"]).model.model_impl_used == "transformers"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model implementation")]
    assert lines == [
        "model implementation: host (native implementation of LlamaForCausalLM)",
        "model implementation: transformers (asked for with --model-impl transformers)",
        "model implementation: transformers (no native implementation of Olmo2ForCausalLM)",
    ]


def test_model_impl_host_refuses_an_architecture_without_native_code(checkpoints):
    with pytest.raises(ValueError, match=r"--model-impl host: .*Olmo2ForCausalLM.*not supported.*--model-impl transformers"):
        config_of(checkpoints["Olmo2"], model_impl="host")


def test_an_architecture_neither_has_is_a_clear_error(tmp_path, tiny_checkpoint):
    src = tiny_checkpoint("llama", weights=False)
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["NoSuchThingForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"not supported.*transformers .* has no causal LM class 'NoSuchThingForCausalLM'"):
        config_of(str(tmp_path))
    with pytest.raises(ValueError, match=r"--model-impl transformers: .*no causal LM class 'NoSuchThingForCausalLM'"):
        config_of(str(tmp_path), model_impl="transformers")
    with pytest.raises(ValueError, match=r"model_impl='python'.*auto, host, transformers"):
        config_of(str(tmp_path), model_impl="python")


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_parallel_size=2), r"--model-impl transformers runs with -tp 1 -pp 1"),
    (dict(enable_lora=True), r"--model-impl transformers cannot serve LoRA"),
    (dict(runner="pooling", convert="embed"), r"--model-impl transformers generates text only"),
    (dict(speculative_config={"method": "eagle", "model": "/nonexistent", "num_speculative_tokens": 2}),
     r"--model-impl transformers cannot drive an EAGLE head"),
])
def test_what_the_fallback_cannot_run_is_refused_at_start_up(checkpoints, kwargs, message):
    with pytest.raises(ValueError, match=message):
        config_of(checkpoints["Olmo2"], **kwargs)


def test_a_gguf_runs_dequantized_and_its_blocks_are_refused(tmp_path):
    """A Llama GGUF through the fallback with --quantization none (dequantized by host's GGUF
    reader) against transformers' own GGUF loading; kept blocks (the default) are refused."""
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", 8)  # Q8_0 blocks
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=64, model_impl="transformers", quantization="none")
    prompts = prompts_of([7, 2], seed=3)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    with pytest.raises(ValueError, match=r"--model-impl transformers runs unquantized weights.*--quantization none"):
        LLM(str(path), skip_tokenizer_init=True, max_model_len=64, model_impl="transformers")
