"""Speed of the compiled CPU quantized-linear kernels against float32 ``F.linear``.

For each GGUF format (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) and int8, on SmolLM2-135M's projection
shapes (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536, the tied LM head 49152x576;
K-quant formats only where K is a multiple of 256, so on 1536/2048-wide inputs instead), prints
and saves:

- at M = 1 (batch-1 decode): microseconds per call and GB/s of quantized weight bytes read,
  next to ``torch.nn.functional.linear`` on the dequantized float32 weight (its fp32 bytes) and
  the compiled float32 ``linear_small_m`` on the blocked copy;
- at M = 64 (prefill / big batches): GFLOP/s (2 M N K per call) of the kernel and of ``F.linear``.

The weights are quantized with ``gguf.quants.quantize`` (random valid blocks for Q4_K/Q6_K, which
the package cannot quantize). Results go to ``bench/results/quant_kernels_cpu.json``.

    python bench/quant_kernels_cpu.py [--threads N] [--reps 30]

Note the weights of one layer fit in the L3 cache, so the M = 1 figures are the kernels' compute
rate over cached weights; a whole model (about 85 MB in Q4_1) streams from memory instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parent / "results"

SHAPES_32 = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
SHAPES_256 = {"gate_up_k1536": (3072, 1536), "down_k2048": (1536, 2048), "wide_k4096": (4096, 4096)}


def _time(fn, reps: int) -> float:
    """Seconds per call: the fastest of ``reps`` trials of 3 calls each (after two warm-up calls).
    The minimum rather than the median, so other processes on a shared machine (preemption, a
    descheduled OpenMP thread) show as little as possible."""
    fn()
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(3):
            fn()
        best = min(best, (time.perf_counter() - t) / 3)
    return best


def _blocks(qtype, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K):
        raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
        d = rng.uniform(1e-5, 1e-4, size=(n, k // block)).astype(np.float16).view(np.uint8).reshape(n, -1, 2)
        if qtype == gguf.GGMLQuantizationType.Q4_K:
            raw[..., 0:2] = d
            raw[..., 2:4] = d
        else:
            raw[..., 208:210] = d
        return raw.reshape(n, -1)
    return gguf.quants.quantize((rng.standard_normal((n, k)) * 0.02).astype(np.float32), qtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import gguf

    from host.plugins.builtin_cpu.kernels import block_weight, cpu_kernels

    k = cpu_kernels()
    if k is None:
        raise SystemExit("the compiled CPU kernels did not build here (see the warning above)")
    rng = np.random.default_rng(0)
    QT = gguf.GGMLQuantizationType
    rows = []
    cases = [(q, name, shape) for q in (QT.Q4_0, QT.Q4_1, QT.Q8_0) for name, shape in SHAPES_32.items()]
    cases += [(q, name, shape) for q in (QT.Q4_K, QT.Q6_K) for name, shape in SHAPES_256.items()]
    cases += [("int8", name, shape) for name, shape in SHAPES_32.items()]
    for qtype, name, (n, kdim) in cases:
        if qtype == "int8":
            qweight = torch.randint(-127, 128, (n, kdim), dtype=torch.int8)
            scales = torch.rand(n) * 1e-3
            weight = qweight.float() * scales[:, None]
            run = lambda x: k.int8_linear(x, qweight, scales, None)  # noqa: E731
            qbytes, fmt = qweight.numel() + 4 * n, "int8"
        else:
            blocks = _blocks(qtype, n, kdim, rng)
            qweight = torch.from_numpy(blocks)
            weight = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).reshape(n, kdim).astype(np.float32))
            run = lambda x, qw=qweight, qt=int(qtype): k.gguf_linear(x, qw, qt, None)  # noqa: E731
            qbytes, fmt = qweight.numel(), qtype.name
        blocked = block_weight(weight)
        x1, x64 = torch.randn(1, kdim), torch.randn(64, kdim)
        t1 = _time(lambda: run(x1), args.reps)
        t1_ref = _time(lambda: F.linear(x1, weight), args.reps)
        t1_small = _time(lambda: k.linear_small_m(x1, blocked, None), args.reps)
        t64 = _time(lambda: run(x64), max(5, args.reps // 3))
        t64_ref = _time(lambda: F.linear(x64, weight), max(5, args.reps // 3))
        flop = 2 * 64 * n * kdim
        row = {
            "format": fmt, "layer": name, "N": n, "K": kdim,
            "m1_us": t1 * 1e6, "m1_GBps": qbytes / t1 / 1e9,
            "m1_fp32_F_linear_us": t1_ref * 1e6, "m1_fp32_F_linear_GBps": 4 * n * kdim / t1_ref / 1e9,
            "m1_fp32_linear_small_m_us": t1_small * 1e6,
            "m64_GFLOPs": flop / t64 / 1e9, "m64_fp32_F_linear_GFLOPs": flop / t64_ref / 1e9,
        }
        rows.append(row)
        print(
            f"{fmt:5} {name:14} {n:6}x{kdim:<5} M=1 {row['m1_us']:8.1f} us {row['m1_GBps']:5.1f} GB/s"
            f" (fp32 F.linear {row['m1_fp32_F_linear_us']:8.1f} us, linear_small_m {row['m1_fp32_linear_small_m_us']:8.1f} us)"
            f"  M=64 {row['m64_GFLOPs']:6.1f} GFLOP/s (F.linear {row['m64_fp32_F_linear_GFLOPs']:6.1f})",
            flush=True,
        )
    # one decode step's linears of SmolLM2-135M in Q4_1 (30 layers) + the Q8_0 LM head, at M = 1
    per_layer = sum(r["m1_us"] for r in rows if r["format"] == "Q4_1" and r["layer"] in ("qkv", "o", "gate_up", "down"))
    head = next(r["m1_us"] for r in rows if r["format"] == "Q8_0" and r["layer"] == "lm_head")
    step_ms = (30 * per_layer + head) / 1e3
    summary = {"smollm2_q4_1_linears_ms_per_token": step_ms, "linear_bound_tok_s": 1e3 / step_ms}
    print(f"SmolLM2-135M Q4_1 linears per decode token: {step_ms:.2f} ms (at most {1e3 / step_ms:.0f} tok/s)")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "isa": k.kernels_isa(), "threads": args.threads, "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "summary": summary, "rows": rows,
    }
    (RESULTS / "quant_kernels_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"saved {RESULTS / 'quant_kernels_cpu.json'}")


if __name__ == "__main__":
    main()
