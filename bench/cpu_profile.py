"""Where a CPU engine step spends its time (issue 37, deliverable 1): a 64-sequence decode step
and a 2,048-token prefill step of host's engine, for each configuration named (default: the
default model kept quantized, ``gguf``, and the same weights in ``bf16`` and ``fp32``).

Each configuration runs in its own child process: an in-process ``LLM`` (the engine core in the
same process, so torch's profiler sees the whole step), 64 requests of 128 random prompt tokens
prefilled first, then ``--steps`` decode steps profiled; then one fresh 2,048-token prompt
prefilled in one step (``max_num_batched_tokens`` 2,048), profiled. The step's wall time is
split into:

- ``linears``: the matmul ops (``gguf_linear``, ``linear_small_m``, ``int8_linear``, aten's and
  oneDNN's linear/mm/addmm), the logits head included;
- ``attention``: everything under the model's attention layers (the paged attention kernels,
  which are C++ calls rather than torch ops, and the KV-cache writes);
- ``other ops``: every other torch op inside the model's forward (norms, rotary, SiLU, copies);
- ``sampler``: everything under the sampler call;
- ``python``: the step's wall time minus all op time: the scheduler, the runner's input
  preparation, the output handling, dispatch and Python itself.

Ops are timed by their self CPU time (a parent op does not count its children twice).
``--out`` writes the JSON; the printed table is what docs/performance.md records.

    python bench/cpu_profile.py                       # gguf, bf16, fp32
    python bench/cpu_profile.py --configs gguf --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONFIGS = {"gguf": {}, "bf16": {"quantization": "none", "dtype": "bfloat16"}, "fp32": {"quantization": "none", "dtype": "float32"}}
LINEAR_OPS = ("gguf_linear", "linear_small_m", "int8_linear", "aten::addmm", "aten::mm", "aten::linear", "aten::bmm",
              "mkldnn", "aten::matmul", "llama_decode_step")
ATTENTION_OPS = ("paged_decode", "attention", "reshape_and_cache", "index_put", "scaled_dot_product")
CATEGORIES = ("linears", "attention", "other ops", "sampler", "python")


def categorize(events: list[tuple[str, float, str | None]], regions: dict[str, float], wall_us: float) -> dict[str, float]:
    """``events``: (op name, self CPU microseconds, the region it ran in: ``"sampler"``,
    ``"attention"`` or ``None``); ``regions``: each region's inclusive CPU microseconds (its C++
    kernels are no torch ops, so their time shows only there). The step's shares in ms."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for name, self_us, region in events:
        if region is not None:
            continue  # counted with its region
        if any(key in name for key in LINEAR_OPS):
            out["linears"] += self_us
        elif any(key in name for key in ATTENTION_OPS):
            out["attention"] += self_us
        else:
            out["other ops"] += self_us
    out["sampler"] += regions.get("sampler", 0.0)
    out["attention"] += regions.get("attention", 0.0)
    out["python"] = max(wall_us - sum(out.values()), 0.0)
    return {k: v / 1000.0 for k, v in out.items()}


