"""The CPU paged-attention backend against dense attention on the unpaged sequences."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend
from host.plugins.torch_paged.metadata import TorchPagedAttentionMetadata, TorchPagedAttentionMetadataBuilder
from host.sdk.attention import AttentionRequirements, CommonAttentionMetadata

HEADS, KV_HEADS, HEAD_SIZE = 8, 2, 64


@dataclass
class Batch:
    """A paged batch plus the dense sequences it stands for."""

    common: CommonAttentionMetadata
    kv_cache: torch.Tensor
    query: torch.Tensor  # [num_tokens, heads, hd]  new tokens only
    key: torch.Tensor  # [num_tokens, kv_heads, hd]
    value: torch.Tensor
    full_k: list[torch.Tensor]  # per request, [seq_len, kv_heads, hd]: context + new
    full_v: list[torch.Tensor]
    queries: list[torch.Tensor]  # per request, [query_len, heads, hd]
    context_lens: list[int]


def make_batch(
    shapes: list[tuple[int, int]],
    block_size: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_blocks: int = 7,
) -> Batch:
    """``shapes`` is ``[(context_len, query_len), ...]``. Context K/V is put into the cache
    directly; the new tokens' K/V are left for ``forward`` to write through the slot mapping."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_req = [math.ceil((c + q) / block_size) for c, q in shapes]
    num_blocks = sum(blocks_per_req) + spare_blocks
    ids = torch.randperm(num_blocks, generator=gen).tolist()  # shuffled, non-contiguous pages
    kv_cache = torch.randn(
        CpuPagedAttentionBackend.get_kv_cache_shape(num_blocks, block_size, KV_HEADS, HEAD_SIZE),
        generator=gen,
    ).to(dtype)  # garbage everywhere; only written slots may matter
    max_blocks = max(blocks_per_req) + 2
    block_table = torch.zeros(len(shapes), max_blocks, dtype=torch.int32)
    block_table[:, :] = 10**6  # stale entries past a request's pages must never be read
    qs, ks, vs, full_k, full_v, queries, slots = [], [], [], [], [], [], []
    for r, (ctx, qlen) in enumerate(shapes):
        mine = [ids.pop() for _ in range(blocks_per_req[r])]
        block_table[r, : len(mine)] = torch.tensor(mine, dtype=torch.int32)
        seq = ctx + qlen
        k = torch.randn(seq, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        v = torch.randn(seq, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        q = torch.randn(qlen, HEADS, HEAD_SIZE, generator=gen).to(dtype)
        pos = torch.arange(seq)
        seq_slots = torch.tensor(mine)[pos // block_size] * block_size + pos % block_size
        kv_cache[0].view(-1, KV_HEADS, HEAD_SIZE)[seq_slots[:ctx]] = k[:ctx]
        kv_cache[1].view(-1, KV_HEADS, HEAD_SIZE)[seq_slots[:ctx]] = v[:ctx]
        slots.append(seq_slots[ctx:])
        qs.append(q), ks.append(k[ctx:]), vs.append(v[ctx:])
        full_k.append(k), full_v.append(v), queries.append(q)
    qlens = torch.tensor([q for _, q in shapes])
    qsl = torch.zeros(len(shapes) + 1, dtype=torch.int32)
    qsl[1:] = qlens.cumsum(0)
    seq_lens = torch.tensor([c + q for c, q in shapes], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_table=block_table,
        slot_mapping=torch.cat(slots).to(torch.int64),
        num_reqs=len(shapes),
        num_actual_tokens=int(qlens.sum()),
        max_query_len=int(qlens.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        query_start_loc_cpu=qsl.clone(),
        seq_lens_cpu=seq_lens.clone(),
    )
    return Batch(common, kv_cache, torch.cat(qs), torch.cat(ks), torch.cat(vs), full_k, full_v, queries, [c for c, _ in shapes])


def dense_reference(
    batch: Batch, scale: float, sliding_window: int | None = None, soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain float64 causal attention, request by request, over the unpaged sequences (logits
    soft-capped to ``soft_cap * tanh(logit / soft_cap)`` when given; with ``sinks [heads]`` each
    head's softmax denominator gains ``exp(sink)``)."""
    outs = []
    rep = HEADS // KV_HEADS
    for q, k, v, ctx in zip(batch.queries, batch.full_k, batch.full_v, batch.context_lens):
        q, k, v = q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
        qpos = ctx + torch.arange(q.shape[0])
        kpos = torch.arange(k.shape[0])
        allowed = kpos[None, :] <= qpos[:, None]
        if sliding_window is not None:
            allowed &= kpos[None, :] > qpos[:, None] - sliding_window
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if soft_cap is not None:
            scores = torch.tanh(scores / soft_cap) * soft_cap
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            exp = (scores - scores.amax(-1, keepdim=True)).exp()
            sink = (sinks.double().view(-1, 1, 1) - scores.amax(-1, keepdim=True)).exp()
            probs = exp / (exp.sum(-1, keepdim=True) + sink)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs)


def run(batch: Batch, sliding_window: int | None = None, output: torch.Tensor | None = None) -> torch.Tensor:
    builder = CpuPagedAttentionBackend.get_builder_cls()(CpuPagedAttentionBackend, torch.device("cpu"))
    md = builder.build(batch.common)
    impl = CpuPagedAttentionBackend.get_impl_cls()(
        HEADS, HEAD_SIZE, 1 / math.sqrt(HEAD_SIZE), KV_HEADS, sliding_window
    )
    return impl.forward(batch.query, batch.key, batch.value, batch.kv_cache, md, output=output)


# decodes, a fresh prefill, a chunked prefill with cached context, a short multi-token query
MIXED = [(37, 1), (0, 23), (5, 1), (40, 17), (64, 1), (1, 1), (18, 3), (0, 1)]


@pytest.mark.parametrize("block_size", [16, 4])
def test_mixed_batch_matches_dense_float32(block_size: int) -> None:
    batch = make_batch(MIXED, block_size)
    out = run(batch)
    ref = dense_reference(batch, 1 / math.sqrt(HEAD_SIZE))
    assert out.shape == (batch.common.num_actual_tokens, HEADS, HEAD_SIZE)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_mixed_batch_matches_dense_bfloat16() -> None:
    batch = make_batch(MIXED, 16, dtype=torch.bfloat16)
    out = run(batch)
    assert out.dtype == torch.bfloat16
    ref = dense_reference(batch, 1 / math.sqrt(HEAD_SIZE))
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_many_decodes_of_varied_length_match_dense() -> None:
    """Enough decodes that requests are split into several padded groups."""
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(3, 300, (40,), generator=gen).tolist()
    batch = make_batch([(c, 1) for c in lens] + [(0, 70), (0, 70), (12, 9)], 16)
    md = TorchPagedAttentionMetadataBuilder(CpuPagedAttentionBackend, "cpu").build(batch.common)
    assert len(md.groups) >= 3
    assert sorted(torch.cat([g.req_indices for g in md.groups]).tolist()) == list(range(43))
    torch.testing.assert_close(run(batch).double(), dense_reference(batch, 1 / math.sqrt(HEAD_SIZE)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 5, 16, 33])
def test_sliding_window_matches_dense_windowed(window: int) -> None:
    batch = make_batch(MIXED + [(90, 30)], 4)
    out = run(batch, sliding_window=window)
    ref = dense_reference(batch, 1 / math.sqrt(HEAD_SIZE), sliding_window=window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_kv_written_through_slot_mapping() -> None:
    batch = make_batch([(5, 3), (0, 6)], 4)
    cache_before = batch.kv_cache.clone()
    run(batch)
    flat_k = batch.kv_cache[0].view(-1, KV_HEADS, HEAD_SIZE)
    flat_v = batch.kv_cache[1].view(-1, KV_HEADS, HEAD_SIZE)
    slots = batch.common.slot_mapping
    torch.testing.assert_close(flat_k[slots], batch.key, atol=0, rtol=0)
    torch.testing.assert_close(flat_v[slots], batch.value, atol=0, rtol=0)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots] = False
    before = cache_before.view(2, -1, KV_HEADS, HEAD_SIZE)
    assert torch.equal(flat_k[untouched], before[0][untouched])
    assert torch.equal(flat_v[untouched], before[1][untouched])


def test_negative_slots_are_not_written() -> None:
    batch = make_batch([(5, 3), (0, 6)], 4)
    skipped = [1, 6]
    slots = batch.common.slot_mapping.clone()
    target = slots[skipped].clone()
    slots[skipped] = -1
    batch.common.slot_mapping = slots
    cache_before = batch.kv_cache.clone()
    run(batch)
    for cache, before, new in ((batch.kv_cache[0], cache_before[0], batch.key), (batch.kv_cache[1], cache_before[1], batch.value)):
        flat, flat_before = cache.view(-1, KV_HEADS, HEAD_SIZE), before.view(-1, KV_HEADS, HEAD_SIZE)
        assert torch.equal(flat[target], flat_before[target])  # skipped tokens left the cache alone
        kept = slots >= 0
        assert torch.equal(flat[slots[kept]], new[kept])


def test_padding_tokens_beyond_num_actual_tokens_are_zero() -> None:
    batch = make_batch([(9, 1), (0, 4)], 16)
    pad = 3
    batch.query = torch.cat([batch.query, torch.randn(pad, HEADS, HEAD_SIZE)])
    batch.key = torch.cat([batch.key, torch.randn(pad, KV_HEADS, HEAD_SIZE)])
    batch.value = torch.cat([batch.value, torch.randn(pad, KV_HEADS, HEAD_SIZE)])
    output = torch.full((batch.query.shape[0], HEADS, HEAD_SIZE), float("nan"))
    out = run(batch, output=output)
    assert out is output
    assert torch.equal(out[-pad:], torch.zeros(pad, HEADS, HEAD_SIZE))
    torch.testing.assert_close(out[:-pad].double(), dense_reference(batch, 1 / math.sqrt(HEAD_SIZE)), atol=1e-5, rtol=1e-5)


def test_profiling_run_without_metadata_returns_zeros() -> None:
    impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, 0.125, KV_HEADS)
    q = torch.randn(5, HEADS, HEAD_SIZE)
    k = torch.randn(5, KV_HEADS, HEAD_SIZE)
    cache = torch.zeros(CpuPagedAttentionBackend.get_kv_cache_shape(2, 16, KV_HEADS, HEAD_SIZE))
    out = impl.forward(q, k, k, cache, None)
    assert out.shape == (5, HEADS, HEAD_SIZE) and not out.any()
    assert not cache.any()


def test_metadata_is_built_once_for_all_layers() -> None:
    batch = make_batch(MIXED, 16)
    md = TorchPagedAttentionMetadataBuilder(CpuPagedAttentionBackend, "cpu").build(batch.common)
    assert isinstance(md, TorchPagedAttentionMetadata)
    assert md.write_token_index is None and torch.equal(md.write_slots, batch.common.slot_mapping)
    assert md.context_lens.tolist() == [c for c, _ in MIXED]
    impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, 1 / math.sqrt(HEAD_SIZE), KV_HEADS)
    first = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache, md)
    second = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache, md)  # another layer
    assert torch.equal(first, second)


def test_supports_combination() -> None:
    ok = AttentionRequirements(device_type="cpu", dtype="bfloat16", head_size=64, block_size=16, sliding_window=4096)
    assert CpuPagedAttentionBackend.supports_combination(ok) is None
    assert CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cpu", "float32", 80, 1)) is None
    wrong_device = CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cuda", "float32", 64, 16))
    assert isinstance(wrong_device, str) and "cuda" in wrong_device
    wrong_dtype = CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cpu", "float16", 64, 16))
    assert isinstance(wrong_dtype, str) and "float16" in wrong_dtype
    # fp8 pages run on the torch path (tests/plugins/torch_paged/test_fp8_kv.py); e5m2 is refused
    assert CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cpu", "float32", 64, 16, kv_cache_dtype="fp8")) is None
    e5m2 = CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cpu", "float32", 64, 16, kv_cache_dtype="fp8_e5m2"))
    assert isinstance(e5m2, str) and "fp8_e5m2" in e5m2
    assert CpuPagedAttentionBackend.name == "cpu_paged"
    assert CpuPagedAttentionBackend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)


