"""Fixtures of tests/core/lora: PEFT-format adapter directories written tensor by tensor."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

# (in, out) of each targetable linear of the tests' tiny Llama (hidden 64, 4 heads, 2 kv heads,
# intermediate 96)
SHAPES = {"q_proj": (64, 64), "k_proj": (64, 32), "v_proj": (64, 32), "o_proj": (64, 64),
          "gate_proj": (64, 96), "up_proj": (64, 96), "down_proj": (96, 64)}


@pytest.fixture
def write_adapter():
    """``write_adapter(path, r=4, alpha=8, targets=..., layers=(0, 1), config_extra=None,
    tensors=None, seed=0) -> str``: an adapter directory as PEFT's ``save_pretrained`` writes it
    (its config keys, its tensor names), random A/B of the tiny Llama's shapes unless
    ``tensors`` gives them."""

    def write(path, r=4, alpha=8, targets=("q_proj", "v_proj"), layers=(0, 1), config_extra=None, tensors=None, seed=0):
        path.mkdir(parents=True, exist_ok=True)
        config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(targets),
                  "use_rslora": False, "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
                  "rank_pattern": {}, "alpha_pattern": {}, **(config_extra or {})}
        (path / "adapter_config.json").write_text(json.dumps(config))
        if tensors is None:
            gen = torch.Generator().manual_seed(seed)
            tensors = {}
            for i in layers:
                for m in targets:
                    parent = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                    fan_in, fan_out = SHAPES[m]
                    key = f"base_model.model.model.layers.{i}.{parent}.{m}"
                    tensors[f"{key}.lora_A.weight"] = torch.randn(r, fan_in, generator=gen)
                    tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, r, generator=gen)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        return str(path)

    return write
