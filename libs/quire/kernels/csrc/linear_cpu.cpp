// Linear layers on the CPU with AVX-512 or AVX2: y = x W^T (+ bias), W packed once at load.
//
// Packed layout. The weight [N, K] is cut into tiles of kTileCols = 64 output columns (N padded
// with zero columns to a multiple of 64). Within a tile, for each step along K, the 64
// columns' weights sit side by side: four 16-column vectors, one cache-line each.
//   float32:  packed[tile][k][64]                    = W[64 * tile + c][k]
//   bfloat16: packed[tile][k / 2][64][2] (pairs of k) = W[64 * tile + c][k, k + 1]
// so a tile is one contiguous stream, read front to back, and each vector feeds one
// multiply-add per row of x: an FMA of a broadcast x[m][k] (float32) or a vdpbf16ps of a
// broadcast pair x[m][k, k + 1] (bfloat16; exact products, float32 sums).
//
// The product runs tile by tile, tiles spread over torch's threads; within a tile, rows of x
// go kMaxRows at a time, 4 x kMaxRows accumulators in registers, so a few rows (decode) read
// each weight once from memory and many rows re-read the tile from L2. Sums are float32 and
// the output is rounded to the dtype once (bfloat16: round to nearest even).
//
// An AVX2 build (x86-64-v3: 16 registers of 8 lanes, no 16-bit dot product) reads the same
// layout. One row of x (a lone decoding sequence) takes a whole tile at once: 8 accumulators,
// each weight read once. More rows take the tile as two halves of 32 columns, kAvx2Rows rows of
// x a pass (4 x kAvx2Rows accumulators; the half re-read from L1/L2 for the next rows). A
// bfloat16 pair is widened to two float32 vectors by shifts (exact) and meets x[m][k] and
// x[m][k + 1] in two FMAs: the same exact products and float32 sums as vdpbf16ps, in another
// order. The output is rounded to the dtype once, as above.
//
// The product exists only in a build with AVX-512 (x86-64-v4) or AVX2 and FMA (x86-64-v3,
// cpu_features.h); in any other build packed_linear_supported is false for every dtype and the
// model keeps torch's linears.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
// GCC 12's AVX-512 headers pass an undefined vector as the unused merge operand of the
// masked-load and widening builtins and then warn about it at every use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "cpu_features.h"
#include "packed_tile.h"

namespace {

using quire_cpu::can_use_avx512_bf16;
using namespace quire_cpu::packed_tile;

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define QUIRE_PACKED_AVX2 1
#endif

// Whether packed_linear runs for this dtype on this CPU and build.
bool supported(at::ScalarType dtype) {
#if defined(__AVX512F__)
  if (dtype == at::kFloat) return true;
  if (dtype == at::kBFloat16) return can_use_avx512_bf16();
#elif defined(QUIRE_PACKED_AVX2)
  if (dtype == at::kFloat || dtype == at::kBFloat16) return true;
#endif
  (void)dtype;
  return false;
}


#if defined(QUIRE_PACKED_AVX2)
constexpr int kAvx2Rows = 3;     // rows of x per pass over a half tile: 12 accumulators
constexpr int kHalfCols = 32;    // columns of a half tile: four 8-lane vectors

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }

// The float32 sums acc [kRows][kVecs * 8] plus bias, rounded to T, into the columns < num_cols.
template <typename T, int kRows, int kVecs>
void store_sums(const __m256 (&acc)[kRows][kVecs], const T* bias, T* out, int64_t out_stride,
                int num_cols) {
  alignas(32) float sums[kVecs * 8];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) _mm256_store_ps(sums + 8 * v, acc[r][v]);
    for (int c = 0; c < num_cols; ++c) {
      const float y = bias != nullptr ? sums[c] + widen(bias[c]) : sums[c];
      out[r * out_stride + c] = static_cast<T>(y);
    }
  }
}

// kRows rows of x times kVecs vectors of a tile's columns, starting at column `first` of the
// tile (0, or 32 for a half tile's second half).
template <int kRows, int kVecs>
void avx2_float(const float* x, int64_t x_stride, const float* tile, int first, int64_t k_dim,
                const float* bias, float* out, int64_t out_stride, int num_cols) {
  __m256 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < k_dim; ++k) {
    const float* w = tile + k * kTileCols + first;
    for (int r = 0; r < kRows; ++r) {
      const __m256 xv = _mm256_set1_ps(x[r * x_stride + k]);
      for (int v = 0; v < kVecs; ++v) {
        acc[r][v] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 8 * v), acc[r][v]);
      }
    }
  }
  store_sums<float, kRows, kVecs>(acc, bias, out, out_stride, num_cols);
}

