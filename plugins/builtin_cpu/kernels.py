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

The C++ lives in ``csrc/`` (shipped as package data): the translation units and shared headers
named in :mod:`~host.plugins.builtin_cpu.kernel_build`, which also says how they are compiled.
``pip install`` builds them (the project's ``setup.py``, through torch's ``BuildExtension``) into
one module per instruction set, ``_kernels_avx512`` and ``_kernels_avx2`` on x86-64
(``_kernels_scalar`` elsewhere). :func:`cpu_kernels` takes the widest prebuilt module whose
instructions run here (its ``isa_probe()`` executed once in a child process: ``/proc/cpuinfo`` of a
virtual machine can list features that trap; the answer is kept in ``host_isa_probe.json`` next to
torch's extension builds) and whose ``sources_hash`` is that of the installed sources.

Without a usable prebuilt module (an install that could not import torch while building, sources
edited since, ``HOST_CPU_ISA`` naming a set that was not prebuilt), the module is built on first use
instead, as before: the sources are copied out of the installed package into torch's build folder
(``~/.cache/torch_extensions``) with the generated bindings and compiled by ninja, which rebuilds
only what an edit touched. The instruction set of that build is the first whose probe program
compiles and runs (:func:`isa_flags`). If neither way gives a module, :func:`cpu_kernels` returns
``None`` (with one warning naming the error) and every caller keeps its pure-torch path. Set
``HOST_CPU_KERNELS=0`` to use the torch paths unconditionally; ``HOST_CPU_ISA=avx512|avx2|scalar``
forces an instruction set. The kernels use AVX2 intrinsics when built with AVX2 (also under the
AVX-512 flags, where the compiler may widen the plain loops) and scalar loops otherwise. The choice
is logged once (``host.cpu``).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from importlib import resources
from typing import Any, Callable

import torch

from host.plugins.builtin_cpu.kernel_build import (
    CFLAGS,
    HEADERS,
    ISA_CANDIDATES,
    LDFLAGS,
    PREBUILT_PREFIX,
    SCALAR,
    SOURCES,
    isa_flags_of,
    isa_names,
    probe_runs,
    sources_hash,
    stage_sources,
)

logger = logging.getLogger("host.cpu")


JIT_MODULE_NAME = "host_cpu_kernels_v12"
"""The first-use build's module name (torch keeps its build folder under this name)."""


def kernel_sources() -> list[str]:
    """The text of each of :data:`SOURCES` and then :data:`HEADERS`, read from the installed package
    (``csrc/``)."""
    folder = resources.files(__package__).joinpath("csrc")
    return [folder.joinpath(name).read_text(encoding="utf-8") for name in (*SOURCES, *HEADERS)]


def _stage_sources(build_directory: str) -> list[str]:
    """Copies the sources out of the installed package into ``build_directory/csrc`` with the
    generated bindings (:func:`~host.plugins.builtin_cpu.kernel_build.stage_sources`); returns the
    translation units to compile."""
    return stage_sources(os.path.join(build_directory, "csrc"), kernel_sources())


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


_ISA: list[tuple[str, ...]] = []


def _probe_cache_key(compiler: str) -> str:
    """What the probe's answer depends on: the CPU (model and flags as the kernel reports them;
    the probe still decides), the compiler, and the candidates."""
    import hashlib

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = sorted({line for line in f if line.startswith(("model name", "flags", "vendor_id"))})
    except OSError:
        cpu = [os.uname().machine]
    text = "\n".join([*cpu, shutil.which(compiler) or compiler, repr(ISA_CANDIDATES)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _probe_cache_path() -> str:
    from torch.utils.cpp_extension import get_default_build_root

    return os.path.join(get_default_build_root(), "host_isa_probe.json")


def _cached_probe(key: str, probe: Callable[[], Any]) -> Any:
    """``probe()``'s answer, kept in ``host_isa_probe.json`` under ``key`` (probes cost seconds)."""
    import json

    path, cached = _probe_cache_path(), {}
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return cached[key]
    answer = probe()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({**cached, key: answer}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # no cache: the next process probes again
    return answer


def _forced_isa() -> str | None:
    """``HOST_CPU_ISA`` when set (checked: a ``ValueError`` names the choices), else ``None``."""
    forced = os.environ.get("HOST_CPU_ISA", "").strip().lower()
    if not forced:
        return None
    if forced not in isa_names():
        raise ValueError(f"HOST_CPU_ISA={forced!r} is not one of {', '.join(isa_names())}")
    return forced


def isa_flags() -> tuple[str, ...]:
    """The ``-m`` flags of a first-use kernel build: the widest of AVX-512 (F, BW, VL, VNNI), AVX2
    (+ FMA, F16C) whose probe program really runs here, else none (the kernels' scalar loops). The
    probe costs a few seconds of compiling, so its answer is kept next to torch's extension builds
    (``host_isa_probe.json``, keyed by the CPU and the compiler) and per process;
    ``HOST_CPU_ISA=avx2|avx512|scalar`` skips the probe."""
    if _ISA:
        return _ISA[0]
    forced = _forced_isa()
    if forced:
        chosen = isa_flags_of(forced)
    else:
        compiler = os.environ.get("CXX", "c++")
        chosen = tuple(_cached_probe(
            _probe_cache_key(compiler),
            lambda: list(next((flags for name, flags, _ in ISA_CANDIDATES if probe_runs(name)), ())),
        ))
    logger.info("CPU kernel instruction set: %s", " ".join(chosen) or "scalar (no AVX2 probe ran here)")
    _ISA.append(chosen)
    return chosen


def _prebuilt_runs(path: str) -> bool:
    """Whether the prebuilt module at ``path`` runs here: its ``isa_probe()`` executed in a child
    process (an instruction the CPU lacks kills the child, not this process); kept in the probe
    cache under the CPU and the module file."""
    import subprocess

    stat = os.stat(path)
    key = f"{_probe_cache_key(os.environ.get('CXX', 'c++'))}:{path}:{stat.st_size}:{stat.st_mtime_ns}"
    code = (
        "import sys, torch, importlib.util as u\n"
        "spec = u.spec_from_file_location(sys.argv[2], sys.argv[1]); m = u.module_from_spec(spec)\n"
        "spec.loader.exec_module(m); sys.exit(0 if m.isa_probe() == 1 else 1)\n"
    )
    name = f"{__package__}.{os.path.basename(path).split('.')[0]}"

    def probe() -> bool:
        try:
            return subprocess.run([sys.executable, "-c", code, path, name], capture_output=True, timeout=300).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    return bool(_cached_probe(key, probe))


def prebuilt_module() -> Any | None:
    """The module ``pip install`` built for the widest instruction set that runs here (or for
    ``HOST_CPU_ISA``) among those built from the installed sources; else ``None`` (then
    :func:`cpu_kernels` builds one)."""
    import importlib
    import importlib.util

    forced = _forced_isa()
    for isa in [forced] if forced else isa_names():
        spec = importlib.util.find_spec(f"{__package__}.{PREBUILT_PREFIX}{isa}")
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            continue
        if not forced and isa != SCALAR and not _prebuilt_runs(spec.origin):
            continue
        module = importlib.import_module(spec.name)
        if getattr(module, "sources_hash", None) == sources_hash(kernel_sources()):
            return module
        logger.info(
            "The prebuilt CPU kernels %s were built from other sources than the installed ones; not using them "
            "(reinstall the package, e.g. make install, to prebuild them again)", os.path.basename(spec.origin),
        )
    return None


_MODULE: list[Any] = []  # [module or None] once attempted in this process


def cpu_kernels() -> Any | None:
    """The compiled kernel module (the functions of
    :data:`~host.plugins.builtin_cpu.kernel_build.FUNCTIONS`): the prebuilt one that fits
    (:func:`prebuilt_module`), else one built here on first use; ``None`` when the kernels are
    disabled (``HOST_CPU_KERNELS=0``) or cannot be built here."""
    if _MODULE:
        return _MODULE[0]
    module = None
    if os.environ.get("HOST_CPU_KERNELS", "1") != "0":
        try:
            module = prebuilt_module()
            if module is not None:
                logger.info("CPU kernels for %s (prebuilt: %s)", module.kernels_isa(), os.path.basename(module.__file__))
            else:
                from torch.utils.cpp_extension import _get_build_directory, load

                _ensure_ninja_on_path()
                isa = isa_flags()
                build_directory = _get_build_directory(JIT_MODULE_NAME, verbose=False)
                module = load(
                    name=JIT_MODULE_NAME,
                    sources=_stage_sources(build_directory),
                    build_directory=build_directory,
                    extra_cflags=[*CFLAGS, *isa],
                    extra_ldflags=list(LDFLAGS),
                    verbose=False,
                )
                logger.info("CPU kernels built for %s", module.kernels_isa())
        except Exception as exc:  # noqa: BLE001 - fall back to the torch paths, loudly
            logger.warning("CPU kernels could not be built (%s: %s); using the torch paths", type(exc).__name__, exc)
            module = None
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
