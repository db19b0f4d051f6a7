// The packed linear's register tiles (linear_cpu.cpp has the layout and why), shared with the
// kernels that multiply by the same layout: prefill attention's keys and values packed per call
// (paged_attention_cpu.cpp). Header-only: every translation unit gets its own copy, compiled
// for its own build's instruction set.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace quire_cpu::packed_tile {

constexpr int64_t kTileCols = 64;  // output columns per tile: four 16-lane vectors
constexpr int kVectors = 4;        // vectors per tile row
constexpr int kMaxRows = 6;        // rows of x per pass: 24 accumulators + 4 weights in registers
// How far ahead of its loads a tile's first pass over x prefetches the weights: a few k steps
// (eight bfloat16 pairs, 32 float32 steps), near enough to stay in L2 until read.
constexpr int kPrefetchBytes = 2048;

}  // namespace quire_cpu::packed_tile

#if defined(__AVX512F__)
#include <immintrin.h>

namespace quire_cpu::packed_tile {

// The lanes of the 16-column vector starting at column `first` that hold one of num_cols.
inline __mmask16 column_mask(int num_cols, int first) {
  return static_cast<__mmask16>(num_cols - first >= 16 ? 0xFFFFu
                                                       : (1u << (num_cols - first)) - 1u);
}

// rows x [kRows, K] times one tile: acc[r][v] over the tile's 64 columns, then bias, rounding
// and a store of the columns < num_cols. With `prefetch`, the tile's stream is prefetched
// kPrefetchBytes ahead (into the next tile past its end: tiles lie back to back).
template <int kRows>
void tile_float(const float* x, int64_t x_stride, const float* tile, int64_t k_dim,
                const float* bias, float* out, int64_t out_stride, int num_cols, bool prefetch) {
  __m512 acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < k_dim; ++k) {
    const float* w = tile + k * kTileCols;
    if (prefetch) {
      for (int v = 0; v < kVectors; ++v) {
        __builtin_prefetch(reinterpret_cast<const char*>(w + 16 * v) + kPrefetchBytes, 0, 2);
      }
    }
    __m512 wv[kVectors];
    for (int v = 0; v < kVectors; ++v) wv[v] = _mm512_loadu_ps(w + 16 * v);
    for (int r = 0; r < kRows; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * x_stride + k]);
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_fmadd_ps(xv, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) {
      const int first = 16 * v;
      if (first >= num_cols) break;
      const __mmask16 mask = column_mask(num_cols, first);
      __m512 y = acc[r][v];
      if (bias != nullptr) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, bias + first));
      _mm512_mask_storeu_ps(out + r * out_stride + first, mask, y);
    }
  }
}

// The same for bfloat16 x and tile (k_dim even), the float32 sums stored as out_t: rounded to
// bfloat16 (the linears) or as they are (float32: attention's scores and weighted values).
template <int kRows, typename out_t = c10::BFloat16>
__attribute__((target("avx512bf16"))) void tile_bf16(const c10::BFloat16* x, int64_t x_stride,
                                                     const c10::BFloat16* tile, int64_t k_dim,
                                                     const c10::BFloat16* bias, out_t* out,
                                                     int64_t out_stride, int num_cols,
                                                     bool prefetch) {
  __m512 acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t pair = 0; pair < k_dim / 2; ++pair) {
    const c10::BFloat16* w = tile + pair * 2 * kTileCols;
    if (prefetch) {
      for (int v = 0; v < kVectors; ++v) {
        __builtin_prefetch(reinterpret_cast<const char*>(w + 32 * v) + kPrefetchBytes, 0, 2);
      }
    }
    __m512bh wv[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      wv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 32 * v));
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t bits;
      std::memcpy(&bits, x + r * x_stride + 2 * pair, sizeof(bits));
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(bits));
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xv, wv[v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) {
      const int first = 16 * v;
      if (first >= num_cols) break;
      const __mmask16 mask = column_mask(num_cols, first);
      __m512 y = acc[r][v];
      if (bias != nullptr) {
        const __m256i b = _mm256_maskz_loadu_epi16(mask, bias + first);
        y = _mm512_add_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
      }
      if constexpr (std::is_same_v<out_t, float>) {
        _mm512_mask_storeu_ps(out + r * out_stride + first, mask, y);
      } else {
        const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(y));
        _mm256_mask_storeu_epi16(out + r * out_stride + first, mask, rounded);
      }
    }
  }
}

// One tile against every row of x, kMaxRows rows at a time.
template <typename TileFn>
void tile_all_rows(int64_t num_rows, TileFn&& fn) {
  int64_t row = 0;
  for (; row + kMaxRows <= num_rows; row += kMaxRows) fn(std::integral_constant<int, kMaxRows>{}, row);
  switch (num_rows - row) {
    case 1:
      return fn(std::integral_constant<int, 1>{}, row);
    case 2:
      return fn(std::integral_constant<int, 2>{}, row);
    case 3:
      return fn(std::integral_constant<int, 3>{}, row);
    case 4:
      return fn(std::integral_constant<int, 4>{}, row);
    case 5:
      return fn(std::integral_constant<int, 5>{}, row);
    default:
      return;
  }
}
static_assert(kMaxRows == 6, "tile_all_rows dispatches remainders 1 .. kMaxRows - 1");

}  // namespace quire_cpu::packed_tile
#endif
