// The C++ CPU kernels' entry points, for kernels that call others in C++ (decoder_layer_cpu.cpp)
// rather than through torch's dispatcher. Each is defined, documented and registered in its own
// source file; the signatures here must match those definitions.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

// quantized_linear_cpu.cpp
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type,
                            bool int8_activations);
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, int64_t out_features);

// fused_ops_cpu.cpp
void add_rms_norm_(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps);
void rotary_embedding_(const at::Tensor& positions, at::Tensor query, at::Tensor key,
                       const at::Tensor& cos, const at::Tensor& sin);

// cache_cpu.cpp
void write_kv_cache_(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
                     at::Tensor value_cache, const at::Tensor& slot_mapping);

// paged_attention_cpu.cpp
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale,
                                  std::optional<int64_t> sliding_window,
                                  std::optional<double> logits_soft_cap,
                                  const std::optional<at::Tensor>& sinks);
at::Tensor paged_prefill_attention(const at::Tensor& query, const at::Tensor& key_cache,
                                   const at::Tensor& value_cache, const at::Tensor& block_tables,
                                   const at::Tensor& cu_query_lens,
                                   const at::Tensor& context_lens, double scale,
                                   std::optional<int64_t> sliding_window,
                                   std::optional<double> logits_soft_cap,
                                   const std::optional<at::Tensor>& sinks);