template <int kRows, int kVecs>
void avx2_bf16(const c10::BFloat16* x, int64_t x_stride, const c10::BFloat16* tile, int first,
               int64_t k_dim, const c10::BFloat16* bias, c10::BFloat16* out, int64_t out_stride,
               int num_cols) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t pair = 0; pair < k_dim / 2; ++pair) {
    // 8 columns' (k, k + 1) pairs per vector: k in the low 16 bits of each lane, k + 1 high
    const c10::BFloat16* w = tile + pair * 2 * kTileCols + 2 * first;
    for (int v = 0; v < kVecs; ++v) {
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * v));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, high));
      for (int r = 0; r < kRows; ++r) {
        const c10::BFloat16* xr = x + r * x_stride + 2 * pair;
        acc[r][v] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(xr[0])), even, acc[r][v]);
        acc[r][v] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(xr[1])), odd, acc[r][v]);
      }
    }
  }
  store_sums<c10::BFloat16, kRows, kVecs>(acc, bias, out, out_stride, num_cols);
}

// Part `part` of a tile's columns against every row of x: a lone row takes the whole tile
// (part -1), more rows one half (part 0 or 1), kAvx2Rows rows at a time.
template <typename Fn>
void avx2_part(int64_t num_rows, int part, Fn&& fn) {
  if (part < 0) return fn(std::integral_constant<int, 1>{}, std::integral_constant<int, 8>{}, 0);
  int64_t row = 0;
  constexpr auto half = std::integral_constant<int, 4>{};
  for (; row + kAvx2Rows <= num_rows; row += kAvx2Rows) {
    fn(std::integral_constant<int, kAvx2Rows>{}, half, row);
  }
  switch (num_rows - row) {
    case 1:
      return fn(std::integral_constant<int, 1>{}, half, row);
    case 2:
      return fn(std::integral_constant<int, 2>{}, half, row);
    default:
      return;
  }
}
static_assert(kAvx2Rows == 3, "avx2_part dispatches remainders 1 .. kAvx2Rows - 1");
#endif

// Values per tile and k step in the packed layout: 64 (float32) or 128 (bfloat16, a pair).
int64_t packed_row_width(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 2 * kTileCols : kTileCols; }

}  // namespace

// x: [M, K] (unit last stride); packed: [ceil(N / 64), K or K / 2, 64 or 128], the layout above
// (built by quire.kernels.packed_linear.pack_weight); bias: [N] or None. Returns [M, N].
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, int64_t out_features) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK_VALUE(supported(dtype), "packed linears do not run on this CPU for ", dtype);
  TORCH_CHECK_VALUE(x.dim() == 2 && x.stride(1) == 1 && x.device().is_cpu(),
                    "x must be a CPU [rows, in_features] tensor with unit last stride");
  TORCH_CHECK_VALUE(packed.scalar_type() == dtype && packed.dim() == 3 && packed.is_contiguous() &&
                        packed.size(2) == packed_row_width(dtype),
                    "packed must be a packed weight in x's dtype");
  const int64_t k_dim = x.size(1), num_rows = x.size(0);
  TORCH_CHECK_VALUE(packed.size(1) == (dtype == at::kBFloat16 ? k_dim / 2 : k_dim) &&
                        (dtype != at::kBFloat16 || k_dim % 2 == 0),
                    "x's in_features (", k_dim, ") do not match the packed weight");
  const int64_t num_tiles = packed.size(0);
  TORCH_CHECK_VALUE(out_features > (num_tiles - 1) * kTileCols &&
                        out_features <= num_tiles * kTileCols,
                    "out_features (", out_features, ") do not match the packed weight");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK_VALUE(bias->scalar_type() == dtype && bias->dim() == 1 &&
                          bias->size(0) == out_features && bias->is_contiguous(),
                      "bias must be a contiguous [out_features] vector in x's dtype");
  }
  at::Tensor out = at::empty({num_rows, out_features}, x.options());
  if (num_rows == 0) return out;