def test_non_causal_attends_the_whole_sequence() -> None:
    batch = make_batch([(7, 5), (0, 9), (30, 1)], 4)
    batch.common.causal = False
    out = run(batch)
    rep = HEADS // KV_HEADS
    refs = []
    for q, k, v in zip(batch.queries, batch.full_k, batch.full_v):
        k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(HEAD_SIZE)
        refs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    torch.testing.assert_close(out.double(), torch.cat(refs), atol=1e-5, rtol=1e-5)


def test_non_contiguous_cache_view_and_inference_mode() -> None:
    batch = make_batch(MIXED, 16)
    ref = dense_reference(batch, 1 / math.sqrt(HEAD_SIZE))
    # the same pages inside a larger buffer: the per-layer view is not contiguous
    big = torch.zeros(2, batch.kv_cache.shape[1] + 3, *batch.kv_cache.shape[2:])
    big[:, : batch.kv_cache.shape[1]] = batch.kv_cache
    batch.kv_cache = big[:, : batch.kv_cache.shape[1]]
    assert not batch.kv_cache.is_contiguous()
    with torch.inference_mode():
        out = run(batch)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 7])
def test_compiled_decode_kernel_and_torch_path_both_match_dense(window) -> None:
    """Decode rows go through the compiled kernel when it builds; the torch path stays correct
    (it is the fallback) and both match the dense reference."""
    from host.plugins.builtin_cpu.kernels import paged_decode_kernel

    kernel = paged_decode_kernel()
    assert kernel is not None, "the C++ decode kernel should build on this machine"
    gen = torch.Generator().manual_seed(5)
    lens = torch.randint(1, 200, (24,), generator=gen).tolist()
    batch = make_batch([(c, 1) for c in lens] + [(10, 5)], 16)
    ref = dense_reference(batch, 1 / math.sqrt(HEAD_SIZE), sliding_window=window)
    md = TorchPagedAttentionMetadataBuilder(CpuPagedAttentionBackend, "cpu").build(batch.common)
    impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, 1 / math.sqrt(HEAD_SIZE), KV_HEADS, window)
    calls = []
    impl._decode_kernel = lambda *a: calls.append(1) or kernel(*a)
    cache = batch.kv_cache.clone()
    out_kernel = impl.forward(batch.query, batch.key, batch.value, cache, md)
    assert calls, "decode groups must use the compiled kernel"
    torch.testing.assert_close(out_kernel.double(), ref, atol=1e-5, rtol=1e-5)
    impl._decode_kernel = None
    out_torch = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), md)
    torch.testing.assert_close(out_torch.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 300])
