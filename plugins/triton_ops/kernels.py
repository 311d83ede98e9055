"""The Triton kernels of the GPU platforms (CUDA and ROCm), each next to its plain-torch reference.

- :func:`reshape_and_cache`: write new tokens' K/V into the paged cache through the slot
  mapping (slot ``-1``: skip the token).
- :func:`paged_attention`: attention of a mixed batch over the paged cache — every request's
  query tokens (a whole prompt, a prefill chunk after a prefix-cache hit, or one decode token)
  attend causally to its cached context and to themselves; GQA; sliding window; online softmax
  in float32 over key tiles gathered through the block table.
- :func:`paged_decode_split`: single-token decode split over spans of the sequence (split-K,
  flash-decoding) with a second kernel merging the spans, for long contexts.
- :func:`rms_norm` / :func:`fused_add_rms_norm`, :func:`rotary_neox`, :func:`silu_and_mul`.

The kernels run on a GPU, or on CPU tensors under ``TRITON_INTERPRET=1`` — which is how CI
checks them against the references (``tests/plugins/triton_ops/test_kernels.py``). The
``*_ref`` functions define what each kernel must compute.
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton ships with torch on Linux x86_64
    HAS_TRITON = False


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


if HAS_TRITON:

    @triton.jit
    def _round_e4m3(x):
        """``x`` (float32, |x| <= 448) rounded to the nearest e4m3 value, ties to even, still in
        float32: the step is 2^(exponent - 3), 2^-9 among subnormals; the rounding is the
        float32 add-and-subtract of 1.5 * 2^23. The cast to float8 that follows is then exact
        on any converter (the interpreter's own rounding loses carries and ties)."""
        exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        step = ((tl.maximum(exponent, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)
        rounded = ((x / step + 12582912.0) - 12582912.0) * step
        return tl.where(rounded == 0.0, x * 0.0, rounded)  # keep the sign of a zero, as torch's cast does

    @triton.jit
    def _reshape_and_cache_kernel(
        key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        key_stride, value_stride, cache_block_stride, cache_slot_stride,
        block_size, row_size, k_scale, v_scale,
        BLOCK: tl.constexpr, FP8: tl.constexpr,
    ):
        t = tl.program_id(0)
        chunk = tl.program_id(1)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            offs = chunk * BLOCK + tl.arange(0, BLOCK)
            mask = offs < row_size
            dst = (slot // block_size) * cache_block_stride + (slot % block_size) * cache_slot_stride + offs
            k = tl.load(key_ptr + t * key_stride + offs, mask=mask)
            v = tl.load(value_ptr + t * value_stride + offs, mask=mask)
            if FP8:  # value = stored * scale, saturated to e4m3's finite range (no NaN)
                k = _round_e4m3(tl.minimum(tl.maximum(k.to(tl.float32) / k_scale, -448.0), 448.0))
                v = _round_e4m3(tl.minimum(tl.maximum(v.to(tl.float32) / v_scale, -448.0), 448.0))
            tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_table_ptr, query_start_ptr, seq_lens_ptr,
        scale, v_scale, window,
        q_stride_t, q_stride_h, o_stride_t, o_stride_h,
        c_stride_b, c_stride_s, c_stride_h,
        bt_stride,
        block_size,
        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
        FP8: tl.constexpr = False,
    ):
        r = tl.program_id(0)
        h = tl.program_id(1)
        mb = tl.program_id(2)
        q_start = tl.load(query_start_ptr + r)
        q_len = tl.load(query_start_ptr + r + 1) - q_start
        if mb * BLOCK_M < q_len:
            seq_len = tl.load(seq_lens_ptr + r)
            ctx_len = seq_len - q_len
            kvh = h // (NUM_HEADS // NUM_KV_HEADS)
            offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, BLOCK_D)
            mask_m = offs_m < q_len
            mask_d = offs_d < HEAD_DIM
            q_pos = ctx_len + offs_m
            q = tl.load(
                q_ptr + (q_start + offs_m)[:, None] * q_stride_t + h * q_stride_h + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0,
            )
            if UPCAST:
                q = q.to(tl.float32)
            m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            hi = tl.minimum(seq_len, ctx_len + (mb + 1) * BLOCK_M)
            lo = 0
            if window > 0:
                lo = tl.maximum(0, ctx_len + mb * BLOCK_M - window + 1)
                lo = (lo // BLOCK_N) * BLOCK_N
            for start_n in range(lo, hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                mask_n = offs_n < seq_len
                phys = tl.load(block_table_ptr + r * bt_stride + offs_n // block_size, mask=mask_n, other=0).to(tl.int64)
                kv_off = phys * c_stride_b + (offs_n % block_size) * c_stride_s + kvh * c_stride_h
                k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
                v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
                # pages in the compute dtype (fp8 pages widen here, through float32: every GPU's
                # conversion has that path; their scales are ``scale`` for K, ``v_scale`` on out)
                if FP8:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                k = k.to(q.dtype)
                v = v.to(q.dtype)
                s = tl.dot(q, tl.trans(k), input_precision="ieee").to(tl.float32) * scale
                allowed = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
                if window > 0:
                    allowed = allowed & (q_pos[:, None] - offs_n[None, :] < window)
                s = tl.where(allowed, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee").to(tl.float32)
                m_i = m_new
            out = acc * v_scale / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(
                out_ptr + (q_start + offs_m)[:, None] * o_stride_t + h * o_stride_h + offs_d[None, :],
                out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :],
            )

    @triton.jit
    def _decode_split_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr,
        part_m_ptr, part_l_ptr, part_acc_ptr,
        scale, v_scale, window, span,
        q_stride_t, q_stride_h,
        c_stride_b, c_stride_s, c_stride_h,
        bt_stride, block_size, num_splits,
        NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
        FP8: tl.constexpr = False,
    ):
        # one program per (request, KV head, span): the GROUP query heads sharing the KV head
        # are the rows of one matmul, so each K/V tile is read once for all of them
        r = tl.program_id(0)
        kvh = tl.program_id(1)
        sp = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + r)
        start = 0
        if window > 0:
            start = tl.maximum(0, seq_len - window)
        lo = start + sp * span
        hi = tl.minimum(seq_len, lo + span)
        offs_g = tl.arange(0, BLOCK_G)
        mask_g = offs_g < GROUP
        heads = kvh * GROUP + offs_g
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        q = tl.load(
            q_ptr + r * q_stride_t + heads[:, None] * q_stride_h + offs_d[None, :],
            mask=mask_g[:, None] & mask_d[None, :], other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < hi
            phys = tl.load(block_table_ptr + r * bt_stride + offs_n // block_size, mask=mask_n, other=0).to(tl.int64)
            kv_off = phys * c_stride_b + (offs_n % block_size) * c_stride_s + kvh * c_stride_h
            k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            if FP8:  # fp8 pages widen here, through float32 (scales: ``scale`` for K, ``v_scale`` on acc)
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            k = k.to(q.dtype)
            v = v.to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision="ieee").to(tl.float32) * scale
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee").to(tl.float32)
            m_i = m_new
        idx = (r * NUM_HEADS + heads) * num_splits + sp
        tl.store(part_m_ptr + idx, m_i, mask=mask_g)
        tl.store(part_l_ptr + idx, l_i, mask=mask_g)
        tl.store(part_acc_ptr + idx[:, None] * HEAD_DIM + offs_d[None, :], acc * v_scale, mask=mask_g[:, None] & mask_d[None, :])

    @triton.jit
    def _decode_merge_kernel(
        part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, o_stride_t, o_stride_h, num_splits,
        NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        r = tl.program_id(0)
        h = tl.program_id(1)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        mask_s = offs_s < num_splits
        mask_d = offs_d < HEAD_DIM
        base = (r * NUM_HEADS + h) * num_splits
        m = tl.load(part_m_ptr + base + offs_s, mask=mask_s, other=-1.0e30)
        part_l = tl.load(part_l_ptr + base + offs_s, mask=mask_s, other=0.0)
        acc = tl.load(part_acc_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0)
        m_max = tl.max(m, 0)
        c = tl.exp(m - m_max)
        den = tl.sum(c * part_l, 0)
        out = tl.sum(c[:, None] * acc, 0) / tl.where(den > 0, den, 1.0)
        tl.store(out_ptr + r * o_stride_t + h * o_stride_h + offs_d, out.to(out_ptr.dtype.element_ty), mask=mask_d)

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, x_stride, res_stride, out_stride, n, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0)
        dtype = x.dtype
        if HAS_RESIDUAL:
            # the sum is rounded to the model dtype, as the reference model's add is
            x = (x.to(tl.float32) + tl.load(res_ptr + row * res_stride + offs, mask=mask, other=0.0).to(tl.float32)).to(dtype)
            tl.store(res_ptr + row * res_stride + offs, x, mask=mask)
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, 0) / n
        y = (xf * (1.0 / tl.sqrt(var + eps))).to(dtype).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * out_stride + offs, (w * y).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotary_kernel(
        x_ptr, pos_ptr, cache_ptr, x_stride_t, x_stride_h, cache_stride, half,
        BLOCK: tl.constexpr,
    ):
        t = tl.program_id(0)
        h = tl.program_id(1)
        offs = tl.arange(0, BLOCK)
        mask = offs < half
        pos = tl.load(pos_ptr + t).to(tl.int64)
        cos = tl.load(cache_ptr + pos * cache_stride + offs, mask=mask, other=0.0).to(tl.float32)
        sin = tl.load(cache_ptr + pos * cache_stride + half + offs, mask=mask, other=0.0).to(tl.float32)
        base = x_ptr + t * x_stride_t + h * x_stride_h
        x1 = tl.load(base + offs, mask=mask, other=0.0)
        x2 = tl.load(base + half + offs, mask=mask, other=0.0)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        tl.store(base + offs, (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
        tl.store(base + half + offs, (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, d, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < d
        g = tl.load(x_ptr + t * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + t * x_stride + d + offs, mask=mask, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + t * out_stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; the CUDA platform's kernels need it (pip install triton)")


# -- launchers ---------------------------------------------------------------------------------


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_fp8(cache: torch.Tensor) -> bool:
    """Whether a KV cache holds float8_e4m3fn pages (``--kv-cache-dtype fp8``)."""
    return cache.dtype == torch.float8_e4m3fn


def _upcast(t: torch.Tensor) -> bool:
    """Compute the attention matmuls in float32: always for float32 models, and under the
    interpreter (numpy has no bfloat16 arithmetic). On a GPU, 16-bit inputs go to the tensor
    cores as they are (float32 accumulation either way)."""
    return t.dtype == torch.float32 or _interpreting() or not t.is_cuda


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """``key``/``value`` [T, KVH, D] into caches [num_blocks, block_size, KVH, D] at
    ``slot_mapping`` [T] (``block * block_size + offset``; negative: skipped). float8_e4m3fn
    caches store ``clamp(k / k_scale, +-448)`` rounded to nearest (``v`` with ``v_scale``); the
    scales are ignored for caches in the model dtype."""
    _require_triton()
    T = key.shape[0]
    if T == 0:
        return
    assert k_cache.stride(3) == 1 and k_cache.stride(2) == k_cache.shape[3] and k_cache.stride() == v_cache.stride()
    row = key.shape[1] * key.shape[2]
    key2, value2 = key.reshape(T, row), value.reshape(T, row)
    block = min(1024, _next_pow2(row))
    _reshape_and_cache_kernel[(T, triton.cdiv(row, block))](
        key2, value2, k_cache, v_cache, slot_mapping,
        key2.stride(0), value2.stride(0), k_cache.stride(0), k_cache.stride(1),
        k_cache.shape[1], row, float(k_scale), float(v_scale), BLOCK=block, FP8=is_fp8(k_cache),
    )


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention for a varlen batch: ``query`` [T, H, D] (request ``r`` owns rows
    ``query_start_loc[r]:query_start_loc[r+1]``, the last tokens of its ``seq_lens[r]``) over
    caches [num_blocks, block_size, KVH, D] addressed by ``block_table`` [R, max_blocks].
    float8_e4m3fn caches are read as ``page * k_scale`` / ``page * v_scale``."""
    _require_triton()
    T, H, D = query.shape
    KVH = k_cache.shape[2]
    R = block_table.shape[0]
    out = torch.empty_like(query) if out is None else out
    if T == 0 or R == 0:
        return out
    block_m = 16
    block_n = 16 if k_cache.shape[1] % 16 else min(64, k_cache.shape[1])
    block_d = max(16, _next_pow2(D))
    grid = (R, H, triton.cdiv(max(int(max_query_len), 1), block_m))
    k_scale, v_scale = (float(k_scale), float(v_scale)) if is_fp8(k_cache) else (1.0, 1.0)
    _paged_attention_kernel[grid](
        query, k_cache, v_cache, out, block_table, query_start_loc, seq_lens,
        float(scale) * k_scale, v_scale, int(sliding_window or 0),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), k_cache.shape[1],
        NUM_HEADS=H, NUM_KV_HEADS=KVH, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        UPCAST=_upcast(query), FP8=is_fp8(k_cache),
    )
    return out


SPLIT_TARGET_PROGRAMS = 2048  # about 16 programs per SM on a 132-SM GPU


def paged_decode_split(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    span: int = 256,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """One query token per request (``query`` [R, H, D]) over its whole context, split into
    spans of at least ``span`` positions computed in parallel and merged (flash-decoding).

    A program handles one (request, KV head, span) and all the query heads of that KV head's
    group as the rows of its matmuls, so K/V are read once per group (GQA), not once per query
    head. The number of spans depends only on ``R``, the head counts and ``max_seq_len``, never
    on the values in ``seq_lens``, so a launch captured in a graph with ``max_seq_len`` set to
    the model's limit is valid for any later batch of that size. float8_e4m3fn caches are read
    as ``page * k_scale`` / ``page * v_scale``."""
    _require_triton()
    R, H, D = query.shape
    out = torch.empty_like(query) if out is None else out
    if R == 0:
        return out
    longest = int(max_seq_len if max_seq_len is not None else seq_lens.max())
    if sliding_window:
        longest = min(longest, int(sliding_window))
    # enough (request, KV head, span) programs to fill the device, never spans under
    # ``span``: a big batch needs no split, a single long sequence gets many
    KVH = k_cache.shape[2]
    group = H // KVH
    wanted = max(1, -(-SPLIT_TARGET_PROGRAMS // (R * KVH)))
    splits = max(1, min(math.ceil(longest / span), wanted))
    span = -(-math.ceil(longest / splits) // 32) * 32
    part_m = torch.empty(R * H * splits, dtype=torch.float32, device=query.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(R * H * splits * D, dtype=torch.float32, device=query.device)
    block_d = max(16, _next_pow2(D))
    k_scale, v_scale = (float(k_scale), float(v_scale)) if is_fp8(k_cache) else (1.0, 1.0)
    _decode_split_kernel[(R, KVH, splits)](
        query, k_cache, v_cache, block_table, seq_lens, part_m, part_l, part_acc,
        float(scale) * k_scale, v_scale, int(sliding_window or 0), span,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), k_cache.shape[1], splits,
        NUM_HEADS=H, GROUP=group, HEAD_DIM=D, BLOCK_G=max(16, _next_pow2(group)), BLOCK_N=32, BLOCK_D=block_d,
        UPCAST=_upcast(query), FP8=is_fp8(k_cache),
    )
    _decode_merge_kernel[(R, H)](
        part_m, part_l, part_acc, out, out.stride(0), out.stride(1), splits,
        NUM_HEADS=H, HEAD_DIM=D, BLOCK_S=max(2, _next_pow2(splits)), BLOCK_D=block_d,
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _require_triton()
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    out = torch.empty_like(x2)
    n = shape[-1]
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, x2, weight, out, x2.stride(0), 0, out.stride(0), n, float(eps), HAS_RESIDUAL=False, BLOCK=_next_pow2(n))
    return out.view(shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x``; returns ``(rms_norm(residual), residual)`` (``residual`` in place)."""
    _require_triton()
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n), residual.view(-1, n)
    out = torch.empty_like(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, out, x2.stride(0), r2.stride(0), out.stride(0), n, float(eps), HAS_RESIDUAL=True, BLOCK=_next_pow2(n))
    return out.view(x.shape), residual


def rotary_neox(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, head_dim] (head dim contiguous) in place; ``cos_sin_cache``
    [max_pos, rot] holds cos then sin halves; dims past ``rot`` are untouched."""
    _require_triton()
    T, heads, _ = x.shape
    half = cos_sin_cache.shape[1] // 2
    if T:
        _rotary_kernel[(T, heads)](x, positions, cos_sin_cache, x.stride(0), x.stride(1), cos_sin_cache.stride(0), half, BLOCK=max(2, _next_pow2(half)))
    return x


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    _require_triton()
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    block = min(1024, _next_pow2(d))
    if x2.shape[0]:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](x2, out, x2.stride(0), out.stride(0), d, BLOCK=block)
    return out.view(*x.shape[:-1], d)


# -- torch references --------------------------------------------------------------------------


def reshape_and_cache_ref(key, value, k_cache, v_cache, slot_mapping, k_scale=1.0, v_scale=1.0) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    bs = k_cache.shape[1]
    if is_fp8(k_cache):  # bytes: CPU torch indexes no float8 tensors
        for cache, x, s in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
            q = (x[keep].float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            cache.view(torch.uint8)[slots // bs, slots % bs] = q.view(torch.uint8)
        return
    k_cache[slots // bs, slots % bs] = key[keep].to(k_cache.dtype)
    v_cache[slots // bs, slots % bs] = value[keep].to(v_cache.dtype)


def paged_attention_ref(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale, sliding_window=None,
                        k_scale=1.0, v_scale=1.0) -> torch.Tensor:
    if is_fp8(k_cache):  # the pages as the values they stand for
        k_cache, v_cache = k_cache.float() * k_scale, v_cache.float() * v_scale
    out = torch.empty_like(query)
    H, KVH = query.shape[1], k_cache.shape[2]
    bs = k_cache.shape[1]
    for r in range(block_table.shape[0]):
        a, b = int(query_start_loc[r]), int(query_start_loc[r + 1])
        L = int(seq_lens[r])
        if b == a:
            continue
        pos = torch.arange(L)
        blocks = block_table[r, pos // bs].long()
        k = k_cache[blocks, pos % bs].float().repeat_interleave(H // KVH, dim=1)  # [L, H, D]
        v = v_cache[blocks, pos % bs].float().repeat_interleave(H // KVH, dim=1)
        q = query[a:b].float()
        qpos = torch.arange(L - (b - a), L)
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        allowed = pos[None, :] <= qpos[:, None]
        if sliding_window:
            allowed &= qpos[:, None] - pos[None, :] < sliding_window
        s = s.masked_fill(~allowed[None], float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).to(query.dtype)
    return out


def rms_norm_ref(x, weight, eps, residual=None):
    if residual is not None:
        x = x + residual
    y = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * y, x) if residual is not None else weight * y


def rotary_neox_ref(x, positions, cos_sin_cache):
    half = cos_sin_cache.shape[1] // 2
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = x.clone()
    x1, x2 = x[..., :half].float(), x[..., half : 2 * half].float()
    out[..., :half] = (x1 * cos - x2 * sin).to(x.dtype)
    out[..., half : 2 * half] = (x2 * cos + x1 * sin).to(x.dtype)
    return out


def silu_and_mul_ref(x):
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    return (torch.nn.functional.silu(g) * u).to(x.dtype)
