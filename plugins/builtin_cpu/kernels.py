"""Compiled CPU kernels, built on first use with the system C++ compiler.

All float32, OpenMP-parallel through ``at::parallel_for``:

- ``paged_decode``: single-token (decode) paged attention that reads K/V straight from the
  cache pages through the block table, instead of first gathering every page into a padded
  buffer: one pass over the keys for the scores, one over the values.
- ``linear_small_m``: ``x @ W^T (+ b)`` for a handful of rows (batch-1 and small-batch decode).
  oneDNN's GEMM spends more time on setup and blocking than on streaming the weights when
  ``x`` has one row; this kernel reads the weight once, as one contiguous stream in the
  blocked layout of :func:`block_weight`, with AVX2 FMAs, near the machine's read bandwidth
  (about 20 GB/s against oneDNN's 13 GB/s over SmolLM2-135M's weights).
- ``gguf_linear`` / ``int8_linear``: ``x @ dequantize(W)^T (+ b)`` straight from GGUF blocks
  (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) or int8 rows with per-row scales, the weights dequantized in
  registers and the activations in float32 (``csrc/quant_linear.cpp``): up to 8 rows of ``x``
  stream each weight row once; more rows multiply panels of dequantized rows with ``at::mm``.
- ``rms_norm`` and ``fused_add_rms_norm_`` (residual add and norm in one pass, in place),
  ``rotary_neox_`` (in-place rotate-half RoPE from the cos/sin table), ``silu_and_mul``: each
  replaces three to eight small torch ops whose dispatch cost dominates at decode sizes.

The C++ lives in ``csrc/`` (shipped as package data): the translation units listed in
:data:`SOURCES`, each compiled on its own (ninja builds them side by side), and the headers of
:data:`HEADERS` they share (``host_cpu.h``: the instruction-set macros and the declarations one
file needs from another; ``vector_math.h``: the inline vector helpers). They are copied out of the
installed package into the build folder, next to the module's generated bindings, and linked into
one extension module. The build needs a C++ compiler and ``ninja``; torch keeps the build
(``~/.cache/torch_extensions``) and rebuilds only when the sources or the flags change (ninja
recompiles the files an edit touches, headers included). If the build fails, :func:`cpu_kernels`
returns ``None`` (with one warning naming the error) and every caller keeps its pure-torch
path. Set ``HOST_CPU_KERNELS=0`` to use the torch paths unconditionally.

The instruction set is detected by trying, not by the CPU flags: :func:`isa_flags` compiles and
runs a tiny AVX-512 program, then an AVX2 + FMA + F16C one, in a subprocess (``/proc/cpuinfo``
of a virtual machine can list features that trap), and the build gets explicit ``-m`` flags for
the first that runs instead of ``-march=native`` (``-mtune=native`` only tunes). The kernels use
AVX2 intrinsics when built with AVX2 (also under the AVX-512 flags, where the compiler may widen
the plain loops) and scalar loops otherwise. The choice is logged once (``host.cpu``);
``HOST_CPU_ISA`` forces it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from importlib import resources
from typing import Any, Callable

import torch

logger = logging.getLogger("host.cpu")

# The C++ translation units (package data under csrc/), each compiled on its own, and the headers
# they include (every unit includes host_cpu.h, which includes vector_math.h). The longest to
# compile come first, so ninja starts them first.
SOURCES = ("quant_linear.cpp", "llama_decode.cpp", "elementwise.cpp", "paged_decode.cpp", "linear_small_m.cpp")
HEADERS = ("host_cpu.h", "vector_math.h")
_BINDINGS = "bindings.cpp"  # generated into the build folder from _FUNCTIONS


def kernel_sources() -> list[str]:
    """The text of each of :data:`SOURCES` and then :data:`HEADERS`, read from the installed package
    (``csrc/``)."""
    folder = resources.files(__package__).joinpath("csrc")
    return [folder.joinpath(name).read_text(encoding="utf-8") for name in (*SOURCES, *HEADERS)]


def _write_if_changed(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` unless it already holds it (an unchanged file keeps its time, so
    ninja does not rebuild it), through a temporary file: a process starting beside this one
    never compiles half a file."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _bindings_source() -> str:
    """The pybind11 module binding every function of ``_FUNCTIONS`` under its name, as
    ``load_inline(functions=...)`` writes it (torch's error handling around each call)."""
    lines = ["#include <torch/extension.h>", '#include "host_cpu.h"', "", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [f'  m.def("{name}", torch::wrap_pybind_function({name}), "{name}");' for name in _FUNCTIONS]
    return "\n".join([*lines, "}", ""])


def _stage_sources(build_directory: str) -> list[str]:
    """Copies :data:`SOURCES` and :data:`HEADERS` out of the installed package into
    ``build_directory/csrc`` and writes the bindings beside them; returns the paths of the
    translation units to compile (the bindings first: with all of ``torch/extension.h`` to parse,
    they take about as long as quant_linear.cpp)."""
    folder = os.path.join(build_directory, "csrc")
    os.makedirs(folder, exist_ok=True)
    names = (*SOURCES, *HEADERS)
    for name, text in zip(names, kernel_sources()):
        _write_if_changed(os.path.join(folder, name), text)
    _write_if_changed(os.path.join(folder, _BINDINGS), _bindings_source())
    return [os.path.join(folder, name) for name in (_BINDINGS, *SOURCES)]


def _ensure_ninja_on_path() -> None:
    """torch looks for ``ninja`` on PATH; the pip ``ninja`` package puts it next to the
    interpreter, which is not on PATH when a virtual environment is used without activating it."""
    if shutil.which("ninja") is not None:
        return
    candidates = [os.path.dirname(sys.executable)]
    try:
        import ninja

        candidates.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for folder in candidates:
        if os.path.exists(os.path.join(folder, "ninja")):
            os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
            return


# Instruction sets are chosen by running a probe, not by reading /proc/cpuinfo: a virtual
# machine may list features (AVX-512, AMX) whose instructions trap. Each candidate is a tiny
# program compiled with the candidate's flags and run in a subprocess; the first that exits
# cleanly sets the flags of the kernel build.
_ISA_CANDIDATES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "avx512",
        ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
        """#include <immintrin.h>
int main() { volatile float s = 1.5f; __m512 a = _mm512_set1_ps(s); a = _mm512_fmadd_ps(a, a, a);
  __m512i b = _mm512_dpbusd_epi32(_mm512_castps_si512(a), _mm512_set1_epi8(1), _mm512_set1_epi8(2));
  __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_set1_ps(s), _mm256_set1_ps(_cvtsh_ss(0x3c00)));
  return (_mm512_reduce_add_ps(a) > 0.f && _mm512_reduce_add_epi32(b) != 0 && _mm256_cvtss_f32(c) > 0.f) ? 0 : 1; }
""",
    ),
    (
        "avx2",
        ("-mavx2", "-mfma", "-mf16c"),
        """#include <immintrin.h>
int main() { volatile float s = 1.5f; __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_set1_ps(s), _mm256_set1_ps(_cvtsh_ss(0x3c00)));
  __m256i b = _mm256_add_epi32(_mm256_cvtepi8_epi32(_mm_set1_epi8(3)), _mm256_set1_epi32(1));
  return (_mm256_cvtss_f32(a) > 0.f && _mm256_extract_epi32(b, 7) == 4) ? 0 : 1; }
""",
    ),
)
_ISA: list[tuple[str, ...]] = []


