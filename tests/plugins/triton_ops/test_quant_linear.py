"""The Triton quantized-linear kernels (``plugins/triton_ops/quant_linear.py``) against ground
truth: GGUF rows dequantized by the ``gguf`` package (``gguf.quants.dequantize``), int8 and fp8
weights expanded in float64, products in float64.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU tensors);
with one (``bench/gpu_check.sh quant``) the same tests run on it, and the ``torch._scaled_mm`` fp8
path is checked too. Shapes are tiny (K = 256 is one Q4_K / Q6_K super-block): the interpreter is
slow.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
gguf_quants = pytest.importorskip("gguf.quants")
from host.plugins.triton_ops import quant_linear as ql  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton
QTYPES = [ql.Q4_0, ql.Q4_1, ql.Q8_0, ql.Q4_K, ql.Q6_K]


def gguf_rows(qtype: int, n: int, k: int, seed: int = 0) -> np.ndarray:
    """``uint8 [n, row_bytes]`` GGUF rows of an [n, k] weight: quantized by ``gguf.quants.quantize``
    where it supports the type, else random blocks (every byte random, the float16 scales set
    to small finite values)."""
    rng = np.random.default_rng(seed)
    if qtype in (ql.Q4_0, ql.Q4_1, ql.Q8_0):
        return gguf_quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    size, nbytes = ql.GGUF_BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(n, k // size, nbytes), dtype=np.uint8)
    for offset in ((0, 2) if qtype == ql.Q4_K else (208,)):  # d, dmin of Q4_K; d of Q6_K
        half = rng.uniform(2e-4, 4e-3, size=(n, k // size)).astype(np.float16)
        half *= rng.choice(np.array([-1, 1], dtype=np.float16), size=half.shape)
        blocks[:, :, offset : offset + 2] = half.view(np.uint8).reshape(n, k // size, 2)
    return blocks.reshape(n, -1)


def assert_close_to(y: torch.Tensor, ref: torch.Tensor) -> None:
    """``y`` (x's dtype) equals the float64 ``ref`` up to float32 summation, plus rounding to
    ``y``'s dtype for 16-bit outputs."""
    y64, ref = y.double().cpu(), ref.double().cpu()
    atol = 2e-6 * ref.abs().max().item()
    rtol = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[y.dtype]
    err = (y64 - ref).abs() - rtol * ref.abs()
    assert err.max().item() <= atol, f"max error {(y64 - ref).abs().max().item():.3g} (max |ref| {ref.abs().max().item():.3g})"


def gguf_case(qtype: int, m: int, n: int = 64, k: int = 256, dtype=torch.float32, bias: bool = True, seed: int = 0):
    rows = gguf_rows(qtype, n, k, seed)
    w = torch.from_numpy(gguf_quants.dequantize(rows, qtype)).double()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen) if bias else None
    ref = x.double() @ w.T + (b.double() if bias else 0.0)
    return x.to(DEV), torch.from_numpy(rows).to(DEV), (b.to(DEV) if bias else None), ref


@pytest.mark.parametrize("qtype", QTYPES, ids=[ql.GGUF_NAMES[q] for q in QTYPES])
@pytest.mark.parametrize("m", [1, 5, 32])
def test_gguf_linear_matches_gguf_dequantize(qtype, m):
    """M = 1: the GEMV launch (split along K); 5 and 32: the tiled GEMM."""
    x, rows, bias, ref = gguf_case(qtype, m, bias=m != 5)
    y = ql.gguf_linear(x, rows, qtype, bias)
    assert y.shape == (m, 64) and y.dtype == torch.float32
    assert_close_to(y, ref)


@pytest.mark.parametrize("qtype,m,dtype", [
    (ql.Q4_K, 1, torch.bfloat16), (ql.Q6_K, 32, torch.bfloat16), (ql.Q4_0, 3, torch.float16), (ql.Q8_0, 33, torch.float16),
])
def test_gguf_linear_16bit_activations(qtype, m, dtype):
    x, rows, bias, ref = gguf_case(qtype, m, dtype=dtype, seed=1)
    y = ql.gguf_linear(x, rows, qtype, bias)
    assert y.dtype == dtype
    assert_close_to(y, ref)


@pytest.mark.parametrize("m", [1, 40])
def test_gguf_linear_ragged_shapes_and_split_k(m):
    """N not a multiple of the row tile, K of two super-blocks, the K split forced both ways."""
    x, rows, bias, ref = gguf_case(ql.Q4_K, m, n=40, k=512, seed=2)
    for split_k in (1, 4):
        assert_close_to(ql.gguf_linear(x, rows, ql.Q4_K, bias, split_k=split_k), ref)


