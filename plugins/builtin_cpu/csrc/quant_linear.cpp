// host_cpu_kernels: gguf_linear and int8_linear, y = x @ dequantize(W)^T (+ b) straight from the
// quantized weight, the weights dequantized in registers and the activations kept in float32.
//
// Weight formats (the GGUF block layouts, as the .gguf file stores them; one row of the [N, K]
// weight is K / block_size consecutive blocks):
//   Q4_0 (2):  32 values, 18 bytes: fp16 d, 16 bytes of nibbles; v = d * (q - 8)
//   Q4_1 (3):  32 values, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles; v = d * q + m
//   Q5_0 (6):  32 values, 22 bytes: fp16 d, 4 bytes qh, 16 bytes of nibbles; v = d * (q - 16)
//   Q5_1 (7):  32 values, 24 bytes: fp16 d, fp16 m, 4 bytes qh, 16 bytes of nibbles; v = d * q + m
//   Q8_0 (8):  32 values, 34 bytes: fp16 d, 32 int8; v = d * q
//   Q4_K (12): 256 values, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs for
//              8 groups of 32, 128 bytes of nibbles; v = d * sc_g * q - dmin * m_g
//   Q6_K (14): 256 values, 210 bytes: 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8
//              scales (one per 16 values), fp16 d; v = d * sc * (q - 32)
// In the nibble formats of 32 values, byte j holds value j (low nibble) and value j + 16 (high);
// the 5-bit formats add bit i of the little-endian 32-bit qh as bit 4 of value i.
//
// Every format is read in groups of 32 values. The AVX2 and scalar kernels turn group g of a row
// into 32 floats w (already multiplied by the group's scale) and an offset b with value = w + b,
// so a dot product is sum(w * x) + b * sum(x over the group), the per-group sums of x computed
// once per call; the AVX-512 kernels decode the group's values themselves (group512). Up to SMALL_M rows of x are handled by streaming each weight row once (the group is
// dequantized once and used for every row of x); more rows run in blocks of SMALL_M over tiles
// of weight rows (AVX-512 builds) or dequantize a panel of weight rows into float32 (it stays in
// L2) and multiply it with at::mm (see ROWS_MAX_M).
//
// The AVX2 paths below also need F16C (HOST_QAVX2), the AVX-512 ones F, BW and VL (HOST_QAVX512):
// see host_cpu.h.

#include "host_cpu.h"

namespace quant {

constexpr int64_t SMALL_M = 8;
// Batches up to ROWS_MAX_M rows run the row kernels, in blocks of SMALL_M rows over tiles of
// ROWS_TILE weight rows; larger ones dequantize weight panels for at::mm. With AVX-512 the row
// kernels win at every size measured (default model's linears, 2 threads: 64 rows 25.0 -> 16.3
// ms, 1024 rows 398 -> 307 ms); with AVX2 they only tie at 64 rows and lose at 1024 (the
// panels' at::mm still runs AVX-512 there), so AVX2 builds keep the panels above SMALL_M rows.
#ifdef HOST_QAVX512
constexpr int64_t ROWS_MAX_M = INT64_MAX;
#else
constexpr int64_t ROWS_MAX_M = SMALL_M;
#endif
constexpr int64_t ROWS_TILE = 64;
constexpr int64_t PREFETCH_ROWS = 4;  // how far ahead the small-M path prefetches weight rows

enum QType : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q6_K = 14, INT8 = -1 };

// the 5-bit formats: bytes per block and the offset of qh (the nibbles follow it)
template <int64_t QT>
constexpr bool is_q5() { return QT == Q5_0 || QT == Q5_1; }
template <int64_t QT>
constexpr int64_t q5_block_bytes() { return QT == Q5_0 ? 22 : 24; }
template <int64_t QT>
constexpr int64_t q5_qh_offset() { return QT == Q5_0 ? 2 : 4; }

// f(std::integral_constant<int, r>) for a runtime r in 1..SMALL_M: the small-M paths dot all the
// rows of x with a weight row in one pass (5 rows: one read and dequantization of each group, not
// a 4-row pass and a 1-row pass; a speculative decoding verification step is 1 + k rows)
template <typename F>
static inline void with_rows(int64_t r, F&& f) {
  switch (r) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

static inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal half: renormalize
      int e = -1;
      uint32_t m = man;
      do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
      bits = sign | ((112 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// (values per block, bytes per block) of a format
static inline void block_shape(int64_t qtype, int64_t& values, int64_t& bytes) {
  switch (qtype) {
    case Q4_0: values = 32; bytes = 18; return;
    case Q4_1: values = 32; bytes = 20; return;
    case Q5_0: values = 32; bytes = 22; return;
    case Q5_1: values = 32; bytes = 24; return;
    case Q8_0: values = 32; bytes = 34; return;
    case Q4_K: values = 256; bytes = 144; return;
    case Q6_K: values = 256; bytes = 210; return;
    case INT8: values = 32; bytes = 32; return;
    default:
      TORCH_CHECK(false, "gguf_linear: qtype ", qtype,
                  " is not one of the CPU kernel's formats: Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q8_0 (8), Q4_K (12), Q6_K (14)");
  }
}

// Q4_K's 6-bit scale and min of group j (0..7) from the 12 packed bytes s
static inline void k4_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---- scalar group decoders: group g of a row -> w[32] (scaled), returns the offset b ----

template <int64_t QT>
static inline float group_scalar(const uint8_t* row, int64_t g, float* w) {
  if constexpr (QT == Q4_0 || QT == Q4_1) {
    const uint8_t* b = row + g * (QT == Q4_0 ? 18 : 20);
    const float d = f16(b);
    const uint8_t* q = b + (QT == Q4_0 ? 2 : 4);
    const int sub = QT == Q4_0 ? 8 : 0;
    for (int j = 0; j < 16; ++j) {
      w[j] = d * static_cast<float>((q[j] & 0x0f) - sub);
      w[j + 16] = d * static_cast<float>((q[j] >> 4) - sub);
    }
    return QT == Q4_1 ? f16(b + 2) : 0.f;
  } else if constexpr (is_q5<QT>()) {
    const uint8_t* b = row + g * q5_block_bytes<QT>();
    const float d = f16(b);
    uint32_t qh;
    std::memcpy(&qh, b + q5_qh_offset<QT>(), 4);
    const uint8_t* q = b + q5_qh_offset<QT>() + 4;
    const int sub = QT == Q5_0 ? 16 : 0;
    for (int j = 0; j < 16; ++j) {  // the 5-bit levels as int (qh is unsigned: no wrap below 16)
      const int lo = static_cast<int>((q[j] & 0x0f) | (((qh >> j) & 1u) << 4));
      const int hi = static_cast<int>((q[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      w[j] = d * static_cast<float>(lo - sub);
      w[j + 16] = d * static_cast<float>(hi - sub);
    }
    return QT == Q5_1 ? f16(b + 2) : 0.f;
  } else if constexpr (QT == Q8_0) {
    const uint8_t* b = row + g * 34;
    const float d = f16(b);
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) w[j] = d * static_cast<float>(q[j]);
    return 0.f;
  } else if constexpr (QT == INT8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(row) + g * 32;
    for (int j = 0; j < 32; ++j) w[j] = static_cast<float>(q[j]);
    return 0.f;
  } else if constexpr (QT == Q4_K) {
    const uint8_t* b = row + (g / 8) * 144;
    const int j = static_cast<int>(g % 8);
    int sc, mn;
    k4_scale_min(b + 4, j, sc, mn);
    const float d = f16(b) * static_cast<float>(sc), off = -f16(b + 2) * static_cast<float>(mn);
    const uint8_t* q = b + 16 + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) w[l] = d * static_cast<float>((q[l] >> shift) & 0x0f);
    return off;
  } else {  // Q6_K
    const uint8_t* b = row + (g / 8) * 210;
    const int h = static_cast<int>((g % 8) / 4), s = static_cast<int>(g % 4);
    const uint8_t* ql = b + h * 64 + (s % 2) * 32;
    const uint8_t* qh = b + 128 + h * 32;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + h * 8 + s * 2;
    const float d = f16(b + 208);
    const int lshift = (s / 2) * 4, hshift = 2 * s;
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l] >> lshift) & 0x0f) | (((qh[l] >> hshift) & 3) << 4)) - 32;
      w[l] = d * static_cast<float>(sc[l / 16]) * static_cast<float>(q);
    }
    return 0.f;
  }
}

