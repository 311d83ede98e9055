"""Quantized linear layers on the GPU: Triton dequant-GEMM kernels for the kernel-table ops
``gguf_linear``, ``int8_linear`` and ``fp8_linear`` (contracts in ``host.sdk.kernels``' callers,
``plugins/quantization/``).

- :func:`gguf_linear` ``(x [M, K], qweight uint8 [N, row_bytes], qtype, bias) -> [M, N]``:
  ``x @ dequantize(qweight)^T + bias`` for GGUF Q4_0, Q4_1, Q8_0, Q4_K and Q6_K rows (Q5_0 and Q5_1
  go to the torch reference), stored
  exactly as the .gguf file stores them. Weights are dequantized in registers a scale group at
  a time (32 values, 16 for Q6_K): the group's scale and offset are decoded once (float16s
  assembled from two bytes, so no alignment is assumed), each value's nibble or byte unpacked
  and ``q * scale + offset`` formed in float32; activations are read in their dtype and multiplied in float32 with float32 accumulation
  (``tl.dot`` in IEEE precision), so the result equals the dequantized-float32 reference up to
  summation order.
- :func:`int8_linear` ``(x, qweight int8 [N, K], scales float32 [N], bias)``:
  ``x @ (qweight * scales[:, None])^T + bias``; the row scale is applied to the accumulator.
- :func:`fp8_linear` ``(x, qweight float8_e4m3fn [N, K], scales float32 [N], bias)``: W8A8 with
  per-token dynamic activation scales (:func:`quantize_per_token`: ``sx = amax|x row| / 448``,
  ``xq = (x / sx)`` rounded to e4m3). On GPUs of compute capability >= 8.9 (Ada, Hopper) the
  product is ``torch._scaled_mm`` with row-wise scales; elsewhere (and where ``K`` or ``N`` is
  not a multiple of 16) a Triton kernel decodes both e4m3 operands from their bytes and
  multiplies in float32 (:func:`fp8_linear_triton`).

Two launch shapes: for ``M <= GEMV_MAX_M`` (decode) a GEMV grid of one token by ``BLOCK_N`` rows
per program, split along K over enough programs to fill the GPU (partials summed with float32
atomics); for larger ``M`` a tiled GEMM. Under the interpreter (which truncates float32 ->
bfloat16 stores) the kernels write float32 and torch rounds to x's dtype. All kernels also run on CPU tensors under
``TRITON_INTERPRET=1``, which is how CI checks them against ``gguf.quants.dequantize``
(``tests/plugins/triton_ops/test_quant_linear.py``). These are plain functions: the
quantization plugin's ``host_quant::*`` custom ops (fake implementations included) look them up
in the kernel table and call them, so ``torch.compile`` sees one opaque node per linear.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton ships with torch on Linux x86_64
    HAS_TRITON = False

# gguf.GGMLQuantizationType values (fixed by the file format) -> (values, bytes) per block
from host.sdk.gguf_formats import BLOCKS as GGUF_BLOCKS
from host.sdk.gguf_formats import NAMES as GGUF_NAMES
from host.sdk.gguf_formats import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0  # noqa: F401

TRITON_GGUF_QTYPES = (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)
"""The GGUF formats the Triton kernel decodes; :func:`gguf_linear` hands the other kept formats
(Q5_0, Q5_1) to the device-independent torch reference in the kernel table."""

FP8_MAX = 448.0  # largest finite float8_e4m3fn
# Launch shapes (first choices, not tuned on a GPU yet: bench/gpu_check.sh quant prints the figures
# to tune them against)
GEMV_MAX_M = 4  # up to this many tokens, the GEMV launch (weights are re-read per token from L2)
GEMV_BLOCK_N, GEMV_BLOCK_K = 16, 128  # rows per program, values of K per step (whole scale groups)
GEMV_PROGRAMS_PER_SM = 2  # the K split aims at this many programs per SM
GEMV_NUM_WARPS = 4
GEMM_BLOCK_N, GEMM_BLOCK_K = 64, 32  # and 16 / 32 / 64 tokens by M
GEMM_NUM_WARPS = 4


if HAS_TRITON:

    @triton.jit
    def _f16_at(ptr, mask):
        """The little-endian float16 at byte pointers ``ptr``, as float32."""
        lo = tl.load(ptr, mask=mask, other=0).to(tl.int32)
        hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.int32)
        return (lo | (hi << 8)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _i8_at(ptr, mask):
        """The int8 at byte pointers ``ptr``, as int32."""
        v = tl.load(ptr, mask=mask, other=0).to(tl.int32)
        return v - ((v >> 7) << 8)

    @triton.jit
    def _gguf_groups(w_ptr, row_stride, rows, grp, lane, mask, QTYPE: tl.constexpr):
        """Dequantize GGUF weight values, as float32, one scale group at a time: ``rows`` and
        ``grp`` (the group's index along K; a group is the GROUP values sharing one scale: 16 for
        Q6_K, 32 otherwise) are broadcast index tensors of the group shape (size 1 on the lane
        axis), ``lane`` (0..GROUP-1) runs along the lane axis, ``mask`` has the group shape.
        Scales, mins and their decoding are computed per group; per value only its byte is read
        and unpacked, then ``w = q * scale + offset``."""
        if QTYPE == 2:  # Q4_0: d, 16 bytes of nibbles (low: values 0-15, high: 16-31); (q - 8) d
            base = w_ptr + rows * row_stride + grp * 18
            scale = _f16_at(base, mask)
            offset = -8.0 * scale
            q = (tl.load(base + 2 + lane % 16, mask=mask, other=0).to(tl.int32) >> ((lane // 16) * 4)) & 15
        elif QTYPE == 3:  # Q4_1: d, m, 16 bytes of nibbles; q d + m
            base = w_ptr + rows * row_stride + grp * 20
            scale = _f16_at(base, mask)
            offset = _f16_at(base + 2, mask)
            q = (tl.load(base + 4 + lane % 16, mask=mask, other=0).to(tl.int32) >> ((lane // 16) * 4)) & 15
        elif QTYPE == 8:  # Q8_0: d, 32 int8; q d
            base = w_ptr + rows * row_stride + grp * 34
            scale = _f16_at(base, mask)
            offset = 0.0 * scale
            q = _i8_at(base + 2 + lane, mask)
        elif QTYPE == 12:  # Q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
            sb = grp % 8  # sub-block of the 256-value super-block
            base = w_ptr + rows * row_stride + (grp // 8) * 144
            d = _f16_at(base, mask)
            dmin = _f16_at(base + 2, mask)
            s_lo = tl.load(base + 4 + sb % 4, mask=mask, other=0).to(tl.int32)  # scales[sb % 4]
            s_mid = tl.load(base + 8 + sb % 4, mask=mask, other=0).to(tl.int32)  # scales[4 + sb % 4]
            s_hi = tl.load(base + 12 + sb % 4, mask=mask, other=0).to(tl.int32)  # scales[8 + sb % 4]
            low = sb < 4
            sc = tl.where(low, s_lo & 63, (s_hi & 15) | ((s_lo >> 6) << 4))
            mn = tl.where(low, s_mid & 63, (s_hi >> 4) | ((s_mid >> 6) << 4))
            scale = d * sc.to(tl.float32)
            offset = -(dmin * mn.to(tl.float32))
            # sub-blocks 2i and 2i+1 share 32 bytes: low nibbles, then high nibbles
            q = (tl.load(base + 16 + (sb // 2) * 32 + lane, mask=mask, other=0).to(tl.int32) >> ((sb % 2) * 4)) & 15
        else:  # Q6_K: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d; groups of 16
            g = grp % 16  # group of the super-block: values 16 g .. 16 g + 15
            base = w_ptr + rows * row_stride + (grp // 16) * 210
            half = g // 8  # each 128-value half: 64 low-nibble bytes, 32 high-pair bytes
            quarter = (g % 8) // 2  # quarters of 32 values: nibble (quarter // 2), pair (quarter)
            ql = tl.load(base + half * 64 + (quarter % 2) * 32 + (g % 2) * 16 + lane, mask=mask, other=0).to(tl.int32)
            qh = tl.load(base + 128 + half * 32 + (g % 2) * 16 + lane, mask=mask, other=0).to(tl.int32)
            q = ((ql >> ((quarter // 2) * 4)) & 15) | (((qh >> (quarter * 2)) & 3) << 4)
            scale = _f16_at(base + 208, mask) * _i8_at(base + 192 + g, mask).to(tl.float32)
            offset = -32.0 * scale
        return q.to(tl.float32) * scale + offset

    @triton.jit
    def _weight_tile(w_ptr, row_stride, rows, cols, mask, KIND: tl.constexpr):
        """One tile of an int8 (KIND 1) or e4m3fn (KIND 2) weight in float32, unscaled (the row
        scale goes on the accumulator)."""
        v = tl.load(w_ptr + rows * row_stride + cols, mask=mask, other=0)
        if KIND == 1:
            w = v.to(tl.float32)
        else:
            w = _e4m3_decode(v.to(tl.int32))
        return w

    @triton.jit
    def _e4m3_decode(b):
        """float8_e4m3fn bit patterns (int32 0..255) -> float32 (no NaN: quantization saturates)."""
        sign = tl.where((b & 128) != 0, -1.0, 1.0)
        exp = (b >> 3) & 15
        mant = (b & 7).to(tl.float32)
        normal = (1.0 + mant * 0.125) * tl.exp2((exp - 7).to(tl.float32))
        subnormal = mant * 0.001953125  # mant / 8 * 2**-6
        return sign * tl.where(exp == 0, subnormal, normal)

    @triton.jit
    def _load_x(x_ptr, offs, mask, X_FP8: tl.constexpr):
        if X_FP8:
            xv = _e4m3_decode(tl.load(x_ptr + offs, mask=mask, other=0).to(tl.int32))
        else:
            xv = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return xv

    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, out_ptr, bias_ptr, row_scale_ptr, tok_scale_ptr,
        N, K, x_stride, w_stride, out_stride, k_per_split,
        KIND: tl.constexpr, QTYPE: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_ROW_SCALE: tl.constexpr, HAS_TOK_SCALE: tl.constexpr, X_FP8: tl.constexpr, ATOMIC: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        m = tl.program_id(1).to(tl.int64)
        pid_k = tl.program_id(2)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows64 = rows.to(tl.int64)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        k_lo = pid_k * k_per_split
        k_hi = tl.minimum(k_lo + k_per_split, K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if KIND == 0:  # [BLOCK_N, groups, GROUP] tiles
                g_idx = tl.arange(0, BLOCK_K // GROUP)
                lanes = tl.arange(0, GROUP)
                g_ok = k0 + g_idx * GROUP < k_hi
                xv = _load_x(x_ptr, m * x_stride + (k0 + g_idx * GROUP)[:, None] + lanes[None, :], g_ok[:, None], X_FP8)
                w = _gguf_groups(
                    w_ptr, w_stride, rows64[:, None, None], (k0 // GROUP + g_idx)[None, :, None], lanes[None, None, :],
                    row_ok[:, None, None] & g_ok[None, :, None], QTYPE,
                )
                acc += tl.sum(tl.sum(w * xv[None, :, :], axis=2), axis=1)
            else:
                cols = k0 + tl.arange(0, BLOCK_K)
                col_ok = cols < k_hi
                xv = _load_x(x_ptr, m * x_stride + cols, col_ok, X_FP8)
                w = _weight_tile(w_ptr, w_stride, rows64[:, None], cols[None, :], row_ok[:, None] & col_ok[None, :], KIND)
                acc += tl.sum(w * xv[None, :], axis=1)
        if HAS_ROW_SCALE:
            acc = acc * tl.load(row_scale_ptr + rows, mask=row_ok, other=0.0)
        if HAS_TOK_SCALE:
            acc = acc * tl.load(tok_scale_ptr + m)
        if HAS_BIAS:
            if pid_k == 0:  # the first K span adds the bias
                acc += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        dst = out_ptr + m * out_stride + rows
        if ATOMIC:
            tl.atomic_add(dst, acc, mask=row_ok)
        else:
            tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok)

    @triton.jit
    def _gemm_kernel(
        x_ptr, w_ptr, out_ptr, bias_ptr, row_scale_ptr, tok_scale_ptr,
        M, N, K, x_stride, w_stride, out_stride,
        KIND: tl.constexpr, QTYPE: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_ROW_SCALE: tl.constexpr, HAS_TOK_SCALE: tl.constexpr, X_FP8: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        toks = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tok_ok = toks < M
        row_ok = rows < N
        rows64 = rows.to(tl.int64)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            xv = _load_x(x_ptr, toks[:, None] * x_stride + cols[None, :], tok_ok[:, None] & col_ok[None, :], X_FP8)
            # the weight tile transposed: [BLOCK_K, BLOCK_N]
            if KIND == 0:  # built as [groups, GROUP, BLOCK_N]
                g_idx = tl.arange(0, BLOCK_K // GROUP)
                g_ok = k0 + g_idx * GROUP < K
                w3 = _gguf_groups(
                    w_ptr, w_stride, rows64[None, None, :], (k0 // GROUP + g_idx)[:, None, None],
                    tl.arange(0, GROUP)[None, :, None], g_ok[:, None, None] & row_ok[None, None, :], QTYPE,
                )
                w = tl.reshape(w3, (BLOCK_K, BLOCK_N))
            else:
                w = _weight_tile(w_ptr, w_stride, rows64[None, :], cols[:, None], col_ok[:, None] & row_ok[None, :], KIND)
            acc += tl.dot(xv, w, input_precision="ieee")
        if HAS_ROW_SCALE:
            acc = acc * tl.load(row_scale_ptr + rows, mask=row_ok, other=0.0)[None, :]
        if HAS_TOK_SCALE:
            acc = acc * tl.load(tok_scale_ptr + toks, mask=tok_ok, other=0.0)[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        dst = out_ptr + toks[:, None] * out_stride + rows[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=tok_ok[:, None] & row_ok[None, :])

    @triton.jit
    def _quant_per_token_kernel(x_ptr, xq_ptr, scale_ptr, K, x_stride, xq_stride, BLOCK: tl.constexpr):
        m = tl.program_id(0).to(tl.int64)
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + m * x_stride + cols, mask=cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        row_max = tl.max(amax, axis=0)
        scale = tl.where(row_max > 0, row_max / 448.0, 1.0)  # an all-zero row: scale 1
        tl.store(scale_ptr + m, scale)
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + m * x_stride + cols, mask=cols < K, other=0.0).to(tl.float32)
            q = _round_e4m3(tl.minimum(tl.maximum(v / scale, -448.0), 448.0))
            tl.store(xq_ptr + m * xq_stride + cols, q.to(tl.float8e4nv), mask=cols < K)

    @triton.jit
    def _round_e4m3(v):
        """float32 in [-448, 448] -> the nearest float8_e4m3fn value (ties to even), still as
        float32, so the cast that follows is exact. Done by hand because Triton's interpreter
        rounds wrongly across a binade (127.5 -> 64); on a GPU it equals ``cvt.rn``."""
        bits = v.to(tl.int32, bitcast=True)
        exp = ((bits >> 23) & 255) - 127
        step = tl.exp2((tl.maximum(exp, -6) - 3).to(tl.float32))  # 3 mantissa bits; subnormals below 2**-6
        r = tl.abs(v) / step  # exact: step is a power of two
        f = tl.floor(r)
        frac = r - f
        odd = (f.to(tl.int32) & 1) == 1
        f = tl.where((frac > 0.5) | ((frac == 0.5) & odd), f + 1.0, f)
        return tl.where(bits < 0, -f * step, f * step)  # the sign bit: -0.0 stays -0.0


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("the quantized-linear GPU kernels need Triton (pip install triton)")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int | None) -> int:
    if device_index is None or not torch.cuda.is_available():
        return 4  # the interpreter: a small "GPU", so the split-K path is exercised on CPU too
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def split_k_for(m: int, n_blocks: int, k_blocks: int, num_sms: int) -> int:
    """How many K spans a GEMV launch splits into: ``GEMV_PROGRAMS_PER_SM`` programs per SM, never
    more spans than ``BLOCK_K`` steps of K (``k_blocks``)."""
    programs = max(1, m * n_blocks)
    return max(1, min(k_blocks, -(-GEMV_PROGRAMS_PER_SM * num_sms // programs)))


def _as_2d(x: torch.Tensor, k: int, op: str) -> torch.Tensor:
    if x.shape[-1] != k:
        raise ValueError(f"{op}: x has {x.shape[-1]} features but the weight has {k} (x {tuple(x.shape)})")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    x2 = x.reshape(-1, k)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(
    x2: torch.Tensor, w: torch.Tensor, n: int, k: int, out_dtype: torch.dtype, bias: torch.Tensor | None,
    *, kind: int, qtype: int = 0, row_scale: torch.Tensor | None = None, tok_scale: torch.Tensor | None = None,
    x_fp8: bool = False, split_k: int | None = None,
) -> torch.Tensor:
    """Run the GEMV or GEMM kernel: ``[M, K] x [N, K]^T -> [M, N]`` in ``out_dtype``."""
    _require_triton()
    m = x2.shape[0]
    if w.stride(-1) != 1:
        w = w.contiguous()
    if bias is not None:
        bias = bias.contiguous()
    dummy = w  # an unused pointer argument (the HAS_* flag is off)
    flags = dict(
        KIND=kind, QTYPE=qtype, GROUP=16 if qtype == Q6_K else 32, HAS_BIAS=bias is not None, HAS_ROW_SCALE=row_scale is not None,
        HAS_TOK_SCALE=tok_scale is not None, X_FP8=x_fp8,
    )
    ptrs = (bias if bias is not None else dummy, row_scale if row_scale is not None else dummy,
            tok_scale if tok_scale is not None else dummy)
    if m == 0:
        return torch.empty(0, n, dtype=out_dtype, device=x2.device)
    # the interpreter truncates float32 -> bfloat16 stores (a GPU rounds to nearest even): there
    # the kernels write float32 and torch rounds
    final_dtype, out_dtype = out_dtype, (torch.float32 if _interpreting() else out_dtype)
    if m <= GEMV_MAX_M:
        block_n, block_k = GEMV_BLOCK_N, GEMV_BLOCK_K
        n_blocks = triton.cdiv(n, block_n)
        k_steps = triton.cdiv(k, block_k)
        if split_k is None:
            split_k = split_k_for(m, n_blocks, k_steps, _num_sms(x2.device.index if x2.is_cuda else None))
        split_k = max(1, min(int(split_k), k_steps))
        k_per_split = triton.cdiv(k_steps, split_k) * block_k
        split_k = triton.cdiv(k, k_per_split)
        atomic = split_k > 1
        if atomic:
            out = torch.zeros(m, n, dtype=torch.float32, device=x2.device)
        else:
            out = torch.empty(m, n, dtype=out_dtype, device=x2.device)
        _gemv_kernel[(n_blocks, m, split_k)](
            x2, w, out, *ptrs, n, k, x2.stride(0), w.stride(0), out.stride(0), k_per_split,
            **flags, ATOMIC=atomic, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=GEMV_NUM_WARPS,
        )
        return out.to(final_dtype)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n, block_k = GEMM_BLOCK_N, GEMM_BLOCK_K
    out = torch.empty(m, n, dtype=out_dtype, device=x2.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _gemm_kernel[grid](
        x2, w, out, *ptrs, m, n, k, x2.stride(0), w.stride(0), out.stride(0),
        **flags, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=GEMM_NUM_WARPS,
    )
    return out.to(final_dtype)


def _check_bias(bias: torch.Tensor | None, n: int, op: str) -> None:
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"{op}: bias must be [{n}] (one per output row), got {tuple(bias.shape)}")


def gguf_linear(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None, *, split_k: int | None = None
) -> torch.Tensor:
    """``x @ dequantize(qweight)^T + bias`` in x's dtype; ``qweight`` is ``uint8 [N, row_bytes]``
    of GGUF blocks of type ``qtype`` (``int(gguf.GGMLQuantizationType.X)``). ``split_k`` forces
    the GEMV launch's K split (tests); by default it is chosen to fill the GPU."""
    qtype = int(qtype)
    if qtype in GGUF_BLOCKS and qtype not in TRITON_GGUF_QTYPES:
        from host.sdk.kernels import ANY_DEVICE, kernel_entry

        return kernel_entry("gguf_linear", ANY_DEVICE).impl(x, qweight, qtype, bias)
    if qtype not in GGUF_BLOCKS:
        raise ValueError(
            f"gguf_linear: GGUF quantization type {qtype} has no Triton kernel; supported: "
            + ", ".join(f"{name} ({t})" for t, name in GGUF_NAMES.items())
        )
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"gguf_linear: qweight must be uint8 [N, row_bytes], got {qweight.dtype} {tuple(qweight.shape)}")
    size, nbytes = GGUF_BLOCKS[qtype]
    n, rb = qweight.shape
    if rb % nbytes:
        raise ValueError(f"gguf_linear: a {GGUF_NAMES[qtype]} row is whole blocks of {nbytes} bytes; {rb} bytes is not")
    k = rb // nbytes * size
    _check_bias(bias, n, "gguf_linear")
    x2 = _as_2d(x, k, "gguf_linear")
    out = _launch(x2, qweight, n, k, x.dtype, bias, kind=0, qtype=qtype, split_k=split_k)
    return out.reshape(*x.shape[:-1], n)


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, *, split_k: int | None = None
) -> torch.Tensor:
    """``x @ (qweight * scales[:, None])^T + bias`` in x's dtype (``qweight`` int8 [N, K],
    ``scales`` float32 [N])."""
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError(f"int8_linear: qweight must be int8 [N, K], got {qweight.dtype} {tuple(qweight.shape)}")
    n, k = qweight.shape
    if scales.shape != (n,):
        raise ValueError(f"int8_linear: scales must be [{n}] (one per output row), got {tuple(scales.shape)}")
    _check_bias(bias, n, "int8_linear")
    x2 = _as_2d(x, k, "int8_linear")
    out = _launch(x2, qweight, n, k, x.dtype, bias, kind=1, row_scale=scales.float().contiguous(), split_k=split_k)
    return out.reshape(*x.shape[:-1], n)


