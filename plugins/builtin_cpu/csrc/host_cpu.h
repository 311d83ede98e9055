// host_cpu_kernels: the header every translation unit of csrc/ includes. Each .cpp compiles on its
// own (plugins/builtin_cpu/kernels.py lists them; ninja builds them side by side) and the objects
// link into one extension module, whose bindings kernels.py writes into the build folder.
//
// Here: the common headers, the instruction-set macros (what the build's -m flags turned on), the
// inline vector helpers (vector_math.h) and the declarations of the functions one file defines
// and another calls or the module binds.

#pragma once

#include <torch/types.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOST_AVX2 1
#endif
// the quantized kernels' AVX2 paths also use F16C (half -> float conversions)
#if defined(HOST_AVX2) && defined(__F16C__)
#define HOST_QAVX2 1
#endif
// and where AVX-512 (F, BW, VL) was built in, their small-M paths use 512-bit registers
#if defined(HOST_QAVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HOST_QAVX512 1
#endif

#include "vector_math.h"

// ---- the module's functions (kernels.py's _FUNCTIONS binds each under its name) ----

// paged_decode.cpp
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_table, torch::Tensor seq_lens, double scale,
                           int64_t window, double softcap, c10::optional<torch::Tensor> sinks);
// fused_moe.cpp
torch::Tensor fused_moe(torch::Tensor x, torch::Tensor w13, torch::Tensor w2, torch::Tensor topk_weights,
                        torch::Tensor topk_ids, int64_t activation, c10::optional<torch::Tensor> w13_bias,
                        c10::optional<torch::Tensor> w2_bias, double alpha, double limit);
// linear_small_m.cpp
torch::Tensor linear_small_m(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
// quant_linear.cpp
torch::Tensor gguf_linear(torch::Tensor x, torch::Tensor qweight, int64_t qtype, c10::optional<torch::Tensor> bias);
torch::Tensor gguf_linear_q8(torch::Tensor x, torch::Tensor qweight, int64_t qtype, c10::optional<torch::Tensor> bias);
std::vector<torch::Tensor> quantize_q8(torch::Tensor x);
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, c10::optional<torch::Tensor> bias);
std::string kernels_isa();
// elementwise.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
void fused_add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps);
void rotary_neox_(torch::Tensor x, torch::Tensor positions, torch::Tensor cache);
torch::Tensor silu_and_mul(torch::Tensor x);
// llama_decode.cpp
int64_t llama_decode_plan(std::vector<torch::Tensor> weights, std::vector<torch::Tensor> quant_tensors,
                          std::vector<int64_t> linear_meta, std::vector<torch::Tensor> kv_caches,
                          std::vector<int64_t> windows, torch::Tensor cos_sin, torch::Tensor final_norm, int64_t H,
                          int64_t KVH, int64_t hd, double eps, double scale);
void llama_decode_release(int64_t plan);
torch::Tensor llama_decode_step(int64_t plan_id, torch::Tensor hidden, torch::Tensor positions, torch::Tensor slots,
                                torch::Tensor block_table, torch::Tensor seq_lens);

// ---- quant_linear.cpp's entry points for the fused decode step (llama_decode.cpp) ----
namespace quant {
// The columns of y [M, sum of the shards' N] = x [M, K] float32 rows @ dequantize(shard)^T for each
// GGUF shard in turn (+ bias[N] where not null).
void gguf_shards_into(const torch::Tensor& x, const std::vector<torch::Tensor>& qweights,
                      const std::vector<int64_t>& qtypes, const float* bias, torch::Tensor& y);
// gguf_shards_into with the rows of x quantized to Q8 blocks once, every shard reading them.
void gguf_shards_q8_into(const torch::Tensor& x, const std::vector<torch::Tensor>& qweights,
                         const std::vector<int64_t>& qtypes, const float* bias, torch::Tensor& y);
}  // namespace quant
