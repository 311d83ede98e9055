"""The Triton multi-LoRA shrink/expand (``plugins/triton_ops/lora.py``) against the torch
reference of the kernel table (``host/core/lora/punica.py``) and a float64 per-token product.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU
tensors), with small shapes (the interpreter is slow); on a GPU the same tests run there, in
float32 and bfloat16.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
from host.core.lora.punica import build_mapping, lora_shrink_expand_torch  # noqa: E402
from host.plugins.triton_ops import lora as tl_lora  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton


def case(m=7, k=40, n=72, r=12, slots_count=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    a = torch.randn(slots_count, k, r, generator=g) * 0.3  # A transposed: [slots, in, R]
    b = torch.randn(slots_count, r, n, generator=g) * 0.3  # B transposed: [slots, R, out]
    a[1, :, 8:] = 0  # a rank-8 adapter padded to 12
    b[1, 8:] = 0
    base = torch.randn(m, n, generator=g)
    token_slots = np.array(([0, 2, -1, 1, 1, 2, -1, 0] * m)[:m], dtype=np.int32)
    want = base.double().clone()
    for t, s in enumerate(token_slots):
        if s >= 0:
            want[t] += (x[t].double() @ a[s].double()) @ b[s].double()
    to = lambda v: v.to(DEV, dtype)  # noqa: E731
    return to(x), to(base), to(a), to(b), build_mapping(token_slots, torch.device(DEV)), want


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else []))
def test_triton_equals_the_torch_reference_and_float64(dtype):
    x, base, a, b, mapping, want = case(dtype=dtype)
    got = tl_lora.lora_shrink_expand_triton(x, base.clone(), a, b, mapping, [True, True, True])
    ref = lora_shrink_expand_torch(x, base.clone(), a, b, mapping, [True, True, True])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(got.double().cpu(), want, **tol)
    torch.testing.assert_close(got.float(), ref.float(), **tol)
    # base-model rows are left exactly as they were
    rows = (mapping.token_slots < 0).cpu()
    assert torch.equal(got[rows.to(DEV)], base[rows.to(DEV)])


def test_inactive_modules_and_large_steps():
    x, base, a, b, mapping, want = case(m=5)
    out = base.clone()
    assert torch.equal(tl_lora.lora_shrink_expand_triton(x, out, a, b, mapping, [False, False, False]), base)
    # more tokens than the per-token launch takes: the grouped torch path, same result
    got = tl_lora.lora_shrink_expand_triton(x, base.clone(), a, b, mapping, None, max_tokens=2)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)


def test_registered_for_the_device_type():
    from host.sdk.kernels import kernel_entry, unregister_kernel

    assert tl_lora.register_lora_kernels("cuda") == ["lora_shrink_expand"]
    try:
        assert kernel_entry("lora_shrink_expand", "cuda").impl is tl_lora.lora_shrink_expand_triton
        assert kernel_entry("lora_shrink_expand", "cpu").name == "torch"
    finally:
        if DEV != "cuda":
            unregister_kernel("lora_shrink_expand", "cuda", "triton")
