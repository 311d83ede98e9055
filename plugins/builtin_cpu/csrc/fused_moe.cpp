// host_cpu_kernels: fused_moe, every token through its chosen experts in one call (float32).
//
// The contract is host_moe::fused_experts' (core/moe/fused_experts.py): x [T, H], w13 [E, 2I, H]
// (gate rows then up rows), w2 [E, H, I], topk_weights float [T, k], topk_ids int32 [T, k] (local
// expert slots, -1: skip), activation 0 silu / 1 gelu / 2 swigluoai (alpha, limit), optional
// biases w13_bias [E, 2I], w2_bias [E, H].
//
// 1. The token-choices are sorted by expert (a counting sort; within an expert in token order).
// 2. Gate/up: the work is (expert, 4 intermediate rows); each item reads its 4 gate and 4 up
//    rows of w13 once and computes them for every token of the expert (8 accumulators per
//    token, the x row loaded once per 8 columns), then the activation -> act[choice, I].
// 3. Down: (expert, 4 hidden rows) items read their 4 rows of w2 once for every token of the
//    expert -> y[choice, H], scaled by the routing weight.
// 4. Each token sums its choices' rows in ascending expert order (the reference's order).
// An expert with many token-choices (a prefill) runs as two GEMMs of its gathered rows instead.
// Every expert's weights are streamed from memory once per call, whatever its token count.

#include "host_cpu.h"

namespace {

constexpr int64_t kGemmTokens = 48;  // an expert with this many token-choices or more: GEMMs

inline float act_scalar(float g, float u, int64_t activation, float alpha, float limit) {
  if (activation == 0) return g / (1.f + std::exp(-g)) * u;
  if (activation == 1) return 0.5f * g * (1.f + std::erf(g * 0.70710678118654752f)) * u;
  g = std::min(g, limit);
  u = std::max(std::min(u, limit), -limit);
  return (u + 1.f) * (g / (1.f + std::exp(-g * alpha)));
}

// out[m][r] = dot(x row m, rows r of w) for R = 4 rows of w starting at w0 (row stride K), M rows of x.
template <int R>
inline void dots(const float* const* xrows, int64_t M, const float* w0, int64_t K, float* out /* [M][R] */) {
#ifdef HOST_AVX2
  if (K % 8 == 0) {
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = xrows[m];
      __m256 acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; k += 8) {
        const __m256 xv = _mm256_loadu_ps(xr + k);
        for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + r * K + k), xv, acc[r]);
      }
      for (int r = 0; r < R; ++r) out[m * R + r] = hsum256(acc[r]);
    }
    return;
  }
#endif
  for (int64_t m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) out[m * R + r] = dot(xrows[m], w0 + r * K, K);
}

}  // namespace