def quantize_per_token_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`quantize_per_token`: ``(xq float8_e4m3fn [M, K], sx float32
    [M, 1])`` with ``sx = amax|x row| / 448`` (1 for an all-zero row) and ``xq = x / sx`` rounded
    to nearest even (the quantization plugin's ``quantize_fp8_per_token``)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    sx = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    xq = (xf / sx).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return xq, sx


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token fp8 activation quantization in one Triton launch (one program per row):
    ``(xq float8_e4m3fn [M, K], sx float32 [M, 1])``, ``x ≈ xq * sx`` (see the reference)."""
    _require_triton()
    m, k = x.shape
    xq = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    sx = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        block = min(1024, triton.next_power_of_2(max(k, 16)))
        _quant_per_token_kernel[(m,)](x, xq, sx, k, x.stride(0), xq.stride(0), BLOCK=block, num_warps=4)
    return xq, sx


def _check_fp8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if qweight.dtype != torch.float8_e4m3fn or qweight.dim() != 2:
        raise ValueError(f"fp8_linear: qweight must be float8_e4m3fn [N, K], got {qweight.dtype} {tuple(qweight.shape)}")
    n, k = qweight.shape
    if scales.numel() != n:
        raise ValueError(f"fp8_linear: scales must be [{n}] (one per output row), got {tuple(scales.shape)}")
    _check_bias(bias, n, "fp8_linear")
    return _as_2d(x, k, "fp8_linear")


def fp8_linear_triton(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, *, split_k: int | None = None
) -> torch.Tensor:
    """The fp8 product without fp8 tensor cores: per-token quantization in torch ops (casts to
    e4m3 work on any GPU), then a Triton kernel that decodes both e4m3 operands from their
    bytes, multiplies in float32 and applies ``sx[m] * scales[n]``."""
    x2 = _check_fp8(x, qweight, scales, bias)
    n, k = qweight.shape
    xq, sx = quantize_per_token_reference(x2)
    out = _launch(
        xq.view(torch.uint8), qweight.view(torch.uint8), n, k, x.dtype, bias, kind=2,
        row_scale=scales.reshape(n).float().contiguous(), tok_scale=sx.reshape(-1).contiguous(), x_fp8=True,
        split_k=split_k,
    )
    return out.reshape(*x.shape[:-1], n)


def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` can multiply e4m3 on ``device``: a CUDA GPU of compute
    capability >= 8.9 (not under the interpreter)."""
    if device.type != "cuda" or _interpreting() or getattr(torch.version, "hip", None):
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (8, 9)


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device_index))


