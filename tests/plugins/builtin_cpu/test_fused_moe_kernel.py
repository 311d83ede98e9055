"""The compiled fused MoE experts (csrc/fused_moe.cpp) against the core's sorted torch reference:
every activation, with and without biases, sizes that are and are not multiples of the vector
width, ``-1`` choices (experts on another rank), an expert without tokens, a token without a
local expert; and that the CPU platform offers it for ``fused_moe``."""

from __future__ import annotations

import pytest
import torch

from host.core.moe.fused_experts import fused_experts_sorted
from host.plugins.builtin_cpu.kernels import cpu_kernels
from host.plugins.builtin_cpu.moe_kernel import fused_moe_kernel

kernels = cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="the CPU kernels do not build here")


def _case(tokens: int, experts: int, hidden: int, inter: int, top_k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.2
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    ids[ids == experts - 1] = 0 if experts > 2 else ids[ids == experts - 1]  # expert E-1 gets no token
    ids[0, :] = -1  # token 0: every choice on another rank
    if tokens > 2:
        ids[2, 0] = -1
    weights = torch.rand(tokens, top_k, generator=g)
    b13 = torch.randn(experts, 2 * inter, generator=g) if bias else None
    b2 = torch.randn(experts, hidden, generator=g) if bias else None
    return x, w13, w2, weights, ids, b13, b2


@pytest.mark.parametrize("activation", ["silu", "gelu", "swigluoai"])
@pytest.mark.parametrize("bias", [False, True])
# the last shape gives experts 48+ token-choices each: the GEMM path (prefill)
@pytest.mark.parametrize("shape", [(9, 6, 32, 16, 2), (33, 8, 20, 10, 3), (1, 4, 64, 24, 2), (150, 4, 24, 16, 2)])
def test_matches_the_sorted_reference(activation: str, bias: bool, shape: tuple) -> None:
    x, w13, w2, weights, ids, b13, b2 = _case(*shape, bias)
    ref = fused_experts_sorted(x, w13, w2, weights, ids, activation, b13, b2, 1.702, 7.0)
    got = fused_moe_kernel(kernels)(x, w13, w2, weights, ids, activation, b13, b2, 1.702, 7.0)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (got - ref).abs().max()
    assert torch.count_nonzero(got[0]) == 0  # no local expert: nothing added


def test_bfloat16_goes_to_the_reference() -> None:
    from host.core.plugins.manager import get_plugin_host
    from host.core.plugins.platform import current_platform

    get_plugin_host().offer_kernels(current_platform())
    x, w13, w2, weights, ids, _, _ = _case(5, 4, 16, 8, 2, False)
    bf = [t.bfloat16() for t in (x, w13, w2)]
    got = fused_moe_kernel(kernels)(*bf, weights, ids, "silu", None, None, 1.702, 7.0)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, fused_experts_sorted(*bf, weights, ids, "silu", None, None, 1.702, 7.0))


def test_the_cpu_platform_offers_it() -> None:
    from host.core.plugins.manager import get_plugin_host
    from host.core.plugins.platform import current_platform
    from host.interfaces.kernels import kernel_entry

    get_plugin_host().offer_kernels(current_platform())
    assert kernel_entry("fused_moe", "cpu").name.startswith("cpu_")
