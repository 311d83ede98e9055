"""The Triton fused experts (``plugins/triton_ops/fused_moe.py``) against the core's torch
reference (``fused_experts_sorted``): silu, gelu and gpt-oss's swiglu, with and without biases,
choices of other ranks (``-1``), an expert without tokens, shapes that are not block multiples.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU tensors),
with tiny shapes (the interpreter is slow); on a GPU the same tests run there.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
from host.core.moe.fused_experts import fused_experts_sorted  # noqa: E402
from host.plugins.triton_ops import fused_moe as tfm  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton


def case(tokens: int, experts: int, hidden: int, inter: int, top_k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.2
    b13 = torch.randn(experts, 2 * inter, generator=g) * 0.1 if bias else None
    b2 = torch.randn(experts, hidden, generator=g) * 0.1 if bias else None
    # every token's choices distinct, drawn from all experts but the last (it gets no token)
    ids = torch.stack([torch.randperm(experts - 1, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    ids[0, -1] = -1  # served by another rank
    if tokens > 2:
        ids[2, :] = -1  # a token with no expert here at all
    weights = torch.rand(tokens, top_k, generator=g)
    to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return to(x), to(w13), to(w2), to(weights), to(ids), to(b13), to(b2)


@pytest.mark.parametrize("activation", ["silu", "swigluoai", "gelu"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5, 4, 32, 16, 2), (19, 6, 40, 24, 3)])
def test_triton_equals_the_torch_reference(activation: str, bias: bool, shape) -> None:
    x, w13, w2, weights, ids, b13, b2 = case(*shape, bias=bias)
    alpha, limit = 1.702, 0.8  # a small limit, so gpt-oss's clamps bite
    got = tfm.fused_experts_triton(x, w13, w2, weights, ids, activation, b13, b2, alpha, limit)
    ref = fused_experts_sorted(x, w13, w2, weights, ids, activation, b13, b2, alpha, limit)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[2], torch.zeros_like(got[2]))  # no expert of this rank


def test_alignment_pads_each_expert_to_the_block() -> None:
    ids = torch.tensor([[2, 0], [2, -1], [0, 2], [2, 1]], dtype=torch.int32)
    sorted_ids, block_expert = tfm.align_by_expert(ids, num_experts=4, block_m=4)
    used = block_expert[block_expert >= 0].tolist()
    assert used == [0, 1, 2]  # expert 3 has no token: no block
    blocks = sorted_ids.view(-1, 4)
    pad = ids.numel()
    assert blocks[0].tolist() == [1, 4, pad, pad]  # expert 0: choices (0,1) and (2,0)
    assert blocks[1].tolist() == [7, pad, pad, pad]
    assert blocks[2].tolist() == [0, 2, 5, 6]
    assert (blocks[3:] == pad).all() and (block_expert[3:] == -1).all()


def test_the_cuda_platform_offers_it() -> None:
    from host.plugins.builtin_cuda.platform import CudaPlatform

    got = {}
    ops = CudaPlatform().offer_kernels(lambda op, device, fn, **kw: got.setdefault((op, device), (fn, kw)))
    assert "fused_moe" in ops
    fn, kw = got[("fused_moe", "cuda")]
    assert fn is tfm.fused_experts_triton and kw["priority"] > 0
