"""Phi-3 / Phi-4-mini against Hugging Face transformers on tiny random checkpoints.

Cases: LongRoPE (short/long factors, the cos/sin attention scale), LongRoPE with partial rotary
(0.75 of each head, tied embeddings: Phi-4-mini's shape), and a sliding window on every layer
(Phi-3-mini-4k's shape). LongRoPE's factor set is chosen once per engine from max_model_len
(see ``RotaryEmbedding``): an engine within ``original_max_position_embeddings`` (64 here) uses the
short factors, as transformers does for sequences that fit; an engine beyond it uses the long
ones, as transformers does for a sequence longer than 64 tokens. Both regimes are compared.
Checkpoints load from safetensors (fused ``qkv_proj`` / ``gate_up_proj``) and from a GGUF
written the way llama.cpp's converter writes Phi-3.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.core.config import LoadConfig, ModelConfig
from host.core.models.loader import load_model

VOCAB, ORIGINAL, HEAD_DIM = 256, 64, 16
SHAPE = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=VOCAB, max_position_embeddings=256, original_max_position_embeddings=ORIGINAL,
    rms_norm_eps=1e-5, initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


def _longrope(rotary_dim: int) -> dict[str, Any]:
    n = rotary_dim // 2
    return dict(
        rope_type="longrope", rope_theta=10000.0,
        short_factor=[1.0 + 0.1 * i for i in range(n)],
        long_factor=[1.0 + 2.0 * i for i in range(n)],  # far apart: the wrong set shows
    )


CASES = {
    "longrope": dict(rope_scaling=_longrope(HEAD_DIM), tie_word_embeddings=False),
    "partial-tied": dict(rope_scaling={**_longrope(12), "partial_rotary_factor": 0.75}, partial_rotary_factor=0.75,
                         tie_word_embeddings=True),
    "sliding": dict(sliding_window=8, max_position_embeddings=ORIGINAL, tie_word_embeddings=False),
}


def tiny_phi3(tmp_path_factory: Any, seed: int = 0, **overrides: Any) -> Path:
    """A tiny random ``Phi3ForCausalLM`` saved with ``save_pretrained`` (norms moved off 1)."""
    config = transformers.Phi3Config(**{**SHAPE, **overrides})
    config.architectures = ["Phi3ForCausalLM"]
    path = tmp_path_factory.mktemp("phi3")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.Phi3ForCausalLM(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, Any]]:
    made = {}
    for case, overrides in CASES.items():
        path = tiny_phi3(tmp_path_factory, **overrides)
        made[case] = (str(path), hf_model(path))
    return made


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _compare(model: Any, hf: Any, ids: torch.Tensor) -> float:
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(len(ids))))
        ref = hf(ids[None]).logits[0].float()
    return (ours - ref).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers_short_regime(checkpoints, case: str) -> None:
    """max_model_len within the original length: short factors, as transformers for <= 64 tokens."""
    path, hf = checkpoints[case]
    model, _ = load_model(ModelConfig(model=path, max_model_len=ORIGINAL), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == "Phi3ForCausalLM"
    rope = model.model.rotary_emb
    assert rope.rotary_dim == (12 if case == "partial-tied" else HEAD_DIM)
    assert (model.lm_head is model.model.embed_tokens) == (case == "partial-tied")
    windows = {layer.self_attn.attn.sliding_window for layer in model.model.layers}
    assert windows == ({8} if case == "sliding" else {None})
    diff = _compare(model, hf, _ids(40, seed=1))
    assert diff < 1e-4, f"{case}: max |logit diff| = {diff}"


@pytest.mark.parametrize("case", ["longrope", "partial-tied"])
def test_logits_match_transformers_long_regime(checkpoints, case: str) -> None:
    """max_model_len beyond the original length: long factors and the attention scale
    sqrt(1 + log(256/64) / log(64)), as transformers for a 90-token sequence."""
    path, hf = checkpoints[case]
    model, _ = load_model(ModelConfig(model=path, max_model_len=256), LoadConfig(), attn_backend=None)
    rope = model.model.rotary_emb
    scale = math.sqrt(1 + math.log(256 / ORIGINAL) / math.log(ORIGINAL))
    assert rope.cos_sin_cache[0, 0].item() == pytest.approx(scale)  # cos(0) * the attention scale
    diff = _compare(model, hf, _ids(90, seed=3))
    assert diff < 1e-4, f"{case}: max |logit diff| = {diff}"


@pytest.mark.parametrize("case", list(CASES))
def test_engine_greedy_matches_transformers(checkpoints, case: str) -> None:
    """The whole engine (paged attention, prefix caching with a shared 16-token prefix, chunked
    prefill of 16-token steps) within the original length."""
    path, hf = checkpoints[case]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=ORIGINAL, block_size=8, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, enable_chunked_prefill=True)
    prefix = _ids(16, seed=5).tolist()
    prompts = [prefix + _ids(n, seed=10 + n).tolist() for n in (3, 21)] + [_ids(11, seed=4).tolist()]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params)
    assert rest[0].num_cached_tokens == 16
    got = [o.outputs[0].token_ids for o in first + rest]
    assert got == [hf_greedy(hf, p, 10) for p in prompts]


def test_engine_long_regime_matches_transformers(checkpoints) -> None:
    """An engine beyond the original length on a prompt beyond it: long factors throughout, as
    transformers once a sequence passes 64 tokens."""
    path, hf = checkpoints["partial-tied"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=128, max_num_batched_tokens=32, enable_chunked_prefill=True)
    prompt = _ids(70, seed=8).tolist()
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(hf, prompt, 8)


def write_phi3_gguf(path: Path, hf: Any, quantize_to: Any = None) -> Path:
    """The HF model as llama.cpp's converter writes Phi-3: architecture ``phi3``, fused
    ``attn_qkv`` and gate+up ``ffn_up``, no q/k permutation, ``rope.dimension_count``, the
    pretraining length, ``sliding_window`` (0: none) and the LongRoPE factors as tensors; the
    layers' projections in float32 or in the block type ``quantize_to``."""
    from gguf import GGUFWriter
    from gguf.quants import quantize

    c = hf.config
    rope = c.rope_parameters
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    head_dim = c.hidden_size // c.num_attention_heads
    writer = GGUFWriter(str(path), "phi3")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * head_dim))
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_sliding_window(c.sliding_window or 0)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not c.tie_word_embeddings:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    if rope.get("long_factor"):
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.qkv_proj": "attn_qkv",
             "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf_name, gguf_name in names.items():
            weight = state[f"model.layers.{i}.{hf_name}.weight"]
            if quantize_to is not None and weight.ndim == 2:
                writer.add_tensor(f"blk.{i}.{gguf_name}.weight", quantize(weight, quantize_to), raw_dtype=quantize_to)
            else:
                writer.add_tensor(f"blk.{i}.{gguf_name}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_round_trip_matches_transformers(checkpoints, case: str, tmp_path) -> None:
    path, hf = checkpoints[case]
    gguf = str(write_phi3_gguf(tmp_path / "phi3.gguf", hf))
    model, config = load_model(ModelConfig(model=gguf, max_model_len=ORIGINAL), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == "Phi3ForCausalLM"
    assert config.sliding_window == hf.config.sliding_window
    assert model.model.rotary_emb.rotary_dim == (12 if case == "partial-tied" else HEAD_DIM)
    assert _compare(model, hf, _ids(40, seed=2)) < 1e-4
    if case == "partial-tied":  # and the long regime, from the factors stored as tensors
        model, _ = load_model(ModelConfig(model=gguf, max_model_len=256), LoadConfig(), attn_backend=None)
        assert _compare(model, hf, _ids(90, seed=3)) < 1e-4


def test_gguf_q8_0_blocks_kept_split_like_the_float_file(checkpoints, tmp_path) -> None:
    """Q8_0 projections kept as blocks: the fused attn_qkv / ffn_up blocks are split by rows into
    the q/k/v and gate/up shards; greedy tokens equal the same file dequantized."""
    from gguf import GGMLQuantizationType

    from host.core.models.quant_linear import QuantLinear

    _, hf = checkpoints["longrope"]
    gguf = str(write_phi3_gguf(tmp_path / "phi3-q8.gguf", hf, GGMLQuantizationType.Q8_0))
    prompts = [_ids(19, seed=20).tolist(), _ids(6, seed=21).tolist()]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    runs = {}
    for quant in ("auto", "none"):
        llm = LLM(gguf, skip_tokenizer_init=True, max_model_len=ORIGINAL, **({} if quant == "auto" else {"quantization": "none"}))
        model = llm.engine.executor.worker.model_runner.model
        assert isinstance(model.model.layers[0].self_attn.qkv_proj, QuantLinear) == (quant == "auto")
        assert isinstance(model.model.layers[1].mlp.gate_up_proj, QuantLinear) == (quant == "auto")
        runs[quant] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert runs["auto"] == runs["none"]


def test_fused_tensor_of_the_wrong_size_is_an_error(checkpoints) -> None:
    _, hf = checkpoints["longrope"]
    from host.core.models.phi3 import Phi3ForCausalLM

    model = Phi3ForCausalLM(hf.config)
    state = dict(hf.state_dict())
    state["model.layers.1.self_attn.qkv_proj.weight"] = state["model.layers.1.self_attn.qkv_proj.weight"][:-16]
    with pytest.raises(ValueError, match=r"qkv_proj.*rows"):
        model.load_weights(state.items())


def test_tp2_engine_matches_transformers(checkpoints) -> None:
    """``-tp 2`` (two worker processes over gloo): each rank keeps its q heads and kv heads of the
    fused checkpoint qkv_proj and its half of gate_up_proj; the greedy tokens equal transformers'."""
    path, hf = checkpoints["partial-tied"]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=ORIGINAL, max_num_batched_tokens=16, enable_chunked_prefill=True,
              tensor_parallel_size=2, distributed_executor_backend="mp")
    try:
        prompts = [_ids(23, seed=12).tolist(), _ids(9, seed=13).tolist()]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]
    finally:
        llm.shutdown()
