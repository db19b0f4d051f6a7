// Linear layers over llama.cpp's quantized blocks on the CPU: y = x W^T with W [N, K] kept as
// its GGUF holds it (quire/kernels/reference_quantized.py: each row of W its blocks end to end).
//
// Dequantize-then-FMA, in tiles. The output columns are cut into tiles of kTileRows = 4 rows
// of W, spread over torch's threads. A thread dequantizes its tile's 4 rows into a float32
// scratch [4][K] (24 KiB at K = 1536: it stays in L1) and multiplies every row of x by it,
// kRowsPerPass rows of x at a time: kRowsPerPass x 4 accumulators of one vector along K, each
// pass over K reading 4 weight and kRowsPerPass x vectors, then one horizontal sum per output.
// x is taken kChunkRows = 64 rows at a time (the outer loop), so the chunk a thread multiplies
// its tiles by stays in L2, and each weight tile is dequantized once per chunk: once in decode.
//
// A prefill chunk's many rows (at least kGemmMinRows) take another road: panels of W dequantized
// into float32, multiplied by torch's GEMM (at::mm), the dequantizing shared by every row.
//
// Decode's few rows skip the scratch (direct_dot): with at most kDirectRows rows of x and a
// Q8_0 / Q4_0 / Q4_1 weight, each thread takes whole rows of W, dequantizes each 32-weight block
// into registers and multiplies it by every row of x at once: the same dequantized values and
// FMAs without a store and a load of each, the weights' bytes read once.
//
// Two vector widths, one code: an x86-64-v4 build (AVX-512) works on 16 float lanes and 4 rows
// of x a pass (16 accumulators of its 32 registers); an x86-64-v3 build (AVX2 + FMA + F16C) on
// 8 lanes and 2 rows a pass (8 accumulators, 4 weights and one x of its 16 registers). The
// thin layer below (Vec, vload, ...) is all that differs.
//
// With int8_activations, fewer than kInt8MaxRows rows of x against Q8_0 / Q4_0 / Q4_1 are
// quantized to int8 per 32 inputs and multiplied in integers, as llama.cpp does (int8_linear).
//
// Sums are float32 (in another order than the torch oracle's); the dequantized weights are the
// oracle's (d * q, d * q + m, ... in float32). In a build with neither (cpu_features.h)
// quantized_linear_supported is false and the model keeps the torch oracle.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
// GCC 12 warns about the undefined vectors its own headers use (masked loads, reductions).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "cpu_features.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define QUIRE_QUANTIZED_VECTOR 1
#endif