#ifdef HOST_QAVX2
// 16 bytes in a register -> 2 x 8 floats (sign-extended)
static inline void cvt16(__m128i v, __m256* out) {
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
}

// 8 bytes at p, zero-extended to 8 int32 lanes (one vpmovzxbd with its load folded in)
static inline __m256i load8u(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// group g of a Q6_K row -> its 32 signed levels (q - 32) as bytes, in value order
static inline __m256i q6k_levels(const uint8_t* row, int64_t g) {
  const uint8_t* b = row + (g / 8) * 210;
  const int h = static_cast<int>((g % 8) / 4), s = static_cast<int>(g % 4);
  __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + h * 64 + (s % 2) * 32));
  __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + h * 32));
  if (s / 2) ql = _mm256_srli_epi16(ql, 4);
  ql = _mm256_and_si256(ql, _mm256_set1_epi8(0x0f));
  switch (s) {  // bits 2s, 2s+1 of each qh byte -> bits 4, 5
    case 0: qh = _mm256_slli_epi16(qh, 4); break;
    case 1: qh = _mm256_slli_epi16(qh, 2); break;
    case 2: break;
    default: qh = _mm256_srli_epi16(qh, 2); break;
  }
  qh = _mm256_and_si256(qh, _mm256_set1_epi8(0x30));
  return _mm256_sub_epi8(_mm256_or_si256(ql, qh), _mm256_set1_epi8(32));
}

// group g of a Q5_0 / Q5_1 row -> its 32 unsigned 5-bit levels as bytes, in value order: the
// nibbles (low ones: values 0-15, high ones: 16-31) or'ed with bit i of qh moved to bit 4 of byte i
template <int64_t QT>
static inline __m256i q5_levels(const uint8_t* row, int64_t g) {
  const uint8_t* b = row + g * q5_block_bytes<QT>();
  int32_t qh;
  std::memcpy(&qh, b + q5_qh_offset<QT>(), 4);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + q5_qh_offset<QT>() + 4));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
  // byte i <- byte i / 8 of qh (every 32-bit lane holds qh, so the in-lane shuffle finds it),
  // then tested against its own bit i % 8
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(qh), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                               2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

// ---- AVX2 group decoders: group g of a row -> w[4] (8 floats each) holding the integer
// levels, and their scales: value = w[i] * (i < 2 ? d0 : d1) + b; returns b ----
template <int64_t QT, bool S = true>
static inline float group_avx2(const uint8_t* row, int64_t g, __m256* w, float& d0, float& d1) {
  if constexpr (QT == Q4_0 || QT == Q4_1) {
    const uint8_t* b = row + g * (QT == Q4_0 ? 18 : 20);
    const uint8_t* q = b + (QT == Q4_0 ? 2 : 4);
    const __m256i lo = load8u(q), hi = load8u(q + 8), mask = _mm256_set1_epi32(0x0f);
    w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, mask));  // values 0..7
    w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, mask));  // values 8..15
    w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));    // values 16..23
    w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));    // values 24..31
    if constexpr (!S) return 0.f;
    d0 = d1 = f16(b);
    return QT == Q4_1 ? f16(b + 2) : -8.f * d0;
  } else if constexpr (is_q5<QT>()) {
    const __m256i q = q5_levels<QT>(row, g);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    if constexpr (!S) return 0.f;
    const uint8_t* b = row + g * q5_block_bytes<QT>();
    d0 = d1 = f16(b);
    return QT == Q5_1 ? f16(b + 2) : -16.f * d0;
  } else if constexpr (QT == Q8_0 || QT == INT8) {
    const uint8_t* q = QT == Q8_0 ? row + g * 34 + 2 : row + g * 32;
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i))));
    if constexpr (S) d0 = d1 = QT == Q8_0 ? f16(row + g * 34) : 1.f;
    return 0.f;
  } else if constexpr (QT == Q4_K) {
    const uint8_t* b = row + (g / 8) * 144;
    const int j = static_cast<int>(g % 8);
    const uint8_t* q = b + 16 + (j / 2) * 32;
    const __m256i mask = _mm256_set1_epi32(0x0f);
    for (int i = 0; i < 4; ++i) {
      const __m256i v = load8u(q + 8 * i);
      w[i] = _mm256_cvtepi32_ps(j % 2 ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, mask));
    }
    if constexpr (!S) return 0.f;
    int sc, mn;
    k4_scale_min(b + 4, j, sc, mn);
    d0 = d1 = f16(b) * static_cast<float>(sc);
    return -f16(b + 2) * static_cast<float>(mn);
  } else {  // Q6_K
    const __m256i q = q6k_levels(row, g);
    cvt16(_mm256_castsi256_si128(q), w);
    cvt16(_mm256_extracti128_si256(q, 1), w + 2);
    if constexpr (!S) return 0.f;
    const uint8_t* b = row + (g / 8) * 210;
    const int h = static_cast<int>((g % 8) / 4), s = static_cast<int>(g % 4);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + h * 8 + s * 2;
    const float d = f16(b + 208);
    d0 = d * static_cast<float>(sc[0]);
    d1 = d * static_cast<float>(sc[1]);
    return 0.f;
  }
}
#endif

