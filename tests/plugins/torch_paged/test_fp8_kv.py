"""fp8 KV pages (``--kv-cache-dtype fp8``) in the torch path that ``torch_paged`` and ``cpu_paged``
share: the write rounds ``k / k_scale`` to float8_e4m3fn, the read widens and multiplies by the scale.

The reference rounding is an e4m3 value grid built here from the format's definition (sign, 4
exponent bits of bias 7, 3 mantissa bits, subnormals, no infinities, 0x7F NaN) with round to
nearest, ties to even — not torch's cast. Attention over fp8 pages must then equal dense float64
attention over the grid-rounded K/V.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend
from host.plugins.torch_paged.attention import TorchPagedAttentionBackend, dequantize_kv, quantize_kv
from host.sdk.attention import CommonAttentionMetadata

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 16, 4


def e4m3_grid() -> np.ndarray:
    """The finite non-negative e4m3fn values, in byte order (bytes 0x00..0x7E are increasing)."""
    values = []
    for b in range(0x7F):
        e, m = b >> 3, b & 7
        values.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(values)


def round_e4m3(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to e4m3fn (nearest, ties to the even byte), saturated at +-448."""
    grid = e4m3_grid()
    a = np.minimum(np.abs(x), grid[-1])
    hi = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(x) * grid[pick]


def test_round_trip_matches_the_e4m3_grid_with_scale_and_saturation():
    gen = torch.Generator().manual_seed(0)
    scale = 0.25
    x = torch.randn(4096, generator=gen) * torch.logspace(-4, 2.5, 4096)  # subnormals to outliers
    ties = torch.tensor([1 + 1 / 16, 1 + 3 / 16, 2**-9 * 1.5, 600.0, -1000.0, 1e6, 0.0]) * scale
    x = torch.cat((x, ties))
    stored = quantize_kv(x, scale)
    assert stored.dtype == torch.float8_e4m3fn
    expect = round_e4m3(x.double().numpy() / scale) * scale
    got = dequantize_kv(stored, scale, torch.float32).double().numpy()
    np.testing.assert_array_equal(got, expect)
    assert got[-4] == 448 * scale and got[-3] == -448 * scale and got[-2] == 448 * scale  # saturated, no NaN
    # bfloat16 holds every e4m3 value times a power-of-two scale exactly
    assert torch.equal(dequantize_kv(stored, scale, torch.bfloat16).double(), torch.from_numpy(expect))


