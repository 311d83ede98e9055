"""Multi-LoRA cost on the default model: offline decode throughput of one batch with LoRA off,
with ``--enable-lora`` but base-model requests only, with one adapter for every request, and
with a mix of two adapters and the base model (docs/lora.md, "Figures").

    .venv/bin/python bench/lora.py [--batch 8] [--prompt-len 64] [--max-tokens 64] [--rank 16]

The adapters are random rank-``--rank`` LoRA weights on all seven projections of every layer
(PEFT's file layout). Two engines (LoRA off, LoRA on with two slots) live in this process; the
four configurations run in interleaved rounds (``--rounds``) and each keeps its best round, so
a machine's load drift hits them alike. Results: ``bench/results/lora_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_adapter(path: str, hf_config, rank: int, seed: int) -> str:
    """A rank-``rank`` adapter on q/k/v/o/gate/up/down of every layer, as PEFT saves one."""
    from safetensors.torch import save_file

    from host.core.lora.adapter import module_shapes

    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(hf_config.num_hidden_layers):
        for module, (fan_in, fan_out) in module_shapes(hf_config).items():
            parent = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{i}.{parent}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": list(module_shapes(hf_config))}, f)
    return path


def run(llm, prompts, loras, max_tokens: int) -> tuple[float, int]:
    from host import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=loras)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from host import LLM, LoRARequest

    rng = random.Random(0)
    prompts = [[rng.randrange(100, 20000) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    tmp = tempfile.mkdtemp(prefix="lora-bench-")
    common = dict(skip_tokenizer_init=True, max_num_seqs=max(args.batch, 8), max_lora_rank=args.rank)
    off = LLM(**common)
    on = LLM(enable_lora=True, max_loras=2, **common)
    hf = on.config.model.hf_config
    adapters = [LoRARequest(f"bench{i}", i + 1, write_adapter(os.path.join(tmp, f"a{i}"), hf, args.rank, i))
                for i in range(2)]
    configs = [
        ("lora off", off, None),
        ("--enable-lora, base requests", on, None),
        ("one adapter for every request", on, adapters[0]),
        ("two adapters + base, mixed", on, [[adapters[0], adapters[1], None][i % 3] for i in range(args.batch)]),
    ]
    for _, llm, loras in configs:  # warm-up (adapters loaded into their slots)
        run(llm, prompts[:3], loras if not isinstance(loras, list) else loras[:3], 2)
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.rounds):  # interleaved rounds, best of each: load drift hits every config alike
        for label, llm, loras in configs:
            elapsed, tokens = run(llm, prompts, loras, args.max_tokens)
            if label not in best or elapsed < best[label][0]:
                best[label] = (elapsed, tokens)
            print(f"{label:34s} {tokens / elapsed:8.1f} tok/s ({elapsed:.2f} s)", flush=True)
    results = [{"config": label, "seconds": round(best[label][0], 3), "generated_tokens": best[label][1],
                "tokens_per_s": round(best[label][1] / best[label][0], 1)} for label, _, _ in configs]
    off.shutdown()
    on.shutdown()
    base = results[0]["tokens_per_s"]
    for r in results:
        r["vs_lora_off"] = round(r["tokens_per_s"] / base, 3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record = {
        "bench": "lora", "device": device, "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_average": os.getloadavg()[0], "model": "SmolLM2-135M-Instruct (default)",
        "batch": args.batch, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "rank": args.rank,
        "rounds": args.rounds,
        "results": results,
    }
    out = args.out or os.path.join(REPO, "bench", "results", f"lora_{device}.json")
    with open(out, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