def test_compiled_decode_kernel_splits_long_sequences(window) -> None:
    """Batch-1 style decode (few request x KV-head pairs) splits long sequences into spans
    computed in parallel and merged; the result must still be the dense attention."""
    from host.plugins.builtin_cpu.kernels import paged_decode_kernel

    kernel = paged_decode_kernel()
    assert kernel is not None
    batch = make_batch([(700, 1)], 16)
    ref = dense_reference(batch, 1 / math.sqrt(HEAD_SIZE), sliding_window=window)
    md = TorchPagedAttentionMetadataBuilder(CpuPagedAttentionBackend, "cpu").build(batch.common)
    impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, 1 / math.sqrt(HEAD_SIZE), KV_HEADS, window)
    impl._decode_kernel = kernel
    out = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), md)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_size", [36, 40, 80, 128])
@pytest.mark.parametrize("heads", [6, 10])
def test_compiled_decode_kernel_head_sizes(head_size, heads) -> None:
    """Head sizes in 8s take the register-blocked loops (values in 32-column chunks, then 8-column
    ones: 40 and 80 need both; query heads in groups of 4 for the scores and of 2 for the values:
    a KV group of 3 or 5 heads leaves a partial group), others (36) the general loops; all equal
    softmax(q k^T) v."""
    from host.plugins.builtin_cpu.kernels import cpu_kernels

    k = cpu_kernels()
    assert k is not None
    gen = torch.Generator().manual_seed(head_size)
    reqs, kv_heads, bs, length = 3, 2, 16, 130  # 130 positions: value tiles of 48, the last partial
    per = -(-length // bs)
    blocks = reqs * per + 1
    kc, vc = torch.randn(blocks, bs, kv_heads, head_size, generator=gen), torch.randn(blocks, bs, kv_heads, head_size, generator=gen)
    table = torch.randperm(blocks - 1, generator=gen)[: reqs * per].add(1).view(reqs, per).to(torch.int32)
    lens = torch.tensor([length, 17, 1], dtype=torch.int32)
    q = torch.randn(reqs, heads, head_size, generator=gen)
    out = k.paged_decode(q, kc, vc, table, lens, 0.1, 0, 0.0, None)
    for r in range(reqs):
        n = int(lens[r])
        keys = kc[table[r].long()].reshape(-1, kv_heads, head_size)[:n].double()
        vals = vc[table[r].long()].reshape(-1, kv_heads, head_size)[:n].double()
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            p = torch.softmax(keys[:, kvh] @ q[r, h].double() * 0.1, dim=0)
            torch.testing.assert_close(out[r, h].double(), p @ vals[:, kvh], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 7])
