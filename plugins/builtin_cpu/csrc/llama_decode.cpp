// host_cpu_kernels: llama_decode, a whole decode step of a Llama-family decoder in one call, from the
// kernels of the other files (declared in host_cpu.h).

#include "host_cpu.h"

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

// How one linear layer of the decoder holds its weight (see llama_decode's linear_meta).
struct DecodeLinear {
  int64_t kind = 0;                  // 0: float32 (the weight slot), 1: int8 rows + scales, 2: GGUF shards,
                                     // 3: GGUF shards with Q8 activations
  std::vector<torch::Tensor> tensors;  // int8: {qweight, scales}; GGUF: one uint8 block tensor per shard
  std::vector<int64_t> qtypes;         // GGUF: each shard's qtype
  int64_t out_features = 0;
};

// Reads the 4 * L linear descriptions: per linear, linear_meta holds kind, count, then count qtypes
// (GGUF; int8 and float32 list none), and the kind's tensors follow in order in quant_tensors.
static std::vector<DecodeLinear> parse_linears(const std::vector<torch::Tensor>& quant_tensors,
                                               const std::vector<int64_t>& meta, int64_t count) {
  std::vector<DecodeLinear> out(static_cast<size_t>(count));
  size_t pos = 0, next = 0;
  for (auto& lin : out) {
    TORCH_CHECK(pos + 2 <= meta.size(), "llama_decode: linear_meta is too short for ", count, " linears");
    lin.kind = meta[pos];
    const int64_t n = meta[pos + 1];
    pos += 2;
    if (lin.kind == 1) {
      TORCH_CHECK(next + 2 <= quant_tensors.size(), "llama_decode: missing int8 weight tensors");
      lin.tensors = {quant_tensors[next], quant_tensors[next + 1]};
      next += 2;
      lin.out_features = lin.tensors[0].size(0);
    } else if (lin.kind == 2 || lin.kind == 3) {
      TORCH_CHECK(n > 0 && pos + n <= meta.size() && next + n <= quant_tensors.size(), "llama_decode: bad GGUF shards");
      for (int64_t s = 0; s < n; ++s) {
        lin.qtypes.push_back(meta[pos + s]);
        lin.tensors.push_back(quant_tensors[next + s]);
        lin.out_features += quant_tensors[next + s].size(0);
      }
      pos += n;
      next += n;
    } else {
      TORCH_CHECK(lin.kind == 0, "llama_decode: linear kind ", lin.kind,
                  " is not 0 (float32), 1 (int8), 2 (GGUF) or 3 (GGUF, Q8 activations)");
    }
  }
  TORCH_CHECK(pos == meta.size() && next == quant_tensors.size(), "llama_decode: linear_meta and quant_tensors disagree");
  return out;
}

// x @ W^T (+ bias) for one linear of the decoder, by the way it holds its weight.
static torch::Tensor decode_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                   const DecodeLinear& lin) {
  if (lin.kind == 0) return linear_small_m(x, w, opt(bias));
  if (lin.kind == 1) return int8_linear(x, lin.tensors[0], lin.tensors[1], opt(bias));
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.stride(1) == 1, "llama_decode: float32 rows");
  torch::Tensor y = torch::empty({x.size(0), lin.out_features}, x.options());
  TORCH_CHECK(!bias.numel() || (bias.scalar_type() == torch::kFloat32 && bias.is_contiguous() &&
                                bias.numel() == lin.out_features), "llama_decode: GGUF bias must be float32 [N]");
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  if (lin.kind == 3) {
    quant::gguf_shards_q8_into(x, lin.tensors, lin.qtypes, bp, y);
  } else {
    quant::gguf_shards_into(x, lin.tensors, lin.qtypes, bp, y);
  }
  return y;
}

// A decode plan: everything a Llama-family decode step reads that stays the same from step to
// step (the weights, how each linear holds its weight, the KV caches, the RoPE table), converted
// from Python once (llama_decode_plan) instead of on every step: the ~500 tensors of a 30-layer
// model cost ~170 us of argument conversion per call.
struct DecodePlan {
  std::vector<torch::Tensor> weights;     // 12 per layer (see llama_decode_plan)
  std::vector<DecodeLinear> linears;      // 4 per layer: qkv, o, gate_up, down
  std::vector<torch::Tensor> kv_caches;   // [2, num_blocks, block_size, KVH, hd] per layer
  std::vector<int64_t> windows;           // sliding window per layer (0: none)
  torch::Tensor cos_sin, final_norm;
  int64_t H = 0, KVH = 0, hd = 0;
  double eps = 0.0, scale = 0.0;
};

static std::vector<std::unique_ptr<DecodePlan>>& decode_plans() {
  static std::vector<std::unique_ptr<DecodePlan>> plans;  // index: plan id; released plans are null
  return plans;
}

