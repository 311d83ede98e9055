// host_cpu_kernels, part 5 of 5 (one translation unit with the parts before it; see
// vector_math.cpp). llama_decode: a whole decode step of a Llama-family decoder in one call, from the kernels above.

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