def metadata(context_and_query, table) -> CommonAttentionMetadata:
    qlens = torch.tensor([q for _, q in context_and_query])
    seq_lens = torch.tensor([c + q for c, q in context_and_query], dtype=torch.int32)
    slots = []
    for r, (ctx, q) in enumerate(context_and_query):
        pos = torch.arange(ctx, ctx + q)
        slots.append(table[r, pos // BLOCK].long() * BLOCK + pos % BLOCK)
    return CommonAttentionMetadata(
        query_start_loc=torch.cat((torch.zeros(1, dtype=torch.int64), qlens.cumsum(0))).to(torch.int32),
        seq_lens=seq_lens, block_table=table, slot_mapping=torch.cat(slots), num_reqs=len(context_and_query),
        num_actual_tokens=int(qlens.sum()), max_query_len=int(qlens.max()), max_seq_len=int(seq_lens.max()),
        block_size=BLOCK,
    )


def run_two_steps(backend, k_scale: float, v_scale: float, gen: torch.Generator, magnitude: float):
    """Prompts written into an empty fp8 cache by a first step, then decodes and a chunk after the
    cached context attending over those pages: (second step's output, per-request q/k/v)."""
    context_and_query = [(9, 1), (5, 4), (13, 1), (7, 3)]
    seqs = [(torch.randn(q, HEADS, HEAD_SIZE, generator=gen),
             torch.randn(c + q, KV_HEADS, HEAD_SIZE, generator=gen) * magnitude,
             torch.randn(c + q, KV_HEADS, HEAD_SIZE, generator=gen) * magnitude) for c, q in context_and_query]
    blocks = [math.ceil((c + q) / BLOCK) for c, q in context_and_query]
    pages = torch.randperm(sum(blocks) + 3, generator=gen)[: sum(blocks)].tolist()
    table = torch.zeros(len(blocks), max(blocks), dtype=torch.int32)
    for r, n in enumerate(blocks):
        table[r, :n] = torch.tensor([pages.pop() for _ in range(n)], dtype=torch.int32)
    cache = torch.zeros(backend.get_kv_cache_shape(sum(blocks) + 3, BLOCK, KV_HEADS, HEAD_SIZE), dtype=torch.float8_e4m3fn)
    scale = 1 / math.sqrt(HEAD_SIZE)
    impl = backend.get_impl_cls()(HEADS, HEAD_SIZE, scale, KV_HEADS)
    impl.k_scale, impl.v_scale = k_scale, v_scale
    builder = backend.get_builder_cls()(backend, torch.device("cpu"))
    # step 1: the contexts as prompts (their outputs are not checked here)
    ctx_only = [(0, c) for c, _ in context_and_query]
    q1 = torch.cat([torch.randn(c, HEADS, HEAD_SIZE, generator=gen) for c, _ in context_and_query])
    k1 = torch.cat([k[:c] for (c, _), (_, k, _) in zip(context_and_query, seqs)])
    v1 = torch.cat([v[:c] for (c, _), (_, _, v) in zip(context_and_query, seqs)])
    impl.forward(q1, k1, v1, cache, builder.build(metadata(ctx_only, table)))
    # step 2: the new tokens over the cached context
    q2 = torch.cat([q for q, _, _ in seqs])
    k2 = torch.cat([k[c:] for (c, _), (_, k, _) in zip(context_and_query, seqs)])
    v2 = torch.cat([v[c:] for (c, _), (_, _, v) in zip(context_and_query, seqs)])
    out = impl.forward(q2, k2, v2, cache, builder.build(metadata(context_and_query, table)))
    return out, seqs, [c for c, _ in context_and_query], scale


def dense(seqs, contexts, scale, round_kv=None) -> torch.Tensor:
    outs = []
    for (q, k, v), ctx in zip(seqs, contexts):
        k, v = k.double(), v.double()
        if round_kv:
            k = torch.from_numpy(round_e4m3(k.numpy() / round_kv[0]) * round_kv[0])
            v = torch.from_numpy(round_e4m3(v.numpy() / round_kv[1]) * round_kv[1])
        mask = torch.arange(k.shape[0])[None, :] <= (ctx + torch.arange(q.shape[0]))[:, None]
        rep = HEADS // KV_HEADS
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).double(), k.transpose(0, 1).repeat_interleave(rep, 0),
            v.transpose(0, 1).repeat_interleave(rep, 0), attn_mask=mask, scale=scale,
        )
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def test_attention_over_fp8_pages_equals_dense_attention_over_rounded_kv():
    """Scales other than 1 (K and V of very different magnitudes) are applied on write and read;
    cpu_paged (whose compiled decode kernel reads float32 pages only) gives the same result."""
    k_scale, v_scale = 0.05, 4.0
    out, seqs, contexts, scale = run_two_steps(TorchPagedAttentionBackend, k_scale, v_scale, torch.Generator().manual_seed(1), 1.0)
    ref = dense(seqs, contexts, scale, round_kv=(k_scale, v_scale))
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    # and close to attention over the unrounded K/V (3 mantissa bits: a few percent per element)
    assert (out.double() - dense(seqs, contexts, scale)).abs().max() < 0.15
    cpu_out, *_ = run_two_steps(CpuPagedAttentionBackend, k_scale, v_scale, torch.Generator().manual_seed(1), 1.0)
    torch.testing.assert_close(cpu_out, out, atol=0, rtol=0)


def test_default_scale_one_keeps_large_activations_finite():
    """With the default scales (1.0) K/V past +-448 saturate instead of turning into NaN."""
    out, seqs, contexts, scale = run_two_steps(TorchPagedAttentionBackend, 1.0, 1.0, torch.Generator().manual_seed(2), 300.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), dense(seqs, contexts, scale, round_kv=(1.0, 1.0)), atol=1e-3, rtol=1e-4)
