"""Micro-benchmark of the CPU paged-attention backend (prints, asserts nothing).

    .venv/bin/python bench/attention_cpu.py [--threads N]

Shapes are SmolLM2-135M's (9 heads, 3 KV heads, head size 64, block size 16). Reported times
are per layer call (``impl.forward``: KV write + attention); the metadata build is per step.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend
from host.sdk.attention import CommonAttentionMetadata

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 9, 3, 64, 16


def make_step(shapes: list[tuple[int, int]], dtype: torch.dtype) -> tuple[CommonAttentionMetadata, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``shapes``: ``[(context_len, query_len), ...]`` -> common metadata, query, key, cache."""
    blocks = [math.ceil((c + q) / BLOCK) for c, q in shapes]
    num_blocks = sum(blocks) + 64
    ids = torch.randperm(num_blocks)
    table = torch.zeros(len(shapes), max(blocks), dtype=torch.int32)
    slots, at = [], 0
    for r, (c, q) in enumerate(shapes):
        mine = ids[at : at + blocks[r]]
        at += blocks[r]
        table[r, : blocks[r]] = mine.to(torch.int32)
        pos = torch.arange(c, c + q)
        slots.append(mine[pos // BLOCK] * BLOCK + pos % BLOCK)
    qlens = torch.tensor([q for _, q in shapes])
    qsl = torch.zeros(len(shapes) + 1, dtype=torch.int32)
    qsl[1:] = qlens.cumsum(0)
    seq = torch.tensor([c + q for c, q in shapes], dtype=torch.int32)
    n = int(qlens.sum())
    common = CommonAttentionMetadata(
        query_start_loc=qsl, seq_lens=seq, block_table=table, slot_mapping=torch.cat(slots),
        num_reqs=len(shapes), num_actual_tokens=n, max_query_len=int(qlens.max()),
        max_seq_len=int(seq.max()), block_size=BLOCK, query_start_loc_cpu=qsl, seq_lens_cpu=seq,
    )
    cache = torch.randn(CpuPagedAttentionBackend.get_kv_cache_shape(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE)).to(dtype)
    return common, torch.randn(n, HEADS, HEAD_SIZE).to(dtype), torch.randn(n, KV_HEADS, HEAD_SIZE).to(dtype), cache


def best_ms(fn, iters: int, repeats: int = 5) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters * 1e3)
    return best


def bench(label: str, shapes: list[tuple[int, int]], dtype: torch.dtype, iters: int) -> None:
    common, q, k, cache = make_step(shapes, dtype)
    builder = CpuPagedAttentionBackend.get_builder_cls()(CpuPagedAttentionBackend, "cpu")
    impl = CpuPagedAttentionBackend.get_impl_cls()(HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, KV_HEADS)
    with torch.inference_mode():
        md = builder.build(common)
        build_ms = best_ms(lambda: builder.build(common), iters)
        layer_ms = best_ms(lambda: impl.forward(q, k, k, cache, md), iters)
    kv_tokens = sum(c + qq for c, qq in shapes)
    print(
        f"{label:<44} {str(dtype).replace('torch.', ''):<9} groups={len(md.groups):<2} "
        f"build={build_ms:6.3f} ms/step  forward={layer_ms:7.3f} ms/layer  "
        f"({kv_tokens / layer_ms / 1e3:5.2f} M kv-tok/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    gen = torch.Generator().manual_seed(0)
    varied = torch.randint(100, 401, (64,), generator=gen).tolist()
    for dtype in (torch.float32, torch.bfloat16):
        bench("decode 64 x ctx 256", [(256, 1)] * 64, dtype, 20)
        bench("decode 64 x ctx 100..400", [(c, 1) for c in varied], dtype, 20)
        bench("decode 8 x ctx 256", [(256, 1)] * 8, dtype, 50)
        bench("decode 1 x ctx 256", [(256, 1)], dtype, 200)
        bench("prefill 1 x 512", [(0, 512)], dtype, 5)
        bench("mixed 60 decodes + chunk 256 (ctx 512)", [(c, 1) for c in varied[:60]] + [(512, 256)], dtype, 10)


if __name__ == "__main__":
    main()
