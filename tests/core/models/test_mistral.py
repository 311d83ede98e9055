"""Mistral (a sliding window on every layer) and Ministral (interleaved sliding and full layers)
against Hugging Face transformers on tiny random checkpoints.

The window (8) is shorter than every prompt, so a window applied to the wrong layers, off by
one, or not at all shows in the logits: through the dense path (no forward context), through
the whole engine (paged attention, prefix caching, chunked prefill) and from a GGUF file
(llama.cpp writes Mistral as ``general.architecture = llama``; ``llama.attention.sliding_window``
then makes it a Mistral).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.core.config import LoadConfig, ModelConfig
from host.core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from host.core.models.loader import load_model

VOCAB, WINDOW = 256, 8
SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1,
    sliding_window=WINDOW, tie_word_embeddings=False,
)
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
CASES = {
    "mistral": ("Mistral", {}),
    "ministral": ("Ministral", dict(head_dim=16, layer_types=LAYER_TYPES)),
}


def tiny(tmp_path_factory: Any, prefix: str, seed: int = 0, **overrides: Any) -> Path:
    """A tiny random ``{prefix}ForCausalLM`` saved with ``save_pretrained`` (norms moved off 1)."""
    config = getattr(transformers, f"{prefix}Config")(**{**SHAPE, **overrides})
    config.architectures = [f"{prefix}ForCausalLM"]
    path = tmp_path_factory.mktemp(prefix.lower())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, Any]]:
    made = {}
    for case, (prefix, overrides) in CASES.items():
        path = tiny(tmp_path_factory, prefix, **overrides)
        made[case] = (str(path), hf_model(path))
    return made


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(checkpoints, case: str) -> None:
    path, hf = checkpoints[case]
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == CASES[case][0] + "ForCausalLM"
    windows = [layer.self_attn.attn.sliding_window for layer in model.model.layers]
    assert windows == ([WINDOW] * 4 if case == "mistral" else [WINDOW, None, WINDOW, None])
    ids = _ids(30, seed=1)
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(len(ids))))
        ref = hf(ids[None]).logits[0].float()
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-4, f"{case}: max |logit diff| = {diff}"


@pytest.mark.parametrize("case", list(CASES))
def test_engine_greedy_matches_transformers(checkpoints, case: str) -> None:
    """Paged attention with the window, prefix caching (a shared 24-token prefix) and chunked
    prefill (16-token steps); the KV cache specs follow each layer's window."""
    path, hf = checkpoints[case]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=96, block_size=8, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, enable_chunked_prefill=True)
    runner = llm.engine.executor.worker.model_runner
    specs = runner.get_kv_cache_specs()
    want = [SlidingWindowSpec if w else FullAttentionSpec for w in ([1] * 4 if case == "mistral" else [1, 0, 1, 0])]
    assert [type(s) for s in specs] == want
    assert all(s.sliding_window == WINDOW for s in specs if isinstance(s, SlidingWindowSpec))
    prefix = _ids(24, seed=5).tolist()
    prompts = [prefix + _ids(n, seed=10 + n).tolist() for n in (3, 17)] + [_ids(13, seed=4).tolist()]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params)
    assert rest[0].num_cached_tokens == 24  # three blocks of the shared prefix came from the cache
    got = [o.outputs[0].token_ids for o in first + rest]
    assert got == [hf_greedy(hf, p, 10) for p in prompts]


def _permute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's interleaving of each head's RoPE halves in q/k rows (what its converter writes)."""
    half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_mistral_gguf(path: Path, hf: Any) -> Path:
    """The HF model as llama.cpp's converter writes a Mistral: architecture ``llama``, q/k rows
    permuted, float32 tensors, plus ``llama.attention.sliding_window``."""
    from gguf import GGUFWriter

    c = hf.config
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_vocab_size(c.vocab_size)
    writer.add_sliding_window(c.sliding_window)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf_name, gguf_name in names.items():
            w = state[f"model.layers.{i}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                w = _permute_rows(w, c.num_attention_heads)
            elif gguf_name == "attn_k":
                w = _permute_rows(w, c.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_with_sliding_window_loads_as_mistral(checkpoints, tmp_path) -> None:
    path, hf = checkpoints["mistral"]
    gguf = str(write_mistral_gguf(tmp_path / "mistral.gguf", hf))
    model, config = load_model(ModelConfig(model=gguf), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == "MistralForCausalLM" and config.sliding_window == WINDOW
    ids = _ids(30, seed=2)
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(len(ids))))
        ref = hf(ids[None]).logits[0].float()
    assert (ours - ref).abs().max().item() < 1e-4
    llm = LLM(gguf, skip_tokenizer_init=True, max_model_len=64, max_num_batched_tokens=16, enable_chunked_prefill=True)
    prompt = _ids(21, seed=6).tolist()
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(hf, prompt, 8)


def test_backend_requirements_name_the_window_of_any_sliding_layer() -> None:
    """The attention backend is chosen before the model is built, from the config: a window some
    layer uses must be asked for (a backend without sliding windows would attend too far)."""
    from host.core.worker.attention_selector import config_sliding_window

    small = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)
    assert config_sliding_window(transformers.MistralConfig(**small, sliding_window=8)) == 8
    assert config_sliding_window(transformers.MistralConfig(**small, sliding_window=None)) is None
    assert config_sliding_window(transformers.Phi3Config(**small, sliding_window=2047)) == 2047
    assert config_sliding_window(transformers.Qwen2Config(**small, sliding_window=8, use_sliding_window=False)) is None
    assert config_sliding_window(transformers.Qwen2Config(**small, sliding_window=8, use_sliding_window=True, max_window_layers=1)) == 8
    full = transformers.MinistralConfig(**small, sliding_window=8, layer_types=["full_attention"] * 2)
    assert config_sliding_window(full) is None
    assert config_sliding_window(transformers.LlamaConfig(**small)) is None