def fp8_linear_scaled_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The fp8 product on fp8 tensor cores: :func:`quantize_per_token` (Triton) then
    ``torch._scaled_mm`` with row-wise scales (``sx`` [M, 1], ``scales`` [1, N]). Row-wise
    scaling produces bfloat16; the bias is added in float32 afterwards and the sum rounded to
    x's dtype (``_scaled_mm``'s own bias argument is left alone: which dtypes it takes with
    row-wise scales differs between torch versions)."""
    x2 = _check_fp8(x, qweight, scales, bias)
    n = qweight.shape[0]
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], n)
    xq, sx = quantize_per_token(x2)
    out = torch._scaled_mm(
        xq, qweight.t(), scale_a=sx, scale_b=scales.reshape(1, n).float().contiguous(), out_dtype=torch.bfloat16,
    )
    if bias is not None:
        out = out.float() + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def fp8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``fp8_linear``: ``torch._scaled_mm`` where the GPU has fp8 tensor cores and the shape
    suits it (K and N multiples of 16), else :func:`fp8_linear_triton`."""
    n, k = qweight.shape
    if fp8_tensor_cores(x.device) and k % 16 == 0 and n % 16 == 0:
        return fp8_linear_scaled_mm(x, qweight, scales, bias)
    return fp8_linear_triton(x, qweight, scales, bias)


