"""``torch_paged``: the device-neutral paged attention in plain torch, behind an entry point of
its own (so blocking a platform's kernels keeps the fallback the platforms list after them)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from host.core.plugins.settings import PluginSettings
from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend
from host.plugins.torch_paged.attention import TorchPagedAttentionBackend, TorchPagedAttentionImpl
from host.sdk.attention import AttentionRequirements, CommonAttentionMetadata
from host.sdk.testing import isolated_plugin_host

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 16, 4


@pytest.mark.parametrize("blocked", [(), ("triton_paged",), ("triton_paged", "triton_rocm", "cpu_paged")])
def test_blocking_the_kernels_keeps_torch_paged(blocked):
    with isolated_plugin_host(PluginSettings(block=blocked)) as host:
        backends = host.registry("attention_backends")
        assert backends["torch_paged"] is TorchPagedAttentionBackend
        assert not set(blocked) & set(backends)
    with isolated_plugin_host(PluginSettings(block=("torch_paged",))) as host:
        assert "torch_paged" not in host.registry("attention_backends")
        assert {"cpu_paged", "triton_paged", "triton_rocm"} <= set(host.registry("attention_backends"))


def test_plugins_list_shows_each_backend_under_its_own_entry_point(builtin_plugins_listing):
    listing = builtin_plugins_listing  # ``host plugins list --json``, run once for the session
    assert listing.returncode == 0, listing.stderr
    rows = {r["name"]: r for r in json.loads(listing.stdout)["plugins"] if r["group"] == "host.attention_backends"}
    for name in ("cpu_paged", "torch_paged", "triton_paged", "triton_rocm"):
        assert rows[name]["status"] == "loaded" and rows[name]["source"] == "builtin"
        assert rows[name]["registered"] == [f"attention_backends:{name}"]


def test_flags_any_device_and_the_gpu_dtypes():
    for device in ("cuda", "cpu"):
        for dtype in ("float32", "bfloat16", "float16"):
            req = AttentionRequirements(device, dtype, head_size=80, block_size=3, sliding_window=64)
            assert TorchPagedAttentionBackend.supports_combination(req) is None
    for fp8 in ("fp8", "fp8_e4m3"):  # float8_e4m3fn pages, converted by torch on any device
        assert TorchPagedAttentionBackend.supports_combination(AttentionRequirements("cuda", "bfloat16", 64, 16, kv_cache_dtype=fp8)) is None
    assert "kv cache dtype" in TorchPagedAttentionBackend.supports_combination(
        AttentionRequirements("cuda", "bfloat16", 64, 16, kv_cache_dtype="fp8_e5m2")
    )
    assert not TorchPagedAttentionBackend.supports_cuda_graphs
    # cpu_paged is this algorithm plus the compiled decode kernel, under the CPU's flags
    assert issubclass(CpuPagedAttentionBackend, TorchPagedAttentionBackend)
    assert CpuPagedAttentionBackend.get_builder_cls() is TorchPagedAttentionBackend.get_builder_cls()
    assert "device type" in CpuPagedAttentionBackend.supports_combination(AttentionRequirements("cuda", "float32", 64, 16))


def paged_batch(context_and_query: list[tuple[int, int]], gen: torch.Generator):
    """Random K/V for each request's whole sequence: the context already in shuffled cache
    pages, the new tokens' K/V and queries returned for ``forward`` (which writes them)."""
    blocks = [math.ceil((c + q) / BLOCK) for c, q in context_and_query]
    num_blocks = sum(blocks) + 3
    pages = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.randn(TorchPagedAttentionBackend.get_kv_cache_shape(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE), generator=gen)
    table = torch.zeros(len(blocks), max(blocks), dtype=torch.int32)
    seqs, new, slots = [], [], []
    for r, ((ctx, qlen), n) in enumerate(zip(context_and_query, blocks)):
        table[r, :n] = torch.tensor([pages.pop() for _ in range(n)], dtype=torch.int32)
        k, v = (torch.randn(ctx + qlen, KV_HEADS, HEAD_SIZE, generator=gen) for _ in range(2))
        q = torch.randn(qlen, HEADS, HEAD_SIZE, generator=gen)
        pos = torch.arange(ctx + qlen)
        slot = table[r, pos // BLOCK].long() * BLOCK + pos % BLOCK
        cache[0].view(-1, KV_HEADS, HEAD_SIZE)[slot[:ctx]] = k[:ctx]
        cache[1].view(-1, KV_HEADS, HEAD_SIZE)[slot[:ctx]] = v[:ctx]
        seqs.append((q, k, v, ctx))
        new.append((q, k[ctx:], v[ctx:]))
        slots.append(slot[ctx:])
    qlens = torch.tensor([q for _, q in context_and_query])
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), qlens.cumsum(0))).to(torch.int32)
    seq_lens = torch.tensor([c + q for c, q in context_and_query], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, seq_lens=seq_lens, block_table=table, slot_mapping=torch.cat(slots),
        num_reqs=len(blocks), num_actual_tokens=int(qlens.sum()), max_query_len=int(qlens.max()),
        max_seq_len=int(seq_lens.max()), block_size=BLOCK,
    )
    query, key, value = (torch.cat(parts) for parts in zip(*new))
    return common, cache, query, key, value, seqs


def dense(seqs, scale: float) -> torch.Tensor:
    outs = []
    for q, k, v, ctx in seqs:
        mask = torch.arange(k.shape[0])[None, :] <= (ctx + torch.arange(q.shape[0]))[:, None]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).double(), k.transpose(0, 1).double().repeat_interleave(HEADS // KV_HEADS, 0),
            v.transpose(0, 1).double().repeat_interleave(HEADS // KV_HEADS, 0), attn_mask=mask, scale=scale,
        )
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def test_mixed_batch_in_plain_torch_matches_dense_attention():
    """Decodes, a fresh prompt and a chunk after cached context, without any compiled kernel."""
    gen = torch.Generator().manual_seed(3)
    common, cache, query, key, value, seqs = paged_batch([(9, 1), (0, 7), (13, 1), (5, 4), (2, 1)], gen)
    scale = 1 / math.sqrt(HEAD_SIZE)
    impl = TorchPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, scale, KV_HEADS)
    assert type(impl) is TorchPagedAttentionImpl
    md = TorchPagedAttentionBackend.get_builder_cls()(TorchPagedAttentionBackend, torch.device("cpu")).build(common)
    out = impl.forward(query, key, value, cache, md)
    torch.testing.assert_close(out.double(), dense(seqs, scale), atol=1e-5, rtol=1e-5)
