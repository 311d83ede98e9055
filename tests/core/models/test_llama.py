"""Our Llama / Qwen2 / Qwen3 against Hugging Face transformers on tiny random checkpoints.

Each case takes a tiny random checkpoint (``tiny_checkpoint``: transformers' model saved with
``save_pretrained``), loads the directory through our loader and compares logits of one causal sequence (no forward
context: the attention layer's dense causal path).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers

from helpers import hf_model
from host.core.config import LoadConfig, ModelConfig
from host.core.models.layers import RotaryEmbedding, rope_parameters_from_config
from host.core.models.loader import get_model_architecture, load_model, max_model_len, resolve_dtype
from host.core.models.registry import resolve_model_class
from host.sdk import hookimpl
from host.sdk.testing import isolated_plugin_host, registered_plugin

VOCAB = 512
SEQ_LEN = 24

BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    initializer_range=0.1,  # larger than real (0.02) so RoPE and attention visibly matter
)

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-tied": ("llama", dict(tie_word_embeddings=True, rope_theta=10000.0)),
    "llama-untied-bias": ("llama", dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    "llama3-rope": (
        "llama",
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "llama-linear-rope": ("llama", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
    "llama-dynamic-rope": ("llama", dict(rope_scaling=dict(rope_type="dynamic", factor=2.0))),
    "qwen2-bias": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen2-yarn": (
        "qwen2",
        dict(rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)),
    ),
    "qwen2-sliding-window": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=8, max_window_layers=1),
    ),
    "qwen3-qk-norm": ("qwen3", dict(head_dim=32, tie_word_embeddings=False)),
}


def _checkpoint(tiny_checkpoint: Any, arch: str, overrides: dict[str, Any]) -> tuple[str, Any]:
    """The checkpoint directory and its HF reference model; norms and biases are moved away from
    1 / 0 so a mis-mapped tensor shows."""
    path = tiny_checkpoint(arch, norm_std=0.1, bias_std=0.05, **{**BASE, **overrides})
    return str(path), hf_model(path)


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids))))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case: str, tiny_checkpoint: Any) -> None:
    arch, overrides = CASES[case]
    path, hf = _checkpoint(tiny_checkpoint, arch, overrides)
    model, hf_config = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    assert type(model).__name__ == {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[arch] + "ForCausalLM"
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(1))
    ours = _logits(model, ids)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert ours.dtype == torch.float32 and ours.shape == (SEQ_LEN, VOCAB)
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-4, f"{case}: max |logit diff| = {diff}"


def test_bfloat16_close_to_transformers(tiny_checkpoint: Any) -> None:
    path, hf = _checkpoint(tiny_checkpoint, "llama", {})
    model, _ = load_model(ModelConfig(model=path, dtype="bfloat16"), LoadConfig(), attn_backend=None)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(2))
    ours = _logits(model, ids)
    hf = hf.to(torch.bfloat16)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 0.1  # a few bf16 ulps at |logit| ~ 3


def test_positions_are_honoured(tiny_checkpoint: Any) -> None:
    """Positions come from the argument, not from token order: shifting every position by a
    constant leaves the outputs unchanged (RoPE depends only on relative position), while a
    different relative layout changes them."""
    path, _ = _checkpoint(tiny_checkpoint, "qwen3", {"head_dim": 32})
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), attn_backend=None)
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = model.compute_logits(model(ids, torch.arange(12)))
        b = model.compute_logits(model(ids, torch.arange(12) + 40))
        c = model.compute_logits(model(ids, torch.arange(12) * 2))
    assert (a - b).abs().max().item() < 1e-4
    assert (a - c).abs().max().item() > 1e-2


def test_dummy_weights_from_config_only(tiny_checkpoint: Any) -> None:
    path = tiny_checkpoint("qwen2", weights=False, **BASE)
    assert not list(path.glob("*.safetensors"))
    m1, _ = load_model(ModelConfig(model=str(path), seed=7), LoadConfig(load_format="dummy"), None)
    m2, _ = load_model(ModelConfig(model=str(path), seed=7), LoadConfig(load_format="dummy"), None)
    w1, w2 = (m.model.layers[0].self_attn.qkv_proj.weight for m in (m1, m2))
    assert torch.equal(w1, w2)
    assert torch.all(m1.model.norm.weight == 1)
    assert 0.01 < m1.model.embed_tokens.weight.std().item() < 0.03
    logits = _logits(m1, torch.arange(8))
    assert torch.isfinite(logits).all()


def test_missing_and_misshaped_weights_are_errors(tiny_checkpoint: Any) -> None:
    _, hf = _checkpoint(tiny_checkpoint, "llama", {"tie_word_embeddings": False})
    state = hf.state_dict()
    model = resolve_model_class(["LlamaForCausalLM"])(hf.config, torch.float32, None)
    partial = {k: v for k, v in state.items() if "layers.1.self_attn.k_proj" not in k}
    with pytest.raises(ValueError, match="layers.1.self_attn.qkv_proj"):
        model.load_weights(partial.items())
    bad = dict(state)
    bad["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape"):
        model.load_weights(bad.items())
    with pytest.raises(ValueError, match="no matching parameter"):
        model.load_weights([*state.items(), ("model.layers.0.foo.weight", torch.zeros(1))])
    loaded = model.load_weights(state.items())
    assert "model.layers.0.self_attn.qkv_proj.weight" in loaded and "lm_head.weight" in loaded


def test_unknown_architecture_error_names_supported_and_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as excinfo:
        resolve_model_class(["FooForCausalLM"])
    message = str(excinfo.value)
    assert "FooForCausalLM" in message and "LlamaForCausalLM" in message and "Qwen3ForCausalLM" in message
    assert "host_register_models" in message and "host.models" in message

    config = json.loads(transformers.LlamaConfig(**BASE).to_json_string())
    config["architectures"] = ["FooForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="FooForCausalLM"):
        load_model(ModelConfig(model=str(tmp_path)), LoadConfig(load_format="dummy"), None)


class _TinyArchPlugin:
    @hookimpl
    def host_register_models(self, register: Any) -> None:
        register("TinyLlamaAlias", "host.core.models.llama:Qwen3ForCausalLM")


def test_plugin_registered_architecture_resolves() -> None:
    with isolated_plugin_host(load_all_groups=False), registered_plugin(_TinyArchPlugin(), name="tiny-arch", group="host.models"):
        cls = resolve_model_class(["NotThere", "TinyLlamaAlias"])
        assert cls.__name__ == "Qwen3ForCausalLM"
        assert resolve_model_class(["LlamaForCausalLM"]).__name__ == "LlamaForCausalLM"


def test_config_helpers() -> None:
    config = transformers.LlamaConfig(**BASE)
    config.architectures = None
    assert get_model_architecture(config) == "LlamaForCausalLM"
    assert max_model_len(config) == 128
    assert resolve_dtype("auto", config, "cpu") == torch.float32
    config.dtype = torch.bfloat16
    assert resolve_dtype("auto", config, "cuda") == torch.bfloat16
    assert resolve_dtype("bfloat16", config, "cpu") == torch.bfloat16
    # legacy layout: rope_theta next to rope_scaling with a "type" key
    legacy = SimpleNamespace(
        rope_theta=500.0, rope_scaling={"type": "linear", "factor": 2.0}, max_position_embeddings=10
    )
    params = rope_parameters_from_config(legacy)
    assert params == {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    assert RotaryEmbedding(8, params, 10).cos_sin_cache.shape == (20, 8)
    with pytest.raises(ValueError, match="rope_type"):
        RotaryEmbedding(8, {"rope_type": "mrope", "rope_theta": 1.0}, 10)
