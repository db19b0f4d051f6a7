// The paged KV cache write on the CPU: each new token's key and value rows copied to the
// slot the slot mapping names, one pass, with every slot checked before anything is written.
// signatures.KVCacheWrite gives the arguments and their meaning.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace {

// Tokens per task below which the copy stays on the calling thread.
constexpr int64_t kMinTokensPerTask = 256;

void copy_rows(const at::Tensor& src, at::Tensor& cache, const int64_t* slots,
               int64_t num_tokens) {
  // src: [num_tokens, num_kv_heads, head_dim]; cache: [num_blocks, block_size, heads, D]
  const int64_t block_size = cache.size(1), num_heads = cache.size(2);
  const int64_t row_bytes = cache.size(3) * cache.element_size();
  const char* src_data = static_cast<const char*>(src.data_ptr());
  char* cache_data = static_cast<char*>(cache.data_ptr());
  const int64_t elem = cache.element_size();
  at::parallel_for(0, num_tokens, kMinTokensPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
      for (int64_t h = 0; h < num_heads; ++h) {
        std::memcpy(cache_data + (block * cache.stride(0) + offset * cache.stride(1) +
                                  h * cache.stride(2)) * elem,
                    src_data + (t * src.stride(0) + h * src.stride(1)) * elem, row_bytes);
      }
    }
  });
}

}  // namespace

// key, value: [num_tokens, num_kv_heads, head_dim] (views allowed, unit last stride);
// key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], written in place;
// slot_mapping: [num_tokens] int64, distinct slots.
void write_kv_cache_(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
                     at::Tensor value_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK_VALUE(key.device().is_cpu() && key_cache.device().is_cpu() &&
                        slot_mapping.device().is_cpu(),
                    "the C++ CPU kernels take CPU tensors");
  TORCH_CHECK_VALUE(key.dim() == 3 && value.sizes() == key.sizes() && key_cache.dim() == 4 &&
                        value_cache.sizes() == key_cache.sizes() &&
                        key.size(1) == key_cache.size(2) && key.size(2) == key_cache.size(3),
                    "key/value must be [num_tokens, num_kv_heads, head_dim] of the caches' "
                    "[num_blocks, block_size, num_kv_heads, head_dim]");
  TORCH_CHECK_VALUE(key.stride(2) == 1 && value.stride(2) == 1 && key_cache.stride(3) == 1 &&
                        value_cache.stride(3) == 1,
                    "key, value and caches must have head_dim stride 1");
  TORCH_CHECK_VALUE(key.scalar_type() == key_cache.scalar_type() &&
                        value.scalar_type() == key_cache.scalar_type() &&
                        value_cache.scalar_type() == key_cache.scalar_type(),
                    "key, value and caches must share one dtype");
  TORCH_CHECK_VALUE(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 &&
                        slot_mapping.is_contiguous() && slot_mapping.size(0) == key.size(0),
                    "slot_mapping must be a contiguous [num_tokens] int64 vector");
  const int64_t num_tokens = key.size(0);
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK_VALUE(slots[t] >= 0 && slots[t] < num_slots, "slot_mapping holds slots outside [0, ",
                      num_slots, ")");
  }
  copy_rows(key, key_cache, slots, num_tokens);
  copy_rows(value, value_cache, slots, num_tokens);
}

TORCH_LIBRARY_FRAGMENT(quire_cpu, m) {
  m.def(
      "write_kv_cache_(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(quire_cpu, CPU, m) { m.impl("write_kv_cache_", &write_kv_cache_); }