// The groups 0 .. n-1 of a chunk through step(i, a): group i into accumulator a = i % 2, in
// group order within each accumulator, so a row of x gets the same arithmetic (the same result,
// to the bit) whatever the number MT of rows dotted with the weight row at once. Up to 4 rows
// the even and odd groups alternate (two independent chains: a single row is not held up by
// the FMA latency); more rows run the even groups, then the odd ones, so only MT accumulators
// are live at a time and 8 rows fit the 16 vector registers.
template <int MT, typename Step>
static inline void pass_groups(int64_t n, Step&& step) {
  if constexpr (MT <= 4) {
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      step(i, 0);
      step(i + 1, 1);
    }
    if (i < n) step(i, 0);
  } else {
    for (int64_t i = 0; i < n; i += 2) step(i, 0);
    for (int64_t i = 1; i < n; i += 2) step(i, 1);
  }
}

template <int64_t QT>
constexpr bool has_offset() { return QT == Q4_0 || QT == Q4_1 || QT == Q5_0 || QT == Q5_1 || QT == Q4_K; }

#ifdef HOST_QAVX2
// The offset terms of MT rows of x, offset_g * (sum of row m over group g), accumulated beside
// the row kernels' dot products, even and odd groups apart (a = g % 2): with one row in lane 1 of
// an fma of sc = [scale, offset, ...] with xs2's (0, sum) pairs, with more in lane m of an fma of
// the broadcast offset with xsT's [8] sums; the same fma per row either way, so a row's result
// does not depend on MT.
template <int MT>
struct GroupOffsets {
  __m128 one[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
  __m256 many[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __attribute__((always_inline)) inline void add(__m128 sc, const float* xs2, const float* xsT, int64_t g, int a) {
    if constexpr (MT == 1) {
      one[a] = _mm_fmadd_ps(sc, _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xs2 + 2 * g))), one[a]);
    } else {
      many[a] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(sc)), _mm256_loadu_ps(xsT + 8 * g), many[a]);
    }
  }
  // offs[m] = the total of row m (offs holds 8)
  inline void totals(float* offs) const {
    if constexpr (MT == 1) {
      offs[0] = _mm_cvtss_f32(_mm_movehdup_ps(_mm_add_ps(one[0], one[1])));
    } else {
      _mm256_storeu_ps(offs, _mm256_add_ps(many[0], many[1]));
    }
  }
};
#endif

#ifdef HOST_QAVX512
// ---- AVX-512 group decoders: group g of a row -> its 32 weight values as floats, scale and
// offset applied (w0: values 0-15, w1: values 16-31), so a row of x needs only two fmas per
// group whatever the format. The nibble formats look their values up in a 16-entry table,
// level * scale + offset built once per group (vpermps reads the low 4 bits of each lane): one
// fma for the table instead of a scale multiply per row of x and an offset term beside it. ----
template <int64_t QT>
__attribute__((always_inline)) static inline void group512(const uint8_t* row, int64_t g, __m512& w0, __m512& w1) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  if constexpr (QT == Q4_0 || QT == Q4_1) {
    const uint8_t* b = row + g * (QT == Q4_0 ? 18 : 20);
    int32_t h = 0;
    std::memcpy(&h, b, QT == Q4_0 ? 2 : 4);  // d (and m): two halves -> lanes 0 and 1
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
    const __m512 d = _mm512_broadcastss_ps(dm);
    // Q4_0: (q - 8) * d; Q4_1: q * d + m
    const __m512 table = QT == Q4_0 ? _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.f)), d)
                                    : _mm512_fmadd_ps(iota, d, _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (QT == Q4_0 ? 2 : 4))));
    w0 = _mm512_permutexvar_ps(q, table);                         // low nibbles: values 0..15
    w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);   // high nibbles: values 16..31
  } else if constexpr (is_q5<QT>()) {  // Q5_0: (q - 16) * d; Q5_1: q * d + m (32 levels: no table)
    const uint8_t* b = row + g * q5_block_bytes<QT>();
    const __m256i q = q5_levels<QT>(row, g);
    const float d = f16(b);
    const __m512 vd = _mm512_set1_ps(d), off = _mm512_set1_ps(QT == Q5_1 ? f16(b + 2) : -16.f * d);
    w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q))), vd, off);
    w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1))), vd, off);
  } else if constexpr (QT == Q8_0 || QT == INT8) {  // INT8: its per-row scale is applied to the dot product
    const uint8_t* q = QT == Q8_0 ? row + g * 34 + 2 : row + g * 32;
    w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
    w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
    if constexpr (QT == Q8_0) {
      const __m512 d = _mm512_set1_ps(f16(row + g * 34));
      w0 = _mm512_mul_ps(w0, d);
      w1 = _mm512_mul_ps(w1, d);
    }
  } else if constexpr (QT == Q4_K) {
    const uint8_t* b = row + (g / 8) * 144;
    const int j = static_cast<int>(g % 8);
    const uint8_t* q = b + 16 + (j / 2) * 32;  // value l of the group: byte l, low nibble (j even) or high
    __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
    if (j % 2) {
      q0 = _mm512_srli_epi32(q0, 4);
      q1 = _mm512_srli_epi32(q1, 4);
    }
    int s6, m6;
    k4_scale_min(b + 4, j, s6, m6);
    const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(f16(b) * static_cast<float>(s6)),
                                         _mm512_set1_ps(-f16(b + 2) * static_cast<float>(m6)));
    w0 = _mm512_permutexvar_ps(q0, table);
    w1 = _mm512_permutexvar_ps(q1, table);
  } else {  // Q6_K: the 32 signed levels, each half times its scale
    const __m256i q = q6k_levels(row, g);
    const uint8_t* b = row + (g / 8) * 210;
    const int h = static_cast<int>((g % 8) / 4), s = static_cast<int>(g % 4);
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192) + h * 8 + s * 2;
    const float d = f16(b + 208);
    w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), _mm512_set1_ps(d * static_cast<float>(scales[0])));
    w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), _mm512_set1_ps(d * static_cast<float>(scales[1])));
  }
}