#if defined(__AVX512F__)
  const int64_t x_stride = x.stride(0);
  const int64_t tile_elems = packed.size(1) * packed.size(2);
  // Tiles split evenly over the threads: each is the same work.
  const int64_t grain = std::max<int64_t>(1, (num_tiles + at::get_num_threads() - 1) /
                                                 at::get_num_threads());
  at::parallel_for(0, num_tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int num_cols = static_cast<int>(std::min(kTileCols, out_features - t * kTileCols));
      const int64_t col = t * kTileCols;
      if (dtype == at::kFloat) {
        const float* xs = x.data_ptr<float>();
        const float* tile = packed.data_ptr<float>() + t * tile_elems;
        const float* b = has_bias ? bias->data_ptr<float>() + col : nullptr;
        float* o = out.data_ptr<float>() + col;
        tile_all_rows(num_rows, [&](auto rows, int64_t row) {
          tile_float<decltype(rows)::value>(xs + row * x_stride, x_stride, tile, k_dim, b,
                                            o + row * out_features, out_features, num_cols,
                                            row == 0);
        });
      } else {
        const c10::BFloat16* xs = x.data_ptr<c10::BFloat16>();
        const c10::BFloat16* tile = packed.data_ptr<c10::BFloat16>() + t * tile_elems;
        const c10::BFloat16* b = has_bias ? bias->data_ptr<c10::BFloat16>() + col : nullptr;
        c10::BFloat16* o = out.data_ptr<c10::BFloat16>() + col;
        tile_all_rows(num_rows, [&](auto rows, int64_t row) {
          tile_bf16<decltype(rows)::value>(xs + row * x_stride, x_stride, tile, k_dim, b,
                                           o + row * out_features, out_features, num_cols,
                                           row == 0);
        });
      }
    }
  });
#elif defined(QUIRE_PACKED_AVX2)
  const int64_t x_stride = x.stride(0);
  const int64_t tile_elems = packed.size(1) * packed.size(2);
  // Work units: whole tiles for a lone row, else half tiles (twice as many to share out).
  const int64_t parts = num_rows == 1 ? 1 : 2;
  const int64_t num_units = num_tiles * parts;
  const int64_t grain = std::max<int64_t>(1, (num_units + at::get_num_threads() - 1) /
                                                 at::get_num_threads());
  at::parallel_for(0, num_units, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t t = u / parts;
      const int part = parts == 1 ? -1 : static_cast<int>(u % parts);
      const int first = part > 0 ? kHalfCols : 0;
      const int64_t col = t * kTileCols + first;
      if (col >= out_features) continue;  // a half tile of padding only
      const int width = part < 0 ? static_cast<int>(kTileCols) : kHalfCols;
      const int num_cols = static_cast<int>(std::min<int64_t>(width, out_features - col));
      if (dtype == at::kFloat) {
        const float* xs = x.data_ptr<float>();
        const float* tile = packed.data_ptr<float>() + t * tile_elems;
        const float* b = has_bias ? bias->data_ptr<float>() + col : nullptr;
        float* o = out.data_ptr<float>() + col;
        avx2_part(num_rows, part, [&](auto rows, auto vecs, int64_t row) {
          avx2_float<decltype(rows)::value, decltype(vecs)::value>(
              xs + row * x_stride, x_stride, tile, first, k_dim, b, o + row * out_features,
              out_features, num_cols);
        });
      } else {
        const c10::BFloat16* xs = x.data_ptr<c10::BFloat16>();
        const c10::BFloat16* tile = packed.data_ptr<c10::BFloat16>() + t * tile_elems;
        const c10::BFloat16* b = has_bias ? bias->data_ptr<c10::BFloat16>() + col : nullptr;
        c10::BFloat16* o = out.data_ptr<c10::BFloat16>() + col;
        avx2_part(num_rows, part, [&](auto rows, auto vecs, int64_t row) {
          avx2_bf16<decltype(rows)::value, decltype(vecs)::value>(
              xs + row * x_stride, x_stride, tile, first, k_dim, b, o + row * out_features,
              out_features, num_cols);
        });
      }
    }
  });
#endif
  return out;
}

bool packed_linear_supported(c10::ScalarType dtype) { return supported(dtype); }

TORCH_LIBRARY_FRAGMENT(quire_cpu, m) {
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
  // whether packed_linear runs for a dtype on this CPU and build (no tensor to dispatch on)
  m.def("packed_linear_supported(ScalarType dtype) -> bool", &packed_linear_supported);
}

TORCH_LIBRARY_IMPL(quire_cpu, CPU, m) { m.impl("packed_linear", &packed_linear); }
