"""Resolution of the quantization plan (seed §11.1 in host's terms): which method, for which layer, on which platform."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

from host.core.config import EngineConfig, ModelConfig, QuantizationConfig
from host.core.models.quant_plan import GGUF, model_layer_names, pattern_matches, registered_methods, resolve_quant_plan

HF = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)


def platform(name="cpu", device_type="cpu", capability=None, allow=()):
    return SimpleNamespace(name=name, device_type=device_type, supported_quantization=list(allow),
                           get_device_capability=lambda device_id=0: capability)


def config(tmp_path, quantization=None, ignore=(), targets=None, hf=HF, gguf=False, dtype="float32"):
    model_dir = tmp_path / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    if gguf:
        (model_dir / "model.gguf").write_bytes(b"GGUF")
    quant = QuantizationConfig(quantization, list(ignore), dict(targets or {}))
    return EngineConfig(model=ModelConfig(model=str(model_dir), dtype=dtype, hf_config=hf, resolved_path=str(model_dir)), quant=quant)


@pytest.fixture(scope="module")
def registry():
    return registered_methods()


def test_the_case_table(tmp_path, registry):
    cpu = platform()
    assert {"gguf", "int8", "fp8"} <= set(registry)
    plan = resolve_quant_plan(config(tmp_path), registry, cpu)
    assert not plan.quantized and plan.method is None
    plan = resolve_quant_plan(config(tmp_path, "int8"), registry, cpu)
    assert plan.method == "int8" and plan.method_name_for("model.layers.0.mlp.down_proj") == "int8"
    assert not plan.keeps_gguf_blocks
    plan = resolve_quant_plan(config(tmp_path, gguf=True), registry, cpu)  # a GGUF source: blocks kept
    assert plan.method == GGUF and plan.keeps_gguf_blocks and plan.gguf_path.endswith("model.gguf")
    plan = resolve_quant_plan(config(tmp_path, "none", gguf=True), registry, cpu)  # none: dequantized
    assert plan.method is None and not plan.keeps_gguf_blocks
    with pytest.raises(ValueError, match="'awq' is not a registered method; registered: fp8, gguf, int8"):
        resolve_quant_plan(config(tmp_path, "awq"), registry, cpu)
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_quant_plan(config(tmp_path / "x", "gguf"), registry, cpu)


def test_checkpoint_quantization_config(tmp_path, registry):
    hf = LlamaConfig(**{**HF.to_dict(), "quantization_config": {"quant_method": "int8"}})
    assert resolve_quant_plan(config(tmp_path, hf=hf), registry, platform()).source == "the checkpoint's quantization_config"
    hf = LlamaConfig(**{**HF.to_dict(), "quantization_config": {"quant_method": "gptq", "bits": 4}})
    with pytest.raises(ValueError, match="quant_method='gptq', which no registered method runs"):
        resolve_quant_plan(config(tmp_path, hf=hf), registry, platform())
    with pytest.raises(ValueError, match="drop the targets"):
        hf = LlamaConfig(**{**HF.to_dict(), "quantization_config": {"quant_method": "int8"}})
        resolve_quant_plan(config(tmp_path, hf=hf, targets={"lm_head": "int8"}), registry, platform())


def test_ignore_and_targets(tmp_path, registry, caplog):
    plan = resolve_quant_plan(config(tmp_path, "int8", ignore=["re:.*\\.0\\.mlp\\..*", "model.layers.1.self_attn.k_proj"]), registry, platform())
    assert plan.method_name_for("model.layers.0.mlp.gate_up_proj") is None
    assert plan.method_name_for("model.layers.1.mlp.gate_up_proj") == "int8"
    # a Hugging Face name of a fused layer's part matches the fused layer
    assert plan.method_name_for("model.layers.1.self_attn.qkv_proj") is None
    plan = resolve_quant_plan(config(tmp_path, targets={"*down_proj": "int8", "re:.*qkv.*": "fp8"}), registry, platform())
    assert plan.method is None and plan.quantized
    assert plan.method_name_for("model.layers.1.mlp.down_proj") == "int8"
    assert plan.method_name_for("model.layers.0.self_attn.qkv_proj") == "fp8"
    assert plan.method_name_for("model.layers.0.self_attn.o_proj") is None
    with pytest.raises(ValueError, match="exclusive"):
        resolve_quant_plan(config(tmp_path, "int8", targets={"lm_head": "int8"}), registry, platform())
    with pytest.raises(ValueError, match="not registered"):
        resolve_quant_plan(config(tmp_path, targets={"lm_head": "nope"}), registry, platform())
    with pytest.raises(ValueError, match="not a valid regular expression"):
        QuantizationConfig("int8", ["re:(unclosed"])
    with caplog.at_level(logging.WARNING, logger="host.quantization"):
        resolve_quant_plan(config(tmp_path, "int8", ignore=["*attn_q*"]), registry, platform())
    assert "'*attn_q*' matches no layer" in caplog.text


def test_a_method_the_platform_cannot_run_names_those_that_can(tmp_path, registry):
    old_gpu = platform("cuda", "cuda", capability=80)
    with pytest.raises(ValueError, match=r"'fp8' cannot run on the cuda platform.*compute capability >= 8.9, this device has 8.0; methods that can: gguf, int8"):
        resolve_quant_plan(config(tmp_path, "fp8", dtype="bfloat16"), registry, old_gpu)
    assert resolve_quant_plan(config(tmp_path, "fp8", dtype="bfloat16"), registry, platform("cuda", "cuda", capability=90)).method == "fp8"
    with pytest.raises(ValueError, match="e4m3fnuz"):
        resolve_quant_plan(config(tmp_path, "fp8", dtype="bfloat16"), registry, platform("rocm", "cuda", capability=94))
    with pytest.raises(ValueError, match="runs only gguf"):
        resolve_quant_plan(config(tmp_path, "int8"), registry, platform(allow=["gguf"]))


def test_layer_names_and_patterns():
    names = model_layer_names(HF)
    assert names[0] == "model.embed_tokens" and "model.layers.1.mlp.down_proj" in names and names[-1] == "lm_head"
    assert pattern_matches("model.layers.0.mlp.up_proj", "model.layers.0.mlp.gate_up_proj")
    assert not pattern_matches("re:lm_head", "model.layers.0.mlp.gate_up_proj")
