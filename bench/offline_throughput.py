"""Offline throughput: host vs Hugging Face transformers on the same model and workload.

Workload (defaults): the default model (SmolLM2-135M-Instruct), 64 prompts of random token ids
with lengths uniform in [32, 256], 128 output tokens each, EOS ignored, greedy. Both engines run
in this one process, one after the other, and the ratio is printed. Also measured: batch-1
decode speed (greedy) against the memory-bandwidth bound of this machine: the weight bytes a
decode step reads, over the read bandwidth measured here (a sum over a 512 MiB tensor; the copy
bandwidth is printed too, but a decode step only reads its weights, and it can beat a bound
derived from copying). A second, sampled run of the same prompts (temperature 0.8, top-p 0.95,
top-k 50) reports the sampler's share of step time on decode steps of the full batch.

    .venv/bin/python bench/offline_throughput.py [--num-prompts 64] [--output-len 128]

Results are written to bench/results/offline_throughput_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import random
import time
from pathlib import Path

import torch


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # avoid the first ids (special tokens on most vocabularies)
    return [[rng.randrange(100, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_host(model: str | None, prompts: list[list[int]], output_len: int, max_num_seqs: int, batched_tokens: int) -> dict:
    from host import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=batched_tokens)
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0][:16]}], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    elapsed = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    # sampled run: same prompts, temperature 0.8 / top-p 0.95 / top-k 50; the sampler's share
    # of step time is measured on decode steps with the whole batch running
    runner = llm.engine.executor.worker.model_runner
    llm.engine.scheduler.reset_prefix_cache()  # same prompts: do not let them hit the cache
    runner.step_timings = []
    sampled_params = SamplingParams(max_tokens=output_len, temperature=0.8, top_p=0.95, top_k=50, seed=0, ignore_eos=True)
    t0 = time.perf_counter()
    souts = llm.generate([{"prompt_token_ids": p} for p in prompts], sampled_params)
    sampled_s = time.perf_counter() - t0
    full = [t for t in runner.step_timings if t.num_reqs == len(prompts) and t.num_tokens == len(prompts)]
    runner.step_timings = None
    sampler_share = sum(t.sampler_s for t in full) / max(sum(t.step_s for t in full), 1e-9)
    sampled = {
        "elapsed_s": sampled_s,
        "output_tok_s": sum(len(o.outputs[0].token_ids) for o in souts) / sampled_s,
        "full_batch_decode_steps": len(full),
        "sampler_share_of_step": sampler_share,
        "sampler_ms_per_step": 1000 * sum(t.sampler_s for t in full) / max(len(full), 1),
    }
    # batch-1 decode: one request, long generation, decode steps only
    single = [{"prompt_token_ids": prompts[0][:32]}]
    llm.generate(single, SamplingParams(max_tokens=1, ignore_eos=True))
    t0 = time.perf_counter()
    one = llm.generate(single, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    single_s = time.perf_counter() - t0
    weight_bytes = llm.engine.executor.worker.model_runner.model_memory_bytes()
    path = llm.config.model.resolved_path
    llm.shutdown()
    return {
        "load_s": load_s,
        "elapsed_s": elapsed,
        "output_tokens": n_out,
        "output_tok_s": n_out / elapsed,
        "batch1_decode_tok_s": len(one[0].outputs[0].token_ids) / single_s,
        "sampled": sampled,
        "weight_bytes": weight_bytes,
        "model_path": path,
        "first_output": outs[0].outputs[0].token_ids[:16],
    }


def run_hf(path: str, prompts: list[list[int]], output_len: int, batch_size: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = 0
    total = 0
    t0 = time.perf_counter()
    first = None
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=output_len, min_new_tokens=output_len,
                do_sample=False, pad_token_id=pad, eos_token_id=None,
            )
        gen = out[:, width:]
        total += gen.numel()
        if first is None:
            first = gen[0, :16].tolist()
    elapsed = time.perf_counter() - t0
    return {"elapsed_s": elapsed, "output_tokens": total, "output_tok_s": total / elapsed, "batch_size": batch_size, "first_output": first}


def measure_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> dict[str, float]:
    """Sustained memory bandwidth in bytes/s: ``read`` sums a large tensor (every byte read
    once), ``copy`` copies it (every byte read and written: 2x the bytes count)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    result = {}
    for name, fn, factor in (("read", lambda: src.sum(), 1), ("copy", lambda: dst.copy_(src), 2)):
        fn()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        result[name] = factor * nbytes / best
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or .gguf (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from host.core.models.default_model import resolve_model_path

    path = resolve_model_path(args.model)
    from host.core.models.loader import load_hf_config

    vocab = load_hf_config(path).vocab_size
    prompts = make_prompts(args.num_prompts, args.min_len, args.max_len, vocab, args.seed)
    ours = run_host(path, prompts, args.output_len, args.max_num_seqs, args.max_num_batched_tokens)
    print(f"host:         {ours['output_tok_s']:8.1f} output tok/s ({ours['output_tokens']} tokens in {ours['elapsed_s']:.1f} s)")
    peer = run_hf(path, prompts, args.output_len, args.hf_batch_size)
    print(f"transformers: {peer['output_tok_s']:8.1f} output tok/s ({peer['output_tokens']} tokens in {peer['elapsed_s']:.1f} s, batch {args.hf_batch_size})")
    sm = ours["sampled"]
    print(
        f"host sampled:  {sm['output_tok_s']:8.1f} output tok/s (temperature 0.8, top-p 0.95, top-k 50); "
        f"sampler {100 * sm['sampler_share_of_step']:.1f}% of step time at batch {args.num_prompts} "
        f"({sm['sampler_ms_per_step']:.1f} ms/step over {sm['full_batch_decode_steps']} steps; target < 10%)"
    )
    ratio = ours["output_tok_s"] / peer["output_tok_s"]
    print(f"ratio host / transformers: {ratio:.2f}x (target >= 3x)")
    bws = measure_bandwidth()
    bw = bws["read"]
    bound = bw / ours["weight_bytes"]
    b1 = ours["batch1_decode_tok_s"]
    print(
        f"batch-1 decode: {b1:.1f} tok/s; memory-bandwidth bound {bound:.1f} tok/s "
        f"({bw / 1e9:.1f} GB/s read bandwidth over {ours['weight_bytes'] / 1e6:.0f} MB of weights; "
        f"copy bandwidth {bws['copy'] / 1e9:.1f} GB/s); bound / ours = {bound / b1:.2f}x (target <= 1.5x)"
    )
    result = {
        "benchmark": "offline_throughput",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpu_count": os.cpu_count(), "processor": pyplatform.processor() or pyplatform.machine(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "workload": vars(args) | {"model_path": path},
        "host": ours,
        "transformers": peer,
        "ratio": ratio,
        "same_first_tokens": ours["first_output"] == peer["first_output"],
        "batch1": {"host_tok_s": b1, "bandwidth_bytes_s": bw, "copy_bandwidth_bytes_s": bws["copy"], "bound_tok_s": bound, "bound_over_ours": bound / b1},
    }
    out = Path(args.out or Path(__file__).parent / "results" / f"offline_throughput_{'cuda' if torch.cuda.is_available() else 'cpu'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
