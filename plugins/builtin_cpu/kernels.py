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
- ``rms_norm`` and ``fused_add_rms_norm_`` (residual add and norm in one pass, in place),
  ``rotary_neox_`` (in-place rotate-half RoPE from the cos/sin table), ``silu_and_mul``: each
  replaces three to eight small torch ops whose dispatch cost dominates at decode sizes.

The C++ lives in ``csrc/*.cpp`` (shipped as package data, listed in :data:`SOURCES`). The build
needs a C++ compiler and ``ninja``; torch keeps the build (``~/.cache/torch_extensions``) and
rebuilds only when the sources or the flags change. If the build fails, :func:`cpu_kernels`
returns ``None`` (with one warning naming the error) and every caller keeps its pure-torch
path. Set ``HOST_CPU_KERNELS=0`` to use the torch paths unconditionally.
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

# The C++ sources (package data under csrc/), compiled as one translation unit in this order:
# each part uses what the parts before it define.
SOURCES = ("vector_math.cpp", "paged_decode.cpp", "linear_small_m.cpp", "elementwise.cpp", "llama_decode.cpp")


def kernel_sources() -> list[str]:
    """The text of each of :data:`SOURCES`, read from the installed package (``csrc/``)."""
    folder = resources.files(__package__).joinpath("csrc")
    return [folder.joinpath(name).read_text(encoding="utf-8") for name in SOURCES]


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


_FUNCTIONS = ["paged_decode", "linear_small_m", "rms_norm", "fused_add_rms_norm_", "rotary_neox_", "silu_and_mul", "llama_decode"]
_MODULE: list[Any] = []  # [module or None] once attempted in this process


def cpu_kernels() -> Any | None:
    """The compiled kernel module (functions named in ``_FUNCTIONS``), or ``None`` when the
    kernels are disabled (``HOST_CPU_KERNELS=0``) or cannot be built here."""
    if _MODULE:
        return _MODULE[0]
    module = None
    if os.environ.get("HOST_CPU_KERNELS", "1") != "0":
        try:
            from torch.utils.cpp_extension import load_inline

            _ensure_ninja_on_path()
            module = load_inline(
                name="host_cpu_kernels_v7",
                cpp_sources=kernel_sources(),
                functions=_FUNCTIONS,
                # -fopenmp: at::parallel_for is an OpenMP region compiled into this module
                extra_cflags=["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - fall back to the torch paths, loudly
            logger.warning("CPU kernels could not be built (%s: %s); using the torch paths", type(exc).__name__, exc)
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