namespace {

#if defined(QUIRE_QUANTIZED_VECTOR)
// The sum of 8 float lanes (the AVX2 layer's vsum; int8_linear's sums in both builds).
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// The vector layer: float lanes, and 16 bytes widened to floats kLanes at a time.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
constexpr int64_t kRowsPerPass = 4;  // rows of x per pass over a tile
constexpr int kDirectRows = 4;       // at most this many rows of x skip the scratch (direct_dot)
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset1(float f) { return _mm512_set1_ps(f); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
// bytes[i] as float into out[i / 16][i % 16], signed or unsigned.
inline void i8x16_to_vecs(__m128i bytes, Vec* out) {
  out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}
inline void u8x16_to_vecs(__m128i bytes, Vec* out) {
  out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
}
#elif defined(QUIRE_QUANTIZED_VECTOR)
using Vec = __m256;
constexpr int kLanes = 8;
constexpr int64_t kRowsPerPass = 2;
constexpr int kDirectRows = 2;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset1(float f) { return _mm256_set1_ps(f); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec v) { return hsum256(v); }
inline void i8x16_to_vecs(__m128i bytes, Vec* out) {
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
}
inline void u8x16_to_vecs(__m128i bytes, Vec* out) {
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
}
#else
constexpr int64_t kRowsPerPass = 1;
#endif

// ggml type ids (gguf.GGMLQuantizationType) of the formats here, and Quire's own Q4_Z (ids from
// 1000: no GGUF holds them): Q4_1's layout with an integer zero point z in place of the float16
// min, w = d * (q - z), as AWQ and asymmetric GPTQ checkpoints quantize.
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;
constexpr int64_t kQ4_Z = 1000;
// The row-interleaved layouts (reference_quantized.INTERLEAVED): 16 rows of W block by block,
// multiplied by x16_linear on a CPU with AVX512_VNNI.
constexpr int64_t kQ8_0x16 = 1001, kQ4_1x16 = 1002;
constexpr int64_t kGroupRows = 16;  // rows of W per interleaved group

constexpr bool is_interleaved(int64_t type) { return type == kQ8_0x16 || type == kQ4_1x16; }

// The 32-weight formats: their blocks meet x block by block (direct and int8 paths).
constexpr bool is_small_block(int64_t type) {
  return type == kQ8_0 || type == kQ4_0 || type == kQ4_1 || type == kQ4_Z;
}

constexpr int64_t kTileRows = 4;      // rows of W per tile
constexpr int64_t kChunkRows = 64;    // rows of x per chunk
// From this many rows of x (a prefill chunk), panels of W are dequantized into float32 and
// multiplied by torch's GEMM: the dequantizing is shared by every row, and the GEMM runs far
// nearer the CPU's peak than the dot products of the tiles.
constexpr int64_t kGemmMinRows = 48;
constexpr int64_t kGemmPanelRows = 256;  // rows of W per panel (576 KiB at K = 576)
// Below this many rows of x, int8 activations (when asked for) are cheaper per row than the GEMM
// road: their cost grows with the rows while the road's dequantizing is shared by them all
// (`python -m benchmarks.quantized_linear --rows 64 95 96 128` measures both sides).
constexpr int64_t kInt8MaxRows = 96;

struct Format {
  int64_t block_size;
  int64_t block_bytes;
};

bool format_of(int64_t type, Format* out) {
  switch (type) {
    case kQ4_0: *out = {32, 18}; return true;
    case kQ4_1: *out = {32, 20}; return true;
    case kQ4_Z: *out = {32, 20}; return true;
    case kQ8_0: *out = {32, 34}; return true;
    case kQ8_0x16: *out = {32, 34}; return true;  // per row: a group's 544 bytes over 16
    case kQ4_1x16: *out = {32, 20}; return true;  // 320 over 16
    case kQ4_K: *out = {256, 144}; return true;
    case kQ5_K: *out = {256, 176}; return true;
    case kQ6_K: *out = {256, 210}; return true;
    default: return false;
  }
}

inline float f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// The m of w = d * q + m in a Q4_1 block (its float16 min) or a Q4_Z one (-d * z: exact in
// float32, d having 11 significant bits and z at most 8).
inline float block_min(int64_t type, const uint8_t* b, float d) {
  return type == kQ4_Z ? -d * static_cast<float>(b[2]) : f16(b + 2);
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
inline void k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One 256-input super-block of Q4_K, Q5_K or Q6_K into out[256], as the oracle computes it.
void dequantize_k_block(int64_t type, const uint8_t* b, float* out) {
  if (type == kQ6_K) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = (d * scales[is]) * q1;
        out[l + 32] = (d * scales[is + 2]) * q2;
        out[l + 64] = (d * scales[is + 4]) * q3;
        out[l + 96] = (d * scales[is + 6]) * q4;
      }
      out += 128;
      ql += 64;
      qh += 32;
      scales += 8;
    }
    return;
  }
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;  // Q5_K only
  const uint8_t* qs = b + (type == kQ5_K ? 48 : 16);
  for (int chunk = 0; chunk < 4; ++chunk) {  // 64 inputs: sub-blocks 2 chunk, 2 chunk + 1
    for (int part = 0; part < 2; ++part) {
      const int j = 2 * chunk + part;
      uint8_t sc, m;
      k_scale_min(j, scales, &sc, &m);
      const float scale = d * sc, min = dmin * m;
      for (int l = 0; l < 32; ++l) {
        int q = part ? qs[32 * chunk + l] >> 4 : qs[32 * chunk + l] & 0xF;
        if (type == kQ5_K) q |= ((qh[l] >> j) & 1) << 4;
        out[32 * j + l] = scale * static_cast<float>(q) - min;
      }
    }
  }
}

#if defined(QUIRE_QUANTIZED_VECTOR)
constexpr int kBlockVecs = 32 / kLanes;  // vectors per 32-weight block

template <int64_t kType>
constexpr int64_t kBlockBytes = kType == kQ8_0 ? 34 : (kType == kQ4_0 ? 18 : 20);

// One 32-weight block of Q8_0, Q4_0, Q4_1 or Q4_Z into w[kBlockVecs], as the oracle computes it:
// d * q, d * (q - 8), d * q + m (two roundings, no FMA) in float32 (Q4_Z: m = -d * z, exact,
// so each weight is d * (q - z) exactly).
template <int64_t kType>
inline void dequantize_block(const uint8_t* b, Vec* w) {
  constexpr int kVecs = 16 / kLanes;  // vectors per 16 bytes
  const Vec d = vset1(f16(b));
  if constexpr (kType == kQ8_0) {
    for (int h = 0; h < 2; ++h) {
      i8x16_to_vecs(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * h)),
                    w + kVecs * h);
    }
    for (int j = 0; j < kBlockVecs; ++j) w[j] = vmul(w[j], d);
  } else {
    const __m128i low_nibbles = _mm_set1_epi8(0x0F);
    constexpr int64_t kHeader = kType == kQ4_0 ? 2 : 4;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kHeader));
    u8x16_to_vecs(_mm_and_si128(qs, low_nibbles), w);
    u8x16_to_vecs(_mm_and_si128(_mm_srli_epi16(qs, 4), low_nibbles), w + kVecs);
    if constexpr (kType == kQ4_0) {
      const Vec eight = vset1(8.0f);
      for (int j = 0; j < kBlockVecs; ++j) w[j] = vmul(d, vsub(w[j], eight));
    } else {
      const Vec m = vset1(block_min(kType, b, f16(b)));
      for (int j = 0; j < kBlockVecs; ++j) w[j] = vadd(vmul(d, w[j]), m);
    }
  }
}

