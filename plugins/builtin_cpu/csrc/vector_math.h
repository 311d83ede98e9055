// host_cpu_kernels: the vector helpers every kernel uses, included by host_cpu.h after its ISA
// macros (HOST_AVX2 and the rest): exp8 / exp_shifted (AVX2 exp), hsum256, dot and axpy (AVX2 +
// FMA where the CPU has them, plain loops otherwise). They are static inline here, not defined in
// one .cpp, so each translation unit inlines them into its loops as before.

#pragma once

#include "host_cpu.h"

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