KERNEL_NAME = "triton"
KERNEL_PRIORITY = 10


REASONS = {
    "gguf_linear": "Triton dequant-and-GEMM kernel",
    "int8_linear": "Triton dequant-and-GEMM kernel",
    "fp8_linear": "torch._scaled_mm on fp8 tensor cores (capability >= 8.9), else a Triton kernel",
}


def register_quant_kernels(device_type: str = "cuda", *, fp8: bool = True, register: Callable[..., None] | None = None) -> list[str]:
    """Put these kernels in the kernel table for ``device_type`` (priority 10, name ``triton``)
    through ``register`` (the ``host_offer_kernels`` callback; the table's ``register_kernel`` by
    default): ``gguf_linear`` and ``int8_linear``, and ``fp8_linear`` when ``fp8`` (GPUs whose
    fp8 is OCP e4m3fn; not ROCm's gfx942, which computes e4m3fnuz). Returns the ops registered."""
    if register is None:
        from host.sdk.kernels import register_kernel as register

    ops = {"gguf_linear": gguf_linear, "int8_linear": int8_linear}
    if fp8:
        ops["fp8_linear"] = fp8_linear
    for op, impl in ops.items():
        register(op, device_type, impl, name=KERNEL_NAME, priority=KERNEL_PRIORITY, reason=REASONS[op])
    return list(ops)
