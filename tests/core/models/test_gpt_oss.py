"""gpt-oss against Hugging Face transformers on a tiny random checkpoint: logits of one dense
forward (attention sinks, biases, the alternating 8-token sliding window, the biased router and
the clamped-SwiGLU experts with their interleaved gate/up layout), the router against
transformers' own, then the whole engine (paged attention with sinks on cpu_paged's compiled
decode kernel and on torch_paged, the per-layer sliding/full KV specs, prefix caching, chunked
prefill) with greedy tokens and logprobs; and an MXFP4 checkpoint (``_blocks``/``_scales``
experts, ``quant_method: mxfp4``) loading dequantized to the same numbers."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import save_file

from helpers import assert_engine_matches_hf, hf_model, random_gpt_oss, random_ids
from host import LLM
from host.core.config import LoadConfig, ModelConfig
from host.core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from host.core.models.gpt_oss import FP4_E2M1_VALUES, MXFP4_BLOCK, dequantize_mxfp4
from host.core.models.loader import load_model
from host.core.moe.layer import FusedMoE
from host.core.moe.router import select_experts

VOCAB, WINDOW = 256, 8
LAYER_TYPES = ["sliding_attention", "full_attention"] * 2
CONFIG = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=256,
    sliding_window=WINDOW, layer_types=LAYER_TYPES, initializer_range=0.1, tie_word_embeddings=False, swiglu_limit=1.5,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 64, "rope_theta": 150000.0},
)


def tiny_gpt_oss(path: str, seed: int = 0) -> transformers.GptOssForCausalLM:
    """A random gpt-oss (``random_gpt_oss``) saved at ``path``; swiglu_limit 1.5 keeps the clamp active."""
    model = random_gpt_oss(CONFIG, seed)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[str, Any]:
    path = str(tmp_path_factory.mktemp("gpt_oss"))
    tiny_gpt_oss(path)
    return path, hf_model(path)


def _ids(n: int, seed: int) -> torch.Tensor:
    return random_ids(n, seed, VOCAB)


def test_logits_match_transformers(checkpoint) -> None:
    """Equal logits (a 40-token prompt: the 8-token window cuts in); without the sinks they differ."""
    path, hf = checkpoint
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == "GptOssForCausalLM"
    assert all(isinstance(layer.mlp.experts, FusedMoE) for layer in model.model.layers)
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == [WINDOW, None, WINDOW, None]
    ids = _ids(40, seed=1)
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(len(ids))))
        ref = hf(ids[None]).logits[0].float()
        diff = (ours - ref).abs().max().item()
        assert diff < 1e-4, f"max |logit diff| = {diff}"
        for layer in model.model.layers:
            layer.self_attn.attn.sinks.zero_()
        unsunk = model.compute_logits(model(ids, torch.arange(len(ids))))
    assert (unsunk - ref).abs().max().item() > 1e-2, "the sinks must matter in this test"


def test_router_is_softmax_top_k_renormalised(checkpoint) -> None:
    """gpt-oss's router (top-k of the logits, softmax over those k) gives the weights and experts
    of select_experts' softmax scoring with renormalize=True."""
    _, hf = checkpoint
    router = hf.model.layers[0].mlp.router
    x = torch.randn(50, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, ref_weights, ref_ids = router(x)
    weights, ids = select_experts(logits, CONFIG["num_experts_per_tok"], scoring="softmax", renormalize=True)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_weights.float(), atol=1e-6, rtol=1e-6)


def _engine_matches(path: str, hf: Any, backend: str | None) -> None:
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=96, block_size=8, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, enable_chunked_prefill=True, attention_backend=backend)
    runner = llm.engine.executor.worker.model_runner
    specs = runner.get_kv_cache_specs()
    assert [type(s) for s in specs] == [SlidingWindowSpec, FullAttentionSpec] * 2
    assert all(s.sliding_window == WINDOW for s in specs if isinstance(s, SlidingWindowSpec))
    impls = {type(layer.self_attn.attn.impl).__name__ for layer in runner.model.model.layers}
    assert impls == {"CpuPagedAttentionImpl" if backend in (None, "cpu_paged") else "TorchPagedAttentionImpl"}
    assert_engine_matches_hf(llm, hf, VOCAB)


@pytest.mark.parametrize("backend", [None, "torch_paged"])
def test_engine_greedy_and_logprobs_match_transformers(checkpoint, backend: str | None) -> None:
    """The default CPU backend (cpu_paged: decode rows through the compiled kernel, with the
    sinks) and torch_paged; sliding KV specs on the sliding layers, full on the others."""
    path, hf = checkpoint
    _engine_matches(path, hf, backend)


