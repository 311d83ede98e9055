// host_cpu_kernels: rms_norm, fused_add_rms_norm_, rotary_neox_ and silu_and_mul, one pass each per row.

#include "host_cpu.h"

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
