"""Micro-benchmark: the same-host shared-memory all-reduce against gloo's, on 2 spawned ranks
(prints a table, writes bench/results/allreduce.json, asserts only that both sums agree).

    .venv/bin/python bench/allreduce.py [--ranks 2] [--threads 1] [--out bench/results/allreduce.json]

Sizes run from one decode row of SmolLM2-135M (576 fp32 values, 2.3 KB) to 8 MiB (the default
``HOST_SHM_ALLREDUCE_MAX_BYTES``). Each figure is the best of 5 rounds of the mean time per call
(µs), measured on group ordinal 0 with the ranks started together after a barrier, with the CPU
time that rank spent per call (waiting included: spinning burns it, gloo's socket waits do not).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import time
from types import SimpleNamespace

import torch

SIZES = [  # (label, numel, dtype)
    ("1 decode row fp32 (576)", 576, torch.float32),
    ("1 decode row bf16 (576)", 576, torch.bfloat16),
    ("8 rows fp32 (4608)", 8 * 576, torch.float32),
    ("64 KiB fp32", 16384, torch.float32),
    ("256 rows fp32 (147456)", 256 * 576, torch.float32),
    ("1 MiB fp32", 1 << 18, torch.float32),
    ("8 MiB fp32", 1 << 21, torch.float32),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _per_call_us(fn, iters: int, barrier) -> tuple[float, float]:
    """(wall µs per call, this process's CPU µs per call) of the fastest of 5 rounds."""
    for _ in range(max(3, iters // 10)):
        fn()
    best = (float("inf"), 0.0)
    for _ in range(5):
        barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            fn()
        wall = (time.perf_counter() - start) / iters * 1e6
        best = min(best, (wall, (time.process_time() - cpu) / iters * 1e6))
    return best


def _rank_main(rank: int, ranks: int, threads: int, init: str, out) -> None:
    torch.set_num_threads(threads)
    import torch.distributed as dist

    from host.core.distributed import parallel_state as ps

    ps.init_distributed(SimpleNamespace(tensor_parallel_size=ranks, pipeline_parallel_size=1, distributed_init_method=init), rank, rank)
    tp = ps.get_tp_group()
    shm = tp.fast_all_reduce
    assert shm is not None, "the shared-memory all-reduce is off (HOST_SHM_ALLREDUCE=0?)"
    rows = []
    for label, numel, dtype in SIZES:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(dtype)
        a, b = shm(x.clone()), x.clone()
        dist.all_reduce(b, group=tp.device_group)
        agree = torch.allclose(a.float(), b.float(), rtol=1e-2 if dtype != torch.float32 else 1e-6, atol=1e-2)
        iters = 2000 if numel <= 20000 else 200 if numel <= 300000 else 30
        buf = x.clone()
        shm_us, shm_cpu = _per_call_us(lambda: shm(buf), iters, tp.barrier)
        gloo_us, gloo_cpu = _per_call_us(lambda: dist.all_reduce(buf, group=tp.device_group), iters, tp.barrier)
        rows.append({"size": label, "bytes": numel * x.element_size(), "dtype": str(dtype).replace("torch.", ""),
                     "shm_us": round(shm_us, 1), "gloo_us": round(gloo_us, 1), "gloo_over_shm": round(gloo_us / shm_us, 2),
                     "shm_cpu_us": round(shm_cpu, 1), "gloo_cpu_us": round(gloo_cpu, 1), "sums_agree": agree})
    ps.destroy_distributed()
    out.put((rank, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "allreduce.json"))
    args = parser.parse_args()
    load = os.getloadavg()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, args.ranks, args.threads, init, q)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    try:
        results = dict(q.get(timeout=900) for _ in procs)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    rows = results[0]
    print(f"{'size':<26}{'bytes':>10}{'shm µs':>10}{'gloo µs':>10}{'gloo/shm':>10}{'shm cpu µs':>12}{'gloo cpu µs':>12}")
    for r in rows:
        print(f"{r['size']:<26}{r['bytes']:>10}{r['shm_us']:>10.1f}{r['gloo_us']:>10.1f}{r['gloo_over_shm']:>10.2f}"
              f"{r['shm_cpu_us']:>12.1f}{r['gloo_cpu_us']:>12.1f}")
    assert all(r["sums_agree"] for r in rows), rows
    record = {
        "what": "per-call latency (and rank 0's CPU time per call) of one all-reduce over the ranks of one host: shared memory vs gloo (best of 5 rounds, group ordinal 0)",
        "machine": {"cpu": _cpu_model(), "arch": platform.machine(), "cores": os.cpu_count(),
                    "load_average_at_start": [round(x, 2) for x in load], "torch": torch.__version__},
        "ranks": args.ranks, "threads_per_rank": args.threads, "rows": rows,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"load average at start {load[0]:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