def _profile_steps(llm, steps: int) -> dict:
    """Profile ``steps`` engine steps; the mean per step of each category (ms) and the top ops."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    engine = llm.engine
    runner = engine.executor.worker.model_runner
    from host.core.models.attention_layer import Attention

    patched = {"sampler": type(runner.sampler), "attention": Attention}
    originals = {region: cls.__call__ if region == "sampler" else cls.forward for region, cls in patched.items()}

    def wrap(region: str, fn):
        def traced(self, *args, **kwargs):
            with record_function(f"host.{region}"):
                return fn(self, *args, **kwargs)
        return traced

    type(runner.sampler).__call__ = wrap("sampler", originals["sampler"])
    Attention.forward = wrap("attention", originals["attention"])
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            tokens = 0
            for _ in range(steps):
                out = engine.step()
                tokens += sum(len(o.new_token_ids) for o in out.outputs)
            wall_us = (time.perf_counter() - t0) * 1e6
    finally:
        type(runner.sampler).__call__ = originals["sampler"]
        Attention.forward = originals["attention"]
    events = prof.events()
    spans = {region: [(e.time_range.start, e.time_range.end) for e in events if e.name == f"host.{region}"] for region in patched}
    regions = {region: sum(e.cpu_time_total for e in events if e.name == f"host.{region}") for region in patched}
    rows = []
    for e in events:
        if e.name.startswith("host.") or e.name.startswith("ProfilerStep"):
            continue
        start = e.time_range.start
        region = next((r for r, ranges in spans.items() if any(a <= start <= b for a, b in ranges)), None)
        rows.append((e.name, float(e.self_cpu_time_total), region))
    shares = categorize(rows, regions, wall_us)
    top: dict[str, float] = {}
    for name, self_us, _ in rows:
        top[name] = top.get(name, 0.0) + self_us
    return {
        "steps": steps, "wall_ms_per_step": wall_us / 1000.0 / steps, "tokens": tokens,
        "ms_per_step": {k: v / steps for k, v in shares.items()},
        "top_ops_ms_per_step": {k: v / 1000.0 / steps for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:12]},
        "threads": torch.get_num_threads(),
    }


def child(config: str, steps: int, out: str) -> None:
    from quantization import make_prompts

    from host import LLM, SamplingParams
    from host.core.frontend.output_processor import OutputProcessor

    llm = LLM(multiprocess=False, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2304, **CONFIGS[config])
    engine = llm.engine
    vocab = llm.get_tokenizer().vocab_size
    llm.generate([{"prompt_token_ids": p} for p in make_prompts(8, 16, vocab, 99)], SamplingParams(max_tokens=4, temperature=0.0))

    def queue(prompts: list[list[int]], params: SamplingParams) -> None:
        """Queue requests straight into the engine core (the steps are driven by hand)."""
        for prompt in prompts:
            llm._add(OutputProcessor(llm.tokenizer), None, prompt, params, 0, [])

    # 64 sequences: prefill them all, then profile decode steps
    queue(make_prompts(64, 128, vocab, 0), SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.requests.values()):
        engine.step()
    for _ in range(2):
        engine.step()
    decode = _profile_steps(llm, steps)
    engine.abort_requests(list(engine.scheduler.requests))
    engine.step()
    # one 2,048-token prompt in one step
    queue(make_prompts(1, 2048, vocab, 1), SamplingParams(max_tokens=1, temperature=0.0))
    prefill = _profile_steps(llm, 1)
    Path(out).write_text(json.dumps({"config": config, "decode_64": decode, "prefill_2048": prefill}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="gguf,bf16,fp32")
    ap.add_argument("--steps", type=int, default=16, help="decode steps profiled (64 sequences each)")
    ap.add_argument("--out", default=str(HERE / "results" / "cpu_profile.json"))
    ap.add_argument("--child", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.steps, args.child[1])
        return
    results = {}
    for config in args.configs.split(","):
        tmp = f"{args.out}.{config}.tmp"
        subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", config, tmp], check=True)
        results[config] = json.loads(Path(tmp).read_text())
        os.unlink(tmp)
    for phase, title in (("decode_64", "64-sequence decode step"), ("prefill_2048", "2,048-token prefill step")):
        print(f"\n{title} (ms per step; share of the wall time)")
        print(f"{'config':8} {'wall':>8} " + " ".join(f"{c:>16}" for c in CATEGORIES))
        for config, r in results.items():
            p = r[phase]
            wall = p["wall_ms_per_step"]
            cells = " ".join(f"{p['ms_per_step'][c]:8.1f} ({p['ms_per_step'][c] / wall:4.0%})" for c in CATEGORIES)
            print(f"{config:8} {wall:8.1f} {cells}")
        for config, r in results.items():
            top = ", ".join(f"{k} {v:.1f}" for k, v in list(r[phase]["top_ops_ms_per_step"].items())[:6])
            print(f"  {config} top ops: {top}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpu": _cpu_name(), "results": results}, indent=2))
    print(f"\nwrote {args.out}")


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()