template <int64_t kType>
void dequantize_blocks(const uint8_t* row, int64_t num_blocks, float* out) {
  Vec w[kBlockVecs];
  for (int64_t i = 0; i < num_blocks; ++i) {
    dequantize_block<kType>(row + i * kBlockBytes<kType>, w);
    for (int j = 0; j < kBlockVecs; ++j) vstore(out + 32 * i + kLanes * j, w[j]);
  }
}
#endif

// One row of W: num_blocks blocks of `type` into out[K].
[[maybe_unused]] void dequantize_row(int64_t type, const uint8_t* row, int64_t num_blocks,
                                    float* out) {
#if defined(QUIRE_QUANTIZED_VECTOR)
  switch (type) {
    case kQ8_0: return dequantize_blocks<kQ8_0>(row, num_blocks, out);
    case kQ4_0: return dequantize_blocks<kQ4_0>(row, num_blocks, out);
    case kQ4_1: return dequantize_blocks<kQ4_1>(row, num_blocks, out);
    case kQ4_Z: return dequantize_blocks<kQ4_Z>(row, num_blocks, out);
    default: break;
  }
#endif
  if (is_small_block(type)) {  // builds without vectors
    const int64_t bytes = type == kQ8_0 ? 34 : (type == kQ4_0 ? 18 : 20);
    for (int64_t i = 0; i < num_blocks; ++i, row += bytes, out += 32) {
      const float d = f16(row);
      for (int j = 0; j < 32; ++j) {
        if (type == kQ8_0) {
          out[j] = static_cast<float>(static_cast<int8_t>(row[2 + j])) * d;
        } else {
          const uint8_t byte = row[(type == kQ4_0 ? 2 : 4) + j % 16];
          const int q = j < 16 ? byte & 0xF : byte >> 4;
          out[j] = type == kQ4_0 ? d * static_cast<float>(q - 8) : d * q + block_min(type, row, d);
        }
      }
    }
    return;
  }
  Format format{};
  format_of(type, &format);
  for (int64_t i = 0; i < num_blocks; ++i) {
    dequantize_k_block(type, row + i * format.block_bytes, out + i * 256);
  }
}

#if defined(QUIRE_QUANTIZED_VECTOR)
// out[r][c] (stride out_stride) = x[r] . w[c] over K, for kRows rows of x and kCols rows of w.
template <int kRows, int kCols>
void dot_tile(const float* x, int64_t x_stride, const float* w, int64_t k_dim, float* out,
              int64_t out_stride) {
  Vec acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) acc[r][c] = vzero();
  }
  for (int64_t k = 0; k < k_dim; k += kLanes) {
    Vec wv[kCols];
    for (int c = 0; c < kCols; ++c) wv[c] = vload(w + c * k_dim + k);
    for (int r = 0; r < kRows; ++r) {
      const Vec xv = vload(x + r * x_stride + k);
      for (int c = 0; c < kCols; ++c) acc[r][c] = vfmadd(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) out[r * out_stride + c] = vsum(acc[r][c]);
  }
}

// The last num_rows < kRowsPerPass rows of x, in one pass of that many rows.
template <int kCols, int kRows = kRowsPerPass - 1>
void dot_leftover(const float* x, int64_t x_stride, int64_t num_rows, const float* w,
                  int64_t k_dim, float* out, int64_t out_stride) {
  if constexpr (kRows > 0) {
    if (num_rows == kRows) return dot_tile<kRows, kCols>(x, x_stride, w, k_dim, out, out_stride);
    dot_leftover<kCols, kRows - 1>(x, x_stride, num_rows, w, k_dim, out, out_stride);
  }
}

template <int kCols>
void dot_rows(const float* x, int64_t x_stride, int64_t num_rows, const float* w, int64_t k_dim,
              float* out, int64_t out_stride) {
  int64_t r = 0;
  for (; r + kRowsPerPass <= num_rows; r += kRowsPerPass) {
    dot_tile<kRowsPerPass, kCols>(x + r * x_stride, x_stride, w, k_dim, out + r * out_stride,
                                  out_stride);
  }
  dot_leftover<kCols>(x + r * x_stride, x_stride, num_rows - r, w, k_dim, out + r * out_stride,
                      out_stride);
}
#endif

