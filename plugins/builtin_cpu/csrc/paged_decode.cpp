// host_cpu_kernels: paged_decode, single-token paged attention reading K/V in place through the block table.

#include "host_cpu.h"

namespace {

// How many rows ahead the loops prefetch: a page's rows arrive from memory while the rows
// before them are computed (the pages of one sequence are scattered, so the hardware
// prefetcher cannot follow them across pages).
constexpr int64_t kAhead = 16;
// The value rows are summed in tiles of this many positions, small enough to stay in L1 while
// every query head and column chunk of the group passes over them.
constexpr int64_t kTile = 48;

// a row of D floats into L1, one prefetch per 64-byte line
inline void prefetch_row(const float* row, int64_t D) {
  for (int64_t d = 0; d < D; d += 16) __builtin_prefetch(row + d, 0, 3);
}

#ifdef HOST_AVX2
// scores[j * n + i] = scale * <q_j, row_i> for the NJ query heads q_j = q + j * D (D % 8 == 0).
template <int NJ>
void scores_of(const float* q, const float* const* rows, int64_t n, int64_t D, float scale, float* scores,
               int64_t stride) {
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_row(rows[i + kAhead], D);
    const float* kt = rows[i];
    __m256 a[NJ];
    for (int j = 0; j < NJ; ++j) a[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 kv = _mm256_loadu_ps(kt + d);
      for (int j = 0; j < NJ; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * D + d), kv, a[j]);
    }
    for (int j = 0; j < NJ; ++j) scores[j * stride + i] = hsum256(a[j]) * scale;
  }
}

// acc[j * D + d0 + c] += sum over i < n of p[j * stride + i] * rows[i][d0 + c], for the NJ heads
// and the 8 * C columns from d0, the sums held in NJ * C registers; each (head, column) is
// summed over i in order, whatever NJ and C are.
template <int NJ, int C>
void values_of(const float* p, int64_t stride, const float* const* rows, int64_t n, int64_t d0, int64_t D,
               float* acc, const float* const* ahead, int64_t n_ahead) {
  __m256 a[NJ][C];
  for (int j = 0; j < NJ; ++j)
    for (int c = 0; c < C; ++c) a[j][c] = _mm256_loadu_ps(acc + j * D + d0 + 8 * c);
  for (int64_t i = 0; i < n; ++i) {
    if (i < n_ahead) prefetch_row(ahead[i], D);
    __m256 w[NJ];
    for (int j = 0; j < NJ; ++j) w[j] = _mm256_broadcast_ss(p + j * stride + i);
    for (int c = 0; c < C; ++c) {
      const __m256 v = _mm256_loadu_ps(rows[i] + d0 + 8 * c);
      for (int j = 0; j < NJ; ++j) a[j][c] = _mm256_fmadd_ps(w[j], v, a[j][c]);
    }
  }
  for (int j = 0; j < NJ; ++j)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + j * D + d0 + 8 * c, a[j][c]);
}
#endif

// The scores of the rep query heads q (rep rows of D) against n key rows: scores[j * n + i].
// Register-blocked where AVX2 is built in and D % 8 == 0; plain loops otherwise.
void decode_scores(const float* q, const float* const* rows, int64_t n, int64_t D, int64_t rep, float scale,
                   float* scores) {
#ifdef HOST_AVX2
  if (D % 8 == 0) {
    for (int64_t j0 = 0; j0 < rep; j0 += 4) {
      const float* qj = q + j0 * D;
      float* sj = scores + j0 * n;
      switch (std::min<int64_t>(4, rep - j0)) {
        case 1: scores_of<1>(qj, rows, n, D, scale, sj, n); break;
        case 2: scores_of<2>(qj, rows, n, D, scale, sj, n); break;
        case 3: scores_of<3>(qj, rows, n, D, scale, sj, n); break;
        default: scores_of<4>(qj, rows, n, D, scale, sj, n); break;
      }
    }
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < rep; ++j) scores[j * n + i] = dot(q + j * D, rows[i], D) * scale;
}