// NT consecutive weight rows (G groups of 32, row_bytes apart) dotted with MT rows of x,
// AVX-512: per group, weight row j and row m of x, acc += w0 * x[0:16], acc += w1 * x[16:32]
// (16 lanes), each group's values decoded once for all MT rows and each load of x used for all
// NT weight rows; two accumulators per (j, m) pair (even and odd groups), so every pair gets the
// same arithmetic whatever MT and NT are (the result is the same to the bit) and a single pair
// runs two independent fma chains. out[8 j + m] receives the dot product of weight row j with
// row m of x.
template <int64_t QT, int MT, int NT>
__attribute__((always_inline)) static inline void row_dot512(const uint8_t* row, int64_t row_bytes, int64_t G, const float* x,
                                                             int64_t xs, float* out) {
  __m512 acc[NT][MT][2];
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < MT; ++m) acc[j][m][0] = acc[j][m][1] = _mm512_setzero_ps();
  auto step = [&](int64_t g, int a) __attribute__((always_inline)) {
    __m512 w0[NT], w1[NT];
    for (int j = 0; j < NT; ++j) group512<QT>(row + j * row_bytes, g, w0[j], w1[j]);
    for (int m = 0; m < MT; ++m) {
      const float* xg = x + m * xs + g * 32;
      const __m512 x0 = _mm512_loadu_ps(xg), x1 = _mm512_loadu_ps(xg + 16);
      for (int j = 0; j < NT; ++j) acc[j][m][a] = _mm512_fmadd_ps(w1[j], x1, _mm512_fmadd_ps(w0[j], x0, acc[j][m][a]));
    }
  };
  int64_t g = 0;
  for (; g + 2 <= G; g += 2) {
    step(g, 0);
    step(g + 1, 1);
  }
  if (g < G) step(g, 0);
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < MT; ++m) out[8 * j + m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j][m][0], acc[j][m][1]));
}

#endif

#ifdef HOST_QAVX2
// The scales of group g of a row as [scale of values 0-15, offset, scale of values 16-31, 0]
// (value = level * scale + offset; the two scales differ only for Q6_K), converted from the
// block's own halves in one instruction where the format allows.
template <int64_t QT>
static inline __m128 group_scales_avx2(const uint8_t* row, int64_t g) {
  if constexpr (QT == Q4_1 || QT == Q5_1) {
    const int64_t bytes = QT == Q4_1 ? 20 : 24;
    return _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(row + g * bytes)));  // [d, m, 0, 0]
  } else if constexpr (QT == Q5_0) {
    const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const uint16_t*>(row + g * 22)));
    return _mm_mul_ps(_mm_moveldup_ps(d), _mm_setr_ps(1.f, -16.f, 0.f, 0.f));  // [d, -16d]
  } else if constexpr (QT == Q4_0 || QT == Q8_0) {
    const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const uint16_t*>(row + g * (QT == Q4_0 ? 18 : 34))));
    return QT == Q4_0 ? _mm_mul_ps(_mm_moveldup_ps(d), _mm_setr_ps(1.f, -8.f, 0.f, 0.f)) : d;  // [d, -8d] / [d, 0]
  } else if constexpr (QT == INT8) {
    return _mm_setr_ps(1.f, 0.f, 0.f, 0.f);
  } else {
    __m256 unused[4];
    float d0, d1;
    const float b = group_avx2<QT, true>(row, g, unused, d0, d1);  // the levels unused: dead code
    return _mm_setr_ps(d0, b, d1, 0.f);
  }
}
#endif

// Row n of the weight (G groups of 32) dotted with MT rows of x: out[m] = sum_k W[n, k] x[m, k].
// xs2 and xsT hold the group sums of x (group_sums; formats with an offset only).
template <int64_t QT, int MT>
static inline void row_dot(const uint8_t* row, int64_t G, const float* x, int64_t xs, const float* xs2,
                           const float* xsT, float* out) {
#ifdef HOST_QAVX2
  // per group: s = sum over its 32 values of level * x, then acc += s * scale (two partial sums
  // with their own scale for Q6_K's 16-value scales), into two accumulators per row of x, one
  // for the even groups and one for the odd ones (pass_groups); the offset term offset *
  // sum(x over the group) beside it (GroupOffsets): every row gets the same arithmetic,
  // whatever MT is.
  constexpr bool two = QT == Q6_K;
  __m256 acc[MT][2];
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  GroupOffsets<MT> off;
  auto step = [&](int64_t g, int a) __attribute__((always_inline)) {
    __m256 w[4];
    float unused0, unused1;
    group_avx2<QT, false>(row, g, w, unused0, unused1);
    const __m128 sc = group_scales_avx2<QT>(row, g);
    const __m256 vd0 = _mm256_broadcastss_ps(sc);
    const __m256 vd1 = two ? _mm256_broadcastss_ps(_mm_movehl_ps(sc, sc)) : vd0;
    for (int m = 0; m < MT; ++m) {
      const float* xg = x + m * xs + g * 32;
      __m256 s0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
      __m256 s1 = _mm256_mul_ps(w[2], _mm256_loadu_ps(xg + 16));
      s0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg + 8), s0);
      s1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), s1);
      if constexpr (two) {
        acc[m][a] = _mm256_fmadd_ps(s1, vd1, _mm256_fmadd_ps(s0, vd0, acc[m][a]));
      } else {
        acc[m][a] = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), vd0, acc[m][a]);
      }
    }
    if constexpr (has_offset<QT>()) off.add(sc, xs2, xsT, g, a);
  };
  pass_groups<MT>(G, step);
  float offs[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if constexpr (has_offset<QT>()) off.totals(offs);
  for (int m = 0; m < MT; ++m) out[m] = hsum256(_mm256_add_ps(acc[m][0], acc[m][1])) + offs[m];
#else
  (void)xsT;
  float w[32];
  for (int m = 0; m < MT; ++m) out[m] = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    const float b = group_scalar<QT>(row, g, w);
    for (int m = 0; m < MT; ++m) {
      const float* xg = x + m * xs + g * 32;
      float s = 0.f;
      for (int l = 0; l < 32; ++l) s += w[l] * xg[l];
      out[m] += s + (has_offset<QT>() ? b * xs2[(m * G + g) * 2 + 1] : 0.f);
    }
  }
#endif
}

// Per-group sums in the row kernels' two layouts (GroupOffsets reads them): xs2 [M, G, 2] =
// (0, sum) pairs, xsT [B, G, 8] for each block of 8 rows (rows past M zero); sum(m, g) gives the
// sum of row m over group g.
template <typename Sum>
static inline void lay_out_group_sums(int64_t M, int64_t G, Sum&& sum, std::vector<float>& xs2, std::vector<float>& xsT) {
  xs2.assign(static_cast<size_t>(M * G * 2), 0.f);
  xsT.assign(static_cast<size_t>((M + 7) / 8 * G * 8), 0.f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const float v = sum(m, g);
      xs2[(m * G + g) * 2 + 1] = v;
      xsT[((m / 8) * G + g) * 8 + m % 8] = v;
    }
}

// The group sums of x [M, K] for the row kernels, summed in order, so every batch-size variant
// reads the same sums.
static inline void group_sums(const float* x, int64_t M, int64_t xs, int64_t G, std::vector<float>& xs2,
                              std::vector<float>& xsT) {
  lay_out_group_sums(M, G, [&](int64_t m, int64_t g) {
    const float* xg = x + m * xs + g * 32;
    float sum = 0.f;
    for (int l = 0; l < 32; ++l) sum += xg[l];
    return sum;
  }, xs2, xsT);
}