#if defined(QUIRE_QUANTIZED_VECTOR)
// Decode's few rows of x (at most kDirectRows) against 32-weight blocks: each row of W
// is dequantized block by block into registers and multiplied at once, with no scratch (the
// same dequantized values, the same float32 FMAs, another summation order): kRows x
// kBlockVecs accumulators, so consecutive FMAs do not wait on each other.
template <int64_t kType, int kRows>
void direct_dot(const uint8_t* row, int64_t num_blocks, const float* x, int64_t x_stride,
                float* out, int64_t out_stride) {
  Vec acc[kRows][kBlockVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kBlockVecs; ++j) acc[r][j] = vzero();
  }
  Vec w[kBlockVecs];
  for (int64_t i = 0; i < num_blocks; ++i) {
    dequantize_block<kType>(row + i * kBlockBytes<kType>, w);
    for (int r = 0; r < kRows; ++r) {
      for (int j = 0; j < kBlockVecs; ++j) {
        acc[r][j] = vfmadd(vload(x + r * x_stride + 32 * i + kLanes * j), w[j], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    Vec sum = acc[r][0];
    for (int j = 1; j < kBlockVecs; ++j) sum = vadd(sum, acc[r][j]);
    out[r * out_stride] = vsum(sum);
  }
}

template <int64_t kType, int kRows = kDirectRows>
void direct_rows(int64_t num_rows, const uint8_t* row, int64_t num_blocks, const float* x,
                 int64_t x_stride, float* out, int64_t out_stride) {
  if constexpr (kRows > 0) {
    if (num_rows == kRows) {
      return direct_dot<kType, kRows>(row, num_blocks, x, x_stride, out, out_stride);
    }
    direct_rows<kType, kRows - 1>(num_rows, row, num_blocks, x, x_stride, out, out_stride);
  }
}

// Whether direct_rows takes this call.
bool takes_direct(int64_t type, int64_t num_rows) {
  return num_rows <= kDirectRows && is_small_block(type);
}

void direct_linear(int64_t type, const float* x, int64_t x_stride, int64_t num_rows,
                   const uint8_t* blocks, int64_t row_bytes, int64_t num_blocks, int64_t n_dim,
                   float* out) {
  const int64_t grain = std::max<int64_t>(
      16, (n_dim + at::get_num_threads() - 1) / at::get_num_threads());
  at::parallel_for(0, n_dim, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = blocks + n * row_bytes;
      float* o = out + n;
      switch (type) {
        case kQ8_0: direct_rows<kQ8_0>(num_rows, row, num_blocks, x, x_stride, o, n_dim); break;
        case kQ4_0: direct_rows<kQ4_0>(num_rows, row, num_blocks, x, x_stride, o, n_dim); break;
        case kQ4_Z: direct_rows<kQ4_Z>(num_rows, row, num_blocks, x, x_stride, o, n_dim); break;
        default: direct_rows<kQ4_1>(num_rows, row, num_blocks, x, x_stride, o, n_dim); break;
      }
    }
  });
}
#endif

#if defined(QUIRE_QUANTIZED_VECTOR)
// int8 activations (quantized_linear's int8_activations, for 32-weight blocks and fewer than
// kInt8MaxRows rows of x): each row of x is quantized per 32 inputs to q = round(x * 127 /
// amax) in int8 with d = amax / 127 and s = d * sum(q), and each weight block meets it in
// integer dot products, 32 byte products in one maddubs (unsigned x signed, pairs summed into
// int16) and one madd (into 8 int32):
//   Q8_0: d_w d_x sum(q_w q_x)                  (signs moved onto x: |q_w| is the unsigned side)
//   Q4_1: d_w d_x sum(q_w q_x) + m_w s_x        (nibbles 0..15 are the unsigned side)
//   Q4_Z: as Q4_1 with m_w = -d_w z_w
//   Q4_0: d_w d_x sum(q_w q_x) - 8 d_w s_x
// (reference_quantized.quantized_linear_int8 is the oracle). 256-bit integer vectors in both
// builds. The weights' bytes are read once, and per block the work is a handful of
// instructions where the float path widens 32 weights to floats.
constexpr int kInt8Rows = 4;  // rows of x per pass over a row of W

struct Int8Rows {
  const int8_t* q;      // [num_rows][K]
  const float* d;       // [num_rows][num_blocks]
  const int32_t* sums;  // [num_rows][num_blocks]: sum(q) of each block
  int64_t k_dim;
  int64_t num_blocks;

  // d * sum(q) of block `at` (row * num_blocks + block): the oracle's s_x, in its float32.
  float s(int64_t at) const { return d[at] * static_cast<float>(sums[at]); }
};

// Row r of x into q[K], d[num_blocks], sums[num_blocks]: the same float32 operations as the
// oracle (127 / amax and amax / 127 divided, x * inv rounded half to even).
void quantize_row_int8(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* sums) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const float* v = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int qi = static_cast<int>(std::nearbyint(v[i] * inv));
      q[32 * b + i] = static_cast<int8_t>(qi);
      sum += qi;
    }
    d[b] = amax / 127.0f;
    sums[b] = sum;
  }
}

// num_rows rows of x (x_stride apart) quantized by quantize_row_int8, and their Int8Rows.
struct Int8Activations {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sums;
  Int8Rows rows;

