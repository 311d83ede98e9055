"""The host_quant custom ops: fake implementations agree with the real ones (opcheck), and the
kernel table decides which implementation runs."""

from __future__ import annotations

import torch
from quant_blocks import random_blocks
from torch.library import opcheck

from host.plugins.quantization import ops
from host.plugins.quantization.fp8 import quantize_fp8_rows
from host.plugins.quantization.gguf_blocks import Q4_1, Q8_0
from host.plugins.quantization.int8 import quantize_int8_rows
from host.sdk.kernels import kernel_entry, kernel_table, register_kernel, unregister_kernel


def test_opcheck_every_op():
    x = torch.randn(3, 64)
    bias = torch.randn(8)
    q4 = torch.from_numpy(random_blocks(Q4_1, rows=8, blocks=2))
    opcheck(torch.ops.host_quant.gguf_linear.default, (x, q4, Q4_1, bias))
    opcheck(torch.ops.host_quant.gguf_linear.default, (x, q4, Q4_1, None))
    qi8, si8 = quantize_int8_rows(torch.randn(8, 64))
    opcheck(torch.ops.host_quant.int8_linear.default, (x, qi8, si8, bias))
    qf8, sf8 = quantize_fp8_rows(torch.randn(8, 64))
    # torch's schema check compares inputs with a multiply float8 has no CPU kernel for: skip that one check
    fp8_checks = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    opcheck(torch.ops.host_quant.fp8_linear.default, (x, qf8, sf8, None), test_utils=fp8_checks)


def test_fake_shapes_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 64)
        q8 = torch.empty(12, 68, dtype=torch.uint8)
        y = ops.gguf_linear(x, q8, Q8_0, None)
        assert y.shape == (5, 12) and y.dtype == x.dtype


def test_int8_and_fp8_references_are_close_to_float():
    w = torch.randn(16, 64)
    x = torch.randn(4, 64)
    q, s = quantize_int8_rows(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    torch.testing.assert_close(ops.int8_linear(x, q, s, None), x @ (q.float() * s[:, None]).T)
    rel = (ops.int8_linear(x, q, s, None) - x @ w.T).norm() / (x @ w.T).norm()
    assert rel < 0.01
    qf, sf = quantize_fp8_rows(w)
    rel8 = (ops.fp8_linear(x, qf, sf, None) - x @ w.T).norm() / (x @ w.T).norm()
    assert rel8 < 0.06  # e4m3 keeps 3 mantissa bits, on both sides
    xq, sx = ops.quantize_fp8_per_token(torch.zeros(2, 8))
    assert torch.equal(sx, torch.ones(2, 1)) and xq.float().abs().sum() == 0


def test_a_platform_overrides_one_kernel():
    calls = []

    def fast(x, qweight, scales, bias):
        calls.append(x.shape)
        return ops.int8_linear_reference(x, qweight, scales, bias)

    q, s = quantize_int8_rows(torch.randn(4, 32))
    before = kernel_entry("int8_linear", "cpu").name
    register_kernel("int8_linear", "cpu", fast, name="test_fast", priority=1000)
    try:
        assert kernel_entry("int8_linear", "cpu").name == "test_fast"
        assert "test_fast" in kernel_table()["int8_linear"]["cpu"]
        ops.int8_linear(torch.randn(2, 32), q, s, None)
        assert calls == [(2, 32)]
        assert kernel_entry("int8_linear", "meta").name == "torch_reference"  # other devices: the reference
    finally:
        unregister_kernel("int8_linear", "cpu", "test_fast")
    assert kernel_entry("int8_linear", "cpu").name == before