// Dequantizes row `row` (G groups) into dst[32 G] floats (the panel path: AVX2 and scalar builds).
template <int64_t QT>
static inline void dequant_row(const uint8_t* row, int64_t G, float* dst) {
  for (int64_t g = 0; g < G; ++g) {
#ifdef HOST_QAVX2
    __m256 w[4];
    float d0, d1;
    const __m256 b = _mm256_set1_ps(group_avx2<QT>(row, g, w, d0, d1));
    const __m256 vd0 = _mm256_set1_ps(d0), vd1 = _mm256_set1_ps(d1);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + g * 32 + 8 * i, _mm256_fmadd_ps(w[i], i < 2 ? vd0 : vd1, b));
#else
    const float b = group_scalar<QT>(row, g, dst + g * 32);
    for (int l = 0; l < 32; ++l) dst[g * 32 + l] += b;
#endif
  }
}

// The output columns [col0, col0 + N) of y (row stride ldy) = x[M, K] @ dequantize(W[N, K])^T,
// times row_scale[n] when given, plus bias[n] when given. W is `row_bytes` bytes per row.
template <int64_t QT>
static void gemm_into(const float* x, int64_t M, int64_t xs, int64_t K, const uint8_t* w, int64_t N, int64_t row_bytes,
                      const float* row_scale, const float* bias, float* y, int64_t ldy, int64_t col0) {
  const int64_t G = K / 32;
  auto finish = [&](int64_t m, int64_t n, float v) {
    if (row_scale) v *= row_scale[n];
    if (bias) v += bias[n];
    y[m * ldy + col0 + n] = v;
  };
  if (M <= ROWS_MAX_M) {
    // blocks of up to SMALL_M rows of x pass over a tile of TR weight rows while it stays in
    // L1 / L2 (one block: the whole range streams once); every row of x gets the arithmetic of
    // the 1-row kernel
    const int64_t blocks = (M + SMALL_M - 1) / SMALL_M, TR = blocks == 1 ? N : ROWS_TILE;
#ifndef HOST_QAVX512
    std::vector<float> xs2, xsT;  // the group sums of x, for the offset terms of the AVX2 / scalar kernels
    if (has_offset<QT>()) group_sums(x, M, xs, G, xs2, xsT);
#endif
    at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
      float out[16];
      for (int64_t n0 = begin; n0 < end; n0 += TR) {
        const int64_t n1 = std::min(end, n0 + TR);
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t m0 = b * SMALL_M, mb = std::min<int64_t>(SMALL_M, M - m0);
          const float* xb = x + m0 * xs;
#ifndef HOST_QAVX512
          const float* s2 = has_offset<QT>() ? xs2.data() + m0 * G * 2 : nullptr;
          const float* sT = has_offset<QT>() ? xsT.data() + b * G * 8 : nullptr;
#endif
          for (int64_t n = n0, nt = 1; n < n1; n += nt) {
            const uint8_t* row = w + n * row_bytes;
#ifdef HOST_QAVX512
            // two weight rows at a time while their 2 x 2 MT accumulators fit the 32 registers
            nt = mb <= 5 && n + 1 < n1 ? 2 : 1;
#endif
#ifdef HOST_QAVX2
            // the nt rows PREFETCH_ROWS ahead into L2 while these compute (the hardware
            // prefetcher alone leaves the whole-model weight stream at about half the kernel's
            // cached speed); later blocks find the tile in cache
            if (b == 0 && n + PREFETCH_ROWS < end) {
              const char* ahead = reinterpret_cast<const char*>(row + PREFETCH_ROWS * row_bytes);
              const int64_t bytes = std::min(nt, end - n - PREFETCH_ROWS) * row_bytes;
              for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
            }
#endif
#ifdef HOST_QAVX512
            if (nt == 2) {
              with_rows(mb, [&](auto mt) {
                if constexpr (decltype(mt)::value <= 5) row_dot512<QT, decltype(mt)::value, 2>(row, row_bytes, G, xb, xs, out);
              });
            } else {
              with_rows(mb, [&](auto mt) { row_dot512<QT, decltype(mt)::value, 1>(row, row_bytes, G, xb, xs, out); });
            }
#else
            with_rows(mb, [&](auto mt) { row_dot<QT, decltype(mt)::value>(row, G, xb, xs, s2, sT, out); });
#endif
            for (int64_t j = 0; j < nt; ++j)
              for (int64_t m = 0; m < mb; ++m) finish(m0 + m, n + j, out[8 * j + m]);
          }
        }
      }
    });
    return;
  }
  // Many rows: a panel of TN dequantized weight rows (about 256 KiB, in L2) times x with at::mm.
  const int64_t TN = std::max<int64_t>(16, std::min<int64_t>(256, (65536 / K) / 16 * 16));
  const int64_t tiles = (N + TN - 1) / TN;
  const torch::Tensor xt = torch::from_blob(const_cast<float*>(x), {M, K}, {xs, 1}, torch::kFloat32);
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    torch::Tensor panel = torch::empty({TN, K}, torch::kFloat32);
    torch::Tensor out = torch::empty({M, TN}, torch::kFloat32);
    float* pp = panel.data_ptr<float>();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * TN, rows = std::min(TN, N - n0);
      for (int64_t r = 0; r < rows; ++r) dequant_row<QT>(w + (n0 + r) * row_bytes, G, pp + r * K);
      torch::Tensor o = out.narrow(1, 0, rows);
      at::mm_out(o, xt, panel.narrow(0, 0, rows).t());
      const float* op = o.data_ptr<float>();
      const int64_t os = o.stride(0);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < rows; ++r) finish(m, n0 + r, op[m * os + r]);
    }
  });
}

static void dispatch_into(int64_t qtype, const float* x, int64_t M, int64_t xs, int64_t K, const uint8_t* w, int64_t N,
                          int64_t row_bytes, const float* row_scale, const float* bias, float* y, int64_t ldy,
                          int64_t col0) {
  switch (qtype) {
    case Q4_0: return gemm_into<Q4_0>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q4_1: return gemm_into<Q4_1>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q5_0: return gemm_into<Q5_0>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q5_1: return gemm_into<Q5_1>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q8_0: return gemm_into<Q8_0>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q4_K: return gemm_into<Q4_K>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q6_K: return gemm_into<Q6_K>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case INT8: return gemm_into<INT8>(x, M, xs, K, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    default: {
      int64_t v, b;
      block_shape(qtype, v, b);  // raises naming the qtype
    }
  }
}

// x as float32 [M, K] with unit column stride (bfloat16 / strided inputs are converted)
static inline torch::Tensor as_f32_rows(const torch::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.dim(), " dimensions");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16, op,
              ": x must be float32 or bfloat16, got ", x.scalar_type());
  torch::Tensor xf = x.scalar_type() == torch::kFloat32 ? x : x.to(torch::kFloat32);
  return xf.stride(1) == 1 ? xf : xf.contiguous();
}

