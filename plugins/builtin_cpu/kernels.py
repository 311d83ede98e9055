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

import torch

logger = logging.getLogger("host.cpu")

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOST_AVX2 1
#endif

#ifdef HOST_AVX2
// exp(x) for 8 floats: range reduction to 2^n * exp(r), |r| <= ln2/2, and a degree-5
// polynomial (the Cephes expf scheme; relative error about 2e-7). Inputs are clamped to
// [-88.38, 88.38], so -inf gives ~0 and no NaN appears.
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}
#endif

// out[i] = exp(in[i] - shift) for i < n; returns their sum.
static inline float exp_shifted(const float* in, float* out, int64_t n, float shift) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef HOST_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(in + i), sh));
    _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float tmp[8];
  _mm256_storeu_ps(tmp, acc);
  for (int j = 0; j < 8; ++j) sum += tmp[j];
#endif
  for (; i < n; ++i) {
    out[i] = std::exp(in[i] - shift);
    sum += out[i];
  }
  return sum;
}
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// a[d] += w * v[d] for d < D
static inline void axpy(float* a, const float* v, float w, int64_t D) {
  int64_t d = 0;
#ifdef HOST_AVX2
  const __m256 wv = _mm256_set1_ps(w);
  for (; d + 8 <= D; d += 8) _mm256_storeu_ps(a + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(a + d)));
#endif
  for (; d < D; ++d) a[d] += w * v[d];
}

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

  // Work items are (request, KV head, span of positions). When there are fewer (request, KV
  // head) pairs than twice the threads (batch-1 decode), long sequences are split into spans
  // of kSpan positions so every thread gets work (split-K, as flash-decoding does); each span
  // keeps its own max, exp-sum and unnormalized output, merged below.
  constexpr int64_t kSpan = 128;
  struct Item { int64_t r, h, t0, t1; };
  std::vector<Item> items;
  std::vector<int64_t> first(R * KVH + 1, 0);
  const bool split = R * KVH < 2 * at::get_num_threads();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t L = sl[r];
    const int64_t start = window > 0 ? std::max<int64_t>(0, L - window) : 0;
    const int64_t span = split ? kSpan : std::max<int64_t>(L - start, 1);
    for (int64_t h = 0; h < KVH; ++h) {
      first[r * KVH + h] = static_cast<int64_t>(items.size());
      for (int64_t t0 = start; t0 < L; t0 += span) items.push_back({r, h, t0, std::min(L, t0 + span)});
    }
  }
  first[R * KVH] = static_cast<int64_t>(items.size());
  const int64_t NI = static_cast<int64_t>(items.size());
  std::vector<float> part_m(NI * rep), part_l(NI * rep), part_acc(NI * rep * D, 0.f);

  at::parallel_for(0, NI, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t idx = begin; idx < end; ++idx) {
      const Item it = items[idx];
      const int64_t n = it.t1 - it.t0;
      scores.resize(rep * n);
      const float* qh = qp + (it.r * H + it.h * rep) * D;
      for (int64_t t = it.t0; t < it.t1; ++t) {
        const int64_t blk = bt[it.r * MB + t / BS];
        const float* kt = kp + blk * ks0 + (t % BS) * ks1 + it.h * ks2;
        for (int64_t j = 0; j < rep; ++j) scores[j * n + (t - it.t0)] = dot(qh + j * D, kt, D) * fscale;
      }
      for (int64_t j = 0; j < rep; ++j) {
        float* sj = scores.data() + j * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, sj[i]);
        part_m[idx * rep + j] = m;
        part_l[idx * rep + j] = exp_shifted(sj, sj, n, m);
      }
      float* acc = part_acc.data() + idx * rep * D;
      for (int64_t t = it.t0; t < it.t1; ++t) {
        const int64_t blk = bt[it.r * MB + t / BS];
        const float* vt = vp + blk * vs0 + (t % BS) * vs1 + it.h * vs2;
        for (int64_t j = 0; j < rep; ++j) axpy(acc + j * D, vt, scores[j * n + (t - it.t0)], D);
      }
    }
  });

  // merge the spans of each (request, KV head): rescale by exp(m_span - m_max)
  for (int64_t rh = 0; rh < R * KVH; ++rh) {
    const int64_t r = rh / KVH, h = rh % KVH;
    float* oh = op + (r * H + h * rep) * D;
    for (int64_t j = 0; j < rep; ++j) {
      float* o = oh + j * D;
      std::fill(o, o + D, 0.f);
      float m = -INFINITY;
      for (int64_t i = first[rh]; i < first[rh + 1]; ++i) m = std::max(m, part_m[i * rep + j]);
      float den = 0.f;
      for (int64_t i = first[rh]; i < first[rh + 1]; ++i) {
        const float c = std::exp(part_m[i * rep + j] - m);
        den += c * part_l[i * rep + j];
        axpy(o, part_acc.data() + (i * rep + j) * D, c, D);
      }
      const float inv = den > 0.f ? 1.f / den : 0.f;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
  }
  return out;
}

