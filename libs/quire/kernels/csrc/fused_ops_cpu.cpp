// Fused elementwise parts of a Llama decoder layer on the CPU: RMSNorm (with the residual
// add before it) and rotary embeddings, each one pass over its rows, in place.
//
// Results match the unfused torch ops of quire.kernels.reference_fused (which follow
// transformers' op order) operation by operation: every intermediate the torch version
// rounds to the model dtype is rounded here too, and products are never contracted into
// fused multiply-adds (fp-contract=off below), so rotary embeddings are bit-identical and
// RMSNorm differs only in the order of its float32 sum of squares.
//
// Rows are spread over torch's intra-op threads only when a call is large enough
// (prefill chunks); a decode batch's few rows run on the calling thread, where a parallel
// region would cost more than the work.

#pragma GCC optimize("fp-contract=off")

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

// Elements per task below which a call stays on one thread (~10 us of one core).
constexpr int64_t kMinElementsPerTask = int64_t{1} << 16;

template <typename scalar_t>
inline float widen(scalar_t x) {
  return static_cast<float>(x);
}

// float -> the dtype, rounded as torch rounds.
template <typename scalar_t>
inline scalar_t narrow(float x) {
  return static_cast<scalar_t>(x);
}

// bfloat16 by its bits: the same values as c10::BFloat16's conversions (nearest even, NaN ->
// 0x7FC0), written as plain integer operations so that the `omp simd` loops vectorize; through
// c10's own functions they stay scalar.
template <>
inline float widen<c10::BFloat16>(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <>
inline c10::BFloat16 narrow<c10::BFloat16>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint16_t out = x != x ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
  return c10::BFloat16(out, c10::BFloat16::from_bits());
}

// x rounded to the dtype and back: what a torch op in that dtype stores.
template <typename scalar_t>
inline float round_to(float x) {
  return widen(narrow<scalar_t>(x));
}

int64_t rows_per_task(int64_t row_elements) {
  return std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, row_elements));
}

// out = weight * to_dtype(x * rsqrt(mean(x^2) + eps)), x in float32 (transformers' order).
template <typename scalar_t>
inline void norm_row(const scalar_t* x, const scalar_t* weight, scalar_t* out, int64_t hidden,
                     float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < hidden; ++d) sum += widen(x[d]) * widen(x[d]);
  const float inv_rms = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + eps);
#pragma omp simd
  for (int64_t d = 0; d < hidden; ++d) {
    out[d] = narrow<scalar_t>(widen(weight[d]) * round_to<scalar_t>(widen(x[d]) * inv_rms));
  }
}

template <typename scalar_t>
void rms_norm_impl(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out, float eps) {
  const int64_t hidden = x.size(1);
  const scalar_t* x_data = x.data_ptr<scalar_t>();
  const scalar_t* w = weight.data_ptr<scalar_t>();
  scalar_t* out_data = out.data_ptr<scalar_t>();
  const int64_t x_stride = x.stride(0), out_stride = out.stride(0);
  at::parallel_for(0, x.size(0), rows_per_task(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      norm_row(x_data + row * x_stride, w, out_data + row * out_stride, hidden, eps);
    }
  });
}

// residual = residual + x (rounded to the dtype), then x = rms_norm(residual).
template <typename scalar_t>
void add_rms_norm_impl(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                       float eps) {
  const int64_t hidden = x.size(1);
  scalar_t* x_data = x.data_ptr<scalar_t>();
  scalar_t* r_data = residual.data_ptr<scalar_t>();
  const scalar_t* w = weight.data_ptr<scalar_t>();
  const int64_t x_stride = x.stride(0), r_stride = residual.stride(0);
  at::parallel_for(0, x.size(0), rows_per_task(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* xr = x_data + row * x_stride;
      scalar_t* rr = r_data + row * r_stride;
#pragma omp simd
      for (int64_t d = 0; d < hidden; ++d) rr[d] = narrow<scalar_t>(widen(rr[d]) + widen(xr[d]));
      norm_row(rr, w, xr, hidden, eps);
    }
  });
}

void check_norm_args(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(x.device().is_cpu() && weight.device().is_cpu(),
                    "the C++ CPU kernels take CPU tensors");
  TORCH_CHECK_VALUE(x.dim() == 2 && x.stride(1) == 1, "x must be [num_tokens, hidden] with unit "
                    "last stride");
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
                    "weight must be a contiguous [hidden] vector");
  TORCH_CHECK_VALUE(weight.scalar_type() == x.scalar_type(), "x and weight must share a dtype");
}

template <typename Fn>
void dispatch_float_types(at::ScalarType type, Fn&& fn) {
  switch (type) {
    case at::kFloat:
      return fn(float{});
    case at::kBFloat16:
      return fn(c10::BFloat16{});
    case at::kHalf:
      return fn(c10::Half{});
    default:
      TORCH_CHECK_VALUE(false, "the C++ kernels take float32, bfloat16 or float16, got ", type);
  }
}