torch::Tensor fused_moe(torch::Tensor x, torch::Tensor w13, torch::Tensor w2, torch::Tensor topk_weights,
                        torch::Tensor topk_ids, int64_t activation, c10::optional<torch::Tensor> w13_bias,
                        c10::optional<torch::Tensor> w2_bias, double alpha, double limit) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w13.scalar_type() == torch::kFloat32 &&
                  w2.scalar_type() == torch::kFloat32 && topk_weights.scalar_type() == torch::kFloat32 &&
                  topk_ids.scalar_type() == torch::kInt32,
              "fused_moe: float32 x and weights, float32 topk_weights, int32 topk_ids");
  TORCH_CHECK(x.dim() == 2 && w13.dim() == 3 && w2.dim() == 3 && topk_ids.dim() == 2, "fused_moe: shapes");
  x = x.contiguous();
  TORCH_CHECK(w13.is_contiguous() && w2.is_contiguous(), "fused_moe: contiguous weights");
  auto ids_c = topk_ids.contiguous();
  auto wts_c = topk_weights.contiguous();
  const int64_t T = x.size(0), H = x.size(1), E = w13.size(0), I2 = w13.size(1), I = I2 / 2, k = topk_ids.size(1);
  TORCH_CHECK(w13.size(2) == H && w2.size(0) == E && w2.size(1) == H && w2.size(2) == I, "fused_moe: weight shapes");
  torch::Tensor b13_t, b2_t;  // kept alive while the raw pointers below are used
  if (w13_bias.has_value() && w13_bias->defined()) b13_t = w13_bias->contiguous().to(torch::kFloat32);
  if (w2_bias.has_value() && w2_bias->defined()) b2_t = w2_bias->contiguous().to(torch::kFloat32);
  const float* b13 = b13_t.defined() ? b13_t.data_ptr<float>() : nullptr;
  const float* b2 = b2_t.defined() ? b2_t.data_ptr<float>() : nullptr;
  auto out = torch::zeros({T, H}, x.options());
  if (T == 0) return out;
  const int32_t* ids = ids_c.data_ptr<int32_t>();
  const float* wts = wts_c.data_ptr<float>();

  // 1. counting sort of the choices by expert
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t c = 0; c < T * k; ++c)
    if (ids[c] >= 0) {
      TORCH_CHECK(ids[c] < E, "fused_moe: expert id ", ids[c], " >= ", E);
      start[ids[c] + 1]++;
    }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  const int64_t C = start[E];
  std::vector<int64_t> token(C), sorted_of(T * k, -1);
  std::vector<float> weight(C);
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t c = 0; c < T * k; ++c) {
      const int32_t e = ids[c];
      if (e < 0) continue;
      const int64_t s = fill[e]++;
      token[s] = c / k;
      weight[s] = wts[c];
      sorted_of[c] = s;
    }
  }
  // experts with many tokens (prefill) go through two GEMMs each (oneDNN, parallel inside), the
  // rest through the streaming items below
  std::vector<int64_t> hit, large;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t M = start[e + 1] - start[e];
    if (M >= kGemmTokens) large.push_back(e);
    else if (M > 0) hit.push_back(e);
  }
  const int64_t nh = static_cast<int64_t>(hit.size());
  if (nh == 0 && large.empty()) return out;

  const float* xp = x.data_ptr<float>();
  const float* w13p = w13.data_ptr<float>();
  const float* w2p = w2.data_ptr<float>();
  std::vector<float> act(static_cast<size_t>(C) * I), y(static_cast<size_t>(C) * H);
  const float fa = static_cast<float>(alpha), fl = static_cast<float>(limit);

  // 2. gate/up + activation: items (expert, 4 intermediate rows)
  const int64_t iblocks = (I + 3) / 4;
  at::parallel_for(0, nh * iblocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<const float*> xrows;
    std::vector<float> g, u;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t e = hit[item / iblocks], n0 = (item % iblocks) * 4;
      const int64_t s0 = start[e], M = start[e + 1] - s0;
      xrows.resize(M);
      for (int64_t m = 0; m < M; ++m) xrows[m] = xp + token[s0 + m] * H;
      g.assign(M * 4, 0.f);
      u.assign(M * 4, 0.f);
      const float* we = w13p + e * I2 * H;
      if (n0 + 4 <= I) {
        dots<4>(xrows.data(), M, we + n0 * H, H, g.data());
        dots<4>(xrows.data(), M, we + (I + n0) * H, H, u.data());
      } else {
        for (int64_t n = n0; n < I; ++n)
          for (int64_t m = 0; m < M; ++m) {
            g[m * 4 + (n - n0)] = dot(xrows[m], we + n * H, H);
            u[m * 4 + (n - n0)] = dot(xrows[m], we + (I + n) * H, H);
          }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < std::min<int64_t>(n0 + 4, I); ++n) {
          float gv = g[m * 4 + (n - n0)], uv = u[m * 4 + (n - n0)];
          if (b13) {
            gv += b13[e * I2 + n];
            uv += b13[e * I2 + I + n];
          }
          act[(s0 + m) * I + n] = act_scalar(gv, uv, activation, fa, fl);
        }
    }
  });

  // 3. down, scaled by the routing weight: items (expert, 4 hidden rows)
  const int64_t hblocks = (H + 3) / 4;
  at::parallel_for(0, nh * hblocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<const float*> arows;
    std::vector<float> d;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t e = hit[item / hblocks], h0 = (item % hblocks) * 4;
      const int64_t s0 = start[e], M = start[e + 1] - s0;
      arows.resize(M);
      for (int64_t m = 0; m < M; ++m) arows[m] = act.data() + (s0 + m) * I;
      d.assign(M * 4, 0.f);
      const float* we = w2p + e * H * I;
      if (h0 + 4 <= H) {
        dots<4>(arows.data(), M, we + h0 * I, I, d.data());
      } else {
        for (int64_t h = h0; h < H; ++h)
          for (int64_t m = 0; m < M; ++m) d[m * 4 + (h - h0)] = dot(arows[m], we + h * I, I);
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t h = h0; h < std::min<int64_t>(h0 + 4, H); ++h) {
          const float v = d[m * 4 + (h - h0)] + (b2 ? b2[e * H + h] : 0.f);
          y[(s0 + m) * H + h] = v * weight[s0 + m];
        }
    }
  });

  // 2-3 for the large experts: gathered rows, two GEMMs, the activation in between
  if (!large.empty()) {
    auto token_t = torch::from_blob(token.data(), {C}, torch::kInt64);
    auto weight_t = torch::from_blob(weight.data(), {C}, torch::kFloat32);
    auto act_t = torch::from_blob(act.data(), {C, I}, torch::kFloat32);
    auto y_t = torch::from_blob(y.data(), {C, H}, torch::kFloat32);
    for (int64_t e : large) {
      const int64_t s0 = start[e], M = start[e + 1] - s0;
      auto rows = x.index_select(0, token_t.narrow(0, s0, M));
      auto h = torch::matmul(rows, w13[e].t());
      if (b13) h.add_(b13_t.select(0, e));
      const float* hp = h.data_ptr<float>();
      float* ap = act.data() + s0 * I;
      at::parallel_for(0, M, 8, [&](int64_t b, int64_t en) {
        for (int64_t m = b; m < en; ++m)
          for (int64_t n = 0; n < I; ++n) ap[m * I + n] = act_scalar(hp[m * I2 + n], hp[m * I2 + I + n], activation, fa, fl);
      });
      auto d = torch::matmul(act_t.narrow(0, s0, M), w2[e].t());
      if (b2) d.add_(b2_t.select(0, e));
      y_t.narrow(0, s0, M).copy_(d.mul_(weight_t.narrow(0, s0, M).unsqueeze(1)));
    }
  }

  // 4. each token's choices summed in ascending expert order (= ascending sorted position)
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> pos;
    for (int64_t t = begin; t < end; ++t) {
      pos.clear();
      for (int64_t j = 0; j < k; ++j)
        if (sorted_of[t * k + j] >= 0) pos.push_back(sorted_of[t * k + j]);
      std::sort(pos.begin(), pos.end());
      float* orow = op + t * H;
      for (int64_t s : pos) {
        const float* yr = y.data() + s * H;
        for (int64_t h = 0; h < H; ++h) orow[h] += yr[h];
      }
    }
  });
  return out;
}
