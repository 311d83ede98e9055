"""The worker's LoRA pieces on their own: the batched shrink/expand (core/lora/punica.py) inside
the wrappers (core/lora/layers.py) against a per-request merged weight ``W + scale * B @ A``,
and the slot manager (core/lora/slots.py): LRU from the device slots to the CPU tier, the CPU
tier's own limit, idempotent activation, zeroed modules an adapter does not target."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from host.contracts.forward_context import ForwardContext, set_forward_context
from host.contracts.lora_request import LoRARequest
from host.core.config import LoRAConfig
from host.core.lora.adapter import adapter_digest
from host.core.lora.layers import LoRALinear, wrap_model
from host.core.lora.punica import build_mapping, lora_shrink_expand_torch
from host.core.lora.slots import LoRASlots

transformers = pytest.importorskip("transformers")
TINY_HF = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                   num_hidden_layers=2, vocab_size=100)


def qkv_wrapper(max_loras=3, max_rank=8):
    torch.manual_seed(0)
    base = nn.Linear(64, 128, bias=True)  # q 64 | k 32 | v 32
    return base, LoRALinear(base, 0, [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)], 64, max_loras, max_rank,
                            torch.float32, torch.device("cpu"))


def test_the_batched_product_equals_each_requests_merged_weight():
    base, w = qkv_wrapper()
    g = torch.Generator().manual_seed(1)
    # slot 0: rank 2 on q and v; slot 1: rank 8 on k only; slot 2: rank 5 on q, k, v
    adapters = {
        0: ({"q_proj": 2, "v_proj": 2}, 0.5),
        1: ({"k_proj": 8}, 2.0),
        2: ({"q_proj": 5, "k_proj": 5, "v_proj": 5}, 1.25),
    }
    sizes = {"q_proj": 64, "k_proj": 32, "v_proj": 32}
    weights = {}
    for slot, (ranks, scale) in adapters.items():
        pairs = {m: (torch.randn(r, 64, generator=g), torch.randn(sizes[m], r, generator=g)) for m, r in ranks.items()}
        weights[slot] = (pairs, scale)
        w.set_slot(slot, pairs, scale)
    assert w.active == [True, True, True]
    slots = [0, 0, -1, 2, 2, 2, 1, -1, 0, 1]  # requests of 2, 1, 3, 1, 1, 1, 1 tokens
    x = torch.randn(len(slots), 64, generator=g)
    mapping = build_mapping(torch.tensor(slots).numpy(), torch.device("cpu"))
    with set_forward_context(ForwardContext(None, [], lora_mapping=mapping)):
        got = w(x)
    for t, slot in enumerate(slots):
        weight = base.weight.detach().clone()
        if slot >= 0:
            pairs, scale = weights[slot]
            row = 0
            for m, size in sizes.items():
                if m in pairs:
                    a, b = pairs[m]
                    weight[row : row + size] += scale * b @ a
                row += size
        want = x[t] @ weight.T + base.bias.detach()
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)
    # outside a step's context (or a pass of another size) only the base runs
    torch.testing.assert_close(w(x), base(x))
    # one adapter for the whole step: the no-gather path gives the same rows
    only = build_mapping(torch.full((4,), 2).numpy(), torch.device("cpu"))
    assert only.groups[0][1] is None
    out = lora_shrink_expand_torch(x[:4], base(x[:4]), w.lora_a, w.lora_b, only, w.active)
    with set_forward_context(ForwardContext(None, [], lora_mapping=build_mapping(torch.tensor([2, 2, 2, -1]).numpy(), torch.device("cpu")))):
        mixed = w(x[:4])
    torch.testing.assert_close(out[:3], mixed[:3])  # the gathered rows of the same adapter agree
    torch.testing.assert_close(mixed[3], base(x[3]))
    assert build_mapping(torch.full((3,), -1).numpy(), torch.device("cpu")) is None


def tiny_model():
    from host.core.models.llama import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(TINY_HF, torch.float32)


def request(name, i, path):
    return LoRARequest(name, i, path, adapter_digest(path))


def test_wrap_model_wraps_every_projection_of_every_layer():
    model = tiny_model()
    wrappers = wrap_model(model, TINY_HF, LoRAConfig(max_loras=2, max_lora_rank=8), torch.float32, torch.device("cpu"))
    assert len(wrappers) == 2 * 4
    attn = model.model.layers[1].self_attn
    assert isinstance(attn.qkv_proj, LoRALinear) and attn.qkv_proj.slice_names == ("q_proj", "k_proj", "v_proj")
    assert attn.qkv_proj.lora_a.shape == (2, 64, 24) and attn.qkv_proj.lora_b.shape == (2, 24, 128)
    assert model.model.layers[0].mlp.down_proj.lora_b.shape == (2, 8, 64)


def test_slots_lru_to_the_cpu_tier_and_its_own_limit(tmp_path, write_adapter):
    model = tiny_model()
    config = LoRAConfig(max_loras=2, max_lora_rank=8, max_cpu_loras=3)
    wrappers = wrap_model(model, TINY_HF, config, torch.float32, torch.device("cpu"))
    slots = LoRASlots(config, TINY_HF, wrappers, torch.float32, torch.device("cpu"))
    a, b, c, d = (request(n, i + 1, write_adapter(tmp_path / n, seed=i)) for i, n in enumerate("abcd"))

    assert slots.activate([a]) == {a.key: 0}
    assert slots.activate([a, a]) == {a.key: 0} and (slots.loads, slots.slot_writes) == (1, 1)  # idempotent
    assert slots.activate([b]) == {b.key: 1}
    assert slots.activate([a])[a.key] == 0  # a is now the most recent; b the least
    assert slots.activate([c]) == {c.key: 1}  # b leaves its slot, stays in the CPU tier
    assert list(slots.slot_of) == [a.key, c.key] and list(slots.cpu) == [a.key, b.key, c.key]
    assert slots.activate([b])[b.key] == 0 and slots.loads == 3  # back from the CPU tier, not the disk
    # a fourth adapter: the CPU tier (3) drops its least recent adapter outside the slots (a)
    slots.activate([d])
    assert a.key not in slots.cpu and len(slots.cpu) == 3 and slots.loads == 4
    slots.activate([a])
    assert slots.loads == 5  # read from its directory again
    with pytest.raises(ValueError, match="one step uses 3 LoRA adapters .* max_loras=2; raise --max-loras"):
        slots.activate([a, b, c])
    # the same id with changed files is another adapter: read again, never the stale slot
    write_adapter(tmp_path / "a", seed=50)
    a2 = request("a", 1, str(tmp_path / "a"))
    assert a2.key != a.key
    loads = slots.loads
    slot = slots.activate([a2])[a2.key]
    assert slots.loads == loads + 1
    q = model.model.layers[0].self_attn.qkv_proj
    from safetensors.torch import load_file

    new_a = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    torch.testing.assert_close(q.lora_a[slot, :, :4].T, new_a)
    # a request validated against content no longer on disk (nor cached) runs with the files as they are
    gone = LoRARequest("a", 1, str(tmp_path / "a"), "f" * 64)
    stale = slots.activate([gone])[gone.key]
    torch.testing.assert_close(q.lora_a[stale, :, :4].T, new_a)


def test_modules_an_adapter_does_not_target_get_a_zeroed_slot(tmp_path, write_adapter):
    model = tiny_model()
    config = LoRAConfig(max_loras=1, max_lora_rank=8)
    wrappers = wrap_model(model, TINY_HF, config, torch.float32, torch.device("cpu"))
    slots = LoRASlots(config, TINY_HF, wrappers, torch.float32, torch.device("cpu"))
    full = request("full", 1, write_adapter(tmp_path / "full", targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))
    slots.activate([full])
    assert all(w.active[0] for w in wrappers)
    only_q = request("q", 2, write_adapter(tmp_path / "q", r=2, targets=("q_proj",), layers=(1,)))
    slots.activate([only_q])  # takes the one slot the full adapter held
    for w in wrappers:
        if w.layer_idx == 1 and w.slice_names[0] == "q_proj":
            assert w.active[0]
            assert w.lora_a[0, :, 2:].abs().sum() == 0 and w.lora_a[0, :, :2].abs().sum() > 0  # rank 2 of 8: padded
            assert w.lora_b[0, :, 64:].abs().sum() == 0  # k and v outputs stay zero
        else:
            assert not w.active[0] and w.lora_a[0].abs().sum() == 0 and w.lora_b[0].abs().sum() == 0
