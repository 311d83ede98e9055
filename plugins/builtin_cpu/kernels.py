"""Compiled CPU kernels, built on first use with the system C++ compiler.

``paged_decode`` is single-token (decode) paged attention that reads K/V straight from the
cache pages through the block table, instead of first gathering every page into a padded
buffer: one pass over the keys for the scores, one over the values, float32 throughout. The
build needs a C++ compiler and ``ninja``; if it fails, :func:`paged_decode_kernel` returns
``None`` (with one warning naming the error) and the backend keeps its pure-torch path.
Set ``HOST_CPU_KERNELS=0`` to use the torch path unconditionally.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import Any, Callable

logger = logging.getLogger("host.cpu")

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

// q: [R, H, D] float32 contiguous; k_cache / v_cache: [num_blocks, block_size, KVH, D] views
// (last dim contiguous); block_table: [R, max_blocks] int32; seq_lens: [R] int32.
// Request r attends its last query token (position seq_lens[r]-1) to positions
// [max(0, seq_lens[r]-window), seq_lens[r]) (window <= 0: no window).
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                           int64_t window) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32 &&
              v_cache.scalar_type() == torch::kFloat32, "paged_decode: float32 only");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32,
              "paged_decode: int32 block table and seq lens");
  TORCH_CHECK(q.is_contiguous() && block_table.is_contiguous() && seq_lens.is_contiguous());
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "paged_decode: head dim must be contiguous");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t BS = k_cache.size(1), KVH = k_cache.size(2);
  TORCH_CHECK(H % KVH == 0);
  const int64_t rep = H / KVH, MB = block_table.size(1);
  const int64_t ks0 = k_cache.stride(0), ks1 = k_cache.stride(1), ks2 = k_cache.stride(2);
  const int64_t vs0 = v_cache.stride(0), vs1 = v_cache.stride(1), vs2 = v_cache.stride(2);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  const int32_t* sl = seq_lens.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, R * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(rep * D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t r = idx / KVH, h = idx % KVH;
      const int64_t L = sl[r];
      const int64_t start = window > 0 ? std::max<int64_t>(0, L - window) : 0;
      const int64_t n = L - start;
      scores.assign(rep * n, 0.f);
      const float* qh = qp + (r * H + h * rep) * D;
      for (int64_t t = start; t < L; ++t) {
        const int64_t blk = bt[r * MB + t / BS];
        const float* kt = kp + blk * ks0 + (t % BS) * ks1 + h * ks2;
        for (int64_t j = 0; j < rep; ++j) {
          const float* qj = qh + j * D;
          float s = 0.f;
          for (int64_t d = 0; d < D; ++d) s += qj[d] * kt[d];
          scores[j * n + (t - start)] = s * fscale;
        }
      }
      for (int64_t j = 0; j < rep; ++j) {
        float* sj = scores.data() + j * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, sj[i]);
        float sum = 0.f;
        for (int64_t i = 0; i < n; ++i) { sj[i] = std::exp(sj[i] - m); sum += sj[i]; }
        const float inv = 1.f / sum;
        for (int64_t i = 0; i < n; ++i) sj[i] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = start; t < L; ++t) {
        const int64_t blk = bt[r * MB + t / BS];
        const float* vt = vp + blk * vs0 + (t % BS) * vs1 + h * vs2;
        for (int64_t j = 0; j < rep; ++j) {
          const float w = scores[j * n + (t - start)];
          float* aj = acc.data() + j * D;
          for (int64_t d = 0; d < D; ++d) aj[d] += w * vt[d];
        }
      }
      float* oh = op + (r * H + h * rep) * D;
      std::copy(acc.begin(), acc.end(), oh);
    }
  });
  return out;
}
"""

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


_KERNEL: list[Any] = []  # [callable or None] once attempted in this process


def paged_decode_kernel() -> Callable[..., Any] | None:
    """The compiled ``paged_decode`` function, or ``None`` when it cannot be built here."""
    if _KERNEL:
        return _KERNEL[0]
    fn = None
    if os.environ.get("HOST_CPU_KERNELS", "1") != "0":
        try:
            from torch.utils.cpp_extension import load_inline

            _ensure_ninja_on_path()

            module = load_inline(
                name="host_cpu_paged_decode_v2",
                cpp_sources=[_SOURCE],
                functions=["paged_decode"],
                # -fopenmp: at::parallel_for is an OpenMP region compiled into this module
                extra_cflags=["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
            fn = module.paged_decode
        except Exception as exc:  # noqa: BLE001 - fall back to the torch path, loudly
            logger.warning("CPU attention kernel could not be built (%s: %s); using the torch path", type(exc).__name__, exc)
    _KERNEL.append(fn)
    return fn