  Int8Activations(const float* xs, int64_t x_stride, int64_t num_rows, int64_t num_blocks)
      : q(num_rows * 32 * num_blocks),
        d(num_rows * num_blocks),
        sums(num_rows * num_blocks),
        rows{q.data(), d.data(), sums.data(), 32 * num_blocks, num_blocks} {
    for (int64_t r = 0; r < num_rows; ++r) {
      quantize_row_int8(xs + r * x_stride, num_blocks, q.data() + r * rows.k_dim,
                        d.data() + r * num_blocks, sums.data() + r * num_blocks);
    }
  }
};

// out[r * out_stride + c] = row c of W . row first + r of x, for kRows rows of x starting at
// row `first` and kCols rows of W starting at `row`, row_bytes apart: kRows * kCols sums in
// flight, each weight block expanded once per pass and each block of x loaded once.
template <int64_t kType, int kRows, int kCols>
void int8_dot(const uint8_t* row, int64_t row_bytes, const Int8Rows& x, int64_t first,
              float* out, int64_t out_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i low_nibbles = _mm_set1_epi8(0x0F);
  __m256 acc[kRows][kCols];
  float mins[kRows][kCols];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      mins[r][c] = 0.0f;
    }
  }
  for (int64_t i = 0; i < x.num_blocks; ++i) {
    for (int c = 0; c < kCols; ++c) {
      const uint8_t* b = row + c * row_bytes + i * kBlockBytes<kType>;
      const float dw = f16(b);
      __m256i w;
      float mw = 0.0f;
      if constexpr (kType == kQ8_0) {
        w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      } else {
        constexpr int64_t kHeader = kType == kQ4_0 ? 2 : 4;
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kHeader));
        w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low_nibbles),
                             _mm_and_si128(qs, low_nibbles));
        mw = kType == kQ4_0 ? -8.0f * dw : block_min(kType, b, dw);
      }
      for (int r = 0; r < kRows; ++r) {
        const int64_t at = (first + r) * x.num_blocks + i;
        const __m256i xq = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(x.q + (first + r) * x.k_dim + 32 * i));
        __m256i pairs;
        if constexpr (kType == kQ8_0) {
          pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
        } else {
          pairs = _mm256_maddubs_epi16(w, xq);
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x.d[at]), dot, acc[r][c]);
        if constexpr (kType != kQ8_0) mins[r][c] += mw * x.s(at);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) out[r * out_stride + c] = hsum256(acc[r][c]) + mins[r][c];
  }
}

template <int64_t kType, int kRows = kInt8Rows>
void int8_rows(int64_t num_rows, const uint8_t* row, const Int8Rows& x, int64_t first,
               float* out, int64_t out_stride) {
  if constexpr (kRows > 0) {
    if (num_rows == kRows) return int8_dot<kType, kRows, 1>(row, 0, x, first, out, out_stride);
    int8_rows<kType, kRows - 1>(num_rows, row, x, first, out, out_stride);
  }
}

// Fewer rows of x than a pass over a row of W takes (a lone decoding sequence): each row of x
// meets kInt8Cols rows of W at a time instead, which keeps as many sums in flight (a 4-bit
// block's nibbles are expanded once per row of W either way; Q8_0 runs slower so).
// Threads take kInt8Group rows of W at a time.
template <int64_t kType>
constexpr int kInt8Cols = kType == kQ8_0 ? 1 : 4;
constexpr int64_t kInt8Group = 4;

template <int64_t kType>
void int8_cols(int64_t num_rows, const uint8_t* blocks, int64_t row_bytes, const Int8Rows& x,
               int64_t n, int64_t n_dim, float* out) {
  constexpr int kCols = kInt8Cols<kType>;
  const int64_t end = std::min(n + kInt8Group, n_dim);
  for (int64_t r = 0; r < num_rows; ++r) {
    float* o = out + r * n_dim;
    for (int64_t c = n; c < end;) {
      if (c + kCols <= end) {
        int8_dot<kType, 1, kCols>(blocks + c * row_bytes, row_bytes, x, r, o + c, n_dim);
        c += kCols;
      } else {
        int8_dot<kType, 1, 1>(blocks + c * row_bytes, row_bytes, x, r, o + c, n_dim);
        c += 1;
      }
    }
  }
}

// Whether int8_linear takes this call.
bool takes_int8(int64_t type, int64_t num_rows) {
  return num_rows < kInt8MaxRows && is_small_block(type);
}

