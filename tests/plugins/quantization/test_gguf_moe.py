"""The ``gguf`` method's MoE method: experts kept in their blocks equal the float fused experts on
the dequantized weights — gate and up in different block types, biases, choices of other ranks
(``-1``), an expert without tokens, and tensor-parallel splits (block rows, whole-block columns)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from host.core.models.gguf_file import GGUFTensor
from host.core.moe.fused_experts import fused_experts_sorted
from host.core.moe.layer import FusedMoE
from host.plugins.quantization.gguf import GGUFMethod
from host.plugins.quantization.gguf_moe import GGUFMoEMethod

gguf = pytest.importorskip("gguf")
Q4_0, Q8_0 = 2, 8
E, H, INTER = 4, 64, 64


def _blocks(w: torch.Tensor, qtype: int) -> tuple[GGUFTensor, torch.Tensor]:
    """``w`` as GGUF block rows, and the float matrix they encode."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q = quantize(w.numpy(), GGMLQuantizationType(qtype))
    deq = torch.from_numpy(np.ascontiguousarray(dequantize(q, GGMLQuantizationType(qtype)), dtype=np.float32))
    return GGUFTensor(torch.from_numpy(q), qtype, tuple(w.shape)), deq.reshape(w.shape)


def _experts(seed: int = 0, up_type: int = Q4_0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(E):
        gate, gate_f = _blocks(torch.randn(INTER, H, generator=g) * 0.2, Q8_0)
        up, up_f = _blocks(torch.randn(INTER, H, generator=g) * 0.2, up_type)
        down, down_f = _blocks(torch.randn(H, INTER, generator=g) * 0.2, Q8_0)
        out.append(((gate, up, down), (gate_f, up_f, down_f)))
    return out


def _layer(experts, bias: bool, tp_rank: int = 0, tp_size: int = 1) -> FusedMoE:
    layer = FusedMoE(E, 2, H, INTER, torch.float32, bias=bias, tp_rank=tp_rank, tp_size=tp_size,
                     method=GGUFMethod().get_moe_method("model.layers.0.mlp.experts"), layer_name="model.layers.0.mlp")
    for e, ((gate, up, down), _) in enumerate(experts):
        layer.load_expert(e, "gate", gate)
        layer.load_expert(e, "up", up)
        layer.load_expert(e, "down", down)
        if bias:
            layer.load_expert(e, "gate_up_bias", torch.linspace(-0.5, 0.5, 2 * INTER) * (e + 1))
            layer.load_expert(e, "down_bias", torch.linspace(-0.3, 0.3, H) * (e + 1))
    layer.finish_loading()
    return layer


def _routing(tokens: int):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, E - 1, (tokens, 2), generator=g).to(torch.int32)  # expert E-1 gets no token
    ids[0, 1] = -1  # a choice served by another rank
    weights = torch.rand(tokens, 2, generator=g)
    return weights, ids


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("up_type", [Q8_0, Q4_0])
def test_gguf_experts_equal_float_experts_on_dequantized_weights(bias: bool, up_type: int) -> None:
    experts = _experts(up_type=up_type)
    layer = _layer(experts, bias)
    assert isinstance(layer.method, GGUFMoEMethod) and layer.gguf_w13.dtype == torch.uint8
    assert (layer.gguf_w3 is None) == (up_type == Q8_0)  # gate and up in one tensor when they share a type
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(1))
    weights, ids = _routing(7)
    w13 = torch.stack([torch.cat([f[0], f[1]]) for _, f in experts])
    w2 = torch.stack([f[2] for _, f in experts])
    ref = fused_experts_sorted(x, w13, w2, weights, ids, "silu", layer.w13_bias, layer.w2_bias, 1.702, 7.0)
    ours = layer.method.apply(layer, x, weights, ids)
    assert (ours - ref).abs().max().item() < 1e-4


def test_tensor_parallel_ranks_sum_to_the_whole() -> None:
    """-tp 2: each rank keeps half the gate/up block rows and half the down blocks' columns."""
    experts = _experts(seed=4)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(2))
    weights, ids = _routing(5)
    one = _layer(experts, False)
    whole = one.method.apply(one, x, weights, ids)
    parts = [_layer(experts, False, rank, 2) for rank in range(2)]
    assert parts[0].gguf_w2.shape == (E, H, INTER // 2 // 32 * 34)
    summed = sum(p.method.apply(p, x, weights, ids) for p in parts)
    assert (summed - whole).abs().max().item() < 1e-4


def test_split_through_a_block_is_refused() -> None:
    experts = _experts(seed=5)
    with pytest.raises(ValueError, match="cut through a block"):
        _layer(experts, False, 0, 4)  # 16 of 64 columns: half a Q8_0 block


def test_the_op_passes_opcheck() -> None:
    """``host_quant::gguf_fused_experts``: schema, fake implementation and dispatch agree."""
    from host.plugins.quantization.gguf_moe import gguf_fused_experts

    layer = _layer(_experts(seed=6, up_type=Q4_0), True)
    x = torch.randn(4, H)
    weights, ids = _routing(4)
    args = (x, layer.gguf_w13, layer.gguf_w13_qtype, layer.gguf_w3, layer.gguf_w3_qtype, layer.gguf_w2,
            layer.gguf_w2_qtype, weights, ids, "silu", layer.w13_bias, layer.w2_bias, 1.702, 7.0, False)
    torch.library.opcheck(gguf_fused_experts, args)