// y[M, N] = x[M, K] @ W^T (+ bias[N]) for a few rows of x. W is either plain, w [N, K], or
// blocked, w [N/4, K/8, 4, 8] (see block_weight): block b holds rows 4b..4b+3 interleaved in
// 8-float chunks, so the kernel streams it as one contiguous run of memory (about 12% faster
// than four row streams on the machines we measured). Work is split over blocks of 4 rows; each
// block is read from memory once and stays in L1 for the M rows of x.
torch::Tensor linear_small_m(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32,
              "linear_small_m: float32 only");
  const bool blocked = w.dim() == 4;
  TORCH_CHECK(x.dim() == 2 && (w.dim() == 2 || (blocked && w.size(2) == 4 && w.size(3) == 8)), "linear_small_m: shapes");
  const int64_t K = blocked ? w.size(1) * 8 : w.size(1);
  const int64_t N = blocked ? w.size(0) * 4 : w.size(0);
  TORCH_CHECK(x.size(1) == K, "linear_small_m: x has ", x.size(1), " columns, the weight ", K);
  TORCH_CHECK(x.stride(1) == 1 && w.is_contiguous(), "linear_small_m: contiguous rows");
  const int64_t M = x.size(0), xs = x.stride(0);
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
        // plain: row r at w0 + r*K + k; blocked: chunk k/8 of row r at w0 + k*4 + r*8
        const int64_t rs = blocked ? 8 : K, ks = blocked ? 4 : 1;
        for (int64_t m = 0; m < M; ++m) {
          const float* xr = xp + m * xs;
          __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
          for (int64_t k = 0; k < K; k += 8) {
            const __m256 xv = _mm256_loadu_ps(xr + k);
            const float* c = w0 + k * ks;
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(c), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(c + rs), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(c + 2 * rs), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(c + 3 * rs), xv, a3);
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
      for (int64_t n = n0; n < std::min<int64_t>(n0 + 4, N); ++n) {
        for (int64_t m = 0; m < M; ++m) {
          const float* xr = xp + m * xs;
          float acc = 0.f;
          if (blocked) {  // element (n, k) of the blocked layout
            const float* base = wp + (n / 4) * 4 * K + (n % 4) * 8;
            for (int64_t k = 0; k < K; ++k) acc += base[(k / 8) * 32 + (k % 8)] * xr[k];
          } else {
            acc = dot(xr, wp + n * K, K);
          }
          yp[m * N + n] = acc + (bp ? bp[n] : 0.f);
        }
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
      int64_t i = 0;
#ifdef HOST_AVX2
      const __m256 one = _mm256_set1_ps(1.f);
      for (; i + 8 <= d; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
      }
#endif
      for (; i < d; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
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
                name="host_cpu_kernels_v7",
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