void int8_linear(int64_t type, const float* xs, int64_t x_stride, int64_t num_rows,
                 const uint8_t* blocks, int64_t row_bytes, int64_t num_blocks, int64_t n_dim,
                 float* out) {
  const Int8Activations activations(xs, x_stride, num_rows, num_blocks);
  const Int8Rows& x = activations.rows;
  const int64_t threads = at::get_num_threads();
  if (num_rows < kInt8Rows) {
    const int64_t groups = (n_dim + kInt8Group - 1) / kInt8Group;
    const int64_t grain = std::max<int64_t>(4, (groups + threads - 1) / threads);
    at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const int64_t n = g * kInt8Group;
        switch (type) {
          case kQ8_0: int8_cols<kQ8_0>(num_rows, blocks, row_bytes, x, n, n_dim, out); break;
          case kQ4_0: int8_cols<kQ4_0>(num_rows, blocks, row_bytes, x, n, n_dim, out); break;
          case kQ4_Z: int8_cols<kQ4_Z>(num_rows, blocks, row_bytes, x, n, n_dim, out); break;
          default: int8_cols<kQ4_1>(num_rows, blocks, row_bytes, x, n, n_dim, out); break;
        }
      }
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(16, (n_dim + threads - 1) / threads);
  at::parallel_for(0, n_dim, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = blocks + n * row_bytes;
      // The row of W stays in L1 while every group of kInt8Rows rows of x meets it.
      for (int64_t first = 0; first < num_rows; first += kInt8Rows) {
        const int64_t rows = std::min<int64_t>(kInt8Rows, num_rows - first);
        float* o = out + first * n_dim + n;
        switch (type) {
          case kQ8_0: int8_rows<kQ8_0>(rows, row, x, first, o, n_dim); break;
          case kQ4_0: int8_rows<kQ4_0>(rows, row, x, first, o, n_dim); break;
          case kQ4_Z: int8_rows<kQ4_Z>(rows, row, x, first, o, n_dim); break;
          default: int8_rows<kQ4_1>(rows, row, x, first, o, n_dim); break;
        }
      }
    }
  });
}
#endif

#if defined(__AVX512F__)
// Interleaved weights (Q8_0x16, Q4_1x16: reference_quantized.INTERLEAVED) against int8
// activations, with AVX512_VNNI's vpdpbusd: one instruction multiplies 4 consecutive inputs of
// 16 rows of W by the same 4 inputs of x (broadcast) and adds each row's 4 products into its
// int32 lane. A 32-weight block of 16 rows is 8 of them, its scales 16 float16 lanes loaded as
// one vector: each lane of the float accumulator is one output column, and the 16 outputs of a
// group are stored at once with no horizontal sum. vpdpbusd multiplies unsigned by signed
// bytes: the weights are the unsigned side, Q4_1x16's nibbles as they are and Q8_0x16's
// integers stored plus 128, so 128 times the block's sum of x's integers is taken off the
// integer dot. Per block: d_w d_x sum(q_w q_x) (+ m_w s_x for Q4_1x16), as int8_linear.

inline bool has_avx512_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has;
}

// Bytes of one block of an interleaved group of 16 rows, and of its head (the 16 scales d,
// then Q4_1x16's 16 mins m) before the integers.
constexpr int64_t group_head_bytes(int64_t type) { return type == kQ8_0x16 ? 32 : 64; }
constexpr int64_t group_block_bytes(int64_t type) {
  return group_head_bytes(type) + (type == kQ8_0x16 ? 512 : 256);
}

// out[r * out_stride + j], j < 16: rows first .. first + kRows - 1 of x against the group of 16
// rows of W at `group` (its blocks one after another).
template <int64_t kType, int kRows>
__attribute__((target("avx512vnni"))) void x16_dot(const uint8_t* group, const Int8Rows& x,
                                                   int64_t first, float* out,
                                                   int64_t out_stride) {
  __m512 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  for (int64_t i = 0; i < x.num_blocks; ++i) {
    const uint8_t* b = group + i * group_block_bytes(kType);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const uint8_t* body = b + group_head_bytes(kType);  // the integers, 64-byte chunks
    __m512i w[8];
    if constexpr (kType == kQ4_1x16) {
      for (int t = 0; t < 4; ++t) {
        const __m512i raw = _mm512_loadu_si512(body + 64 * t);
        w[t] = _mm512_and_si512(raw, low_nibbles);                             // inputs 4t..
        w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_nibbles);  // 16 + 4t..
      }
    } else {
      for (int t = 0; t < 8; ++t) w[t] = _mm512_loadu_si512(body + 64 * t);
    }
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = first + r;
      const int64_t at = row * x.num_blocks + i;
      // x's 32 inputs of this block as 8 runs of 4 bytes
      const int8_t* xb = x.q + row * x.k_dim + 32 * i;
      int32_t runs[8];
      std::memcpy(runs, xb, 32);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int t = 0; t < 8; t += 2) {
        const __m512i x0 = _mm512_set1_epi32(runs[t]), x1 = _mm512_set1_epi32(runs[t + 1]);
        s0 = _mm512_dpbusd_epi32(s0, w[t], x0);
        s1 = _mm512_dpbusd_epi32(s1, w[t + 1], x1);
      }
      __m512i dot = _mm512_add_epi32(s0, s1);
      if constexpr (kType == kQ8_0x16) {
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * x.sums[at]));  // the +128 of w
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
      if constexpr (kType == kQ4_1x16) {
        const __m256i mins = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(mins), _mm512_set1_ps(x.s(at)), acc[r]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(out + r * out_stride, acc[r]);
}

