"""Speculative decoding (ngram prompt lookup) on the default model (SmolLM2-135M-Instruct,
its GGUF file), batch 1, greedy answers of up to 256 tokens ending at EOS (as users see them),
against the same engine without speculation, in the same run:

- **repetitive**: chat prompts that ask the model to repeat / quote their input (code,
  a list, a paragraph, SQL), so the answer copies tokens the prompt holds and ngram's drafts
  are accepted; target: 1.8x the plain decode tok/s. The greedy tokens of both engines must be
  equal (they are compared);
- **lists**: chat prompts whose answers are lists of distinct items (animals,
  countries, numbers in words): ngram finds the list's separators earlier and proposes the
  previous item; part of it repeats (measured: about half the drafts accepted);
- **low acceptance**: free prose (stories, essays), where the few n-grams that recur
  are rarely followed by the same words (a small model's prose does loop, though);
- **random**: prompts of random token ids (ids >= 100: no special tokens; as vLLM's random
  dataset), 256 tokens each past EOS, sampled (temperature 1, a seed per prompt): greedy
  decoding of noise loops (every draft accepted), sampling it does not, so few drafts are right
  and the auto-off must keep the slowdown <= 5 %. Sampled tokens are not compared (the
  rejection sampler keeps the distribution, not the draws).

The last three also run with the auto-off disabled (``auto_off_threshold: 0``), to show what it
costs or saves.

Each prompt runs on every engine, rotating which goes first, after a warm-up request per
engine. The headline is the decode speed, as llama.cpp's ``tg`` and vLLM's TPOT count it: the
generated tokens after the first over the request's wall time less its prefill (the same prompt
run with ``max_tokens=1`` just before, the prefix cache reset in between); the end-to-end ratio
(prefill included, the same for every engine) is kept beside it. The JSON records the figures,
the ratios, the acceptance (drafted / accepted tokens, mean accepted length) and the machine's
load average before and after (a shared machine's figures are noisy: rerun it quiet).

    .venv/bin/python bench/spec_decode.py            # ~4 min on 2 quiet cores
    .venv/bin/python bench/spec_decode.py --quick    # 2 prompts per workload, 32 tokens

Results: bench/results/spec_decode.json (``--quick``: spec_decode_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import random
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

CODE = '''def merge_sorted(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out'''
CLASS = '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def most_common(self, k):
        items = sorted(self.counts.items(), key=lambda kv: -kv[1])
        return items[:k]'''
LIST = "\n".join(f"{i}. {w}" for i, w in enumerate(
    "apples bananas cherries dates elderberries figs grapes honeydew kiwis lemons mangoes nectarines oranges papayas".split(), 1))
PARAGRAPH = ("The quick brown fox jumps over the lazy dog. The dog wakes up and chases the fox around the farm, "
             "past the barn, the pond and the old oak tree, until both of them are too tired to run any further.")
SQL = ("SELECT users.id, users.name, COUNT(orders.id) AS num_orders FROM users LEFT JOIN orders ON orders.user_id = users.id "
       "WHERE users.created_at > '2024-01-01' GROUP BY users.id, users.name ORDER BY num_orders DESC LIMIT 10;")
REPETITIVE = [
    f"Repeat this code exactly, with no comment:\n\n{CODE}",
    f"Copy this Python class exactly as it is:\n\n{CLASS}",
    f"Repeat this list exactly:\n\n{LIST}",
    f"Repeat the following paragraph word for word: {PARAGRAPH}",
    f"Repeat this SQL query exactly:\n\n{SQL}",
    f"Quote this code back to me exactly:\n\n{CODE}",
]
PROSE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write an essay on why cities should plant more trees.",
    "Describe a walk through a busy market on a rainy morning.",
    "Write a letter from a sailor to his sister about his first voyage.",
    "Explain to a child how rain forms, in a friendly tone.",
    "Write a short story about a robot learning to paint.",
]
LISTS = [
    "List 40 different animals, one per line, numbered.",
    "Write the numbers from 1 to 60 in words, separated by commas.",
    "Name 30 countries and their capitals, one per line, as 'country: capital'.",
    "List 30 programming languages, each with a one-sentence description.",
    "Write 25 different fruit names, numbered, one per line.",
    "List 30 famous scientists and what each one discovered, one per line.",
]
RANDOM_PROMPT_LEN = 128
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def run_one(llm, prompt: dict, params) -> tuple[list[int], float, float]:
    """The request's tokens, its wall time and its prefill time (the same prompt with
    ``max_tokens=1`` just before, the prefix cache reset after it, so the full run prefills too)."""
    from host import SamplingParams

    t0 = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    prefill = time.perf_counter() - t0
    llm.engine.scheduler.reset_prefix_cache()
    t0 = time.perf_counter()
    out = llm.generate([prompt], params)[0].outputs[0]
    return out.token_ids, time.perf_counter() - t0, prefill


def chat_prompt(llm, text: str) -> dict:
    tok = llm.get_tokenizer()
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return {"prompt_token_ids": tok.encode(rendered, add_special_tokens=False)}


def _acceptance(before: dict, after: dict) -> dict:
    drafts = after["num_drafts"] - before["num_drafts"]
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    return {
        "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": 1 + accepted / drafts if drafts else 1.0,
    }


def workload(engines: dict, prompts: list[dict], params_of, compare: bool = True) -> dict:
    """Every prompt on every engine (rotating the order); ``params_of(i)``: prompt i's params;
    ``compare``: whether the engines' tokens must be equal (greedy)."""
    names = list(engines)
    before = {n: e.engine.scheduler.spec_decode.totals() for n, e in engines.items() if e.engine.scheduler.spec_decode}
    seconds = {n: 0.0 for n in names}
    prefill = {n: 0.0 for n in names}
    tokens = {n: 0 for n in names}
    outputs: dict[str, list] = {n: [] for n in names}
    for i, p in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        for n in order:
            ids, dt, pf = run_one(engines[n], p, params_of(i))
            seconds[n] += dt
            prefill[n] += min(pf, dt)
            tokens[n] += len(ids)
            outputs[n].append(ids)
    out: dict = {"num_prompts": len(prompts)}
    for n in names:
        decode_s = seconds[n] - prefill[n]
        out[n] = {"decode_tok_s": (tokens[n] - len(prompts)) / decode_s, "tok_s": tokens[n] / seconds[n],
                  "seconds": seconds[n], "prefill_seconds": prefill[n], "tokens": tokens[n]}
        if n in before:
            out[n].update(_acceptance(before[n], engines[n].engine.scheduler.spec_decode.totals()))
        if n != "base":
            out[n]["speed_vs_base"] = out[n]["decode_tok_s"] / out["base"]["decode_tok_s"]
            out[n]["end_to_end_vs_base"] = out[n]["tok_s"] / out["base"]["tok_s"]
            out[n]["equal_tokens_to_base"] = outputs[n] == outputs["base"] if compare else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--num-prompts", type=int, default=None, help="prompts per workload (default 6; --quick 2)")
    ap.add_argument("--workloads", default="repetitive,lists,low_acceptance,random", help="which workloads, comma-separated")
    args = ap.parse_args()
    max_tokens = args.max_tokens or (32 if args.quick else 256)
    load_before = os.getloadavg()

    from host import LLM, SamplingParams

    engine = dict(max_num_seqs=4, max_model_len=1024)
    base = LLM(**engine)
    spec = LLM(speculative_config=SPEC, **engine)
    always = LLM(speculative_config={**SPEC, "auto_off_threshold": 0.0}, **engine)
    n = args.num_prompts or (2 if args.quick else 6)
    prompts = {name: [chat_prompt(base, t) for t in texts[:n]]
               for name, texts in (("repetitive", REPETITIVE), ("lists", LISTS), ("low_acceptance", PROSE))}
    vocab = base.get_tokenizer().vocab_size
    rng = random.Random(0)
    prompts["random"] = [{"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(RANDOM_PROMPT_LEN)]} for _ in range(n)]
    chosen = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(chosen) - set(prompts))
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {', '.join(prompts)}")
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)  # answers end at EOS, as users see them
    for llm in (base, spec, always):  # warm-up
        run_one(llm, prompts["repetitive"][0], SamplingParams(max_tokens=8, temperature=0.0))
    result = {
        "benchmark": "spec_decode",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "model": "SmolLM2-135M-Instruct (the default model, GGUF)",
        "speculative_config": SPEC,
        "auto_off": {k: getattr(spec.engine.config.speculative, k)
                     for k in ("auto_off_threshold", "auto_off_window", "auto_off_probe_steps")},
        "max_tokens": max_tokens,
        "batch": 1,
        "machine": {"platform": pyplatform.platform(), "cpus": os.cpu_count()},
    }
    for name in chosen:
        engines = {"base": base, "ngram": spec} if name == "repetitive" else {"base": base, "ngram": spec, "ngram_no_auto_off": always}
        params_of = (lambda i: SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True)) \
            if name == "random" else (lambda i: greedy)
        result[name] = workload(engines, prompts[name], params_of, compare=name != "random")
    result["load_average_before"] = list(load_before)
    result["load_average_after"] = list(os.getloadavg())
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("spec_decode_quick.json" if args.quick else "spec_decode.json")
    path.write_text(json.dumps(result, indent=2))
    for name in chosen:
        w = result[name]
        line = f"{name:15s} plain {w['base']['decode_tok_s']:6.1f} tok/s"
        for n in [k for k in w if k not in ("base", "num_prompts")]:
            e = w[n]
            line += (f"; {n} {e['decode_tok_s']:6.1f} tok/s ({e['speed_vs_base']:.2f}x; end to end "
                     f"{e['end_to_end_vs_base']:.2f}x; acceptance "
                     f"{100 * e['acceptance_rate']:.0f}% of {e['draft_tokens']}, mean accepted length {e['mean_accepted_length']:.2f})")
        print(line)
    equal = [result[w][n]["equal_tokens_to_base"] for w in chosen
             for n in result[w] if n not in ("base", "num_prompts") and result[w][n]["equal_tokens_to_base"] is not None]
    print(f"greedy tokens equal to the plain engine's: {all(equal)}")
    print(f"load average before {load_before}, after {result['load_average_after']}; saved {path}")


if __name__ == "__main__":
    main()
