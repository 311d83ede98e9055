"""read_adapter / adapter_digest (core/lora/adapter.py) and LoRARequest / LoRAConfig: every bad
adapter is a ValueError that names the problem and the fix; a good one is described exactly.

Adapter directories are written the way PEFT's ``save_pretrained`` writes them (its
``adapter_config.json`` keys and its tensor names), so the cases can break one thing at a time.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from host.contracts.lora_request import LoRARequest
from host.core.config import LoRAConfig
from host.core.lora.adapter import adapter_digest, read_adapter

TINY_HF = pytest.importorskip("transformers").LlamaConfig(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, num_hidden_layers=2)

def test_a_good_adapter_is_described(tmp_path, write_adapter):
    path = write_adapter(tmp_path / "a", r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))
    files = read_adapter(path, LoRAConfig(max_lora_rank=8), TINY_HF)
    assert (files.rank, files.scale, files.target_modules) == (4, 2.0, ("q_proj", "v_proj", "down_proj"))
    assert sorted(files.modules) == sorted((i, m) for i in (0, 1) for m in ("q_proj", "v_proj", "down_proj"))
    loaded = files.load()
    a, b = loaded[(1, "down_proj")]
    assert a.shape == (4, 96) and b.shape == (64, 4)
    rs = read_adapter(write_adapter(tmp_path / "rs", r=4, alpha=8, config_extra={"use_rslora": True}), LoRAConfig(), TINY_HF)
    assert rs.scale == pytest.approx(8 / 2)  # alpha / sqrt(r)


def test_the_digest_is_content_not_the_name(tmp_path, write_adapter):
    one = write_adapter(tmp_path / "one")
    d1 = adapter_digest(one)
    assert len(d1) == 64 and adapter_digest(one) == d1
    write_adapter(tmp_path / "one", seed=1)  # new random weights at the same path
    assert adapter_digest(one) != d1


@pytest.mark.parametrize("case, message", [
    ("no_dir", "does not exist"),
    ("no_weights", "has no adapter_model.safetensors"),
    ("no_config", "has no adapter_config.json"),
    ("rank", "rank r=32, larger than max_lora_rank=16; start the engine with --max-lora-rank 32"),
    ("target", "targets unknown module(s) lm_head; supported target modules: q_proj"),
    ("tensor_target", "targets unknown module mlp.fc1"),
    ("shape", "has shape [4, 48], expected [4, 64]"),
    ("layer", "is for layer 5, but the model has 2 layers"),
    ("dora", "DoRA adapters (use_dora) are not supported"),
    ("half", "has no lora_B weight"),
    ("bad_json", "is not valid JSON"),
])
def test_each_bad_adapter_names_its_problem(tmp_path, write_adapter, case, message):
    path = tmp_path / case
    if case == "no_dir":
        target = str(path)
    elif case == "no_weights":
        target = write_adapter(path)
        (path / "adapter_model.safetensors").unlink()
    elif case == "no_config":
        target = write_adapter(path)
        (path / "adapter_config.json").unlink()
    elif case == "rank":
        target = write_adapter(path, r=32)
    elif case == "target":
        target = write_adapter(path, targets=("q_proj",), config_extra={"target_modules": ["q_proj", "lm_head"]})
    elif case == "tensor_target":
        target = write_adapter(path, targets=(), tensors={"base_model.model.model.layers.0.mlp.fc1.lora_A.weight": torch.zeros(4, 64),
                                                          "base_model.model.model.layers.0.mlp.fc1.lora_B.weight": torch.zeros(64, 4)})
    elif case == "shape":
        target = write_adapter(path, targets=("q_proj",), tensors={
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 48),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)})
    elif case == "layer":
        target = write_adapter(path, targets=("q_proj",), tensors={
            "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
            "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)})
    elif case == "dora":
        target = write_adapter(path, config_extra={"use_dora": True})
    elif case == "half":
        target = write_adapter(path, targets=("q_proj",), tensors={
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64)})
    else:
        target = write_adapter(path)
        (path / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError) as info:
        read_adapter(target, LoRAConfig(max_lora_rank=16), TINY_HF)
    assert message in str(info.value)


def test_lora_request_is_vllms_positional_frozen_struct():
    r = LoRARequest("sql", 1, "/adapters/sql")
    assert (r.lora_name, r.lora_int_id, r.lora_path, r.digest) == ("sql", 1, "/adapters/sql", "")
    assert hash(r) == hash(LoRARequest("sql", 1, "/adapters/sql"))
    filled = r.with_digest("ab" * 32)
    assert filled.key == (1, "ab" * 32) and r.digest == ""
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(filled), type=LoRARequest)
    assert wire == filled
    with pytest.raises(ValueError, match="lora_int_id=0 .* must be an integer >= 1"):
        LoRARequest("sql", 0, "/p")
    with pytest.raises(ValueError, match="lora_name"):
        LoRARequest("", 1, "/p")


def test_lora_config_checks_its_values():
    assert LoRAConfig(max_loras=3).max_cpu_loras == 3
    with pytest.raises(ValueError, match="max_cpu_loras=1 must be >= max_loras=2"):
        LoRAConfig(max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="max_loras=0"):
        LoRAConfig(max_loras=0)
    with pytest.raises(ValueError, match="max_lora_rank=0"):
        LoRAConfig(max_lora_rank=0)


def test_tensor_parallel_lora_is_refused_at_start_with_the_reason():
    from host.core.config import EngineConfig, ParallelConfig
    from host.core.lora.engine import check_lora_support

    config = EngineConfig(parallel=ParallelConfig(tensor_parallel_size=2), lora=LoRAConfig())
    with pytest.raises(ValueError, match="--enable-lora with tensor_parallel_size=2 is not supported yet .* use -tp 1"):
        check_lora_support(config)
    check_lora_support(EngineConfig(parallel=ParallelConfig(pipeline_parallel_size=2), lora=LoRAConfig()))
