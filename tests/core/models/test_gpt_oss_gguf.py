"""gpt-oss from GGUF (``general.architecture = "gpt-oss"``, written as llama.cpp's converter writes
it) against transformers on a tiny random ``GptOssForCausalLM``: the metadata becomes the Hugging
Face config (alternating sliding/full layers, YaRN, experts, the SwiGLU clamp llama.cpp hard-codes);
a float32 file gives transformers' logits; a file whose expert tensors are MXFP4 (and whose q/o
projections are Q8_0) loads the experts dequantized, also under the ``gguf`` plan that keeps the
Q8_0 blocks, and gives the logits and greedy tokens of transformers run on the dequantized weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from helpers import hf_greedy, random_gpt_oss
from host import LLM, SamplingParams
from host.core.config import LoadConfig, ModelConfig
from host.core.models.gguf_file import GGUFCheckpoint
from host.core.models.loader import load_model
from host.core.models.quant_plan import QuantPlan
from host.core.moe.layer import FusedMoE
from host.plugins.quantization.gguf_moe import GGUFMoEMethod

gguf = pytest.importorskip("gguf")

VOCAB, WINDOW, MXFP4, Q8_0 = 256, 8, 39, 8
LAYER_TYPES = ["sliding_attention", "full_attention"] * 2
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 64, "rope_theta": 150000.0}
CONFIG = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=256,
    sliding_window=WINDOW, layer_types=LAYER_TYPES, initializer_range=0.1, tie_word_embeddings=False, swiglu_limit=7.0,
    rms_norm_eps=1e-5, rope_parameters=YARN,
)


def _hf() -> transformers.GptOssForCausalLM:
    """``random_gpt_oss`` with gate/up projections large enough that llama.cpp's clamp (7.0) cuts in."""
    return random_gpt_oss(CONFIG, gate_up_scale=8.0)