static inline const float* bias_ptr(const c10::optional<torch::Tensor>& bias, int64_t N, const char* op,
                                    torch::Tensor& keep) {
  if (!bias.has_value() || !bias->defined() || bias->numel() == 0) return nullptr;
  TORCH_CHECK(bias->numel() == N, op, ": bias has ", bias->numel(), " values for ", N, " output features");
  keep = bias->to(torch::kFloat32).contiguous();
  return keep.data_ptr<float>();
}

// The shards of one GGUF linear (each [N_s, row_bytes_s] uint8 with its qtype) into consecutive
// column ranges of y [M, sum N_s] (float32, contiguous), from x float32 [M, K] (unit column stride).
void gguf_shards_into(const torch::Tensor& x, const std::vector<torch::Tensor>& qweights,
                      const std::vector<int64_t>& qtypes, const float* bias, torch::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1);
  int64_t col = 0;
  for (size_t s = 0; s < qweights.size(); ++s) {
    const torch::Tensor& qw = qweights[s];
    int64_t values, bytes;
    block_shape(qtypes[s], values, bytes);
    TORCH_CHECK(qw.scalar_type() == torch::kUInt8 && qw.dim() == 2 && qw.is_contiguous(),
                "gguf_linear: qweight must be a contiguous uint8 [N, row_bytes] tensor of GGUF blocks");
    TORCH_CHECK(K % values == 0 && qw.size(1) == (K / values) * bytes, "gguf_linear: x has K = ", K,
                " columns, so qtype ", qtypes[s], " rows need ", (K % values ? -1 : (K / values) * bytes),
                " bytes (K a multiple of ", values, "), but qweight rows have ", qw.size(1));
    dispatch_into(qtypes[s], x.data_ptr<float>(), M, x.stride(0), K, qw.data_ptr<uint8_t>(), qw.size(0), qw.size(1),
                  nullptr, bias ? bias + col : nullptr, y.data_ptr<float>(), y.size(1), col);
    col += qw.size(0);
  }
}

// ---- Q8 activations (opt-in: --quantized-activations q8) ----
//
// Each row of x is quantized once per call to blocks of 32 int8 values with a float32 scale
// (llama.cpp's Q8_0 / Q8_1 activations, the scale kept in float32):
//   amax = max |x| over the block, d = amax / 127, id = d > 0 ? 1 / d : 0, q = rint(x * id)
//   (round to nearest, ties to even), s = d * sum(q) (the block sum, for formats with an offset).
// A weight group of 32 integer levels l (unsigned for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K, signed for Q8_0 and
// Q6_K, whose level is q - 32) with scale dw and offset bw (value = l * dw + bw) dots such a
// block as dw * d * sum(l * q) + bw * s: the integer sum with _mm256_maddubs_epi16 (unsigned x
// signed bytes; signed levels by the sign trick |l| x sign(q, l)) and _mm256_madd_epi16, or one
// _mm256_dpbusd_epi32 where AVX-512 VNNI (VL) was built in. The result equals
// dequantize(q, d) @ dequantize(W)^T up to float32 summation order.

// Quantizes rows of x [M, K] (row stride xs, K a multiple of 32): q [M, K] int8, d [M, K/32] and
// s [M, K/32] (s may be null).
static void quantize_q8_rows(const float* x, int64_t M, int64_t xs, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t G = K / 32;
  at::parallel_for(0, M * G, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / G, g = i % G;
      const float* xg = x + m * xs + g * 32;
      int8_t* qg = q + m * K + g * 32;
#ifdef HOST_QAVX2
      __m256 v[4];
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 amax = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(xg + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
      }
      __m128 mx = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
      mx = _mm_max_ss(mx, _mm_movehdup_ps(mx));
      // divisions as instructions, so -ffast-math cannot turn them into reciprocal products
      const __m128 dd = _mm_div_ss(mx, _mm_set_ss(127.f));
      const float dv = _mm_cvtss_f32(dd);
      const float id = dv > 0.f ? _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.f), dd)) : 0.f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i r[4];
      for (int j = 0; j < 4; ++j)
        r[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
      const int isum = _mm_cvtsi128_si32(t);
      // int32 -> int8 in order: the packs interleave 128-bit lanes, the permute restores them
      const __m256i p16a = _mm256_packs_epi32(r[0], r[1]), p16b = _mm256_packs_epi32(r[2], r[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qg), p8);
#else
      float amax = 0.f;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(xg[l]));
      // the divisor read from a volatile: with a constant one the compiler multiplies by 1/127
      // (-ffast-math), one ulp off the reference's division for some inputs
      static volatile float q8_levels = 127.f, one = 1.f;
      const float dv = amax / q8_levels;
      const float id = dv > 0.f ? one / dv : 0.f;
      int isum = 0;
      for (int l = 0; l < 32; ++l) {
        const int v = static_cast<int>(std::nearbyint(xg[l] * id));
        qg[l] = static_cast<int8_t>(std::max(-127, std::min(127, v)));
        isum += qg[l];
      }
#endif
      d[m * G + g] = dv;
      if (s) s[m * G + g] = dv * static_cast<float>(isum);
    }
  });
}

template <int64_t QT>
constexpr bool signed_levels() { return QT == Q8_0 || QT == Q6_K || QT == INT8; }

#ifdef HOST_QAVX2
// group g of a row -> its 32 integer levels as bytes, in value order (unsigned for the nibble
// formats, signed for Q8_0 / INT8 and Q6_K's q - 32)
template <int64_t QT>
static inline __m256i group_levels(const uint8_t* row, int64_t g) {
  if constexpr (QT == Q4_0 || QT == Q4_1) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * (QT == Q4_0 ? 18 : 20) + (QT == Q4_0 ? 2 : 4)));
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
  } else if constexpr (is_q5<QT>()) {
    return q5_levels<QT>(row, g);
  } else if constexpr (QT == Q8_0 || QT == INT8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(QT == Q8_0 ? row + g * 34 + 2 : row + g * 32));
  } else if constexpr (QT == Q4_K) {
    const uint8_t* b = row + (g / 8) * 144;
    const int j = static_cast<int>(g % 8);
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + (j / 2) * 32));
    if (j % 2) v = _mm256_srli_epi16(v, 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
  } else {  // Q6_K
    return q6k_levels(row, g);
  }
}

// 8 int32 partial sums of u[i] * s[i] over 32 bytes (u unsigned, s signed)
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