// One head's rotate-half rotation in place: x[d] and x[d + half] by the angle at d
// (cos/sin rows hold each angle twice, as transformers builds them), with cos and sin
// rounded to the dtype first and each product and the sum rounded as torch does.
template <typename scalar_t>
inline void rotate_head(scalar_t* x, const float* cos, const float* sin, int64_t half) {
#pragma omp simd
  for (int64_t d = 0; d < half; ++d) {
    const float x1 = widen(x[d]), x2 = widen(x[d + half]);
    const float c1 = round_to<scalar_t>(cos[d]), s1 = round_to<scalar_t>(sin[d]);
    const float c2 = round_to<scalar_t>(cos[d + half]), s2 = round_to<scalar_t>(sin[d + half]);
    const float first = round_to<scalar_t>(x1 * c1) + round_to<scalar_t>(-x2 * s1);
    const float second = round_to<scalar_t>(x2 * c2) + round_to<scalar_t>(x1 * s2);
    x[d] = narrow<scalar_t>(first);
    x[d + half] = narrow<scalar_t>(second);
  }
}

template <typename scalar_t>
void rotary_impl(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,
                 const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t num_tokens = query.size(0), head_dim = query.size(2), half = head_dim / 2;
  const int64_t num_q_heads = query.size(1), num_k_heads = key.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cos_data = cos.data_ptr<float>();
  const float* sin_data = sin.data_ptr<float>();
  scalar_t* q = query.data_ptr<scalar_t>();
  scalar_t* k = key.data_ptr<scalar_t>();
  const int64_t row_elements = (num_q_heads + num_k_heads) * head_dim;
  at::parallel_for(0, num_tokens, rows_per_task(row_elements), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_data + pos[t] * cos.stride(0);
      const float* s = sin_data + pos[t] * sin.stride(0);
      for (int64_t h = 0; h < num_q_heads; ++h) {
        rotate_head(q + t * query.stride(0) + h * query.stride(1), c, s, half);
      }
      for (int64_t h = 0; h < num_k_heads; ++h) {
        rotate_head(k + t * key.stride(0) + h * key.stride(1), c, s, half);
      }
    }
  });
}

}  // namespace

// x: [num_tokens, hidden]; weight: [hidden]. Returns rms_norm(x) * weight, a new tensor.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_args(x, weight);
  at::Tensor out = at::empty(x.sizes(), x.options());
  dispatch_float_types(x.scalar_type(), [&](auto tag) {
    rms_norm_impl<decltype(tag)>(x, weight, out, static_cast<float>(eps));
  });
  return out;
}

// In place: residual += x, then x = rms_norm(residual) * weight. Both [num_tokens, hidden].
void add_rms_norm_(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps) {
  check_norm_args(x, weight);
  TORCH_CHECK_VALUE(residual.sizes() == x.sizes() && residual.stride(1) == 1 &&
                        residual.scalar_type() == x.scalar_type(),
                    "residual must match x in shape and dtype, with unit last stride");
  dispatch_float_types(x.scalar_type(), [&](auto tag) {
    add_rms_norm_impl<decltype(tag)>(x, residual, weight, static_cast<float>(eps));
  });
}

// In place on query [num_tokens, num_heads, head_dim] and key [num_tokens, num_kv_heads,
// head_dim] (views with unit last stride, e.g. into one fused qkv output); cos, sin:
// [max_positions, head_dim] float32; positions: [num_tokens] int64.
void rotary_embedding_(const at::Tensor& positions, at::Tensor query, at::Tensor key,
                       const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK_VALUE(query.device().is_cpu() && key.device().is_cpu() && cos.device().is_cpu(),
                    "the C++ CPU kernels take CPU tensors");
  TORCH_CHECK_VALUE(query.dim() == 3 && key.dim() == 3 && query.stride(2) == 1 &&
                        key.stride(2) == 1 && query.size(0) == key.size(0) &&
                        query.size(2) == key.size(2) && query.size(2) % 2 == 0,
                    "query and key must be [num_tokens, heads, head_dim] with unit last stride "
                    "and one even head_dim");
  TORCH_CHECK_VALUE(query.scalar_type() == key.scalar_type(), "query and key must share a dtype");
  TORCH_CHECK_VALUE(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                        cos.dim() == 2 && cos.sizes() == sin.sizes() &&
                        cos.strides() == sin.strides() && cos.stride(1) == 1 &&
                        cos.size(1) == query.size(2),
                    "cos and sin must be float32 [max_positions, head_dim] tables");
  TORCH_CHECK_VALUE(positions.scalar_type() == at::kLong && positions.dim() == 1 &&
                        positions.is_contiguous() && positions.size(0) == query.size(0),
                    "positions must be a contiguous [num_tokens] int64 vector");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < positions.size(0); ++t) {
    TORCH_CHECK_VALUE(pos[t] >= 0 && pos[t] < cos.size(0), "positions must lie in [0, ",
                      cos.size(0), ")");
  }
  dispatch_float_types(query.scalar_type(), [&](auto tag) {
    rotary_impl<decltype(tag)>(positions, query, key, cos, sin);
  });
}

TORCH_LIBRARY_FRAGMENT(quire_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def(
      "rotary_embedding_(Tensor positions, Tensor(a!) query, Tensor(b!) key, Tensor cos, "
      "Tensor sin) -> ()");
}

TORCH_LIBRARY_IMPL(quire_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm_", &add_rms_norm_);
  m.impl("rotary_embedding_", &rotary_embedding_);
}
