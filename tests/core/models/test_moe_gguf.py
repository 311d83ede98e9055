"""Mixture-of-experts GGUF files (Qwen3-MoE, Qwen2-MoE with its shared expert, OLMoE, and Mixtral
as llama.cpp writes it: arch ``llama`` with ``llama.expert_count``) against transformers: float32 files load into float experts; files
whose expert tensors are Q8_0 keep them quantized (the ``gguf`` method's MoE method, computing
through ``gguf_linear``), equal to transformers run on the dequantized weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from helpers import hf_greedy
from host import LLM, SamplingParams
from host.core.config import LoadConfig, ModelConfig
from host.core.models.gguf_file import GGUFCheckpoint
from host.core.models.loader import load_model
from host.core.models.quant_plan import QuantPlan
from host.core.moe.layer import FusedMoE
from host.plugins.quantization.gguf_moe import GGUFMoEMethod

gguf = pytest.importorskip("gguf")

VOCAB = 256
BASE = dict(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
    max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=False,
)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # layer 1 dense: a qwen3moe file without ffn_gate_inp there
    "qwen3moe": ("Qwen3Moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=96,
                                  norm_topk_prob=True, head_dim=16, mlp_only_layers=[1])),
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64)),
    "qwen2moe": ("Qwen2Moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=96,
                                  shared_expert_intermediate_size=48, norm_topk_prob=False)),
    "olmoe": ("Olmoe", dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, clip_qkv=3.0)),
}


def _hf(case: str) -> Any:
    prefix, overrides = CASES[case]
    config = getattr(transformers, f"{prefix}Config")(**{**BASE, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif name.endswith("mlp.gate.weight"):
                    param.mul_(20.0)  # routers with clear choices: the same experts in both runs
    return model


def _permute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's interleaving of each head's RoPE halves in q/k rows (its llama converter)."""
    half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_moe_gguf(path: Path, hf: Any, arch: str, quantize_experts: bool) -> Path:
    """``hf`` as llama.cpp's converter writes it (experts stacked per projection; Mixtral as arch
    ``llama`` with its q/k rows permuted), float32, or with Q8_0 expert tensors — in which case
    ``hf``'s experts are set to the dequantized values, the reference the file encodes."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    c = hf.config
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_vocab_size(c.vocab_size)
    writer.add_expert_used_count(c.num_experts_per_tok)
    if arch == "llama":
        writer.add_expert_count(c.num_local_experts)
    elif arch == "olmoe":
        writer.add_expert_count(c.num_experts)
        writer.add_clamp_kqv(c.clip_qkv)
    else:
        writer.add_expert_count(c.num_experts)
        writer.add_expert_feed_forward_length(c.moe_intermediate_size)
        if arch == "qwen2moe":
            writer.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
        else:
            writer.add_key_length(c.head_dim)
            writer.add_value_length(c.head_dim)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
             "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
    for i in range(c.num_hidden_layers):
        for hf_name, gguf_name in names.items():
            for kind in ("weight", "bias"):
                w = state.get(f"model.layers.{i}.{hf_name}.{kind}")
                if w is None:
                    continue
                if arch == "llama" and gguf_name in ("attn_q", "attn_k"):
                    w = _permute_rows(w, c.num_attention_heads if gguf_name == "attn_q" else c.num_key_value_heads)
                if gguf_name == "ffn_gate_inp_shexp":
                    w = w.reshape(-1)  # llama.cpp's {n_embd} vector
                writer.add_tensor(f"blk.{i}.{gguf_name}.{kind}", np.ascontiguousarray(w))
        gate_up = state.get(f"model.layers.{i}.mlp.experts.gate_up_proj")
        if gate_up is None:
            continue  # a dense layer
        inter = gate_up.shape[1] // 2
        stacked = {"ffn_gate_exps": gate_up[:, :inter], "ffn_up_exps": gate_up[:, inter:],
                   "ffn_down_exps": state[f"model.layers.{i}.mlp.experts.down_proj"]}
        if quantize_experts:
            deq = {}
            for name, w in stacked.items():
                q = quantize(np.ascontiguousarray(w), GGMLQuantizationType.Q8_0)
                writer.add_tensor(f"blk.{i}.{name}.weight", q, raw_dtype=GGMLQuantizationType.Q8_0)
                deq[name] = torch.from_numpy(dequantize(q, GGMLQuantizationType.Q8_0).reshape(w.shape))
            experts = hf.model.layers[i].mlp.experts
            with torch.no_grad():
                experts.gate_up_proj.copy_(torch.cat([deq["ffn_gate_exps"], deq["ffn_up_exps"]], dim=1))
                experts.down_proj.copy_(deq["ffn_down_exps"])
        else:
            for name, w in stacked.items():
                writer.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids))))


def test_moe_metadata_maps_to_the_hf_config(tmp_path) -> None:
    hf = _hf("qwen3moe")
    path = write_moe_gguf(tmp_path / "q.gguf", hf, "qwen3moe", quantize_experts=False)
    config = GGUFCheckpoint(str(path)).hf_config()
    assert config.architectures == ["Qwen3MoeForCausalLM"]
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (8, 2, 32)
    assert config.norm_topk_prob is True and config.mlp_only_layers == [1] and config.head_dim == 16
    hf = _hf("mixtral")
    path = write_moe_gguf(tmp_path / "m.gguf", hf, "llama", quantize_experts=False)
    config = GGUFCheckpoint(str(path)).hf_config()
    assert config.architectures == ["MixtralForCausalLM"]
    assert (config.num_local_experts, config.num_experts_per_tok, config.intermediate_size) == (4, 2, 64)


@pytest.mark.parametrize("case,arch", [("qwen3moe", "qwen3moe"), ("mixtral", "llama"), ("qwen2moe", "qwen2moe"),
                                       ("olmoe", "olmoe")])
def test_float_moe_gguf_matches_transformers(tmp_path, case: str, arch: str) -> None:
    hf = _hf(case)
    path = str(write_moe_gguf(tmp_path / f"{case}.gguf", hf, arch, quantize_experts=False))
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == CASES[case][0] + "ForCausalLM"
    ids = _ids(40, seed=1)
    diff = (_logits(model, ids) - hf(ids[None]).logits[0].float()).abs().max().item()
    assert diff < 1e-4, f"{case}: max |logit diff| = {diff}"


@pytest.mark.parametrize("case,arch", [("qwen3moe", "qwen3moe"), ("mixtral", "llama")])
def test_q8_experts_stay_quantized_and_match_transformers(tmp_path, case: str, arch: str) -> None:
    hf = _hf(case)
    path = str(write_moe_gguf(tmp_path / f"{case}.gguf", hf, arch, quantize_experts=True))
    plan = QuantPlan(method="gguf", source="test", gguf_path=path)
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None, quant_plan=plan)
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(layers) == (2 if case == "qwen3moe" else 3)
    for layer in layers:
        assert isinstance(layer.method, GGUFMoEMethod) and not layer.gguf_float
        assert layer.gguf_w13.dtype == torch.uint8 and layer.gguf_w2.dtype == torch.uint8
        assert layer.gguf_w13_qtype == layer.gguf_w2_qtype == 8 and layer.gguf_w3 is None  # Q8_0
        assert not any(t.is_floating_point() and t.dim() == 3 for t in [*layer.parameters(), *layer.buffers()])
    ids = _ids(40, seed=1)
    diff = (_logits(model, ids) - hf(ids[None]).logits[0].float()).abs().max().item()
    assert diff < 1e-3, f"{case}: max |logit diff| = {diff}"
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, block_size=8, max_num_batched_tokens=16,
              enable_chunked_prefill=True)
    prompts = [_ids(21, seed=6).tolist(), _ids(9, seed=7).tolist()]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for out, prompt in zip(outs, prompts):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8)


def test_experts_dequantized_when_the_plan_keeps_them_float(tmp_path) -> None:
    """--quantization none: the Q8_0 experts load as float ``w13``/``w2`` (dequantized)."""
    hf = _hf("qwen3moe")
    path = str(write_moe_gguf(tmp_path / "q.gguf", hf, "qwen3moe", quantize_experts=True))
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    layer = next(m for m in model.modules() if isinstance(m, FusedMoE))
    assert layer.method is None and layer.w13.dtype == torch.float32
    ids = _ids(30, seed=2)
    assert (_logits(model, ids) - hf(ids[None]).logits[0].float()).abs().max().item() < 1e-3


def test_eplb_moves_quantized_experts_as_stored(tmp_path) -> None:
    """--enable-eplb on Q8_0 experts kept in blocks, two redundant slots, a rearrangement every
    3 steps: the block rows move with their experts and the greedy tokens stay transformers'."""
    hf = _hf("qwen3moe")
    path = str(write_moe_gguf(tmp_path / "q.gguf", hf, "qwen3moe", quantize_experts=True))
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, enable_eplb=True,
              eplb_config={"window_size": 2, "step_interval": 3, "num_redundant_experts": 2, "min_improvement": 0.0})
    prompts = [_ids(21, seed=6).tolist(), _ids(9, seed=7).tolist()]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    layer = next(m for m in llm.engine.executor.worker.model_runner.model.modules() if isinstance(m, FusedMoE))
    assert isinstance(layer.method, GGUFMoEMethod) and layer.num_physical == 10
    assert llm.engine.scheduler.make_stats().eplb_stats.rearrangements >= 2
    for out, prompt in zip(outs, prompts):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 10)