// Row n of the weight (G groups of 32) dotted with MT Q8 rows: out[m] = sum_g dw_g d_mg sum(l q) + bw_g s_mg.
// xq: int8 rows (stride K = 32 G); xd: per-block scales (stride G); xs2, xsT: the block sums
// s in the layouts of group_sums (formats with an offset only).
template <int64_t QT, int MT>
static inline void row_dot_q8(const uint8_t* row, int64_t G, const int8_t* xq, const float* xd, const float* xs2,
                              const float* xsT, float* out) {
  const int64_t K = G * 32;
#ifdef HOST_QAVX2
  // per group and row: the integer dot of the levels and the Q8 block (maddubs + madd, or
  // dpbusd), as 8 float lanes times (weight scale * activation scale), into two accumulators
  // (even and odd groups); the weight scales converted inline, the offsets as row_dot's
  constexpr bool two = QT == Q6_K;
  __m256 acc[MT][2];
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  GroupOffsets<MT> off;
  auto step = [&](int64_t g, int a) __attribute__((always_inline)) {
    const __m256i lv = group_levels<QT>(row, g);
    const __m256i lu = signed_levels<QT>() ? _mm256_sign_epi8(lv, lv) : lv;
    const __m128 sc = group_scales_avx2<QT>(row, g);
    // Q6_K: lanes 0-3 hold values 0-15 (scale lane 0 of sc), lanes 4-7 values 16-31 (lane 2)
    const __m256 wd = two ? _mm256_set_m128(_mm_broadcastss_ps(_mm_movehl_ps(sc, sc)), _mm_broadcastss_ps(sc))
                          : _mm256_broadcastss_ps(sc);
    for (int m = 0; m < MT; ++m) {
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + g * 32));
      if constexpr (signed_levels<QT>()) xv = _mm256_sign_epi8(xv, lv);
      const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(lu, xv));
      acc[m][a] = _mm256_fmadd_ps(p, _mm256_mul_ps(wd, _mm256_broadcast_ss(xd + m * G + g)), acc[m][a]);
    }
    if constexpr (has_offset<QT>()) off.add(sc, xs2, xsT, g, a);
  };
  pass_groups<MT>(G, step);
  float offs[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if constexpr (has_offset<QT>()) off.totals(offs);
  for (int m = 0; m < MT; ++m) out[m] = hsum256(_mm256_add_ps(acc[m][0], acc[m][1])) + offs[m];
#else
  (void)xsT;
  float w[32];
  for (int m = 0; m < MT; ++m) out[m] = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    const float b = group_scalar<QT>(row, g, w);
    for (int m = 0; m < MT; ++m) {
      const int8_t* qg = xq + m * K + g * 32;
      float sacc = 0.f;
      for (int l = 0; l < 32; ++l) sacc += w[l] * static_cast<float>(qg[l]);
      out[m] += sacc * xd[m * G + g] + (has_offset<QT>() ? b * xs2[(m * G + g) * 2 + 1] : 0.f);
    }
  }
#endif
}

// Quantized activations held for one call: q [M, K], d and s [M, K/32].
struct Q8Rows {
  int64_t M = 0, K = 0;
  std::vector<int8_t> q;
  std::vector<float> d, s, s2, sT;  // s: the block sums d * sum(q); s2, sT: the same laid out (lay_out_group_sums)
  Q8Rows(const float* x, int64_t M_, int64_t xs, int64_t K_) : M(M_), K(K_) {
    const int64_t G = K / 32;
    q.resize(static_cast<size_t>(M * K));
    d.resize(static_cast<size_t>(M * G));
    s.resize(d.size());
    quantize_q8_rows(x, M, xs, K, q.data(), d.data(), s.data());
    if (M <= SMALL_M) lay_out_group_sums(M, G, [&](int64_t m, int64_t g) { return s[m * G + g]; }, s2, sT);
  }
};

// The output columns [col0, col0 + N) of y (row stride ldy) = Q8 rows @ dequantize(W[N, K])^T
// (+ bias[n]): each weight row is read once and dotted with every row of x in one pass (the
// row stays in L1, the int8 activations in L2). gguf_shards_q8_into sends batches above SMALL_M
// rows to the float kernels instead (measured faster on AVX2: see docs/quantization.md).
template <int64_t QT>
static void gemm_q8_into(const Q8Rows& xr, const uint8_t* w, int64_t N, int64_t row_bytes, const float* row_scale,
                         const float* bias, float* y, int64_t ldy, int64_t col0) {
  const int64_t M = xr.M, K = xr.K, G = K / 32;
  const int8_t* xq = xr.q.data();
  const float* xd = xr.d.data();
  const float* xs2 = xr.s2.data();
  const float* xsT = xr.sT.data();
  auto finish = [&](int64_t m, int64_t n, float v) {
    if (row_scale) v *= row_scale[n];
    if (bias) v += bias[n];
    y[m * ldy + col0 + n] = v;
  };
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    float out[8];
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = w + n * row_bytes;
#ifdef HOST_QAVX2
      if (n + PREFETCH_ROWS < end) {
        const char* ahead = reinterpret_cast<const char*>(row + PREFETCH_ROWS * row_bytes);
        for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
      }
#endif
      with_rows(M, [&](auto mt) { row_dot_q8<QT, decltype(mt)::value>(row, G, xq, xd, xs2, xsT, out); });
      for (int64_t m = 0; m < M; ++m) finish(m, n, out[m]);
    }
  });
}

static void dispatch_q8_into(int64_t qtype, const Q8Rows& xr, const uint8_t* w, int64_t N, int64_t row_bytes,
                             const float* row_scale, const float* bias, float* y, int64_t ldy, int64_t col0) {
  switch (qtype) {
    case Q4_0: return gemm_q8_into<Q4_0>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q4_1: return gemm_q8_into<Q4_1>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q5_0: return gemm_q8_into<Q5_0>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q5_1: return gemm_q8_into<Q5_1>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q8_0: return gemm_q8_into<Q8_0>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q4_K: return gemm_q8_into<Q4_K>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case Q6_K: return gemm_q8_into<Q6_K>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    case INT8: return gemm_q8_into<INT8>(xr, w, N, row_bytes, row_scale, bias, y, ldy, col0);
    default: {
      int64_t v, b;
      block_shape(qtype, v, b);
    }
  }
}