# -- MXFP4 --------------------------------------------------------------------------------------


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [..., K]`` (K a multiple of 32) -> (blocks uint8 ``[..., K/32, 16]``, scales uint8
    ``[..., K/32]``): per group of 32 the E8M0 exponent ``e = ceil(log2(amax / 6))`` (the largest
    value fits e2m1's 6), each value rounded to the nearest e2m1 code of ``value / 2**e``, two
    codes per byte, the even-indexed value in the low nibble."""
    groups = weight.float().reshape(*weight.shape[:-1], -1, MXFP4_BLOCK)
    amax = groups.abs().amax(-1).clamp(min=2.0**-126)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    values = torch.tensor(FP4_E2M1_VALUES[:8])
    nearest = (scaled.abs().unsqueeze(-1) - values).abs().argmin(-1)
    codes = (nearest | ((scaled < 0).long() << 3)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def test_mxfp4_dequantization_equals_transformers() -> None:
    """Our dequantization of our quantizer's blocks equals transformers' own (which returns the
    float checkpoint layout, the transpose), and it is the quantizer's nearest-value rounding."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    weight = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(0))  # [E, out, in]
    blocks, scales = quantize_mxfp4(weight)
    ours = dequantize_mxfp4(blocks, scales, torch.float32)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(ours.transpose(1, 2), theirs)
    step = torch.exp2(scales.float() - 127).repeat_interleave(MXFP4_BLOCK, -1)
    assert ((ours - weight).abs() <= step + 1e-6).all()  # e2m1's gaps are at most 2 steps: half is 1


def test_mxfp4_checkpoint_loads_dequantized(checkpoint, tmp_path) -> None:
    """The tiny model's experts written as MXFP4 ``_blocks``/``_scales`` with ``quant_method:
    mxfp4`` load (no quantization method needed) and generate what transformers generates from
    the DEQUANTIZED float weights."""
    path, _ = checkpoint
    hf = transformers.GptOssForCausalLM.from_pretrained(path, dtype=torch.float32)
    quantized, floats = {}, {}
    for name, tensor in hf.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize_mxfp4(tensor.transpose(1, 2).contiguous())  # [E, out, in]
            quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
            tensor = dequantize_mxfp4(blocks, scales, torch.float32).transpose(1, 2)
        else:
            quantized[name] = tensor.contiguous()
        floats[name] = tensor.contiguous()
    mx_dir, float_dir = tmp_path / "mxfp4", tmp_path / "dequantized"
    hf.config.save_pretrained(float_dir)
    save_file(floats, os.path.join(float_dir, "model.safetensors"))
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                     "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    mx_dir.mkdir()
    (mx_dir / "config.json").write_text(json.dumps(config))
    save_file(quantized, os.path.join(mx_dir, "model.safetensors"))
    ref = hf_model(str(float_dir))
    with torch.no_grad():
        changed = max((a - b).abs().max().item() for a, b in zip(ref.state_dict().values(), hf.state_dict().values()))
    assert changed > 1e-3, "quantizing must change the expert weights"
    _engine_matches(str(mx_dir), ref, None)


def test_mxfp4_quant_method_is_dequantized_for_gpt_oss_only(tmp_path, caplog) -> None:
    """The plan runs a gpt-oss MXFP4 checkpoint unquantized (its loader dequantizes the experts),
    saying so once; another architecture quantized with mxfp4 is still refused."""
    from types import SimpleNamespace

    from host.core.config import EngineConfig, QuantizationConfig
    from host.core.models.quant_plan import registered_methods, resolve_quant_plan

    cpu = SimpleNamespace(name="cpu", device_type="cpu", supported_quantization=[], get_device_capability=lambda device_id=0: None)
    mxfp4 = {"quant_method": "mxfp4"}

    def engine_config(hf: Any) -> EngineConfig:
        model = ModelConfig(model=str(tmp_path), dtype="float32", hf_config=hf, resolved_path=str(tmp_path))
        return EngineConfig(model=model, quant=QuantizationConfig(None, [], {}))

    gpt_oss = transformers.GptOssConfig(**CONFIG, quantization_config=mxfp4)
    gpt_oss.architectures = ["GptOssForCausalLM"]
    with caplog.at_level("INFO", logger="host.quantization"):
        plan = resolve_quant_plan(engine_config(gpt_oss), registered_methods(), cpu)
    assert plan.method is None and not plan.quantized
    assert sum("mxfp4 weights are dequantized to the model dtype at load" in r.message for r in caplog.records) == 1
    llama = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, quantization_config=mxfp4)
    llama.architectures = ["LlamaForCausalLM"]
    with pytest.raises(ValueError, match="quant_method='mxfp4', which no registered method runs"):
        resolve_quant_plan(engine_config(llama), registered_methods(), cpu)


def test_backend_requirements_ask_for_sinks() -> None:
    """The backend is chosen from the config before the model is built: gpt-oss's class declares
    its sinks, so a backend without them (triton_paged) is not a candidate."""
    from host.core.worker.attention_selector import config_attention_sinks

    gpt_oss = transformers.GptOssConfig(**CONFIG)
    gpt_oss.architectures = ["GptOssForCausalLM"]
    assert config_attention_sinks(gpt_oss)
    llama = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    llama.architectures = ["LlamaForCausalLM"]
    assert not config_attention_sinks(llama)
    llama.architectures = ["NoSuchForCausalLM"]
    assert not config_attention_sinks(llama)


def test_the_transformers_fallback_refuses_sinks(checkpoint) -> None:
    """--model-impl transformers would drop the sinks (transformers passes them as ``s_aux``): refused."""
    path, _ = checkpoint
    with pytest.raises(ValueError, match="attention sinks.*cannot run with --model-impl transformers"):
        load_model(ModelConfig(model=path, model_impl="transformers"), LoadConfig(), attn_backend=None)