def _probe_runs(flags: tuple[str, ...], source: str) -> bool:
    import subprocess
    import tempfile

    compiler = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory(prefix="host_isa_") as tmp:
        src, exe = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        try:
            subprocess.run([compiler, "-O1", *flags, src, "-o", exe], check=True, capture_output=True, timeout=60)
            return subprocess.run([exe], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def _probe_cache_key(compiler: str) -> str:
    """What the probe's answer depends on: the CPU (model and flags as the kernel reports them;
    the probe still decides), the compiler, and the candidates."""
    import hashlib

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = sorted({line for line in f if line.startswith(("model name", "flags", "vendor_id"))})
    except OSError:
        cpu = [os.uname().machine]
    text = "\n".join([*cpu, shutil.which(compiler) or compiler, repr(_ISA_CANDIDATES)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _probe_cache_path() -> str:
    from torch.utils.cpp_extension import get_default_build_root

    return os.path.join(get_default_build_root(), "host_isa_probe.json")


def isa_flags() -> tuple[str, ...]:
    """The ``-m`` flags of the kernel build: the widest of AVX-512 (F, BW, VL, VNNI), AVX2 (+ FMA,
    F16C) whose probe program really runs here, else none (the kernels' scalar loops). The probe
    costs a few seconds of compiling, so its answer is kept next to torch's extension builds
    (``host_isa_probe.json``, keyed by the CPU and the compiler) and per process;
    ``HOST_CPU_ISA=avx2|avx512|scalar`` skips the probe."""
    import json

    if _ISA:
        return _ISA[0]
    forced = os.environ.get("HOST_CPU_ISA", "").strip().lower()
    names = [name for name, _, _ in _ISA_CANDIDATES]
    if forced and forced != "scalar" and forced not in names:
        raise ValueError(f"HOST_CPU_ISA={forced!r} is not one of {', '.join(names)}, scalar")
    chosen: tuple[str, ...] = ()
    if forced:
        chosen = next((flags for name, flags, _ in _ISA_CANDIDATES if name == forced), ())
    else:
        compiler = os.environ.get("CXX", "c++")
        key, path, cached = _probe_cache_key(compiler), _probe_cache_path(), {}
        try:
            with open(path, encoding="utf-8") as f:
                cached = json.load(f)
        except (OSError, ValueError):
            cached = {}
        if isinstance(cached.get(key), list):
            chosen = tuple(cached[key])
        else:
            chosen = next((flags for _, flags, source in _ISA_CANDIDATES if _probe_runs(flags, source)), ())
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{os.getpid()}"
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({**cached, key: list(chosen)}, f)
                os.replace(tmp, path)
            except OSError:
                pass  # no cache: the next process probes again
    logger.info("CPU kernel instruction set: %s", " ".join(chosen) or "scalar (no AVX2 probe ran here)")
    _ISA.append(chosen)
    return chosen


_FUNCTIONS = [
    "paged_decode", "linear_small_m", "gguf_linear", "gguf_linear_q8", "quantize_q8", "int8_linear", "kernels_isa",
    "rms_norm", "fused_add_rms_norm_", "rotary_neox_", "silu_and_mul", "llama_decode_plan", "llama_decode_step",
    "llama_decode_release",
]
_MODULE: list[Any] = []  # [module or None] once attempted in this process


def cpu_kernels() -> Any | None:
    """The compiled kernel module (functions named in ``_FUNCTIONS``), or ``None`` when the
    kernels are disabled (``HOST_CPU_KERNELS=0``) or cannot be built here."""
    if _MODULE:
        return _MODULE[0]
    module = None
    if os.environ.get("HOST_CPU_KERNELS", "1") != "0":
        try:
            from torch.utils.cpp_extension import _get_build_directory, load

            _ensure_ninja_on_path()
            isa = isa_flags()
            name = "host_cpu_kernels_v10"
            build_directory = _get_build_directory(name, verbose=False)
            module = load(
                name=name,
                sources=_stage_sources(build_directory),
                build_directory=build_directory,
                # -fopenmp: at::parallel_for is an OpenMP region compiled into this module.
                # -fno-associative-math: the compiler may not regroup float sums, which it would
                # do differently in each batch-size variant of a kernel (a row's result must not
                # depend on the rows computed beside it; the vector code is written out by hand)
                extra_cflags=["-O3", *isa, "-mtune=native", "-ffast-math", "-fno-finite-math-only",
                              "-fno-associative-math", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - fall back to the torch paths, loudly
            logger.warning("CPU kernels could not be built (%s: %s); using the torch paths", type(exc).__name__, exc)
    if module is not None:
        logger.info("CPU kernels built for %s", module.kernels_isa())
    _MODULE.append(module)
    return module


def block_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` -> the blocked ``[N/4, K/8, 4, 8]`` layout ``linear_small_m`` streams
    contiguously (the weight unchanged when N is not a multiple of 4 or K of 8)."""
    n, k = weight.shape
    if n % 4 or k % 8:
        return weight.contiguous()
    return weight.reshape(n // 4, 4, k // 8, 8).permute(0, 2, 1, 3).contiguous()


def paged_decode_kernel() -> Callable[..., Any] | None:
    """The compiled ``paged_decode`` function, or ``None`` when the kernels are unavailable."""
    module = cpu_kernels()
    return None if module is None else module.paged_decode
