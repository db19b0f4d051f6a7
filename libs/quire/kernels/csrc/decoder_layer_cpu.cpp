// One pre-norm decoder layer of a Llama-shaped model whose four matmuls are quantized blocks
// or packed weights (linear_cpu.cpp), in one call: the same kernels, in the same order, as
// quire.model.decoder's forward calls one by one from Python (so the same bits), without a trip
// through Python and torch's dispatcher between them. quire.model.fused_layer says which layers qualify and calls it.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "kernel_ops.h"

namespace {

at::Tensor unit_last_stride(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// The type id of a matmul given as a packed weight in the activations' dtype (packed_linear)
// rather than quantized blocks of a ggml type (quantized_linear, ids >= 0).
constexpr int64_t kPacked = -1;

at::Tensor layer_linear(const at::Tensor& x, const at::Tensor& weight, int64_t type,
                        int64_t out_features, bool int8_activations) {
  return type == kPacked ? packed_linear(x, weight, std::nullopt, out_features)
                         : quantized_linear(x, weight, type, int8_activations);
}

}  // namespace

// x: [num_tokens, hidden], the previous layer's MLP output (with `add_input`: residual += x and
// x = norm(residual) in place first) or, for the first layer, its normed input; float32, or
// bfloat16 when every matmul is packed; residual: [num_tokens, hidden], updated in place.
// qkv / o / gate_up / down: uint8 blocks of the types given (quantized_linear's layout) or,
// with type kPacked (-1), packed weights in x's dtype; intermediate_size: down's in_features.
// q, k, v are the qkv output's first num_heads, then num_kv_heads, then num_kv_heads heads. positions, cos, sin: rotary_embedding_'s; the
// caches, slot_mapping, block_tables, context_lens: the attention kernels'. With cu_query_lens
// the step runs paged_prefill_attention, else paged_decode_attention (one token a sequence).
// Returns down(silu(gate) * up) of the post-attention norm: the next layer's x.
at::Tensor decoder_layer(at::Tensor x, at::Tensor residual, bool add_input,
                         const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                         const at::Tensor& qkv, int64_t qkv_type, const at::Tensor& o,
                         int64_t o_type, const at::Tensor& gate_up, int64_t gate_up_type,
                         const at::Tensor& down, int64_t down_type, bool int8_activations,
                         int64_t intermediate_size, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, const at::Tensor& positions, const at::Tensor& cos,
                         const at::Tensor& sin,
                         at::Tensor key_cache, at::Tensor value_cache,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& context_lens,
                         const std::optional<at::Tensor>& cu_query_lens, double scale,
                         std::optional<int64_t> sliding_window) {
  TORCH_CHECK_VALUE(x.dim() == 2 &&
                        (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
                    "decoder_layer takes float32 or bfloat16 [num_tokens, hidden] activations");
  if (add_input) add_rms_norm_(x, residual, input_norm, eps);
  const int64_t hidden = x.size(1);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  const at::Tensor fused = layer_linear(x, qkv, qkv_type, q_size + 2 * kv_size, int8_activations);
  TORCH_CHECK_VALUE(fused.size(1) == q_size + 2 * kv_size, "qkv has ", fused.size(1),
                    " outputs, not (num_heads + 2 num_kv_heads) head_dim = ", q_size + 2 * kv_size);
  const std::vector<at::Tensor> parts = fused.split_with_sizes({q_size, kv_size, kv_size}, -1);
  at::Tensor q = parts[0].view({-1, num_heads, head_dim});
  at::Tensor k = parts[1].view({-1, num_kv_heads, head_dim});
  const at::Tensor v = parts[2].view({-1, num_kv_heads, head_dim});
  rotary_embedding_(positions, q, k, cos, sin);
  // A cache narrower than x (kv_cache_dtype): keys and values are stored rounded to it, and
  // the attention reads the queries in it and its output is widened back, as
  // quire.model.attention.PagedAttention does.
  const at::ScalarType cache_type = key_cache.scalar_type();
  const bool narrow = cache_type != x.scalar_type();
  if (narrow) q = q.to(cache_type);
  write_kv_cache_(narrow ? k.to(cache_type) : k, narrow ? v.to(cache_type) : v, key_cache,
                  value_cache, slot_mapping);
  const at::Tensor tables = unit_last_stride(block_tables);
  at::Tensor attn =
      cu_query_lens.has_value()
          ? paged_prefill_attention(q, key_cache, value_cache, tables, *cu_query_lens,
                                    context_lens, scale, sliding_window, std::nullopt,
                                    std::nullopt)
          : paged_decode_attention(q, key_cache, value_cache, tables, context_lens, scale,
                                   sliding_window, std::nullopt, std::nullopt);
  if (narrow) attn = attn.to(x.scalar_type());
  at::Tensor h = layer_linear(attn.reshape({-1, q_size}), o, o_type, hidden, int8_activations);
  add_rms_norm_(h, residual, post_norm, eps);
  const std::vector<at::Tensor> halves =
      layer_linear(h, gate_up, gate_up_type, 2 * intermediate_size, int8_activations)
          .chunk(2, -1);
  return layer_linear(at::silu(halves[0]) * halves[1], down, down_type, hidden, int8_activations);
}

TORCH_LIBRARY_FRAGMENT(quire_cpu, m) {
  m.def(
      "decoder_layer(Tensor(a!) x, Tensor(b!) residual, bool add_input, Tensor input_norm, "
      "Tensor post_norm, float eps, Tensor qkv, int qkv_type, Tensor o, int o_type, "
      "Tensor gate_up, int gate_up_type, Tensor down, int down_type, bool int8_activations, "
      "int intermediate_size, int num_heads, int num_kv_heads, int head_dim, Tensor positions, "
      "Tensor cos, Tensor sin, Tensor(c!) key_cache, Tensor(d!) value_cache, "
      "Tensor slot_mapping, Tensor block_tables, Tensor context_lens, Tensor? cu_query_lens, float scale, int? sliding_window) -> Tensor");
}

TORCH_LIBRARY_IMPL(quire_cpu, CPU, m) { m.impl("decoder_layer", &decoder_layer); }