template <int64_t kType, int kRows = kInt8Rows>
void x16_rows(int64_t num_rows, const uint8_t* group, const Int8Rows& x, int64_t first,
              float* out, int64_t out_stride) {
  if constexpr (kRows > 0) {
    if (num_rows == kRows) return x16_dot<kType, kRows>(group, x, first, out, out_stride);
    x16_rows<kType, kRows - 1>(num_rows, group, x, first, out, out_stride);
  }
}

void x16_linear(int64_t type, const float* xs, int64_t x_stride, int64_t num_rows,
                const uint8_t* blocks, int64_t row_bytes, int64_t num_blocks, int64_t n_dim,
                float* out) {
  const Int8Activations activations(xs, x_stride, num_rows, num_blocks);
  const Int8Rows& x = activations.rows;
  const int64_t groups = n_dim / kGroupRows;
  const int64_t threads = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(1, (groups + threads - 1) / threads);
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* group = blocks + g * kGroupRows * row_bytes;
      for (int64_t first = 0; first < num_rows; first += kInt8Rows) {
        const int64_t rows = std::min<int64_t>(kInt8Rows, num_rows - first);
        float* o = out + first * n_dim + g * kGroupRows;
        if (type == kQ8_0x16) {
          x16_rows<kQ8_0x16>(rows, group, x, first, o, n_dim);
        } else {
          x16_rows<kQ4_1x16>(rows, group, x, first, o, n_dim);
        }
      }
    }
  });
}

// An interleaved group's 16 rows as float32 (out[r * k_dim + k]): the oracle's values.
void dequantize_group(int64_t type, const uint8_t* group, int64_t num_blocks, float* out,
                      int64_t k_dim) {
  for (int64_t i = 0; i < num_blocks; ++i) {
    const uint8_t* b = group + i * group_block_bytes(type);
    for (int64_t r = 0; r < kGroupRows; ++r) {
      const float d = f16(b + 2 * r);
      float* o = out + r * k_dim + 32 * i;
      const uint8_t* qs = b + group_head_bytes(type) + 4 * r;  // chunk t's at qs + 64 t
      if (type == kQ8_0x16) {
        for (int t = 0; t < 8; ++t) {
          for (int p = 0; p < 4; ++p) {
            o[4 * t + p] = d * static_cast<float>(static_cast<int>(qs[64 * t + p]) - 128);
          }
        }
      } else {
        const float m = f16(b + 32 + 2 * r);
        for (int t = 0; t < 4; ++t) {
          for (int p = 0; p < 4; ++p) {
            const uint8_t byte = qs[64 * t + p];
            o[4 * t + p] = d * static_cast<float>(byte & 0x0F) + m;
            o[16 + 4 * t + p] = d * static_cast<float>(byte >> 4) + m;
          }
        }
      }
    }
  }
}
#endif

bool supported(int64_t type) {
  Format format;
  if (is_interleaved(type)) {
#if defined(__AVX512F__)
    return has_avx512_vnni();
#else
    return false;
#endif
  }
#if defined(QUIRE_QUANTIZED_VECTOR)
  return format_of(type, &format);
#else
  (void)type;
  (void)format;
  return false;
#endif
}

}  // namespace

// x: [M, K] float32, unit last stride; blocks: [N, K / block_size * block_bytes] uint8, rows
// contiguous; type: the ggml type id; int8_activations: whether fewer than kInt8MaxRows rows
// of x against 32-weight blocks take int8_linear (else x stays float32). Returns [M, N] float32.
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type,
                            bool int8_activations) {
  Format format;
  TORCH_CHECK_VALUE(format_of(type, &format), "quantized_linear: unknown block type ", type);
  TORCH_CHECK_VALUE(supported(type), "quantized_linear does not run on this CPU and build");
  TORCH_CHECK_VALUE(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1 &&
                        x.device().is_cpu(),
                    "x must be a CPU float32 [rows, in_features] tensor with unit last stride");
  const int64_t num_rows = x.size(0), k_dim = x.size(1);
  TORCH_CHECK_VALUE(k_dim % format.block_size == 0, "in_features (", k_dim,
                    ") is no multiple of the block size ", format.block_size);
  const int64_t num_blocks = k_dim / format.block_size;
  TORCH_CHECK_VALUE(blocks.dim() == 2 && blocks.scalar_type() == at::kByte &&
                        blocks.is_contiguous() && blocks.size(1) == num_blocks * format.block_bytes,
                    "blocks must be a contiguous uint8 [out_features, ", num_blocks * format.block_bytes,
                    "] tensor for in_features ", k_dim);
  const int64_t n_dim = blocks.size(0);
  TORCH_CHECK_VALUE(!is_interleaved(type) || n_dim % kGroupRows == 0,
                    "interleaved blocks hold rows in 16s, not ", n_dim);
  at::Tensor out = at::empty({num_rows, n_dim}, x.options());
  if (num_rows == 0 || n_dim == 0) return out;
#if defined(__AVX512F__)
  if (is_interleaved(type)) {
    const int64_t row_bytes = blocks.size(1);
    const uint8_t* ws = blocks.data_ptr<uint8_t>();
    if (int8_activations && num_rows < kInt8MaxRows) {
      x16_linear(type, x.data_ptr<float>(), x.stride(0), num_rows, ws, row_bytes, num_blocks,
                 n_dim, out.data_ptr<float>());
      return out;
    }
    // float32 activations: panels of W dequantized and multiplied by torch's GEMM, any rows
    at::Tensor panel = at::empty({std::min(kGemmPanelRows, n_dim), k_dim}, x.options());
    float* ps = panel.data_ptr<float>();
    for (int64_t first = 0; first < n_dim; first += kGemmPanelRows) {
      const int64_t rows = std::min(kGemmPanelRows, n_dim - first);
      at::parallel_for(0, rows / kGroupRows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
          dequantize_group(type, ws + (first + g * kGroupRows) * row_bytes, num_blocks,
                           ps + g * kGroupRows * k_dim, k_dim);
        }
      });
      out.slice(1, first, first + rows).copy_(at::mm(x, panel.narrow(0, 0, rows).t()));
    }
    return out;
  }