def _requantized(w: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
    """(the blocks, the float values they decode to) of ``w`` in GGUF type ``qtype``."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q = quantize(np.ascontiguousarray(w), GGMLQuantizationType(qtype))
    return q, dequantize(q, GGMLQuantizationType(qtype)).reshape(w.shape)


def write_gpt_oss_gguf(path: Path, hf: Any, quantized: bool) -> Path:
    """``hf`` as llama.cpp's GptOssModel converter writes it: float32, or (``quantized``) with
    MXFP4 expert tensors and Q8_0 q/o projections, in which case ``hf`` gets the decoded values,
    the reference the file encodes."""
    from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType

    c = hf.config
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    w = GGUFWriter(str(path), "gpt-oss")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(YARN["rope_theta"])
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN["factor"])
    w.add_rope_scaling_orig_ctx_len(YARN["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(YARN["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(YARN["beta_slow"])
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_sliding_window(c.sliding_window)
    w.add_expert_feed_forward_length(c.intermediate_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(c.vocab_size)])  # the vocabulary size comes from the tokens
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    w.add_tensor("output.weight", state["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.router": "ffn_gate_inp"}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        layer = hf.model.layers[i]
        for hf_name, gguf_name in names.items():
            for kind in ("weight", "bias"):
                t = state.get(f"{p}{hf_name}.{kind}")
                if t is None:
                    continue
                if quantized and kind == "weight" and gguf_name in ("attn_q", "attn_output"):
                    q, deq = _requantized(t, Q8_0)
                    w.add_tensor(f"blk.{i}.{gguf_name}.weight", q, raw_dtype=GGMLQuantizationType.Q8_0)
                    with torch.no_grad():
                        getattr(layer.self_attn, hf_name.split(".")[1]).weight.copy_(torch.from_numpy(deq))
                    continue
                w.add_tensor(f"blk.{i}.{gguf_name}.{kind}", np.ascontiguousarray(t))
        w.add_tensor(f"blk.{i}.attn_sinks.weight", state[f"{p}self_attn.sinks"])
        # gate_up_proj [E, H, 2I] (interleaved columns) -> gate / up [E, I, H]; down_proj [E, I, H] -> [E, H, I]
        gate_up = state[f"{p}mlp.experts.gate_up_proj"].transpose(0, 2, 1)
        stacked = {"ffn_gate_exps": gate_up[:, ::2], "ffn_up_exps": gate_up[:, 1::2],
                   "ffn_down_exps": state[f"{p}mlp.experts.down_proj"].transpose(0, 2, 1)}
        bias = state[f"{p}mlp.experts.gate_up_proj_bias"]
        biases = {"ffn_gate_exps": bias[:, ::2], "ffn_up_exps": bias[:, 1::2],
                  "ffn_down_exps": state[f"{p}mlp.experts.down_proj_bias"]}
        for name, t in stacked.items():
            if quantized:
                q, stacked[name] = _requantized(t, MXFP4)
                w.add_tensor(f"blk.{i}.{name}.weight", q, raw_dtype=GGMLQuantizationType.MXFP4)
            else:
                w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))
            w.add_tensor(f"blk.{i}.{name}.bias", np.ascontiguousarray(biases[name]))
        if quantized:
            gate_up = np.empty_like(gate_up)
            gate_up[:, ::2], gate_up[:, 1::2] = stacked["ffn_gate_exps"], stacked["ffn_up_exps"]
            with torch.no_grad():
                layer.mlp.experts.gate_up_proj.copy_(torch.from_numpy(gate_up.transpose(0, 2, 1)))
                layer.mlp.experts.down_proj.copy_(torch.from_numpy(stacked["ffn_down_exps"].transpose(0, 2, 1)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


IDS = _ids(40, seed=1)  # a 40-token prompt: the 8-token window cuts in


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[str, Any, torch.Tensor]]:
    """kind -> (the GGUF file, the transformers model it encodes, that model's logits for IDS)."""
    root = tmp_path_factory.mktemp("gpt_oss_gguf")
    out = {}
    for kind, quantized in (("float", False), ("mxfp4", True)):
        hf = _hf()
        path = str(write_gpt_oss_gguf(root / f"{kind}.gguf", hf, quantized))
        with torch.no_grad():
            out[kind] = (path, hf, hf(IDS[None]).logits[0].float())
    return out


def _logit_diff(model: Any, ref: torch.Tensor) -> float:
    with torch.no_grad():
        return (model.compute_logits(model(IDS, torch.arange(len(IDS)))) - ref).abs().max().item()


def test_metadata_maps_to_the_gpt_oss_config(files) -> None:
    path, hf, _ = files["float"]
    config = GGUFCheckpoint(path).hf_config()
    assert config.architectures == ["GptOssForCausalLM"] and config.model_type == "gpt_oss"
    for key in ("layer_types", "sliding_window", "num_local_experts", "num_experts_per_tok", "intermediate_size",
                "head_dim", "num_key_value_heads", "vocab_size", "swiglu_limit", "attention_bias"):
        assert getattr(config, key) == getattr(hf.config, key), key
    assert config.rms_norm_eps == pytest.approx(hf.config.rms_norm_eps)  # stored as float32
    assert config.rope_parameters == YARN
    assert not config.tie_word_embeddings


def test_float_gguf_matches_transformers(files) -> None:
    """IDS' logits; the clamp llama.cpp hard-codes (7.0, not in the file) matters here."""
    path, _, ref = files["float"]
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == "GptOssForCausalLM"
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == [WINDOW, None, WINDOW, None]
    assert _logit_diff(model, ref) < 1e-4
    for layer in model.model.layers:
        layer.mlp.experts.limit = 100.0
    assert _logit_diff(model, ref) > 1e-2, "the SwiGLU clamp must matter in this test"


def test_mxfp4_experts_load_dequantized(files) -> None:
    """No plan: every GGUF tensor dequantized; the gguf plan (Q8_0 blocks kept): the MXFP4 experts
    still come dequantized (no kernel reads MXFP4), into GGUFMoEMethod's float experts."""
    path, _, ref = files["mxfp4"]
    types = GGUFCheckpoint(path).tensor_types()
    assert types["model.layers.0.mlp.experts.3.down_proj.weight"] == MXFP4
    assert types["model.layers.0.self_attn.q_proj.weight"] == Q8_0
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert _logit_diff(model, ref) < 1e-3
    plan = QuantPlan(method="gguf", source="test", gguf_path=path)
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None, quant_plan=plan)
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(layers) == 4
    assert all(isinstance(layer.method, GGUFMoEMethod) and layer.gguf_float for layer in layers)
    attn = model.model.layers[0].self_attn
    assert attn.o_proj.qtypes == [Q8_0] and Q8_0 in attn.qkv_proj.qtypes
    assert _logit_diff(model, ref) < 1e-3


def test_engine_greedy_matches_transformers(files) -> None:
    """The engine on the MXFP4 file (the gguf plan by default: Q8_0 q/o blocks kept, the experts
    float; paged attention with sinks, sliding KV on the even layers, chunked prefill), a prompt
    longer than the window: transformers' greedy tokens."""
    path, hf, _ = files["mxfp4"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, block_size=8, max_num_batched_tokens=16,
              enable_chunked_prefill=True)
    runner = llm.engine.executor.worker.model_runner
    assert [getattr(s, "sliding_window", None) for s in runner.get_kv_cache_specs()] == [WINDOW, None, WINDOW, None]
    prompts = [_ids(27, seed=6).tolist(), _ids(12, seed=7).tolist()]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for out, prompt in zip(outs, prompts):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8)