def test_logit_soft_capping_in_the_compiled_kernel_and_the_torch_path(window) -> None:
    """``logits_soft_cap`` (Gemma 2): decode rows through the compiled kernel, prefills, chunks
    and a fresh equal-length prompt pair (the ``is_causal`` group) through torch; all equal the
    dense soft-capped reference, which differs visibly from the uncapped one at this cap."""
    from host.plugins.builtin_cpu.kernels import paged_decode_kernel

    kernel = paged_decode_kernel()
    assert kernel is not None
    cap, scale = 0.5, 1 / math.sqrt(HEAD_SIZE)
    for layout in (MIXED, [(0, 9), (0, 9)]):
        batch = make_batch(layout, 4)
        ref = dense_reference(batch, scale, sliding_window=window, soft_cap=cap)
        assert (ref - dense_reference(batch, scale, sliding_window=window)).abs().max() > 1e-2
        md = TorchPagedAttentionMetadataBuilder(CpuPagedAttentionBackend, "cpu").build(batch.common)
        impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, scale, KV_HEADS, window, logits_soft_cap=cap)
        calls = []
        impl._decode_kernel = lambda *a: calls.append(a[7]) or kernel(*a)
        out = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), md)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        assert calls == ([cap] if layout is MIXED else []), "decode rows go through the kernel, with the cap"
        impl._decode_kernel = None
        out_torch = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), md)
        torch.testing.assert_close(out_torch.double(), ref, atol=1e-5, rtol=1e-5)