#endif
#if defined(QUIRE_QUANTIZED_VECTOR)
  const int64_t row_bytes = blocks.size(1);
  if (int8_activations && takes_int8(type, num_rows)) {
    int8_linear(type, x.data_ptr<float>(), x.stride(0), num_rows, blocks.data_ptr<uint8_t>(),
                row_bytes, num_blocks, n_dim, out.data_ptr<float>());
    return out;
  }
  if (takes_direct(type, num_rows)) {
    direct_linear(type, x.data_ptr<float>(), x.stride(0), num_rows, blocks.data_ptr<uint8_t>(),
                  row_bytes, num_blocks, n_dim, out.data_ptr<float>());
    return out;
  }
  if (num_rows >= kGemmMinRows) {
    const uint8_t* ws = blocks.data_ptr<uint8_t>();
    at::Tensor panel = at::empty({std::min(kGemmPanelRows, n_dim), k_dim}, x.options());
    float* ps = panel.data_ptr<float>();
    for (int64_t first = 0; first < n_dim; first += kGemmPanelRows) {
      const int64_t rows = std::min(kGemmPanelRows, n_dim - first);
      at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          dequantize_row(type, ws + (first + r) * row_bytes, num_blocks, ps + r * k_dim);
        }
      });
      out.slice(1, first, first + rows).copy_(at::mm(x, panel.narrow(0, 0, rows).t()));
    }
    return out;
  }
  const int64_t num_tiles = (n_dim + kTileRows - 1) / kTileRows;
  const int64_t grain = std::max<int64_t>(1, (num_tiles + at::get_num_threads() - 1) /
                                                 at::get_num_threads());
  const float* xs = x.data_ptr<float>();
  const int64_t x_stride = x.stride(0);
  const uint8_t* ws = blocks.data_ptr<uint8_t>();
  float* os = out.data_ptr<float>();
  at::parallel_for(0, num_tiles, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(kTileRows * k_dim);
    for (int64_t chunk = 0; chunk < num_rows; chunk += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, num_rows - chunk);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t first = t * kTileRows;
        const int64_t cols = std::min(kTileRows, n_dim - first);
        for (int64_t c = 0; c < cols; ++c) {
          dequantize_row(type, ws + (first + c) * row_bytes, num_blocks,
                         scratch.data() + c * k_dim);
        }
        const float* xc = xs + chunk * x_stride;
        float* oc = os + chunk * n_dim + first;
        switch (cols) {
          case 4: dot_rows<4>(xc, x_stride, rows, scratch.data(), k_dim, oc, n_dim); break;
          case 3: dot_rows<3>(xc, x_stride, rows, scratch.data(), k_dim, oc, n_dim); break;
          case 2: dot_rows<2>(xc, x_stride, rows, scratch.data(), k_dim, oc, n_dim); break;
          default: dot_rows<1>(xc, x_stride, rows, scratch.data(), k_dim, oc, n_dim); break;
        }
      }
    }
  });
#endif
  return out;
}

bool quantized_linear_supported(int64_t type) { return supported(type); }

int64_t quantized_linear_int8_rows() { return kInt8MaxRows; }

TORCH_LIBRARY_FRAGMENT(quire_cpu, m) {
  m.def("quantized_linear(Tensor x, Tensor blocks, int type, bool int8_activations) -> Tensor");
  // whether quantized_linear runs for a block type on this CPU and build
  m.def("quantized_linear_supported(int type) -> bool", &quantized_linear_supported);
  // int8_activations apply to calls of fewer rows of x than this
  m.def("quantized_linear_int8_rows() -> int", &quantized_linear_int8_rows);
}

TORCH_LIBRARY_IMPL(quire_cpu, CPU, m) { m.impl("quantized_linear", &quantized_linear); }
