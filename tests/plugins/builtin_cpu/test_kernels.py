"""The compiled CPU kernels against their torch definitions (float32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from host.core.models.layers import apply_rotary
from host.plugins.builtin_cpu.kernels import block_weight, cpu_kernels


@pytest.fixture(scope="module")
def k():
    kernels = cpu_kernels()
    assert kernels is not None, "the C++ kernels should build on this machine"
    return kernels


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,kdim", [(64, 32), (70, 40), (5, 13), (1, 8), (12, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_small_m(k, m, n, kdim, bias):
    gen = torch.Generator().manual_seed(m * 100 + n)
    x = torch.randn(m, kdim, generator=gen)
    w = torch.randn(n, kdim, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    torch.testing.assert_close(k.linear_small_m(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    blocked = block_weight(w)
    assert blocked.dim() == (4 if n % 4 == 0 and kdim % 8 == 0 else 2)
    torch.testing.assert_close(k.linear_small_m(x, blocked, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    # rows of x at a stride (a slice of a wider activation)
    wide = torch.randn(m, kdim + 5, generator=gen)
    torch.testing.assert_close(k.linear_small_m(wide[:, :kdim], w, b), F.linear(wide[:, :kdim], w, b), atol=1e-4, rtol=1e-4)


def test_linear_small_m_rejects_other_dtypes(k):
    with pytest.raises(RuntimeError, match="float32"):
        k.linear_small_m(torch.ones(1, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), None)


@pytest.mark.parametrize("d", [64, 37])
def test_rms_norm_and_fused_add(k, d):
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(5, d, generator=gen) * 3
    w = 1 + 0.1 * torch.randn(d, generator=gen)
    torch.testing.assert_close(k.rms_norm(x, w, 1e-6), F.rms_norm(x, (d,), w, 1e-6), atol=1e-5, rtol=1e-5)
    strided = torch.randn(5, d + 3, generator=gen)[:, :d]
    torch.testing.assert_close(k.rms_norm(strided, w, 1e-6), F.rms_norm(strided, (d,), w, 1e-6), atol=1e-5, rtol=1e-5)
    residual = torch.randn(5, d, generator=gen)
    want_res = x + residual
    want = F.rms_norm(want_res, (d,), w, 1e-6)
    xx, rr = x.clone(), residual.clone()
    k.fused_add_rms_norm_(xx, rr, w, 1e-6)
    torch.testing.assert_close(rr, want_res)
    torch.testing.assert_close(xx, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotary_in_place(k, rotary_dim):
    gen = torch.Generator().manual_seed(rotary_dim)
    head_dim, positions = 16, torch.tensor([0, 5, 99, 3])
    freqs = torch.outer(torch.arange(100.0), torch.rand(rotary_dim // 2, generator=gen))
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    # q and k heads inside a wider qkv row, as the model rotates them
    qkv = torch.randn(4, 7 * head_dim, generator=gen)
    view = qkv[:, : 5 * head_dim].view(4, 5, head_dim)
    cos, sin = cache[positions].chunk(2, dim=-1)
    want = apply_rotary(view.clone(), torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    untouched = qkv[:, 5 * head_dim :].clone()
    k.rotary_neox_(view, positions, cache)
    torch.testing.assert_close(view, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, 5 * head_dim :], untouched)
    with pytest.raises(RuntimeError, match="outside the table"):
        k.rotary_neox_(view, torch.tensor([0, 1, 2, 100]), cache)


def test_silu_and_mul(k):
    x = torch.randn(3, 2 * 50)
    torch.testing.assert_close(k.silu_and_mul(x), F.silu(x[:, :50]) * x[:, 50:], atol=1e-6, rtol=1e-5)