def test_backends_that_cannot_soft_cap_refuse_it() -> None:
    """The capability is declared (selection skips a backend without it) and an impl without it
    refuses the layer at construction, naming the fix."""
    from host.plugins.triton_ops.attention import TritonPagedAttentionBackend, TritonPagedAttentionImpl

    req = AttentionRequirements("cpu", "float32", 64, 16, logits_soft_cap=50.0)
    assert CpuPagedAttentionBackend.supports_combination(req) is None
    gpu = AttentionRequirements("cuda", "bfloat16", 64, 16, logits_soft_cap=50.0)
    assert "soft-capping is not supported" in TritonPagedAttentionBackend.supports_combination(gpu)
    with pytest.raises(ValueError, match="cannot soft-cap attention logits.*torch_paged"):
        TritonPagedAttentionImpl(8, 64, 0.125, 2, None, logits_soft_cap=50.0)
    with pytest.raises(ValueError, match="logits_soft_cap=-1.0 must be a positive number"):
        CpuPagedAttentionBackend.get_impl_cls()(8, 64, 0.125, 2, None, logits_soft_cap=-1.0)


@pytest.mark.parametrize("window", [None, 7])
def test_attention_sinks_in_the_compiled_kernel_and_the_torch_path(window) -> None:
    """Attention sinks (gpt-oss): decode rows through the compiled kernel (split into spans when
    the batch is small), folded decode-like groups, long prefills, chunks and a fresh
    equal-length prompt pair (the ``is_causal`` group) through torch; all equal the dense
    reference with the sinks in the denominator, which differs visibly from the one without."""
    from host.plugins.builtin_cpu.kernels import paged_decode_kernel

    kernel = paged_decode_kernel()
    assert kernel is not None
    scale = 1 / math.sqrt(HEAD_SIZE)
    sinks = torch.linspace(-2.0, 3.0, HEADS)
    for layout in (MIXED, [(0, 9), (0, 9)], [(300, 1)]):
        batch = make_batch(layout, 4)
        ref = dense_reference(batch, scale, sliding_window=window, sinks=sinks)
        assert (ref - dense_reference(batch, scale, sliding_window=window)).abs().max() > 1e-2
        md = TorchPagedAttentionMetadataBuilder(CpuPagedAttentionBackend, "cpu").build(batch.common)
        impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, scale, KV_HEADS, window, sinks=sinks)
        calls = []
        impl._decode_kernel = lambda *a: calls.append(a[8]) or kernel(*a)
        out = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), md)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        assert len(calls) == (0 if layout[0] == (0, 9) else 1), "decode rows go through the kernel"
        assert all(c is not None and torch.equal(c, sinks) for c in calls), "with the sinks"
        impl._decode_kernel = None
        out_torch = impl.forward(batch.query, batch.key, batch.value, batch.kv_cache.clone(), md)
        torch.testing.assert_close(out_torch.double(), ref, atol=1e-5, rtol=1e-5)


def test_backends_without_sinks_refuse_them() -> None:
    """The capability is declared (selection skips a backend without it) and an impl without it
    refuses the layer at construction, naming the fix; a sinks tensor of the wrong size is refused."""
    from host.plugins.triton_ops.attention import TritonPagedAttentionBackend, TritonPagedAttentionImpl

    assert CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cpu", "float32", 64, 16, sinks=True)) is None
    gpu = AttentionRequirements("cuda", "bfloat16", 64, 16, sinks=True)
    assert "attention sinks are not supported" in TritonPagedAttentionBackend.supports_combination(gpu)
    with pytest.raises(ValueError, match="cannot add attention sinks.*torch_paged"):
        TritonPagedAttentionImpl(8, 64, 0.125, 2, None, sinks=torch.zeros(8))
    with pytest.raises(ValueError, match=r"one sink logit per query head, \(8,\)"):
        CpuPagedAttentionBackend.get_impl_cls()(8, 64, 0.125, 2, None, sinks=torch.zeros(4))
