"""GPU throughput: host vs Hugging Face transformers continuous batching on one GPU.

Workload (the nano-vllm one): 256 requests, prompt and output lengths uniform in [100, 1024],
EOS ignored, a Qwen3-0.6B-shaped model with random weights in bfloat16 (no download: the
config is built here and the weights are ``--load-format dummy``). In the same run,
transformers' continuous batching (``generate_batch`` with ``attn_implementation="paged|sdpa"``)
serves a smaller slice of the same workload (``--peer-requests``), and the decode speed is set
against the HBM-bandwidth bound (weights plus the KV cache read per decode step).

    python bench/gpu_throughput.py                 # the full run (one GPU, under 8 minutes)
    python bench/gpu_throughput.py --smoke         # a tiny model and a few requests (CPU works)

Needs only torch, triton, transformers and host's own pure-Python dependencies (carry wheels
for pluggy, typer, rich, safetensors, gguf, xgrammar if the machine lacks them). Results go to
``bench/results/gpu_throughput-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

QWEN3_06B = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=1000, max_position_embeddings=4096,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "A800": 2.0e12, "L40S": 0.864e12}


def workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(100, vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def model_dir(shape: dict) -> str:
    import transformers

    path = tempfile.mkdtemp(prefix="host-bench-qwen3-")
    transformers.Qwen3Config(**shape, architectures=["Qwen3ForCausalLM"]).save_pretrained(path)
    return path


def run_host(path: str, reqs: list[tuple[list[int], int]], dtype: str, max_num_seqs: int, batched: int, max_len: int,
             temperature: float, extra: dict) -> dict:
    from host import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(path, load_format="dummy", dtype=dtype, skip_tokenizer_init=True, max_model_len=max_len,
              max_num_seqs=max_num_seqs, max_num_batched_tokens=batched, **extra)
    load_s = time.perf_counter() - t0
    llm.generate([{"prompt_token_ids": reqs[0][0][:16]}], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    params = [SamplingParams(max_tokens=out, temperature=temperature, ignore_eos=True) for _, out in reqs]
    runner = llm.engine.executor.worker.model_runner
    runner.step_timings = []
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in reqs], params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    decode = [t for t in runner.step_timings if t.num_tokens == t.num_reqs]
    info = {
        "load_s": load_s,
        "elapsed_s": elapsed,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / elapsed,
        "attention_backend": runner.attn_backend.name,
        "compilation": llm.engine.config.compilation.describe(),
        "graph_replays": runner.decode_graphs.num_replays if runner.decode_graphs is not None else 0,
        "weight_bytes": runner.model_memory_bytes(),
        "decode_steps": len(decode),
        "decode_step_mean_s": sum(t.step_s for t in decode) / max(len(decode), 1),
        "decode_batch_mean": sum(t.num_reqs for t in decode) / max(len(decode), 1),
        "kv_bytes_per_token": 2 * runner.num_layers * runner.num_kv_heads * runner.head_size * runner.dtype.itemsize,
    }
    llm.shutdown()
    return info


def run_peer(path: str, reqs: list[tuple[list[int], int]], dtype: str, temperature: float) -> dict:
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = transformers.AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    attn = "paged|sdpa" if device == "cuda" else "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation=attn).to(device).eval()
    gen_kw = dict(do_sample=temperature > 0, eos_token_id=-1, pad_token_id=0)
    if temperature > 0:
        gen_kw["temperature"] = temperature
    t0 = time.perf_counter()
    tokens = 0
    mode = "generate_batch"
    try:
        longest = max(out for _, out in reqs)
        cfg = transformers.GenerationConfig(max_new_tokens=longest, **gen_kw)
        with torch.inference_mode():
            results = model.generate_batch(inputs=[p for p, _ in reqs], generation_config=cfg)
        for r in results.values():
            tokens += len(getattr(r, "generated_tokens", []) or [])
    except Exception as exc:  # noqa: BLE001 - fall back to padded batched generate
        mode = f"generate (generate_batch failed: {type(exc).__name__})"
        tokens = 0
        t0 = time.perf_counter()
        for p, out in reqs:
            with torch.inference_mode():
                ids = torch.tensor([p], device=device)
                res = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out, min_new_tokens=out, **gen_kw)
            tokens += res.shape[1] - len(p)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {"elapsed_s": elapsed, "output_tokens": tokens, "output_tokens_per_s": tokens / elapsed, "mode": mode, "attn_implementation": attn}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--peer-requests", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.6, help="nano-vllm's workload samples at 0.6; 0 = greedy")
    ap.add_argument("-O", "--optimization-level", type=int, default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny model, few short requests (runs on CPU)")
    ap.add_argument("--ablation", type=int, default=0, metavar="N",
                    help="also run N requests (lengths up to 512) with each optimization turned off in turn: "
                         "what the fused kernels, decode graphs and asynchronous scheduling each pay")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = QWEN3_06B
    if args.smoke:
        shape = TINY
        args.num_requests, args.min_len, args.max_len, args.peer_requests = 6, 8, 24, 3
        args.max_num_batched_tokens = 256
        if not torch.cuda.is_available():
            args.dtype = "float32"
    path = model_dir(shape)
    reqs = workload(args.num_requests, args.min_len, args.max_len, shape["vocab_size"], args.seed)
    max_len = 2 * args.max_len + 16
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    extra = {}
    if args.optimization_level is not None:
        extra["optimization_level"] = args.optimization_level
    if args.enforce_eager:
        extra["enforce_eager"] = True
    ours = run_host(path, reqs, args.dtype, args.max_num_seqs, args.max_num_batched_tokens, max_len, args.temperature, extra)
    print(f"host:         {ours['output_tokens_per_s']:10.1f} output tok/s ({ours['output_tokens']} tokens in {ours['elapsed_s']:.1f} s, "
          f"{ours['attention_backend']}; {ours['compilation']}; {ours['graph_replays']} graph replays)")
    peer = run_peer(path, reqs[: args.peer_requests], args.dtype, args.temperature)
    print(f"transformers: {peer['output_tokens_per_s']:10.1f} output tok/s ({peer['output_tokens']} tokens in {peer['elapsed_s']:.1f} s, {peer['mode']}, {args.peer_requests} requests)")
    ratio = ours["output_tokens_per_s"] / peer["output_tokens_per_s"]
    print(f"ratio host / transformers: {ratio:.2f}x")
    # decode bound: every decode step reads the weights once and the batch's KV once
    bw = next((v for k, v in HBM_BYTES_PER_S.items() if k in gpu), None)
    bound_fraction = None
    if bw and ours["decode_steps"]:
        avg_ctx = (args.min_len + args.max_len) / 2 * 1.5
        step_bytes = ours["weight_bytes"] + ours["decode_batch_mean"] * avg_ctx * ours["kv_bytes_per_token"]
        bound_fraction = (step_bytes / bw) / ours["decode_step_mean_s"]
        print(f"decode: {ours['decode_step_mean_s'] * 1e3:.2f} ms/step at batch {ours['decode_batch_mean']:.0f}; "
              f"HBM-bandwidth bound {step_bytes / bw * 1e3:.2f} ms ({100 * bound_fraction:.0f}% of the bound)")
    ablation = {}
    if args.ablation:
        slice_reqs = workload(args.ablation, args.min_len, min(args.max_len, 512), shape["vocab_size"], args.seed + 1)
        variants = {
            "default": {},
            "no custom ops (torch norms, rotary, activation, sampler)": {"custom_ops": False},
            "no decode graphs (-O1)": {"optimization_level": 1},
            "no asynchronous scheduling": {"async_scheduling": False},
            "eager (-O0, synchronous)": {"optimization_level": 0, "async_scheduling": False},
        }
        for name, kw in variants.items():
            info = run_host(path, slice_reqs, args.dtype, args.max_num_seqs, args.max_num_batched_tokens, max_len, args.temperature, kw)
            ablation[name] = {"output_tokens_per_s": info["output_tokens_per_s"], "compilation": info["compilation"],
                              "decode_step_mean_s": info["decode_step_mean_s"]}
            print(f"ablation {name:58s} {info['output_tokens_per_s']:10.1f} tok/s  ({info['compilation']})")
    result = {
        "benchmark": "gpu_throughput",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "gpu": gpu,
        "model": "Qwen3-0.6B-shaped, random weights" if not args.smoke else "tiny Qwen3 (smoke)",
        "dtype": args.dtype,
        "workload": {"num_requests": args.num_requests, "len_range": [args.min_len, args.max_len], "ignore_eos": True,
                     "peer_requests": args.peer_requests, "temperature": args.temperature},
        "torch": torch.__version__,
        "host_output_tokens_per_s": ours["output_tokens_per_s"],
        "peer_output_tokens_per_s": peer["output_tokens_per_s"],
        "ratio": ratio,
        "decode_bound_fraction": bound_fraction,
        "host": ours,
        "peer": peer,
        "ablation": ablation,
    }
    out = Path(args.out or Path(__file__).parent / "results" / f"gpu_throughput-{time.strftime('%Y%m%d')}{'-smoke' if args.smoke else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
