"""How many concurrent 8k-token sequences a fixed KV budget holds, with and without the hybrid
KV cache allocator (docs/hybrid_kv_cache.md). Prints a table and writes
``bench/results/hybrid_kv.json``.

    .venv/bin/python bench/hybrid_kv.py [--budget-gib 1] [--seq-len 8192] [--chunk 2048]

The shape is Gemma-3-270M's KV cache: 18 layers (every 6th full attention: 3 global layers, 15
with a 512-token window), 1 KV head of 256, bfloat16, block size 16. The count goes through the
real classes: the budget is turned into blocks by ``num_blocks_from_memory`` (one block = a page
of every layer, or of ``group_size`` layers in the hybrid layout), then sequences are admitted one
after the other through the KV cache manager — each prefilled in chunks of ``--chunk`` tokens and
then given one decode step — until the manager refuses an allocation. No model runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from host.contracts.request import Request
from host.core.kv_cache.groups import plan_kv_cache_layout
from host.core.kv_cache.manager import make_kv_cache_manager
from host.core.kv_cache.spec import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec, num_blocks_from_memory

LAYERS, KV_HEADS, HEAD_DIM, DTYPE, WINDOW, BLOCK = 18, 1, 256, "bfloat16", 512, 16


def gemma3_270m_specs() -> list:
    return [
        FullAttentionSpec(BLOCK, KV_HEADS, HEAD_DIM, DTYPE) if i % 6 == 5
        else SlidingWindowSpec(BLOCK, KV_HEADS, HEAD_DIM, DTYPE, sliding_window=WINDOW)
        for i in range(LAYERS)
    ]


def fit(budget: int, seq_len: int, chunk: int, hybrid: bool) -> dict:
    """Admit ``seq_len``-token sequences until the manager refuses one; what fitted."""
    specs = gemma3_270m_specs()
    layout = plan_kv_cache_layout(specs, hybrid=hybrid)
    num_blocks = num_blocks_from_memory(budget, specs, layout=layout)
    manager = make_kv_cache_manager(KVCacheConfig(num_blocks, BLOCK, specs, layout=layout), enable_caching=False)
    fitted = 0
    held_per_seq = None
    while True:
        req = Request(f"s{fitted}", [(fitted * 7919 + t) % 50000 for t in range(seq_len)])
        ok = True
        while req.num_computed_tokens < seq_len and ok:
            n = min(chunk, seq_len - req.num_computed_tokens)
            ok = manager.allocate_slots(req, n) is not None
            if ok:
                req.num_computed_tokens += n
        if ok:  # its first decode step (the window has slid past the prompt's old blocks)
            req.append_output_token_ids(1)
            ok = manager.allocate_slots(req, 1) is not None
        if not ok:
            manager.free(req)
            break
        req.num_computed_tokens += 1
        held_per_seq = manager.num_blocks_held(req.request_id)
        fitted += 1
    return {
        "hybrid": hybrid,
        "groups": layout.num_groups,
        "group_size": layout.group_size,
        "block_bytes": layout.page_size_bytes,
        "num_blocks": num_blocks,
        "blocks_per_sequence": held_per_seq,
        "bytes_per_sequence": held_per_seq * layout.page_size_bytes if held_per_seq else None,
        "sequences": fitted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gib", type=float, default=1.0)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "hybrid_kv.json"))
    args = parser.parse_args()
    budget = int(args.budget_gib * 2**30)
    start = time.perf_counter()
    rows = [fit(budget, args.seq_len, args.chunk, hybrid) for hybrid in (False, True)]
    elapsed = time.perf_counter() - start
    print(f"KV budget {args.budget_gib} GiB, Gemma-3-270M shape ({LAYERS} layers, 3 global, window {WINDOW}), "
          f"{args.seq_len}-token sequences, prefill chunks of {args.chunk}")
    print(f"{'allocator':<10} {'groups':>6} {'block KiB':>9} {'blocks':>7} {'blocks/seq':>10} {'MiB/seq':>8} {'sequences':>9}")
    for r in rows:
        print(f"{'hybrid' if r['hybrid'] else 'one group':<10} {r['groups']:>6} {r['block_bytes'] / 1024:>9.0f} {r['num_blocks']:>7} "
              f"{r['blocks_per_sequence']:>10} {r['bytes_per_sequence'] / 2**20:>8.2f} {r['sequences']:>9}")
    single, hybrid = rows
    ratio = hybrid["sequences"] / single["sequences"]
    print(f"hybrid fits {ratio:.2f}x the sequences ({elapsed:.1f} s)")
    result = {
        "bench": "hybrid_kv",
        "shape": {"layers": LAYERS, "global_layers": 3, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": DTYPE,
                  "sliding_window": WINDOW, "block_size": BLOCK},
        "budget_bytes": budget,
        "seq_len": args.seq_len,
        "prefill_chunk": args.chunk,
        "one_group": single,
        "hybrid": hybrid,
        "ratio": round(ratio, 3),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