def test_gguf_linear_keeps_leading_dims_and_reads_row_slices():
    rows = gguf_rows(ql.Q8_0, 96, 256, seed=3)
    w = torch.from_numpy(gguf_quants.dequantize(rows, ql.Q8_0)).double()
    x = torch.randn(2, 3, 256)
    part = torch.from_numpy(rows).to(DEV)[32:96]  # a view of some rows, as a fused layer's shard is
    y = ql.gguf_linear(x.to(DEV), part, ql.Q8_0, None)
    assert y.shape == (2, 3, 64)
    assert_close_to(y.reshape(6, 64), x.reshape(6, 256).double() @ w[32:96].T)


def test_gguf_linear_refuses_bad_input():
    rows = torch.from_numpy(gguf_rows(ql.Q4_0, 8, 64))
    with pytest.raises(ValueError, match=r"type 13 has no Triton kernel; supported: Q4_0 \(2\)"):
        ql.gguf_linear(torch.randn(1, 64), rows, 13, None)
    with pytest.raises(ValueError, match="x has 32 features but the weight has 64"):
        ql.gguf_linear(torch.randn(1, 32), rows, ql.Q4_0, None)
    with pytest.raises(ValueError, match="whole blocks of 18 bytes; 35 bytes"):
        ql.gguf_linear(torch.randn(1, 64), rows[:, :35], ql.Q4_0, None)
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        ql.gguf_linear(torch.randn(1, 64), rows, ql.Q4_0, torch.zeros(9))


