"""Tensor-parallel throughput: host at -tp 1 and -tp 2 (mp executor, with and without the
shared-memory all-reduce) against Hugging Face transformers, on the same weights, in one run.

The model is a real architecture's shape with random weights saved once as a safetensors
checkpoint (default: Qwen2.5-0.5B's config: 24 layers, hidden 896, 14 heads, 2 KV heads, vocab
151,936), because the default model (SmolLM2-135M, 9 heads) cannot be split in two. Workload:
``--num-prompts`` prompts of random token ids (lengths in [32, 128]), ``--output-len`` tokens each,
EOS ignored, greedy; plus batch-1 decode. Every configuration must produce the same greedy
tokens as -tp 1 (checked and reported), so the figures compare equal work.

On a 2-core machine -tp 2 gives each rank one core, so it shows what the split and its
all-reduces cost rather than a speed-up; on a machine with more sockets (or GPUs) the same run
shows the gain.

    .venv/bin/python bench/distributed.py [--num-prompts 16] [--output-len 64]

Results are written to bench/results/distributed_tp_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import random
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "hidden_act": "silu", "torch_dtype": "float32",
    },
}


def make_checkpoint(shape: str, root: Path) -> Path:
    """A safetensors checkpoint of ``shape`` with transformers' random init (seed 0), made once."""
    path = root / shape
    if (path / "model.safetensors").exists():
        return path
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in SHAPES[shape].items() if k != "architectures"})
    config.architectures = SHAPES[shape]["architectures"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    return path


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(rng.randint(32, 128))] for _ in range(n)]


def run_host_config(path: str, tp: int, shm: bool, prompts: list[list[int]], output_len: int) -> dict:
    """One host configuration in a fresh process (each -tp setting starts its own workers)."""
    env = dict(os.environ, HOST_SHM_ALLREDUCE="1" if shm else "0")
    code = f"""
import json, sys, time
from host import LLM, SamplingParams
prompts = json.loads(sys.stdin.read())
t0 = time.perf_counter()
llm = LLM({path!r}, tensor_parallel_size={tp}, skip_tokenizer_init=True, max_num_seqs=len(prompts), max_model_len=512, enable_prefix_caching=False)
load_s = time.perf_counter() - t0
params = SamplingParams(max_tokens={output_len}, temperature=0.0, ignore_eos=True)
llm.generate([{{"prompt_token_ids": prompts[0][:8]}}], SamplingParams(max_tokens=2, ignore_eos=True))
t0 = time.perf_counter()
outs = llm.generate([{{"prompt_token_ids": p}} for p in prompts], params)
batch_s = time.perf_counter() - t0
t0 = time.perf_counter()
one = llm.generate([{{"prompt_token_ids": prompts[0]}}], SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
decode_s = time.perf_counter() - t0
print("RESULT " + json.dumps({{"load_s": load_s, "batch_s": batch_s, "decode_s": decode_s,
    "tokens": [o.outputs[0].token_ids for o in outs], "decode_tokens": len(one[0].outputs[0].token_ids)}}))
llm.shutdown() if hasattr(llm, "shutdown") else None
"""
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(prompts), capture_output=True, text=True, env=env, timeout=1800)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"host -tp {tp} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    res = json.loads(line[0][len("RESULT "):])
    n_out = sum(len(t) for t in res["tokens"])
    res.update(output_tokens=n_out, output_tok_s=n_out / res["batch_s"], decode_tok_s=res["decode_tokens"] / res["decode_s"])
    return res


def run_hf(path: str, prompts: list[list[int]], output_len: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=output_len, min_new_tokens=output_len,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
    elapsed = time.perf_counter() - t0
    n = out[:, width:].numel()
    return {"elapsed_s": elapsed, "output_tokens": n, "output_tok_s": n / elapsed, "batch_size": len(prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "host" / "bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "distributed_tp_cpu.json"))
    args = ap.parse_args()

    path = str(make_checkpoint(args.shape, Path(args.cache)))
    prompts = make_prompts(args.num_prompts, SHAPES[args.shape]["vocab_size"])
    load_start = os.getloadavg()[0]
    configs = [("tp1", 1, True), ("tp2_shm", 2, True), ("tp2_gloo", 2, False)]
    results = {}
    for name, tp, shm in configs:
        results[name] = run_host_config(path, tp, shm, prompts, args.output_len)
        r = results[name]
        print(f"host {name:9s}: {r['output_tok_s']:7.1f} output tok/s (batch {len(prompts)}), "
              f"batch-1 decode {r['decode_tok_s']:6.1f} tok/s, load {r['load_s']:.1f} s")
    peer = run_hf(path, prompts, args.output_len)
    print(f"transformers : {peer['output_tok_s']:7.1f} output tok/s (batch {len(prompts)})")
    base = results["tp1"]["tokens"]
    same = {name: r["tokens"] == base for name, r in results.items()}
    print("greedy tokens equal to -tp 1:", same)
    ratios = {
        "tp2_shm / tp1": results["tp2_shm"]["output_tok_s"] / results["tp1"]["output_tok_s"],
        "tp2_shm / tp2_gloo": results["tp2_shm"]["output_tok_s"] / results["tp2_gloo"]["output_tok_s"],
        "tp2_shm / transformers": results["tp2_shm"]["output_tok_s"] / peer["output_tok_s"],
        "tp1 / transformers": results["tp1"]["output_tok_s"] / peer["output_tok_s"],
    }
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    for r in results.values():
        r.pop("tokens")
    record = {
        "benchmark": "distributed_tp", "shape": args.shape, "num_prompts": args.num_prompts, "output_len": args.output_len,
        "machine": {"cpu": pyplatform.processor() or pyplatform.machine(), "cores": os.cpu_count(), "load_avg_at_start": load_start},
        "host": results, "transformers": peer, "ratios": ratios, "greedy_equal_to_tp1": same,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