// Builds a plan and returns its id. weights holds 12 tensors per layer, in order: input norm,
// qkv weight, qkv bias, q norm, k norm, o weight, o bias, post-attention norm, gate_up weight,
// gate_up bias, down weight, down bias (an empty tensor: not present). kv_caches[l] is layer l's
// [2, num_blocks, block_size, KVH, hd] cache; windows[l] its sliding window (0: none). The 4
// linears of each layer (qkv, o, gate_up, down) are described by linear_meta and quant_tensors
// (see parse_linears): a float32 one uses its weight slot in weights (plain or blocked,
// linear_small_m), a quantized one leaves that slot empty and runs int8_linear or the GGUF
// kernel on its shards (kind 3: with the input rows quantized to Q8 blocks once per linear).
int64_t llama_decode_plan(std::vector<torch::Tensor> weights, std::vector<torch::Tensor> quant_tensors,
                          std::vector<int64_t> linear_meta, std::vector<torch::Tensor> kv_caches,
                          std::vector<int64_t> windows, torch::Tensor cos_sin, torch::Tensor final_norm, int64_t H,
                          int64_t KVH, int64_t hd, double eps, double scale) {
  const int64_t L = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 12 * L && static_cast<int64_t>(windows.size()) == L,
              "llama_decode_plan: 12 weights and one window per layer");
  auto plan = std::make_unique<DecodePlan>();
  plan->linears = parse_linears(quant_tensors, linear_meta, 4 * L);
  plan->weights = std::move(weights);
  plan->kv_caches = std::move(kv_caches);
  plan->windows = std::move(windows);
  plan->cos_sin = cos_sin;
  plan->final_norm = final_norm;
  plan->H = H;
  plan->KVH = KVH;
  plan->hd = hd;
  plan->eps = eps;
  plan->scale = scale;
  auto& plans = decode_plans();
  plans.push_back(std::move(plan));
  return static_cast<int64_t>(plans.size()) - 1;
}

// Drops a plan (its tensors are released); its id is not reused.
void llama_decode_release(int64_t plan) {
  auto& plans = decode_plans();
  if (plan >= 0 && plan < static_cast<int64_t>(plans.size())) plans[plan].reset();
}

// One decode step of a plan's decoder for M single-token requests, in one call: the same kernels
// and the same arithmetic as the layer-by-layer path, without a Python round trip per op.
// positions and slots: int64 [M]; block_table: int32 [M, max_blocks]; seq_lens: int32 [M].
// Returns the final-normed hidden states [M, D].
torch::Tensor llama_decode_step(int64_t plan_id, torch::Tensor hidden, torch::Tensor positions, torch::Tensor slots,
                                torch::Tensor block_table, torch::Tensor seq_lens) {
  auto& plans = decode_plans();
  TORCH_CHECK(plan_id >= 0 && plan_id < static_cast<int64_t>(plans.size()) && plans[plan_id],
              "llama_decode_step: plan ", plan_id, " does not exist (released, or never built)");
  const DecodePlan& p = *plans[plan_id];
  const int64_t L = static_cast<int64_t>(p.kv_caches.size()), H = p.H, KVH = p.KVH, hd = p.hd;
  const double eps = p.eps;
  TORCH_CHECK(hidden.scalar_type() == torch::kFloat32 && hidden.is_contiguous() && hidden.dim() == 2);
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.is_contiguous() && positions.scalar_type() == torch::kInt64 &&
              positions.is_contiguous(), "llama_decode_step: int64 positions and slots");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32,
              "llama_decode_step: int32 block table and seq lens");
  const int64_t M = hidden.size(0), qs = H * hd, kvs = KVH * hd;
  TORCH_CHECK(slots.numel() == M && positions.numel() == M && seq_lens.numel() == M && block_table.size(0) == M);
  torch::Tensor residual = hidden;
  torch::Tensor x;
  for (int64_t l = 0; l < L; ++l) {
    const torch::Tensor* w = p.weights.data() + 12 * l;
    const DecodeLinear* lin = p.linears.data() + 4 * l;
    if (l == 0) {
      x = rms_norm(residual, w[0], eps);
    } else {
      fused_add_rms_norm_(x, residual, w[0], eps);
    }
    torch::Tensor qkv = decode_linear(x, w[1], w[2], lin[0]);  // [M, qs + 2 kvs]
    torch::Tensor q, k;
    if (w[3].numel()) {  // per-head q/k norm (Qwen3), then RoPE on the normed copies
      q = rms_norm(qkv.narrow(1, 0, qs).reshape({M * H, hd}), w[3], eps).view({M, H, hd});
      k = rms_norm(qkv.narrow(1, qs, kvs).reshape({M * KVH, hd}), w[4], eps).view({M, KVH, hd});
      rotary_neox_(q, positions, p.cos_sin);
      rotary_neox_(k, positions, p.cos_sin);
    } else {  // q and k adjacent in the projection: rotate them in place together
      rotary_neox_(qkv.narrow(1, 0, qs + kvs).view({M, H + KVH, hd}), positions, p.cos_sin);
      q = qkv.narrow(1, 0, qs).reshape({M, H, hd});
      k = qkv.narrow(1, qs, kvs).view({M, KVH, hd});
    }
    torch::Tensor v = qkv.narrow(1, qs + kvs, kvs).view({M, KVH, hd});
    torch::Tensor kc = p.kv_caches[l].select(0, 0), vc = p.kv_caches[l].select(0, 1);
    write_kv(k, v, kc, vc, slots.data_ptr<int64_t>(), M);
    torch::Tensor attn = paged_decode(q.contiguous(), kc, vc, block_table, seq_lens, p.scale, p.windows[l], 0.0, c10::nullopt);
    x = decode_linear(attn.view({M, qs}), w[5], w[6], lin[1]);
    fused_add_rms_norm_(x, residual, w[7], eps);
    x = decode_linear(silu_and_mul(decode_linear(x, w[8], w[9], lin[2])), w[10], w[11], lin[3]);
  }
  fused_add_rms_norm_(x, residual, p.final_norm, eps);
  return x;
}