@pytest.mark.parametrize("m,dtype", [(1, torch.float32), (3, torch.float32), (5, torch.float32), (32, torch.bfloat16)])
def test_int8_linear_matches_float64(m, dtype):
    gen = torch.Generator().manual_seed(m)
    qweight = torch.randint(-128, 128, (48, 256), dtype=torch.int8, generator=gen)
    scales = torch.rand(48, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(48, generator=gen)
    x = torch.randn(m, 256, generator=gen).to(dtype)
    ref = x.double() @ (qweight.double() * scales.double()[:, None]).T + bias.double()
    y = ql.int8_linear(x.to(DEV), qweight.to(DEV), scales.to(DEV), bias.to(DEV))
    assert y.dtype == dtype
    assert_close_to(y, ref)


def activation_rows() -> torch.Tensor:
    """Rows of very different magnitudes, an all-zero row, and a row whose amax is 448 (scale 1)
    holding exact ties between e4m3 neighbours (1.0625 -> 1.0, 1.1875 -> 1.25, 2.5/512
    -> 2/512 in the subnormals) and values just under a binade (127.9 -> 128)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 300, generator=gen) * torch.tensor([1e-3, 0.1, 1.0, 30.0, 1.0, 1.0])[:, None]
    x[4] = 0.0
    x[5, :8] = torch.tensor([448.0, 1.0625, -1.1875, 2.5 / 512, -127.9, 13.0, 2.0**-12, -0.0])
    return x


def test_quantize_per_token_matches_the_torch_reference():
    x = activation_rows()
    xq, sx = ql.quantize_per_token(x.to(DEV))
    ref_q, ref_s = ql.quantize_per_token_reference(x)
    assert xq.dtype == torch.float8_e4m3fn and sx.shape == (6, 1)
    # the contract itself: sx = amax / 448, round to nearest even, saturating at +-448
    assert torch.equal(ref_s[:4, 0], x[:4].abs().amax(1) / 448)
    assert ref_q[5, :5].float().tolist() == [448.0, 1.0, -1.25, 2 / 512, -128.0]
    assert torch.equal(ref_q[4].float(), torch.zeros(300)) and ref_s[4, 0] == 1.0  # an all-zero row: scale 1
    assert torch.equal(sx.cpu(), ref_s)
    assert torch.equal(xq.cpu().view(torch.uint8), ref_q.view(torch.uint8))


def fp8_case(m: int, n: int = 48, k: int = 256, dtype=torch.float32):
    gen = torch.Generator().manual_seed(5 + m)
    w = torch.randn(n, k, generator=gen)
    scales = w.abs().amax(1) / 448
    qweight = (w / scales[:, None]).to(torch.float8_e4m3fn)
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, m)[:, None]).to(dtype)
    bias = torch.randn(n, generator=gen)
    xq, sx = ql.quantize_per_token_reference(x)
    ref = (xq.double() * sx.double()) @ (qweight.double() * scales.double()[:, None]).T + bias.double()
    return x.to(DEV), qweight.to(DEV), scales.to(DEV), bias.to(DEV), ref


@pytest.mark.parametrize("m", [1, 32])
def test_fp8_linear_triton_fallback_matches_float64(m):
    """The path for GPUs without fp8 tensor cores: e4m3 operands decoded from their bytes."""
    x, qweight, scales, bias, ref = fp8_case(m)
    assert_close_to(ql.fp8_linear_triton(x, qweight, scales, bias), ref)


@pytest.mark.parametrize("m,dtype", [(1, torch.bfloat16), (64, torch.bfloat16), (16, torch.float16), (5, torch.float32)])
def test_fp8_linear_scaled_mm_matches_float64(m, dtype):
    """On a GPU of capability >= 8.9 through ``fp8_linear``'s dispatch (one rounding of the
    product to bfloat16, cuBLAS accumulating in float32); on CPU directly, through torch's CPU
    ``_scaled_mm``, whose bfloat16 output is rounded twice (so twice the tolerance)."""
    if DEV == "cuda" and not ql.fp8_tensor_cores(torch.device("cuda")):
        pytest.skip("torch._scaled_mm fp8 needs a GPU of compute capability >= 8.9")
    x, qweight, scales, bias, ref = fp8_case(m, n=256, k=512, dtype=dtype)
    if DEV == "cuda":
        y, ulps = ql.fp8_linear(x, qweight, scales, bias), 1
    else:
        y, ulps = ql.fp8_linear_scaled_mm(x, qweight, scales, bias), 2
    assert y.dtype == dtype and y.shape == (m, 256)
    # products of e4m3 values are exact in float32; the product is rounded to bfloat16, then the
    # sum with the bias to x's dtype
    err = (y.double().cpu() - ref).abs() - ulps * 2.0**-8 * (ref.abs() + bias.double().cpu().abs())
    assert err.max().item() <= 1e-5 * ref.abs().max().item()


def test_fp8_linear_on_cpu_takes_the_triton_path():
    assert not ql.fp8_tensor_cores(torch.device("cpu"))
    x, qweight, scales, bias, ref = fp8_case(2, n=20, k=64)
    assert_close_to(ql.fp8_linear(x, qweight, scales, bias), ref)


def test_the_gpu_platforms_register_the_kernels(monkeypatch):
    """CUDA: all three ops at priority 10 for device type "cuda". ROCm inherits the method but
    gets no fp8_linear (gfx942's fp8 is e4m3fnuz), and nothing where Triton does not target it."""
    from host.interfaces import kernels
    from host.plugins.builtin_cuda.platform import CudaPlatform
    from host.plugins.builtin_rocm.platform import RocmPlatform

    def cleanup():
        for op in ("gguf_linear", "int8_linear", "fp8_linear"):
            kernels.unregister_kernel(op, "cuda", ql.KERNEL_NAME)

    cleanup()
    try:
        assert CudaPlatform().register_quant_kernels() == ["gguf_linear", "int8_linear", "fp8_linear"]
        entry = kernels.kernel_entry("gguf_linear", "cuda")
        assert (entry.name, entry.priority, entry.impl) == ("triton", 10, ql.gguf_linear)
        assert kernels.kernel_for("fp8_linear", "cuda") is ql.fp8_linear
        cleanup()
        monkeypatch.setattr(RocmPlatform, "triton_problem", classmethod(lambda cls: ""))
        assert RocmPlatform().register_quant_kernels() == ["gguf_linear", "int8_linear"]
        assert "cuda" not in kernels.kernel_table().get("fp8_linear", {})
        cleanup()
        monkeypatch.setattr(RocmPlatform, "triton_problem", classmethod(lambda cls: "gfx906 is not a Triton target"))
        assert RocmPlatform().register_quant_kernels() == []
    finally:
        cleanup()


def test_the_quantization_ops_reach_these_kernels_through_the_table(monkeypatch):
    """The seam: the quantization plugin's ``host_quant::*`` ops find these kernels in the table
    (registered here for this test's device type) and their results keep the op's contract."""
    ops = pytest.importorskip("host.plugins.quantization.ops")
    from host.interfaces import kernels

    device_type = torch.device(DEV).type
    # a table without what other tests registered for this device type (the CPU platform's kernels)
    monkeypatch.setattr(kernels, "_TABLE", {k: list(v) for k, v in kernels._TABLE.items() if k[1] != device_type})
    try:
        assert ql.register_quant_kernels(device_type) == ["gguf_linear", "int8_linear", "fp8_linear"]
        assert kernels.kernel_for("gguf_linear", device_type) is ql.gguf_linear
        x, rows, bias, ref = gguf_case(ql.Q6_K, 1, n=16, seed=6)
        assert_close_to(ops.gguf_linear(x, rows, ql.Q6_K, bias), ref)
        x, qweight, scales, bias, ref = fp8_case(4, n=32, k=64)
        assert_close_to(ops.fp8_linear(x, qweight, scales, bias), ref)
        # one fp8 activation rounding: the plugin's torch reference and the Triton kernel agree bit for bit
        rows6 = activation_rows()
        want_q, want_s = ops.quantize_fp8_per_token(rows6)
        got_q, got_s = ql.quantize_per_token(rows6.to(DEV))
        assert torch.equal(got_s.cpu(), want_s) and torch.equal(got_q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    finally:
        for op in ("gguf_linear", "int8_linear", "fp8_linear"):
            kernels.unregister_kernel(op, device_type, ql.KERNEL_NAME)


_COMPILE_FOR_HOPPER = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from host.plugins.triton_ops import quant_linear as ql

target = GPUTarget("cuda", 90, 32)
ptrs = {"x_ptr": "*bf16", "out_ptr": "*bf16", "bias_ptr": "*fp32", "row_scale_ptr": "*fp32", "tok_scale_ptr": "*fp32"}
def build(fn, consts, **types):
    sig = {n: {**ptrs, **types}.get(n, "i32") for n in fn.arg_names if n not in consts}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target, options={"num_warps": 4})
    assert kernel.asm["cubin"], fn
flags = dict(HAS_BIAS=True, HAS_ROW_SCALE=False, HAS_TOK_SCALE=False, X_FP8=False)
gemm = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32)
# Q4_K and Q6_K use every operation the other formats use (float16 from two bytes, int8, nibbles)
build(ql._gemm_kernel, dict(flags, KIND=0, QTYPE=ql.Q4_K, GROUP=32, **gemm), w_ptr="*u8")
build(ql._gemv_kernel, dict(flags, KIND=0, QTYPE=ql.Q6_K, GROUP=16, ATOMIC=True, BLOCK_N=16, BLOCK_K=128), w_ptr="*u8", out_ptr="*fp32")
build(ql._gemm_kernel, dict(flags, KIND=2, QTYPE=0, GROUP=32, HAS_ROW_SCALE=True, HAS_TOK_SCALE=True, X_FP8=True, **gemm), x_ptr="*u8", w_ptr="*u8")
build(ql._quant_per_token_kernel, dict(BLOCK=1024), x_ptr="*bf16", xq_ptr="*fp8e4nv", scale_ptr="*fp32")
print("compiled")
"""


def test_the_kernels_compile_for_hopper(tmp_path):
    """The interpreter does not lower the kernels; this compiles the main variants to sm_90
    machine code (Triton's own ptxas, no GPU needed), so what the GPU would reject fails here
    first. (All of them, every format and dtype, compiled for sm_80 and sm_90 without spills
    when this was written, the per-token quantizer on sm_90 only: e4m3 needs sm_89.)"""
    import subprocess
    import sys
    from pathlib import Path

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton has no NVIDIA backend with its ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("qtype", [6, 7], ids=["Q5_0", "Q5_1"])
def test_gguf_linear_hands_formats_without_a_triton_kernel_to_the_torch_reference(qtype):
    """Q5_0 / Q5_1 (kept quantized by the gguf method) have no Triton kernel: the reference
    computes them, equal to ``gguf.quants.dequantize`` (not an error)."""
    assert qtype in ql.GGUF_BLOCKS and qtype not in ql.TRITON_GGUF_QTYPES
    rng = np.random.default_rng(qtype)
    rows = gguf_quants.quantize(rng.standard_normal((64, 256)).astype(np.float32), qtype)
    w = torch.from_numpy(gguf_quants.dequantize(rows, qtype)).double()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(qtype))
    y = ql.gguf_linear(x.to(DEV), torch.from_numpy(rows).to(DEV), qtype, None)
    assert_close_to(y, x.double() @ w.T)