// gguf_shards_into with Q8 activations: x quantized once, every shard reads the same blocks.
void gguf_shards_q8_into(const torch::Tensor& x, const std::vector<torch::Tensor>& qweights,
                         const std::vector<int64_t>& qtypes, const float* bias, torch::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "gguf_linear_q8: x has K = ", K, " columns, not a multiple of the 32-value Q8 block");
  const Q8Rows xr(x.data_ptr<float>(), M, x.stride(0), K);
  if (M > SMALL_M) {
    // many rows: the same Q8 values, dequantized, through the float kernels (gemm_into), which
    // beat the integer row kernel at these sizes without VNNI
    torch::Tensor xdq = torch::empty({M, K}, x.options());
    float* p = xdq.data_ptr<float>();
    at::parallel_for(0, M, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin * K; i < end * K; ++i) p[i] = static_cast<float>(xr.q[i]) * xr.d[i / 32];
    });
    gguf_shards_into(xdq, qweights, qtypes, bias, y);
    return;
  }
  int64_t col = 0;
  for (size_t s = 0; s < qweights.size(); ++s) {
    const torch::Tensor& qw = qweights[s];
    int64_t values, bytes;
    block_shape(qtypes[s], values, bytes);
    TORCH_CHECK(qw.scalar_type() == torch::kUInt8 && qw.dim() == 2 && qw.is_contiguous(),
                "gguf_linear_q8: qweight must be a contiguous uint8 [N, row_bytes] tensor of GGUF blocks");
    TORCH_CHECK(K % values == 0 && qw.size(1) == (K / values) * bytes, "gguf_linear_q8: x has K = ", K,
                " columns, so qtype ", qtypes[s], " rows need ", (K % values ? -1 : (K / values) * bytes),
                " bytes (K a multiple of ", values, "), but qweight rows have ", qw.size(1));
    dispatch_q8_into(qtypes[s], xr, qw.data_ptr<uint8_t>(), qw.size(0), qw.size(1), nullptr, bias ? bias + col : nullptr,
                     y.data_ptr<float>(), y.size(1), col);
    col += qw.size(0);
  }
}

}  // namespace quant

// y[M, N] = x[M, K] @ dequantize(qweight)^T (+ bias), qweight the [N, row_bytes] GGUF blocks of
// an [N, K] weight of type qtype (int(gguf.GGMLQuantizationType)). Result in x's dtype.
torch::Tensor gguf_linear(torch::Tensor x, torch::Tensor qweight, int64_t qtype, c10::optional<torch::Tensor> bias) {
  torch::Tensor xf = quant::as_f32_rows(x, "gguf_linear");
  TORCH_CHECK(qweight.dim() == 2, "gguf_linear: qweight must be 2-D [N, row_bytes]");
  const int64_t N = qweight.size(0);
  torch::Tensor keep;
  const float* bp = quant::bias_ptr(bias, N, "gguf_linear", keep);
  torch::Tensor y = torch::empty({xf.size(0), N}, xf.options());
  quant::gguf_shards_into(xf, {qweight.contiguous()}, {qtype}, bp, y);
  return x.scalar_type() == torch::kFloat32 ? y : y.to(x.scalar_type());
}

// gguf_linear with the rows of x quantized to Q8 blocks first (see "Q8 activations" above):
// y = dequantize_q8(quantize_q8(x)) @ dequantize(qweight)^T (+ bias), computed with integer dots.
torch::Tensor gguf_linear_q8(torch::Tensor x, torch::Tensor qweight, int64_t qtype, c10::optional<torch::Tensor> bias) {
  torch::Tensor xf = quant::as_f32_rows(x, "gguf_linear_q8");
  TORCH_CHECK(qweight.dim() == 2, "gguf_linear_q8: qweight must be 2-D [N, row_bytes]");
  const int64_t N = qweight.size(0);
  torch::Tensor keep;
  const float* bp = quant::bias_ptr(bias, N, "gguf_linear_q8", keep);
  torch::Tensor y = torch::empty({xf.size(0), N}, xf.options());
  quant::gguf_shards_q8_into(xf, {qweight.contiguous()}, {qtype}, bp, y);
  return x.scalar_type() == torch::kFloat32 ? y : y.to(x.scalar_type());
}

// The Q8 activation blocks of x [M, K] (K a multiple of 32): {q int8 [M, K], d float32 [M, K/32]}.
std::vector<torch::Tensor> quantize_q8(torch::Tensor x) {
  torch::Tensor xf = quant::as_f32_rows(x, "quantize_q8");
  const int64_t M = xf.size(0), K = xf.size(1);
  TORCH_CHECK(K % 32 == 0, "quantize_q8: x has K = ", K, " columns, not a multiple of 32");
  torch::Tensor q = torch::empty({M, K}, xf.options().dtype(torch::kInt8));
  torch::Tensor d = torch::empty({M, K / 32}, xf.options());
  quant::quantize_q8_rows(xf.data_ptr<float>(), M, xf.stride(0), K, q.data_ptr<int8_t>(), d.data_ptr<float>(), nullptr);
  return {q, d};
}

// y[M, N] = x[M, K] @ (qweight * scales[:, None])^T (+ bias), qweight int8 [N, K], scales float32 [N].
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, c10::optional<torch::Tensor> bias) {
  torch::Tensor xf = quant::as_f32_rows(x, "int8_linear");
  TORCH_CHECK(qweight.scalar_type() == torch::kInt8 && qweight.dim() == 2, "int8_linear: qweight must be int8 [N, K]");
  const int64_t M = xf.size(0), K = xf.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.size(1) == K, "int8_linear: x has ", K, " columns, qweight ", qweight.size(1));
  TORCH_CHECK(scales.numel() == N, "int8_linear: ", scales.numel(), " scales for ", N, " rows");
  torch::Tensor y = torch::empty({M, N}, xf.options());
  torch::Tensor keep;
  const float* bp = quant::bias_ptr(bias, N, "int8_linear", keep);
  torch::Tensor sc = scales.to(torch::kFloat32).contiguous();
  torch::Tensor qw = qweight.contiguous();
  if (K % 32 == 0) {
    quant::dispatch_into(quant::INT8, xf.data_ptr<float>(), M, xf.stride(0), K,
                         reinterpret_cast<const uint8_t*>(qw.data_ptr<int8_t>()), N, K, sc.data_ptr<float>(), bp,
                         y.data_ptr<float>(), N, 0);
  } else {  // K not a multiple of the 32-value group: plain torch
    torch::Tensor ref = at::mm(xf, (qw.to(torch::kFloat32) * sc.unsqueeze(1)).t());
    if (bp) ref.add_(keep);
    y.copy_(ref);
  }
  return x.scalar_type() == torch::kFloat32 ? y : y.to(x.scalar_type());
}

// The instruction set this module was compiled for (kernels.py logs it once).
std::string kernels_isa() {
#if defined(__AVX512F__) && defined(HOST_QAVX2)
  return "avx512f+avx2+fma+f16c";
#elif defined(HOST_QAVX2)
  return "avx2+fma+f16c";
#elif defined(HOST_AVX2)
  return "avx2+fma (quantized kernels scalar: no f16c)";
#else
  return "scalar";
#endif
}
