"""Mixture-of-experts speed on the CPU: an OLMoE-shaped model scaled to two cores (random
weights: 64 experts, top-8, hidden 512, expert intermediate 256, 4 layers), host against
transformers' ``generate`` on the same checkpoint at batch 1 and at 64 requests, and the fused
experts op against the reference models' loop over experts (docs/moe.md, "Figures").

    .venv/bin/python bench/moe.py [--requests 64] [--prompt-len 32] [--max-tokens 32]

One run, both sides on the same weights; each figure is the best of ``--rounds`` interleaved
rounds. Results: ``bench/results/moe_cpu.json``.
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
SHAPE = dict(hidden_size=512, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
             num_experts=64, num_experts_per_tok=8, vocab_size=32000, max_position_embeddings=1024, tie_word_embeddings=False)


def make_checkpoint(path: str) -> str:
    import transformers

    config = transformers.OlmoeConfig(**SHAPE)
    config.architectures = ["OlmoeForCausalLM"]
    torch.manual_seed(0)
    transformers.OlmoeForCausalLM(config).eval().save_pretrained(path)
    return path


def bench_host(path: str, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    from host import LLM, SamplingParams

    llm = LLM(path, skip_tokenizer_init=True, max_num_seqs=max(len(prompts), 1), max_model_len=256)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    elapsed = time.perf_counter() - start
    llm.shutdown()
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)


def bench_hf(model, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    ids = torch.tensor(prompts)  # equal lengths: no padding
    with torch.inference_mode():
        model.generate(ids[:1, :4], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - ids.shape[1]) * ids.shape[0]


def fused_experts_loop(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor) -> torch.Tensor:
    """The baseline: the reference models' loop, one boolean mask and ``where`` per expert hit (silu)."""
    from host.core.moe.fused_experts import apply_activation

    out = torch.zeros_like(x)
    for expert in torch.unique(topk_ids[topk_ids >= 0]).tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        h = torch.nn.functional.linear(x[token_idx], w13[expert])
        y = torch.nn.functional.linear(apply_activation(h, "silu", 1.702, 7.0), w2[expert])
        out.index_add_(0, token_idx, y * topk_weights[token_idx, slot, None].to(y.dtype))
    return out


def bench_kernel(tokens: int, rounds: int) -> dict[str, float]:
    """ms per call of the fused experts op (the kernel table's choice) and of the loop over experts."""
    from host.core.moe.fused_experts import fused_experts
    from host.core.moe.router import select_experts

    g = torch.Generator().manual_seed(1)
    e, h, i = SHAPE["num_experts"], SHAPE["hidden_size"], SHAPE["intermediate_size"]
    w13, w2 = torch.randn(e, 2 * i, h, generator=g) * 0.05, torch.randn(e, h, i, generator=g) * 0.05
    x = torch.randn(tokens, h, generator=g)
    weights, ids = select_experts(torch.randn(tokens, e, generator=g), SHAPE["num_experts_per_tok"], renormalize=False)
    best = {"fused_ms": float("inf"), "loop_ms": float("inf")}
    for _ in range(rounds):
        for key, call in (("fused_ms", lambda: fused_experts(x, w13, w2, weights, ids, "silu")),
                          ("loop_ms", lambda: fused_experts_loop(x, w13, w2, weights, ids))):
            start = time.perf_counter()
            for _ in range(5):
                call()
            best[key] = min(best[key], (time.perf_counter() - start) / 5 * 1e3)
    return {k: round(v, 3) for k, v in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import transformers

    from host.core.plugins.manager import get_plugin_host
    from host.core.plugins.platform import current_platform

    path = make_checkpoint(tempfile.mkdtemp(prefix="moe-bench-"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 30000) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    results = []
    for label, batch in (("batch 1", prompts[:1]), (f"{args.requests} requests", prompts)):
        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.rounds):
            for side, fn in (("host", lambda: bench_host(path, batch, args.max_tokens)),
                             ("transformers", lambda: bench_hf(hf, batch, args.max_tokens))):
                elapsed, tokens = fn()
                if side not in best or elapsed < best[side][0]:
                    best[side] = (elapsed, tokens)
        row = {"case": label, **{f"{side}_tok_s": round(t / e, 1) for side, (e, t) in best.items()}}
        row["ratio"] = round(row["host_tok_s"] / row["transformers_tok_s"], 2)
        results.append(row)
        print(f"{label:14s} host {row['host_tok_s']:8.1f} tok/s  transformers {row['transformers_tok_s']:8.1f} tok/s  "
              f"ratio {row['ratio']:.2f}x", flush=True)
    get_plugin_host().offer_kernels(current_platform())
    from host.interfaces.kernels import kernel_entry

    kernel = kernel_entry("fused_moe", "cpu").name
    kernels = []
    for tokens in (1, 64, 512):
        row = {"tokens": tokens, **bench_kernel(tokens, args.rounds)}
        row["loop_over_fused"] = round(row["loop_ms"] / row["fused_ms"], 2)
        kernels.append(row)
        print(f"fused experts ({kernel}) at {tokens:4d} tokens: {row['fused_ms']:.3f} ms vs loop {row['loop_ms']:.3f} ms "
              f"({row['loop_over_fused']:.2f}x)", flush=True)
    record = {
        "bench": "moe", "device": "cpu", "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0], "shape": SHAPE, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
        "rounds": args.rounds, "fused_moe_kernel": kernel, "generate": results, "fused_experts": kernels,
    }
    out = args.out or os.path.join(REPO, "bench", "results", "moe_cpu.json")
    with open(out, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
