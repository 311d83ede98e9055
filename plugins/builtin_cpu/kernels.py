"""Compiled CPU kernels, built on first use with the system C++ compiler.

All float32, OpenMP-parallel through ``at::parallel_for``:

- ``paged_decode``: single-token (decode) paged attention that reads K/V straight from the
  cache pages through the block table, instead of first gathering every page into a padded
  buffer: one pass over the keys for the scores, one over the values.
- ``linear_small_m``: ``x @ W^T (+ b)`` for a handful of rows (batch-1 and small-batch decode).
  oneDNN's GEMM spends more time on setup and blocking than on streaming the weights when
  ``x`` has one row; this kernel reads each weight row once with AVX2 FMAs and reaches the
  machine's read bandwidth (20.8 GB/s against oneDNN's 13.3 GB/s over SmolLM2-135M's weights).
- ``rms_norm`` and ``fused_add_rms_norm_`` (residual add and norm in one pass, in place),
  ``rotary_neox_`` (in-place rotate-half RoPE from the cos/sin table), ``silu_and_mul``: each
  replaces three to eight small torch ops whose dispatch cost dominates at decode sizes.

The build needs a C++ compiler and ``ninja``; if it fails, :func:`cpu_kernels` returns ``None``
(with one warning naming the error) and every caller keeps its pure-torch path. Set
``HOST_CPU_KERNELS=0`` to use the torch paths unconditionally.
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
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOST_AVX2 1
#endif
#include <algorithm>
#include <cmath>
#include <cstring>
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

#ifdef HOST_AVX2
static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}
#endif

// Without AVX2/FMA (other CPUs) the plain loops below are left to the compiler's vectorizer.
static inline float dot(const float* a, const float* b, int64_t K) {
  int64_t k = 0;
  float s = 0.f;
#ifdef HOST_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
  }
  s = hsum256(_mm256_add_ps(acc0, acc1));
#endif
  for (; k < K; ++k) s += a[k] * b[k];
  return s;
}

// y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]). Work is split over blocks of 4 weight rows; each
// block's rows are read from memory once and stay in L1 for the M rows of x.
torch::Tensor linear_small_m(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32,
              "linear_small_m: float32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear_small_m: shapes");
  TORCH_CHECK(x.stride(1) == 1 && w.is_contiguous(), "linear_small_m: contiguous rows");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), xs = x.stride(0);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N);
    bp = bias->data_ptr<float>();
  }
  const int64_t nblocks = (N + 3) / 4;
  at::parallel_for(0, nblocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n0 = blk * 4;
#ifdef HOST_AVX2
      if (n0 + 4 <= N && K % 8 == 0) {
        const float* w0 = wp + n0 * K;
        const float* w1 = w0 + K;
        const float* w2 = w1 + K;
        const float* w3 = w2 + K;
        for (int64_t m = 0; m < M; ++m) {
          const float* xr = xp + m * xs;
          __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
          for (int64_t k = 0; k < K; k += 8) {
            const __m256 xv = _mm256_loadu_ps(xr + k);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
          }
          float* yr = yp + m * N + n0;
          yr[0] = hsum256(a0) + (bp ? bp[n0] : 0.f);
          yr[1] = hsum256(a1) + (bp ? bp[n0 + 1] : 0.f);
          yr[2] = hsum256(a2) + (bp ? bp[n0 + 2] : 0.f);
          yr[3] = hsum256(a3) + (bp ? bp[n0 + 3] : 0.f);
        }
        continue;
      }
#endif
      {
        for (int64_t n = n0; n < std::min<int64_t>(n0 + 4, N); ++n)
          for (int64_t m = 0; m < M; ++m)
            yp[m * N + n] = dot(xp + m * xs, wp + n * K, K) + (bp ? bp[n] : 0.f);
      }
    }
  });
  return y;
}

// Normalizes one row in float32 like Hugging Face's RMSNorm: x * rsqrt(mean(x^2) + eps) * w.
static inline void norm_row(const float* x, const float* w, float* out, int64_t D, float eps) {
  const float ss = dot(x, x, D);
  int64_t d = 0;
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + eps);
  for (d = 0; d < D; ++d) out[d] = (x[d] * inv) * w[d];
}

// out[T, D] = rms_norm(x[T, D]) with rows of x at any stride.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32, "rms_norm: float32 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && w.is_contiguous() && w.numel() == x.size(1), "rms_norm: shapes");
  const int64_t T = x.size(0), D = x.size(1), xs = x.stride(0);
  auto out = torch::empty({T, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) norm_row(xp + t * xs, wp, op + t * D, D, static_cast<float>(eps));
  });
  return out;
}

// residual += x; x = rms_norm(residual) (both [T, D] contiguous, updated in place).
void fused_add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && residual.scalar_type() == torch::kFloat32 &&
              w.scalar_type() == torch::kFloat32, "fused_add_rms_norm_: float32 only");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && x.sizes() == residual.sizes() &&
              x.dim() == 2 && w.numel() == x.size(1), "fused_add_rms_norm_: shapes");
  const int64_t T = x.size(0), D = x.size(1);
  float* xp = x.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* xr = xp + t * D;
      float* rr = rp + t * D;
      for (int64_t d = 0; d < D; ++d) rr[d] += xr[d];
      norm_row(rr, wp, xr, D, static_cast<float>(eps));
    }
  });
}

// Rotate-half (NeoX) RoPE in place. x: [T, Hn, hd] with the head dim contiguous (token and
// head strides free); cache: [P, rot] rows of cos[rot/2] then sin[rot/2]; dims >= rot untouched.
void rotary_neox_(torch::Tensor x, torch::Tensor positions, torch::Tensor cache) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && cache.scalar_type() == torch::kFloat32, "rotary_neox_: float32 only");
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous(), "rotary_neox_: int64 positions");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && cache.is_contiguous() && positions.numel() == x.size(0),
              "rotary_neox_: shapes");
  const int64_t T = x.size(0), Hn = x.size(1), rot = cache.size(1), half = rot / 2;
  const int64_t ts = x.stride(0), hs = x.stride(1), P = cache.size(0);
  float* xp = x.data_ptr<float>();
  const int64_t* pp = positions.data_ptr<int64_t>();
  const float* cp = cache.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(pp[t] >= 0 && pp[t] < P, "rotary_neox_: position ", pp[t], " outside the table of ", P);
  at::parallel_for(0, T, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* cosr = cp + pp[t] * rot;
      const float* sinr = cosr + half;
      for (int64_t h = 0; h < Hn; ++h) {
        float* v = xp + t * ts + h * hs;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * cosr[i] - x2 * sinr[i];
          v[i + half] = x2 * cosr[i] + x1 * sinr[i];
        }
      }
    }
  });
}

// out[T, d] = silu(x[:, :d]) * x[:, d:] for x [T, 2d] with contiguous rows.
torch::Tensor silu_and_mul(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.stride(1) == 1, "silu_and_mul: float32 rows");
  const int64_t T = x.size(0), d = x.size(1) / 2, xs = x.stride(0);
  auto out = torch::empty({T, d}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 8, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* g = xp + t * xs;
      const float* u = g + d;
      float* o = op + t * d;
      for (int64_t i = 0; i < d; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
  return out;
}

// Copies the new tokens' K and V rows ([M, KVH, hd] views with contiguous rows) into the cache
// pages ([num_blocks, block_size, KVH, hd]) at the flat slots (block * block_size + offset).
static void write_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& kc, torch::Tensor& vc,
                     const int64_t* slots, int64_t M) {
  const int64_t BS = kc.size(1), row = kc.size(2) * kc.size(3);
  TORCH_CHECK(kc.stride(2) == kc.size(3) && kc.stride(3) == 1 && vc.stride(2) == vc.size(3) && vc.stride(3) == 1,
              "write_kv: cache rows must be contiguous");
  float* kp = kc.data_ptr<float>();
  float* vp = vc.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const int64_t s = slots[m];
    TORCH_CHECK(s >= 0 && s / BS < kc.size(0), "write_kv: slot ", s, " outside the cache");
    std::memcpy(kp + (s / BS) * kc.stride(0) + (s % BS) * kc.stride(1), k[m].data_ptr<float>(), row * sizeof(float));
    std::memcpy(vp + (s / BS) * vc.stride(0) + (s % BS) * vc.stride(1), v[m].data_ptr<float>(), row * sizeof(float));
  }
}

static inline c10::optional<torch::Tensor> opt(const torch::Tensor& t) {
  return t.numel() ? c10::optional<torch::Tensor>(t) : c10::nullopt;
}

// A whole decode step of a Llama-family decoder (Llama, Qwen2, Qwen3) for M single-token
// requests, in one call: the same kernels and the same arithmetic as the layer-by-layer path,
// without a Python round trip per op. weights holds 12 tensors per layer, in order:
// input norm, qkv weight, qkv bias, q norm, k norm, o weight, o bias, post-attention norm,
// gate_up weight, gate_up bias, down weight, down bias (an empty tensor: not present).
// kv_caches[l] is layer l's [2, num_blocks, block_size, KVH, hd] cache; windows[l] its sliding
// window (0: none). Returns the final-normed hidden states [M, D].
torch::Tensor llama_decode(torch::Tensor hidden, std::vector<torch::Tensor> weights,
                           std::vector<torch::Tensor> kv_caches, std::vector<int64_t> windows,
                           torch::Tensor positions, torch::Tensor slots, torch::Tensor block_table,
                           torch::Tensor seq_lens, torch::Tensor cos_sin, torch::Tensor final_norm,
                           int64_t H, int64_t KVH, int64_t hd, double eps, double scale) {
  const int64_t L = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 12 * L && static_cast<int64_t>(windows.size()) == L,
              "llama_decode: 12 weights and one window per layer");
  TORCH_CHECK(hidden.scalar_type() == torch::kFloat32 && hidden.is_contiguous() && hidden.dim() == 2);
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.is_contiguous());
  const int64_t M = hidden.size(0), qs = H * hd, kvs = KVH * hd;
  TORCH_CHECK(slots.numel() == M && positions.numel() == M && seq_lens.numel() == M && block_table.size(0) == M);
  torch::Tensor residual = hidden;
  torch::Tensor x;
  for (int64_t l = 0; l < L; ++l) {
    const torch::Tensor* w = weights.data() + 12 * l;
    if (l == 0) {
      x = rms_norm(residual, w[0], eps);
    } else {
      fused_add_rms_norm_(x, residual, w[0], eps);
    }
    torch::Tensor qkv = linear_small_m(x, w[1], opt(w[2]));  // [M, qs + 2 kvs]
    torch::Tensor q, k;
    if (w[3].numel()) {  // per-head q/k norm (Qwen3), then RoPE on the normed copies
      q = rms_norm(qkv.narrow(1, 0, qs).reshape({M * H, hd}), w[3], eps).view({M, H, hd});
      k = rms_norm(qkv.narrow(1, qs, kvs).reshape({M * KVH, hd}), w[4], eps).view({M, KVH, hd});
      rotary_neox_(q, positions, cos_sin);
      rotary_neox_(k, positions, cos_sin);
    } else {  // q and k adjacent in the projection: rotate them in place together
      rotary_neox_(qkv.narrow(1, 0, qs + kvs).view({M, H + KVH, hd}), positions, cos_sin);
      q = qkv.narrow(1, 0, qs).reshape({M, H, hd});
      k = qkv.narrow(1, qs, kvs).view({M, KVH, hd});
    }
    torch::Tensor v = qkv.narrow(1, qs + kvs, kvs).view({M, KVH, hd});
    torch::Tensor kc = kv_caches[l].select(0, 0), vc = kv_caches[l].select(0, 1);
    write_kv(k, v, kc, vc, slots.data_ptr<int64_t>(), M);
    torch::Tensor attn = paged_decode(q.contiguous(), kc, vc, block_table, seq_lens, scale, windows[l]);
    x = linear_small_m(attn.view({M, qs}), w[5], opt(w[6]));
    fused_add_rms_norm_(x, residual, w[7], eps);
    x = linear_small_m(silu_and_mul(linear_small_m(x, w[8], opt(w[9]))), w[10], opt(w[11]));
  }
  fused_add_rms_norm_(x, residual, final_norm, eps);
  return x;
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
                name="host_cpu_kernels_v4",
                cpp_sources=[_SOURCE],
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


def paged_decode_kernel() -> Callable[..., Any] | None:
    """The compiled ``paged_decode`` function, or ``None`` when the kernels are unavailable."""
    module = cpu_kernels()
    return None if module is None else module.paged_decode