// acc[j * D + d] = sum over i of p[j * n + i] * rows[i][d] for the rep heads (acc starts at 0).
// Where AVX2 is built in and D % 8 == 0: tiles of kTile positions, each passed over by 2 query
// heads x 32 columns at a time (then 8-column chunks), the first pass over a tile prefetching
// the rows of the next one; plain loops otherwise.
void decode_values(const float* p, const float* const* rows, int64_t n, int64_t D, int64_t rep, float* acc) {
#ifdef HOST_AVX2
  if (D % 8 == 0) {
    for (int64_t i0 = 0; i0 < n; i0 += kTile) {
      const int64_t m = std::min(kTile, n - i0);
      const float* const* tile = rows + i0;
      int64_t n_ahead = std::max<int64_t>(0, std::min(kTile, n - i0 - m));
      for (int64_t j0 = 0; j0 < rep; j0 += 2) {
        const float* pj = p + j0 * n + i0;
        float* aj = acc + j0 * D;
        const bool two = rep - j0 >= 2;
        int64_t d0 = 0;
        for (; d0 + 32 <= D; d0 += 32, n_ahead = 0) {
          if (two) values_of<2, 4>(pj, n, tile, m, d0, D, aj, tile + m, n_ahead);
          else values_of<1, 4>(pj, n, tile, m, d0, D, aj, tile + m, n_ahead);
        }
        for (; d0 < D; d0 += 8, n_ahead = 0) {
          if (two) values_of<2, 1>(pj, n, tile, m, d0, D, aj, tile + m, n_ahead);
          else values_of<1, 1>(pj, n, tile, m, d0, D, aj, tile + m, n_ahead);
        }
      }
    }
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < rep; ++j) axpy(acc + j * D, rows[i], p[j * n + i], D);
}

}  // namespace

// q: [R, H, D] float32 contiguous; k_cache / v_cache: [num_blocks, block_size, KVH, D] views
// (last dim contiguous); block_table: [R, max_blocks] int32; seq_lens: [R] int32.
// Request r attends its last query token (position seq_lens[r]-1) to positions
// [max(0, seq_lens[r]-window), seq_lens[r]) (window <= 0: no window). softcap > 0 soft-caps each
// scaled logit s to softcap * tanh(s / softcap) before the softmax (Gemma 2); softcap <= 0: off.
// sinks (gpt-oss; absent: none): float32 [H], a learned logit per query head whose exp joins the
// head's softmax denominator, with no value.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                           int64_t window, double softcap, c10::optional<torch::Tensor> sinks) {
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
  const float* sp = nullptr;
  if (sinks.has_value() && sinks->defined()) {
    TORCH_CHECK(sinks->scalar_type() == torch::kFloat32 && sinks->is_contiguous() && sinks->numel() == H,
                "paged_decode: sinks must be a contiguous float32 [num_heads] tensor");
    sp = sinks->data_ptr<float>();
  }

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

  // Row pointers first (one division per position, none in the loops), then: the scores of the
  // span, its softmax, and the weighted sum of its values. Where AVX2 is built in and the head
  // size is a multiple of 8, both products keep their sums in registers (several query heads of
  // the group per key/value row read) and prefetch rows ahead, since the pages of a sequence lie
  // anywhere in the cache; other head sizes take the plain loops (decode_scores, decode_values).
  at::parallel_for(0, NI, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<const float*> krow, vrow;
    for (int64_t idx = begin; idx < end; ++idx) {
      const Item it = items[idx];
      const int64_t n = it.t1 - it.t0;
      scores.resize(rep * n);
      krow.resize(n);
      vrow.resize(n);
      for (int64_t t = it.t0; t < it.t1; ++t) {
        const int64_t blk = bt[it.r * MB + t / BS], slot = t % BS;
        krow[t - it.t0] = kp + blk * ks0 + slot * ks1 + it.h * ks2;
        vrow[t - it.t0] = vp + blk * vs0 + slot * vs1 + it.h * vs2;
      }
      const float* qh = qp + (it.r * H + it.h * rep) * D;
      float* acc = part_acc.data() + idx * rep * D;
      decode_scores(qh, krow.data(), n, D, rep, fscale, scores.data());
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
      decode_values(scores.data(), vrow.data(), n, D, rep, acc);
    }
  });

  // merge the spans of each (request, KV head): rescale by exp(m_span - m_max); a sink adds
  // exp(sink - m_max) to the denominator and nothing to the sum of values
  for (int64_t rh = 0; rh < R * KVH; ++rh) {
    const int64_t r = rh / KVH, h = rh % KVH;
    float* oh = op + (r * H + h * rep) * D;
    for (int64_t j = 0; j < rep; ++j) {
      float* o = oh + j * D;
      std::fill(o, o + D, 0.f);
      float m = -INFINITY;
      for (int64_t i = first[rh]; i < first[rh + 1]; ++i) m = std::max(m, part_m[i * rep + j]);
      const float sink = sp != nullptr ? sp[h * rep + j] : -INFINITY;
      m = std::max(m, sink);
      float den = sp != nullptr ? std::exp(sink - m) : 0.f;
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
