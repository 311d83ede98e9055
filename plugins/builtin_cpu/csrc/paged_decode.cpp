// host_cpu_kernels: paged_decode, single-token paged attention reading K/V in place through the block table.

#include "host_cpu.h"

// q: [R, H, D] float32 contiguous; k_cache / v_cache: [num_blocks, block_size, KVH, D] views
// (last dim contiguous); block_table: [R, max_blocks] int32; seq_lens: [R] int32.
// Request r attends its last query token (position seq_lens[r]-1) to positions
// [max(0, seq_lens[r]-window), seq_lens[r]) (window <= 0: no window). softcap > 0 soft-caps each
// scaled logit s to softcap * tanh(s / softcap) before the softmax (Gemma 2); softcap <= 0: off.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                           int64_t window, double softcap) {
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
  const float cap = static_cast<float>(softcap), inv_cap = softcap > 0 ? static_cast<float>(1.0 / softcap) : 0.f;
  [[maybe_unused]] const bool wide = D % 16 == 0;  // the AVX-512 loops (where built) take head sizes in 16s

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
#ifdef __AVX512F__
      if (wide) {  // per head: its query row against each key, 16 lanes at a time
        for (int64_t j = 0; j < rep; ++j) {
          const float* qj = qh + j * D;
          float* sj = scores.data() + j * n;
          for (int64_t t = it.t0; t < it.t1; ++t) {
            const float* kt = kp + bt[it.r * MB + t / BS] * ks0 + (t % BS) * ks1 + it.h * ks2;
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qj), _mm512_loadu_ps(kt));
            for (int64_t d = 16; d < D; d += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + d), _mm512_loadu_ps(kt + d), a);
            sj[t - it.t0] = _mm512_reduce_add_ps(a) * fscale;
          }
        }
      } else
#endif
      for (int64_t t = it.t0; t < it.t1; ++t) {
        const int64_t blk = bt[it.r * MB + t / BS];
        const float* kt = kp + blk * ks0 + (t % BS) * ks1 + it.h * ks2;
        for (int64_t j = 0; j < rep; ++j) scores[j * n + (t - it.t0)] = dot(qh + j * D, kt, D) * fscale;
      }
      if (cap > 0.f) {  // soft-capping: the scaled logits through cap * tanh(s / cap)
        for (int64_t i = 0; i < rep * n; ++i) scores[i] = cap * std::tanh(scores[i] * inv_cap);
      }
      for (int64_t j = 0; j < rep; ++j) {
        float* sj = scores.data() + j * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, sj[i]);
        part_m[idx * rep + j] = m;
        part_l[idx * rep + j] = exp_shifted(sj, sj, n, m);
      }
      float* acc = part_acc.data() + idx * rep * D;
#ifdef __AVX512F__
      if (wide) {  // per head and 64 columns: the weighted sum of the values held in 4 registers
        for (int64_t j = 0; j < rep; ++j) {
          const float* sj = scores.data() + j * n;
          for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int64_t chunks = std::min<int64_t>(64, D - d0) / 16;
            __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t t = it.t0; t < it.t1; ++t) {
              const float* vt = vp + bt[it.r * MB + t / BS] * vs0 + (t % BS) * vs1 + it.h * vs2 + d0;
              const __m512 pt = _mm512_set1_ps(sj[t - it.t0]);
              for (int64_t c = 0; c < chunks; ++c) a[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vt + 16 * c), a[c]);
            }
            for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(acc + j * D + d0 + 16 * c, a[c]);
          }
        }
      } else
#endif
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
