// Paged attention on the CPU: decode and chunked prefill, reading K/V where they live.
//
// Arguments, shapes and the cache layout are signatures.PagedAttention's. What these loops
// add to it: the caches' head_dim stride is 1, so within a block one kv head's keys are
// block_size rows of head_dim values, slot_stride elements apart; query head h reads kv head
// h / group_size (group_size = num_heads / num_kv_heads).
//
// Algorithm. The unit of work is a tile: up to kMaxTileRows query rows of one sequence and
// one kv head, i.e. the group_size query heads of a few consecutive chunk tokens (decode: of
// its one token). A tile walks its sequence's blocks through the block table and, for each
// block, each row
//   1. scores the block's keys it may see (causal: positions <= its own),
//   2. updates its running max m and running sum l of exp(score - m) (online softmax),
//      rescaling its accumulator by exp(m_old - m_new) when the max grows,
//   3. adds exp(score - m) * value to its float32 accumulator;
// and finally writes accumulator / l. Keys and values are read straight from the cache
// (bf16/fp16 blocks are widened to float32 once per block and tile, for all its rows), so
// nothing is gathered and no slot past a row's context is ever read: unused slots may hold
// anything, NaN included. All sums are float32 whatever the cache dtype. A decode tile's
// few rows score each key with a head_dim-wide dot product; a prefill tile's many rows share
// one transposed copy of the block's keys, so that a row's scores are block_size-wide FMAs.
//
// Packed prefill (further down). In an AVX-512 build, a chunk of several tokens in a call with
// no window, soft cap or sinks does not walk blocks: its keys and values are gathered once per
// call into the packed linears' layout and each tile's attention is two register-tiled
// products with one whole-row softmax between them (bfloat16 caches: both products in
// vdpbf16ps, the softmax weights rounded to bfloat16 for the second, as torch's CPU flash
// attention does for 16-bit inputs). It reads the same slots: none past the context.
//
// Tiles are spread over torch's intra-op threads (at::parallel_for), longest first, each
// thread taking the next tile when it finishes one, so sequences of very different lengths
// still balance. Index values (block ids, lengths) are checked before any tile runs.
//
// Split decode. A decode batch of few tiles (a lone request has one per kv head) would leave
// threads idle while one tile walks a long context, so a one-token tile's keys are cut into
// splits of whole blocks, about kSplitKeys keys each, one tile per split (a function of the
// token's position only: the output never depends on the batch or the thread count). A split
// tile keeps its rows' running max, running sum and unnormalized accumulator (a partial)
// instead of writing the output, and the partials are merged afterwards: max M of the splits' maxes, sum of l_j * exp(m_j - M), output
// sum of acc_j * exp(m_j - M) over that sum (flash-decoding, vLLM's paged attention v2). Only
// the first split starts from a head's sink.
//
// A sliding window W (window > 0) makes a row at position p see keys p - W + 1 .. p only: a
// tile starts at the block holding its first row's first key, so the blocks before it are
// never read (the block table may name any block there), and a row's keys before its window
// get weight 0. A soft cap c (soft_cap > 0) turns each scaled score s into c * tanh(s / c)
// before the softmax. Sinks (sinks != nullptr, gpt-oss) give query head h one more logit
// sinks[h] in its softmax's denominator, with no value: the online softmax starts from it
// (running max sinks[h], running sum 1) instead of from nothing.

#include <ATen/Parallel.h>
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The AVX2 two-pass decode tile (decode_tile16_avx2), in an x86-64-v3 build.
#define QUIRE_ATTENTION_AVX2 1
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's AVX-512 headers pass an undefined vector as the unused merge operand of the
// unpack/shuffle/extract builtins and then warn about it at every use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_features.h"
#include "packed_tile.h"

namespace {

using quire_cpu::can_use_avx512_bf16;
using quire_cpu::kHasAvx512;

// Query rows per tile: big enough that widening a bf16 block is shared by many rows, small
// enough that a tile's accumulators stay in L1/L2 and a long prompt still splits into many
// tiles for the threads.
constexpr int kMaxTileRows = 64;

// Calls with fewer multiply-adds than this (~0.1 ms of one core) run on the calling thread.
constexpr int64_t kMinParallelWork = int64_t{1} << 19;
// Split decode (see the top): a one-token tile's keys are cut into splits of about this many
// (whole blocks), when there are at least two.
constexpr int kSplitKeys = 256;

inline float to_float(float x) { return x; }

inline float to_float(c10::BFloat16 x) {
  // bf16 is the top half of a float32: a shift, which the compiler vectorizes.
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float to_float(c10::Half x) { return static_cast<float>(x); }

// exp(x) for x <= 0 (scores minus their running max), written so that a `#pragma omp simd`
// loop of it vectorizes: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, a
// degree-6 polynomial for exp(r) (relative error ~2e-7, about std::exp's float rounding),
// and 2^n built in the exponent bits. exp(0) is exactly 1; below -87 (-inf included) it
// returns ~1e-38 rather than 0.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  // nearbyint, not floor(x + 0.5): GCC vectorizes the first only.
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;  // ln2, split: a high part exact in float ...
  r = r - n * -2.12194440e-4f;     // ... and the rest
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The tensors of one call, as raw pointers and element strides.
template <typename scalar_t>
struct Problem {
  const scalar_t* query;  // [num_tokens, num_heads, head_dim]
  const scalar_t* key_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const scalar_t* value_cache;
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  scalar_t* out;  // [num_tokens, num_heads, head_dim], contiguous
  int64_t query_token_stride, query_head_stride;
  int64_t cache_block_stride, cache_slot_stride, cache_head_stride;
  int64_t table_stride;
  int num_heads, group_size, head_dim, block_size;
  float scale;
  int window;  // > 0: a row at position p sees keys p - window + 1 .. p; 0: all before it
  float soft_cap;  // > 0: scores become soft_cap * tanh(score / soft_cap); 0: no cap
  const float* sinks;  // [num_heads]: each head's value-less logit; nullptr: none
  // Split decode: [num_partials][group_size][head_dim + 2], a split tile's rows' unnormalized
  // accumulator, then running max and running sum; nullptr when nothing is split.
  float* partials = nullptr;
};

// The splits of one sequence's decode for one kv head: partials first .. first + count - 1.
struct SplitGroup {
  int kv_head;
  int64_t token;  // its row in query / out
  int first;
  int count;
};

// The first key position a row at `pos` sees: 0, or the start of its window.
inline int first_key_of(int pos, int window) { return window > 0 ? std::max(0, pos - window + 1) : 0; }

// Rows num_tokens * group_size of one sequence and one kv head: chunk tokens
// first_token .. first_token + num_tokens - 1 (rows into query/out), the first of them at
// position first_pos. Row i * group_size + g is query head kv_head * group_size + g of
// token i, and sees keys at positions first_key(i) .. first_pos + i, where first_key(i) is 0
// or, with a window, the first position in token i's window; first_key is row 0's.
struct Tile {
  int seq;
  int kv_head;
  int64_t first_token;
  int num_tokens;
  int first_pos;
  int first_key;
  int key_end = 0;   // > 0: keys before this position only (a split); 0: through the last row
  int partial = -1;  // >= 0: a split decode tile writing partial `partial`, not the output

  int end() const { return key_end > 0 ? key_end : first_pos + num_tokens; }
  // Whether its rows start from their heads' sinks: it reads from row 0's first key (a split
  // after the first starts later; the first split's sink stands for them all).
  bool takes_sinks(int window) const { return first_key == first_key_of(first_pos, window); }
  int64_t cost() const { return static_cast<int64_t>(end() - first_key) * num_tokens; }
};

// scores[row * stride + t] = cap * tanh(scores[row * stride + t] / cap), t < num_keys.
inline void soft_cap_scores(float* scores, int num_rows, int64_t stride, int num_keys,
                            float cap) {
  const float inv_cap = 1.0f / cap;
  for (int row = 0; row < num_rows; ++row) {
    float* r = scores + row * stride;
    for (int t = 0; t < num_keys; ++t) r[t] = cap * std::tanh(r[t] * inv_cap);
  }
}

// A thread's working memory, reused for every tile it runs: room for max_rows rows, which is
// kMaxTileRows or, if larger, one token's group_size rows.
struct Scratch {
  std::vector<float> query;  // [rows, head_dim], pre-scaled
  std::vector<c10::BFloat16> query_bf16;  // [rows, head_dim], as given (bf16 dot products)
  std::vector<float> acc;  // [rows, head_dim]
  std::vector<float> row_max, row_sum;  // [rows]
  std::vector<float> scores;  // [rows, block_size]: one block's scores, then its weights
  std::vector<float> keys, values;  // [block_size, head_dim] (keys maybe [head_dim, block_size])
  std::vector<float> context_scores;  // decode: [rows, padded context], grown on demand

  Scratch(int max_rows, int head_dim, int block_size)
      : query(static_cast<size_t>(max_rows) * head_dim),
        query_bf16(static_cast<size_t>(max_rows) * head_dim),
        acc(static_cast<size_t>(max_rows) * head_dim),
        row_max(max_rows),
        row_sum(max_rows),
        scores(static_cast<size_t>(max_rows) * block_size),
        keys(static_cast<size_t>(block_size) * head_dim),
        values(static_cast<size_t>(block_size) * head_dim) {}
};

// From this many rows on (and with compile-time sizes), a block's keys are transposed once so
// that each row's scores are block_size-wide vector FMAs; below it (decode: group_size rows),
// the transpose would cost more than it saves and each score is a head_dim-wide dot product.
constexpr int kMinRowsToTranspose = 8;

// a . b over head_dim values. With a compile-time head_dim that is a multiple of 16 the sum
// runs in 16 lanes and ends in a tree (16 -> 8 -> 4 -> 2 -> 1): the compiler's own reduction
// of a `simd reduction` loop adds the lanes one after another, a long serial chain.
template <int kHeadDim>
[[gnu::always_inline]] inline float dot(const float* a, const float* b, int head_dim) {
  constexpr int kLanes = 16;
  if constexpr (kHeadDim > 0 && kHeadDim % kLanes == 0) {
    float lanes[kLanes] = {};
    for (int d = 0; d < kHeadDim; d += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) lanes[l] += a[d + l] * b[d + l];
    }
    for (int width = kLanes / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    return lanes[0];
  } else {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < head_dim; ++d) sum += a[d] * b[d];
    return sum;
  }
}

// scores[row, t] = q[row] . key[t], keys as rows: key t at keys + t * key_stride.
template <int kHeadDim>
void score_block(const float* q, int num_rows, const float* keys, int64_t key_stride,
                 int num_keys, int runtime_head_dim, int block_size, float* scores) {
  const int head_dim = kHeadDim > 0 ? kHeadDim : runtime_head_dim;
  for (int t = 0; t < num_keys; ++t) {
    const float* k = keys + t * key_stride;
    for (int row = 0; row < num_rows; ++row) {
      const float* q_row = q + static_cast<int64_t>(row) * head_dim;
      scores[row * block_size + t] = dot<kHeadDim>(q_row, k, head_dim);
    }
  }
}

#if defined(__AVX512F__)
// 16 consecutive cache values widened to float32.
[[gnu::always_inline]] inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

[[gnu::always_inline]] inline __m512 load16(const c10::BFloat16* p) {
  // bf16 is the top half of a float32: widen to 32 bits, shift into place.
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

[[gnu::always_inline]] inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Lane t of the result = the sum of v[t]'s 16 lanes: sixteen horizontal sums at once, in
// four rounds of shuffles and adds (45 instructions for 16 keys, against ~6 per key for
// reducing each dot product on its own).
[[gnu::always_inline]] inline __m512 sum_lanes16(const __m512 (&v)[16]) {
  // 1. pairs (2i, 2i+1): per 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3]
  __m512 x[8];
  for (int i = 0; i < 8; ++i) {
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  // 2. per 128-bit lane j, [sum of a's lane j, b's, c's, d's] for keys 4i .. 4i + 3
  __m512 z[4];
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(x[2 * i]);
    const __m512d b = _mm512_castps_pd(x[2 * i + 1]);
    z[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // 3. and 4. across the 128-bit lanes: [keys 0-3 | 4-7 | 8-11 | 12-15]
  const __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88),
                                  _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
  const __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x88),
                                  _mm512_shuffle_f32x4(z[2], z[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD));
}

// score_block for a 16-slot block and head_dim a multiple of 16, in AVX-512: per row, key t's
// dot product accumulates in its own 16 lanes, and sum_lanes16 reduces all sixteen at once.
// Keys past num_keys are never read; their scores are 0 (softmax_weights masks them).
template <typename scalar_t, int kHeadDim>
void score_block16_avx512(const float* q, int num_rows, const scalar_t* keys,
                          int64_t key_stride, int num_keys, float* scores,
                          int64_t score_stride) {
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16");
  constexpr int kChunks = kHeadDim / 16;
  // Slots past num_keys re-read the last valid key instead (never an unwritten slot): their
  // scores are masked by softmax_weights.
  const scalar_t* key_rows[16];
  for (int t = 0; t < 16; ++t) key_rows[t] = keys + std::min(t, num_keys - 1) * key_stride;
  for (int row = 0; row < num_rows; ++row) {
    const float* q_row = q + static_cast<int64_t>(row) * kHeadDim;
    // chunk outside, keys inside: sixteen independent FMA chains, not one long one
    __m512 acc[16];
    const __m512 q0 = _mm512_loadu_ps(q_row);
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_mul_ps(q0, load16(key_rows[t]));
    for (int c = 1; c < kChunks; ++c) {
      const __m512 qc = _mm512_loadu_ps(q_row + 16 * c);
      for (int t = 0; t < 16; ++t) {
        acc[t] = _mm512_fmadd_ps(qc, load16(key_rows[t] + 16 * c), acc[t]);
      }
    }
    _mm512_storeu_ps(scores + row * score_stride, sum_lanes16(acc));
  }
}

// score_block16_avx512 for bfloat16 caches with AVX512_BF16: vdpbf16ps multiplies pairs of
// bf16 values exactly and adds them into float32 lanes, 32 values per instruction and no
// widening. q holds the tile's unscaled bf16 query rows; scale multiplies the sums.
template <int kHeadDim>
__attribute__((target("avx512bf16"))) void score_block16_bf16(const c10::BFloat16* q,
                                                              int num_rows,
                                                              const c10::BFloat16* keys,
                                                              int64_t key_stride, int num_keys,
                                                              float scale, float* scores,
                                                              int64_t score_stride) {
  static_assert(kHeadDim % 32 == 0, "head_dim must be a multiple of 32");
  constexpr int kChunks = kHeadDim / 32;
  const c10::BFloat16* key_rows[16];
  for (int t = 0; t < 16; ++t) key_rows[t] = keys + std::min(t, num_keys - 1) * key_stride;
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int row = 0; row < num_rows; ++row) {
    const c10::BFloat16* q_row = q + static_cast<int64_t>(row) * kHeadDim;
    __m512bh q_chunks[kChunks];
    for (int c = 0; c < kChunks; ++c) {
      q_chunks[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q_row + 32 * c));
    }
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
    for (int c = 0; c < kChunks; ++c) {
      for (int t = 0; t < 16; ++t) {
        const __m512i k = _mm512_loadu_si512(key_rows[t] + 32 * c);
        acc[t] = _mm512_dpbf16_ps(acc[t], q_chunks[c], reinterpret_cast<__m512bh>(k));
      }
    }
    _mm512_storeu_ps(scores + row * score_stride, _mm512_mul_ps(scale_v, sum_lanes16(acc)));
  }
}

// accumulate_values in AVX-512: the accumulator in registers, even and odd slots in two
// sets of chains (halving the FMA latency chain), summed at the end.
template <int kHeadDim>
[[gnu::always_inline]] inline void accumulate_values_avx512(float* __restrict__ acc,
                                                          float rescale,
                                                          const float* __restrict__ weights,
                                                          const float* values,
                                                          int64_t value_stride,
                                                          int num_values) {
  constexpr int kChunks = kHeadDim / 16;
  __m512 even[kChunks], odd[kChunks];
  const __m512 r = _mm512_set1_ps(rescale);
  for (int c = 0; c < kChunks; ++c) {
    even[c] = _mm512_mul_ps(r, _mm512_loadu_ps(acc + 16 * c));
    odd[c] = _mm512_setzero_ps();
  }
  int t = 0;
  for (; t + 2 <= num_values; t += 2) {
    const float* v0 = values + t * value_stride;
    const float* v1 = v0 + value_stride;
    const __m512 w0 = _mm512_set1_ps(weights[t]);
    const __m512 w1 = _mm512_set1_ps(weights[t + 1]);
    for (int c = 0; c < kChunks; ++c) {
      even[c] = _mm512_fmadd_ps(w0, load16(v0 + 16 * c), even[c]);
      odd[c] = _mm512_fmadd_ps(w1, load16(v1 + 16 * c), odd[c]);
    }
  }
  if (t < num_values) {
    const float* v0 = values + t * value_stride;
    const __m512 w0 = _mm512_set1_ps(weights[t]);
    for (int c = 0; c < kChunks; ++c) {
      even[c] = _mm512_fmadd_ps(w0, load16(v0 + 16 * c), even[c]);
    }
  }
  for (int c = 0; c < kChunks; ++c) _mm512_storeu_ps(acc + 16 * c, _mm512_add_ps(even[c], odd[c]));
}
#endif

// The same with keys transposed, keys_t: [kHeadDim, kBlockSize]: a row's scores are one
// block_size-wide vector, built by head_dim FMAs. Rows go four at a time, so each key vector
// loaded serves four rows and four FMA chains run side by side.
template <int kHeadDim, int kBlockSize>
void score_block_transposed(const float* q, int num_rows, const float* keys_t, float* scores) {
  int row = 0;
  for (; row + 4 <= num_rows; row += 4) {
    const float* q_rows = q + static_cast<int64_t>(row) * kHeadDim;
    float sums[4][kBlockSize] = {};
    for (int d = 0; d < kHeadDim; ++d) {
      const float* k = keys_t + d * kBlockSize;
      for (int j = 0; j < 4; ++j) {
        const float q_value = q_rows[j * kHeadDim + d];
#pragma omp simd
        for (int t = 0; t < kBlockSize; ++t) sums[j][t] += q_value * k[t];
      }
    }
    std::memcpy(scores + row * kBlockSize, sums, sizeof(sums));
  }
  for (; row < num_rows; ++row) {
    const float* q_row = q + static_cast<int64_t>(row) * kHeadDim;
    float sums[kBlockSize] = {};
    for (int d = 0; d < kHeadDim; ++d) {
      const float q_value = q_row[d];
      const float* k = keys_t + d * kBlockSize;
#pragma omp simd
      for (int t = 0; t < kBlockSize; ++t) sums[t] += q_value * k[t];
    }
    std::memcpy(scores + row * kBlockSize, sums, sizeof(sums));
  }
}

// Turns a row's scores for one block into weights exp(score - new_max) in place and returns
// (new_max, sum of the weights), new_max = max(old_max, the block's scores). Only the scores
// first_seen .. num_seen - 1 count; the weights outside them are 0. With a compile-time block size the
// loops run the full width and reduce in trees, which the compiler vectorizes (a loop that
// stops at num_seen, or a `simd reduction`, comes out scalar).
template <int kBlockSize>
[[gnu::always_inline]] inline std::pair<float, float> softmax_weights(float* weights,
                                                                      int first_seen,
                                                                      int num_seen,
                                                                      float old_max) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if constexpr (kBlockSize > 0) {
    static_assert((kBlockSize & (kBlockSize - 1)) == 0, "block size must be a power of two");
    for (int t = 0; t < first_seen; ++t) weights[t] = kNegInf;
    for (int t = num_seen; t < kBlockSize; ++t) weights[t] = kNegInf;
    float lanes[kBlockSize];
    std::memcpy(lanes, weights, sizeof(lanes));
    for (int width = kBlockSize / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] = std::max(lanes[l], lanes[l + width]);
    }
    const float new_max = std::max(old_max, lanes[0]);
#pragma omp simd
    for (int t = 0; t < kBlockSize; ++t) weights[t] = exp_nonpositive(weights[t] - new_max);
    for (int t = 0; t < first_seen; ++t) weights[t] = 0.0f;
    for (int t = num_seen; t < kBlockSize; ++t) weights[t] = 0.0f;
    std::memcpy(lanes, weights, sizeof(lanes));
    for (int width = kBlockSize / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    return {new_max, lanes[0]};
  } else {
    float new_max = old_max;
    for (int t = first_seen; t < num_seen; ++t) new_max = std::max(new_max, weights[t]);
    float sum = 0.0f;
    for (int t = 0; t < first_seen; ++t) weights[t] = 0.0f;
    for (int t = first_seen; t < num_seen; ++t) {
      weights[t] = exp_nonpositive(weights[t] - new_max);
      sum += weights[t];
    }
    return {new_max, sum};
  }
}

// acc = rescale * acc + sum_t weights[t] * value[t], value t at values + t * value_stride;
// with a compile-time head_dim the accumulator stays in registers across the block.
template <int kHeadDim>
[[gnu::always_inline]] inline void accumulate_values(float* __restrict__ acc, float rescale,
                                                   const float* __restrict__ weights,
                                                   const float* values, int64_t value_stride,
                                                   int num_values, int head_dim) {
  if constexpr (kHeadDim > 0) {
    float sum[kHeadDim];
#pragma omp simd
    for (int d = 0; d < kHeadDim; ++d) sum[d] = rescale * acc[d];
    for (int t = 0; t < num_values; ++t) {
      const float* v = values + t * value_stride;
      const float weight = weights[t];
#pragma omp simd
      for (int d = 0; d < kHeadDim; ++d) sum[d] += weight * v[d];
    }
#pragma omp simd
    for (int d = 0; d < kHeadDim; ++d) acc[d] = sum[d];
  } else {
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) acc[d] *= rescale;
    for (int t = 0; t < num_values; ++t) {
      const float* v = values + t * value_stride;
      const float weight = weights[t];
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) acc[d] += weight * v[d];
    }
  }
}

// Prefetches num_rows rows of head_dim values, slot_stride apart, from both caches, with
// __builtin_prefetch's locality (3: into L1, 2: into L2).
template <typename scalar_t, int kLocality = 3>
[[gnu::always_inline]] inline void prefetch_rows(const scalar_t* key_cache,
                                                 const scalar_t* value_cache, int64_t offset,
                                                 int64_t slot_stride, int num_rows,
                                                 int head_dim) {
  constexpr int kLine = 64 / sizeof(scalar_t);  // values per cache line
  for (int t = 0; t < num_rows; ++t) {
    for (int d = 0; d < head_dim; d += kLine) {
      __builtin_prefetch(key_cache + offset + t * slot_stride + d, 0, kLocality);
      __builtin_prefetch(value_cache + offset + t * slot_stride + d, 0, kLocality);
    }
  }
}

// accumulate_values, in AVX-512 where kVector, else in plain C++.
template <int kHeadDim, bool kVector>
[[gnu::always_inline]] inline void accumulate(float* acc, float rescale, const float* weights,
                                              const float* values, int64_t value_stride,
                                              int num_values, int head_dim) {
#if defined(__AVX512F__)
  if constexpr (kVector) {
    accumulate_values_avx512<kHeadDim>(acc, rescale, weights, values, value_stride, num_values);
    return;
  }
#endif
  accumulate_values<kHeadDim>(acc, rescale, weights, values, value_stride, num_values, head_dim);
}

// A split decode tile's rows (its one token's group_size query heads): the unnormalized
// accumulator, running max and running sum into its partial (Problem::partials).
template <typename scalar_t>
void write_partial(const Problem<scalar_t>& p, const Tile& tile, const Scratch& s,
                   int head_dim) {
  const int64_t stride = head_dim + 2;
  float* partial = p.partials + static_cast<int64_t>(tile.partial) * p.group_size * stride;
  for (int g = 0; g < p.group_size; ++g) {
    std::copy_n(s.acc.data() + static_cast<int64_t>(g) * head_dim, head_dim,
                partial + g * stride);
    partial[g * stride + head_dim] = s.row_max[g];
    partial[g * stride + head_dim + 1] = s.row_sum[g];
  }
}

// A two-pass decode tile's second pass (decode_tile16_avx512, decode_tile16_avx2), given the
// build's softmax over one row's scores: each row's weights, unnormalized, with its max and sum
// kept for the end (the sum with its head's sink, exp(sink - max): +inf past float's range,
// which weighs the keys 0 as it should); keys before the window weigh 0.
template <typename scalar_t, typename Softmax>
void softmax_context_rows(const Problem<scalar_t>& p, const Tile& tile, Scratch& s,
                          float* scores, int64_t padded, int head, int num_keys,
                          Softmax&& softmax) {
  for (int g = 0; g < p.group_size; ++g) {
    float* row = scores + g * padded;
    float row_max;
    s.row_sum[g] = softmax(row + head, num_keys - head, &row_max);
    s.row_max[g] = row_max;
    if (p.sinks != nullptr && tile.takes_sinks(p.window)) {
      s.row_sum[g] += std::exp(p.sinks[tile.kv_head * p.group_size + g] - row_max);
    }
    std::fill_n(row, head, 0.0f);
  }
}

// A tile's end: its partial (a split decode tile), or each row's accumulator over its sum
// into the output.
template <typename scalar_t>
void finish_rows(const Problem<scalar_t>& p, const Tile& tile, const Scratch& s, int head_dim) {
  if (tile.partial >= 0) return write_partial(p, tile, s, head_dim);
  const int group = p.group_size;
  for (int i = 0; i < tile.num_tokens; ++i) {
    for (int g = 0; g < group; ++g) {
      const int row = i * group + g;
      const float inv_sum = 1.0f / s.row_sum[row];
      const float* acc = s.acc.data() + static_cast<int64_t>(row) * head_dim;
      scalar_t* out = p.out + ((tile.first_token + i) * p.num_heads + tile.kv_head * group + g) *
                                  static_cast<int64_t>(head_dim);
      for (int d = 0; d < head_dim; ++d) out[d] = static_cast<scalar_t>(acc[d] * inv_sum);
    }
  }
}

// A block-by-block tile's start: its query rows widened and scaled into s.query (row
// i * group + g = scale * q[token i, head kv_head * group + g]; with `copy_bf16` also copied
// as given into s.query_bf16), accumulators 0, running max -inf and running sum 0, or each
// head's sink (max sink, sum 1) where the tile reads from its rows' first key.
template <typename scalar_t>
void start_rows(const Problem<scalar_t>& p, const Tile& tile, Scratch& s, int head_dim,
                bool copy_bf16) {
  const int group = p.group_size;
  const int num_rows = tile.num_tokens * group;
  for (int i = 0; i < tile.num_tokens; ++i) {
    for (int g = 0; g < group; ++g) {
      const scalar_t* q = p.query + (tile.first_token + i) * p.query_token_stride +
                          static_cast<int64_t>(tile.kv_head * group + g) * p.query_head_stride;
      float* row = s.query.data() + static_cast<int64_t>(i * group + g) * head_dim;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) row[d] = p.scale * to_float(q[d]);
      if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
        if (copy_bf16) {
          std::copy_n(q, head_dim,
                      s.query_bf16.data() + static_cast<int64_t>(i * group + g) * head_dim);
        }
      }
    }
  }
  std::fill_n(s.acc.data(), static_cast<int64_t>(num_rows) * head_dim, 0.0f);
  std::fill_n(s.row_max.data(), num_rows, -std::numeric_limits<float>::infinity());
  std::fill_n(s.row_sum.data(), num_rows, 0.0f);
  if (p.sinks != nullptr && tile.takes_sinks(p.window)) {
    // every row starts from its head's sink: a logit seen, weight exp(0) = 1, no value
    for (int row = 0; row < num_rows; ++row) {
      s.row_max[row] = p.sinks[tile.kv_head * group + row % group];
      s.row_sum[row] = 1.0f;
    }
  }
}

// num_rows cache rows of head_dim values, `stride` apart, widened to float32 into out
// ([num_rows, head_dim], contiguous).
template <typename scalar_t>
void widen_rows(const scalar_t* rows, int64_t stride, int num_rows, int head_dim, float* out) {
  for (int t = 0; t < num_rows; ++t) {
    const scalar_t* row = rows + t * stride;
    float* row_out = out + static_cast<int64_t>(t) * head_dim;
#pragma omp simd
    for (int d = 0; d < head_dim; ++d) row_out[d] = to_float(row[d]);
  }
}

// A register-tile prefill's walk over its blocks (16 slots each): for each block, in order,
// fn(block_start, num_valid, keys, values, value_stride) with the block's first position, its
// slots the tile may read (t < num_valid: none past the context), its keys as stored and its
// values as float32 rows (the cache's own when float32, else widened once into s.values for
// all the tile's rows); the next block's rows are prefetched first.
template <typename scalar_t, int kHeadDim, typename Fn>
void for_each_tile_block(const Problem<scalar_t>& p, const Tile& tile, Scratch& s, Fn&& fn) {
  const int32_t* table = p.block_tables + tile.seq * p.table_stride;
  const int num_keys = tile.end();
  const int first_block = tile.first_key / 16;
  for (int b = first_block, block_start = first_block * 16; block_start < num_keys;
       block_start += 16, ++b) {
    const int num_valid = std::min(16, num_keys - block_start);
    const int64_t offset = table[b] * p.cache_block_stride + tile.kv_head * p.cache_head_stride;
    if (block_start + 16 < num_keys) {
      prefetch_rows(p.key_cache, p.value_cache,
                    table[b + 1] * p.cache_block_stride + tile.kv_head * p.cache_head_stride,
                    p.cache_slot_stride, std::min(16, num_keys - block_start - 16), kHeadDim);
    }
    const scalar_t* value_block = p.value_cache + offset;
    if constexpr (std::is_same_v<scalar_t, float>) {
      fn(block_start, num_valid, p.key_cache + offset, value_block, p.cache_slot_stride);
    } else {
      widen_rows(value_block, p.cache_slot_stride, num_valid, kHeadDim, s.values.data());
      fn(block_start, num_valid, p.key_cache + offset, s.values.data(), int64_t{kHeadDim});
    }
  }
}

// The slots [first, end) of a block starting at block_start (num_valid of them readable)
// that a tile's row sees: causal, and from its window's first key; first >= end: none.
template <typename scalar_t>
std::pair<int, int> seen_slots(const Problem<scalar_t>& p, const Tile& tile, int row,
                               int block_start, int num_valid) {
  const int pos = tile.first_pos + row / p.group_size;
  return {std::max(0, first_key_of(pos, p.window) - block_start),
          std::min(num_valid, pos + 1 - block_start)};
}

// How many blocks ahead a two-pass decode tile prefetches. The rows go to L2, not L1: a tile
// reads the blocks it is told in no order a hardware prefetcher can follow, and L1 can track
// too few misses at once to hide memory latency (`make bench-kernels` reads the caches from
// memory; on an AMD EPYC prefetching into L1 was the slower of the two there).
constexpr int kPrefetchBlocks = 2;

#if defined(__AVX512F__)
// exp_nonpositive on 16 lanes.
[[gnu::always_inline]] inline __m512 exp16_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 poly = _mm512_set1_ps(1.9875691500e-4f);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.3981999507e-3f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(8.3334519073e-3f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(4.1665795894e-2f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.6666665459e-1f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(5.0000001201e-1f));
  poly = _mm512_fmadd_ps(_mm512_mul_ps(poly, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(poly, _mm512_castsi512_ps(bits));
}

// Turns scores[0 .. num_keys) into exp(score - max) in place and returns their sum; *max_out
// is max.
inline float softmax_in_place16(float* scores, int num_keys, float* max_out) {
  const int num_chunks = (num_keys + 15) / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (num_keys - 16 * (num_chunks - 1))) - 1u);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 max_v = neg_inf;
  for (int c = 0; c < num_chunks; ++c) {
    const __mmask16 m = c + 1 < num_chunks ? static_cast<__mmask16>(0xFFFF) : tail;
    max_v = _mm512_max_ps(max_v, _mm512_mask_loadu_ps(neg_inf, m, scores + 16 * c));
  }
  *max_out = _mm512_reduce_max_ps(max_v);
  const __m512 max_all = _mm512_set1_ps(*max_out);
  __m512 sum_v = _mm512_setzero_ps();
  for (int c = 0; c < num_chunks; ++c) {
    const __mmask16 m = c + 1 < num_chunks ? static_cast<__mmask16>(0xFFFF) : tail;
    const __m512 w = _mm512_maskz_mov_ps(
        m, exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + 16 * c), max_all)));
    _mm512_storeu_ps(scores + 16 * c, w);  // the padding past num_keys gets 0
    sum_v = _mm512_add_ps(sum_v, w);
  }
  return _mm512_reduce_add_ps(sum_v);
}

// acc[r][c] += sum over the context's values t of weights[r * weight_stride + t] * value[t]'s
// chunk first_chunk + c (16 channels each), for kRows rows and kChunks chunks: kRows x kChunks
// independent FMA chains, each value chunk loaded (and widened) once for all rows.
template <typename scalar_t, int kRows, int kChunks>
[[gnu::always_inline]] inline void accumulate_context16(const Problem<scalar_t>& p,
                                                        const int32_t* table, int64_t head_offset,
                                                        int num_keys, const float* weights,
                                                        int64_t weight_stride, int first_chunk,
                                                        float* acc_out, int64_t acc_stride) {
  __m512 acc[kRows][kChunks];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int block_start = 0, b = 0; block_start < num_keys; block_start += 16, ++b) {
    const int num_valid = std::min(16, num_keys - block_start);
    const scalar_t* values =
        p.value_cache + table[b] * p.cache_block_stride + head_offset + 16 * first_chunk;
    if (block_start + 16 < num_keys) {
      const scalar_t* next = p.value_cache + table[b + 1] * p.cache_block_stride + head_offset +
                             16 * first_chunk;
      for (int t = 0; t < 16; ++t) __builtin_prefetch(next + t * p.cache_slot_stride);
    }
    for (int t = 0; t < num_valid; ++t) {
      const scalar_t* v = values + t * p.cache_slot_stride;
      __m512 chunk[kChunks];
      for (int c = 0; c < kChunks; ++c) chunk[c] = load16(v + 16 * c);
      for (int r = 0; r < kRows; ++r) {
        const __m512 w = _mm512_set1_ps(weights[r * weight_stride + block_start + t]);
        for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm512_fmadd_ps(w, chunk[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) {
      _mm512_storeu_ps(acc_out + r * acc_stride + 16 * (first_chunk + c), acc[r][c]);
    }
  }
}

// accumulate_context16 for num_rows <= 4 rows, dispatched to a compile-time row count.
template <typename scalar_t, int kChunks>
void accumulate_context16_rows(int num_rows, const Problem<scalar_t>& p, const int32_t* table,
                               int64_t head_offset, int num_keys, const float* weights,
                               int64_t weight_stride, int first_chunk, float* acc_out,
                               int64_t acc_stride) {
  switch (num_rows) {
    case 1:
      return accumulate_context16<scalar_t, 1, kChunks>(p, table, head_offset, num_keys, weights,
                                                        weight_stride, first_chunk, acc_out,
                                                        acc_stride);
    case 2:
      return accumulate_context16<scalar_t, 2, kChunks>(p, table, head_offset, num_keys, weights,
                                                        weight_stride, first_chunk, acc_out,
                                                        acc_stride);
    case 3:
      return accumulate_context16<scalar_t, 3, kChunks>(p, table, head_offset, num_keys, weights,
                                                        weight_stride, first_chunk, acc_out,
                                                        acc_stride);
    default:
      return accumulate_context16<scalar_t, 4, kChunks>(p, table, head_offset, num_keys, weights,
                                                        weight_stride, first_chunk, acc_out,
                                                        acc_stride);
  }
}

// A one-token tile (decode) with 16-slot blocks, in AVX-512 and two passes over the context
// instead of attend_tile's online softmax: (1) every row's scores against every key, block by
// block, into one [rows, context] buffer; (2) one softmax per row over the whole context;
// (3) the weighted values, each value row loaded once for up to four query rows. A row's
// softmax is done once rather than rescaled at every block, and values are widened in
// registers rather than copied. Reads the same slots as attend_tile: none past the context.
template <typename scalar_t, int kHeadDim>
void decode_tile16_avx512(const Problem<scalar_t>& p, const Tile& tile, Scratch& s) {
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16");
  constexpr int kChunks = kHeadDim / 16;
  constexpr bool kBf16Dot = std::is_same_v<scalar_t, c10::BFloat16> && kHeadDim % 32 == 0;
  const int group = p.group_size;
  // Keys are read from the block holding the window's first key (block 0 without a window):
  // relative position t is position base + t; the first `head` of them are before the window.
  const int first_block = tile.first_key / 16;
  const int base = first_block * 16;
  const int head = tile.first_key - base;
  const int num_keys = tile.end() - base;  // a split: its keys only
  const int num_blocks = (num_keys + 15) / 16;
  // A row's softmax past its head may write zeros up to 16 slots past its padded width.
  const int64_t padded = static_cast<int64_t>(num_blocks) * 16 + 16;
  if (s.context_scores.size() < static_cast<size_t>(group * padded)) {
    s.context_scores.resize(static_cast<size_t>(group * padded));
  }
  float* scores = s.context_scores.data();  // [group, padded]

  for (int g = 0; g < group; ++g) {
    const scalar_t* q = p.query + tile.first_token * p.query_token_stride +
                        static_cast<int64_t>(tile.kv_head * group + g) * p.query_head_stride;
    float* row = s.query.data() + static_cast<int64_t>(g) * kHeadDim;
    for (int d = 0; d < kHeadDim; ++d) row[d] = p.scale * to_float(q[d]);
    if constexpr (kBf16Dot) {
      std::copy_n(q, kHeadDim, s.query_bf16.data() + static_cast<int64_t>(g) * kHeadDim);
    }
  }
  const bool bf16_dot = kBf16Dot && can_use_avx512_bf16();
  const int32_t* table = p.block_tables + tile.seq * p.table_stride + first_block;
  const int64_t head_offset = tile.kv_head * p.cache_head_stride;

  // 1. scores, keys read in place
  for (int block_start = 0, b = 0; block_start < num_keys; block_start += 16, ++b) {
    const int num_valid = std::min(16, num_keys - block_start);
    const scalar_t* keys = p.key_cache + table[b] * p.cache_block_stride + head_offset;
    if (b + kPrefetchBlocks < num_blocks) {
      // a later block's keys, and its values for pass 3, into L2
      const int first = (b + kPrefetchBlocks) * 16;
      prefetch_rows<scalar_t, 2>(p.key_cache, p.value_cache,
                                 table[b + kPrefetchBlocks] * p.cache_block_stride + head_offset,
                                 p.cache_slot_stride, std::min(16, num_keys - first), kHeadDim);
    }
    if constexpr (kBf16Dot) {
      if (bf16_dot) {
        score_block16_bf16<kHeadDim>(s.query_bf16.data(), group, keys, p.cache_slot_stride,
                                     num_valid, p.scale, scores + block_start, padded);
        continue;
      }
    }
    score_block16_avx512<scalar_t, kHeadDim>(s.query.data(), group, keys, p.cache_slot_stride,
                                             num_valid, scores + block_start, padded);
  }

  if (p.soft_cap > 0.0f) soft_cap_scores(scores, group, padded, num_keys, p.soft_cap);

  // 2. softmax weights (softmax_context_rows)
  softmax_context_rows(p, tile, s, scores, padded, head, num_keys, softmax_in_place16);

  // 3. weighted values, four rows and four chunks (64 channels) at a time
  constexpr int kChunkStep = kChunks < 4 ? kChunks : 4;
  static_assert(kChunks % kChunkStep == 0, "head_dim must be a multiple of 64 or be 16, 32");
  for (int row = 0; row < group; row += 4) {
    for (int chunk = 0; chunk < kChunks; chunk += kChunkStep) {
      accumulate_context16_rows<scalar_t, kChunkStep>(
          std::min(4, group - row), p, table, head_offset, num_keys, scores + row * padded,
          padded, chunk, s.acc.data() + static_cast<int64_t>(row) * kHeadDim, kHeadDim);
    }
  }

  finish_rows(p, tile, s, kHeadDim);
}
#endif

#if defined(QUIRE_ATTENTION_AVX2)
// decode_tile16_avx512's two passes in AVX2 (8 lanes, 16 registers), for a build without
// AVX-512: the same reads, the same exp polynomial, float32 sums in another order.

// 8 consecutive cache values widened to float32.
[[gnu::always_inline]] inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

[[gnu::always_inline]] inline __m256 load8(const c10::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

[[gnu::always_inline]] inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Lane t of the result = the sum of v[t]'s 8 lanes: eight horizontal sums at once.
[[gnu::always_inline]] inline __m256 sum_lanes8(const __m256 (&v)[8]) {
  // per 128-bit half: [sum of v0's four lanes there, v1's, v2's, v3's], likewise v4 .. v7
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// exp_nonpositive on 8 lanes.
[[gnu::always_inline]] inline __m256 exp8_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
  poly = _mm256_fmadd_ps(_mm256_mul_ps(poly, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(poly, _mm256_castsi256_ps(bits));
}

// Lanes of chunk c (8 scores from 8c) below num_keys, as an all-ones float mask.
[[gnu::always_inline]] inline __m256 valid_lanes8(int c, int num_keys) {
  const __m256 lane = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
  return _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(num_keys - 8 * c)), _CMP_LT_OQ);
}

// The largest and the sum of a vector's 8 lanes.
[[gnu::always_inline]] inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

[[gnu::always_inline]] inline float hsum8(__m256 v) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}

// softmax_in_place16 in AVX2: scores[0 .. num_keys) into exp(score - max) in place, their sum
// returned and the max in *max_out; the padding up to the next multiple of 8 gets 0.
inline float softmax_in_place8(float* scores, int num_keys, float* max_out) {
  const int num_chunks = (num_keys + 7) / 8;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 max_v = neg_inf;
  for (int c = 0; c < num_chunks; ++c) {
    const __m256 v = _mm256_loadu_ps(scores + 8 * c);
    max_v = _mm256_max_ps(max_v, _mm256_blendv_ps(neg_inf, v, valid_lanes8(c, num_keys)));
  }
  *max_out = hmax8(max_v);
  const __m256 max_all = _mm256_set1_ps(*max_out);
  __m256 sum_v = _mm256_setzero_ps();
  for (int c = 0; c < num_chunks; ++c) {
    const __m256 w = _mm256_and_ps(
        valid_lanes8(c, num_keys),
        exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + 8 * c), max_all)));
    _mm256_storeu_ps(scores + 8 * c, w);
    sum_v = _mm256_add_ps(sum_v, w);
  }
  return hsum8(sum_v);
}

// Scores of num_rows query rows against a 16-slot block's keys, 8 keys at a time: per row, key
// t's dot product in its own 8 lanes, sum_lanes8 reducing eight at once. Slots past num_keys
// re-read the last valid key (never an unwritten slot); softmax_in_place8 masks their scores.
template <typename scalar_t, int kHeadDim>
void score_block16_avx2(const float* q, int num_rows, const scalar_t* keys, int64_t key_stride,
                        int num_keys, float* scores, int64_t score_stride) {
  constexpr int kChunks = kHeadDim / 8;
  for (int half = 0; half * 8 < num_keys; ++half) {
    const scalar_t* key_rows[8];
    for (int t = 0; t < 8; ++t) {
      key_rows[t] = keys + std::min(8 * half + t, num_keys - 1) * key_stride;
    }
    for (int row = 0; row < num_rows; ++row) {
      const float* q_row = q + static_cast<int64_t>(row) * kHeadDim;
      __m256 acc[8];
      const __m256 q0 = _mm256_loadu_ps(q_row);
      for (int t = 0; t < 8; ++t) acc[t] = _mm256_mul_ps(q0, load8(key_rows[t]));
      for (int c = 1; c < kChunks; ++c) {
        const __m256 qc = _mm256_loadu_ps(q_row + 8 * c);
        for (int t = 0; t < 8; ++t) {
          acc[t] = _mm256_fmadd_ps(qc, load8(key_rows[t] + 8 * c), acc[t]);
        }
      }
      _mm256_storeu_ps(scores + row * score_stride + 8 * half, sum_lanes8(acc));
    }
  }
}

// accumulate_context16 in AVX2: kRows rows x kChunks chunks of 8 channels from first_chunk.
template <typename scalar_t, int kRows, int kChunks>
[[gnu::always_inline]] inline void accumulate_context8(const Problem<scalar_t>& p,
                                                       const int32_t* table, int64_t head_offset,
                                                       int num_keys, const float* weights,
                                                       int64_t weight_stride, int first_chunk,
                                                       float* acc_out, int64_t acc_stride) {
  __m256 acc[kRows][kChunks];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int block_start = 0, b = 0; block_start < num_keys; block_start += 16, ++b) {
    const int num_valid = std::min(16, num_keys - block_start);
    const scalar_t* values =
        p.value_cache + table[b] * p.cache_block_stride + head_offset + 8 * first_chunk;
    for (int t = 0; t < num_valid; ++t) {
      const scalar_t* v = values + t * p.cache_slot_stride;
      __m256 chunk[kChunks];
      for (int c = 0; c < kChunks; ++c) chunk[c] = load8(v + 8 * c);
      for (int r = 0; r < kRows; ++r) {
        const __m256 w = _mm256_set1_ps(weights[r * weight_stride + block_start + t]);
        for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm256_fmadd_ps(w, chunk[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) {
      _mm256_storeu_ps(acc_out + r * acc_stride + 8 * (first_chunk + c), acc[r][c]);
    }
  }
}

// decode_tile16_avx512's passes in AVX2: (1) scores into one [rows, context] buffer, (2) one
// softmax per row, (3) the weighted values, up to four rows and 16 channels at a time.
template <typename scalar_t, int kHeadDim>
void decode_tile16_avx2(const Problem<scalar_t>& p, const Tile& tile, Scratch& s) {
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16");
  constexpr int kChunkStep = 2;  // 8-lane chunks per pass of accumulate_context8
  const int group = p.group_size;
  const int first_block = tile.first_key / 16;
  const int base = first_block * 16;
  const int head = tile.first_key - base;
  const int num_keys = tile.end() - base;
  const int num_blocks = (num_keys + 15) / 16;
  const int64_t padded = static_cast<int64_t>(num_blocks) * 16 + 16;
  if (s.context_scores.size() < static_cast<size_t>(group * padded)) {
    s.context_scores.resize(static_cast<size_t>(group * padded));
  }
  float* scores = s.context_scores.data();  // [group, padded]
  for (int g = 0; g < group; ++g) {
    const scalar_t* q = p.query + tile.first_token * p.query_token_stride +
                        static_cast<int64_t>(tile.kv_head * group + g) * p.query_head_stride;
    float* row = s.query.data() + static_cast<int64_t>(g) * kHeadDim;
    for (int d = 0; d < kHeadDim; ++d) row[d] = p.scale * to_float(q[d]);
  }
  const int32_t* table = p.block_tables + tile.seq * p.table_stride + first_block;
  const int64_t head_offset = tile.kv_head * p.cache_head_stride;

  for (int block_start = 0, b = 0; block_start < num_keys; block_start += 16, ++b) {
    const scalar_t* keys = p.key_cache + table[b] * p.cache_block_stride + head_offset;
    if (b + kPrefetchBlocks < num_blocks) {
      const int first = (b + kPrefetchBlocks) * 16;
      prefetch_rows<scalar_t, 2>(p.key_cache, p.value_cache,
                                 table[b + kPrefetchBlocks] * p.cache_block_stride + head_offset,
                                 p.cache_slot_stride, std::min(16, num_keys - first), kHeadDim);
    }
    score_block16_avx2<scalar_t, kHeadDim>(s.query.data(), group, keys, p.cache_slot_stride,
                                           std::min(16, num_keys - block_start),
                                           scores + block_start, padded);
  }

  if (p.soft_cap > 0.0f) soft_cap_scores(scores, group, padded, num_keys, p.soft_cap);

  softmax_context_rows(p, tile, s, scores, padded, head, num_keys, softmax_in_place8);

  for (int row = 0; row < group; row += 4) {
    const int rows = std::min(4, group - row);
    for (int chunk = 0; chunk < kHeadDim / 8; chunk += kChunkStep) {
      float* acc = s.acc.data() + static_cast<int64_t>(row) * kHeadDim;
      const float* w = scores + row * padded;
      switch (rows) {
        case 1:
          accumulate_context8<scalar_t, 1, kChunkStep>(p, table, head_offset, num_keys, w, padded,
                                                       chunk, acc, kHeadDim);
          break;
        case 2:
          accumulate_context8<scalar_t, 2, kChunkStep>(p, table, head_offset, num_keys, w, padded,
                                                       chunk, acc, kHeadDim);
          break;
        case 3:
          accumulate_context8<scalar_t, 3, kChunkStep>(p, table, head_offset, num_keys, w, padded,
                                                       chunk, acc, kHeadDim);
          break;
        default:
          accumulate_context8<scalar_t, 4, kChunkStep>(p, table, head_offset, num_keys, w, padded,
                                                       chunk, acc, kHeadDim);
          break;
      }
    }
  }

  finish_rows(p, tile, s, kHeadDim);
}

// An 8 x 8 transpose in registers: afterwards r[k] holds what was lane k of r[0] .. r[7].
[[gnu::always_inline]] inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4h + m], per 128-bit half k: rows 4h .. 4h + 3 of column 4k + m
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
  }
}

// prefill_tile16_avx512 in AVX2 (8 lanes, 16 registers), head_dim a multiple of 32: a block's
// keys transposed once for the tile (8 x 8 in registers), four rows scored at a time (each
// row's 16 scores in two vectors), their softmax in vectors, and the weighted values added
// into two rows' accumulators at a time, 32 channels a pass, in registers for the block.
template <typename scalar_t, int kHeadDim>
void prefill_tile16_avx2(const Problem<scalar_t>& p, const Tile& tile, Scratch& s) {
  static_assert(kHeadDim % 32 == 0, "head_dim must be a multiple of 32");
  constexpr int kRows = 4;
  const int group = p.group_size;
  const int num_rows = tile.num_tokens * group;
  start_rows(p, tile, s, kHeadDim, false);

  float* keys_t = s.keys.data();  // [kHeadDim, 16], 0 past the block's valid slots
  const __m256 lane_lo = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
  const __m256 lane_hi = _mm256_add_ps(lane_lo, _mm256_set1_ps(8.0f));
  alignas(32) float weights[kRows][16];
  for_each_tile_block<scalar_t, kHeadDim>(p, tile, s, [&](int block_start, int num_valid,
                                                          const scalar_t* key_block,
                                                          const float* values,
                                                          int64_t value_stride) {
    for (int half = 0; half < 2; ++half) {
      for (int c = 0; c < kHeadDim / 8; ++c) {
        __m256 rows[8];
        for (int i = 0; i < 8; ++i) {
          const int t = 8 * half + i;
          rows[i] = t < num_valid ? load8(key_block + t * p.cache_slot_stride + 8 * c)
                                  : _mm256_setzero_ps();
        }
        transpose8(rows);
        for (int d = 0; d < 8; ++d) _mm256_storeu_ps(keys_t + (8 * c + d) * 16 + 8 * half, rows[d]);
      }
    }
    for (int first = 0; first < num_rows; first += kRows) {
      int seen_from[kRows], seen_to[kRows];
      int max_seen = 0;
      bool any = false;
      for (int j = 0; j < kRows; ++j) {
        seen_from[j] = seen_to[j] = 0;
        if (first + j >= num_rows) continue;
        std::tie(seen_from[j], seen_to[j]) = seen_slots(p, tile, first + j, block_start, num_valid);
        if (seen_to[j] > seen_from[j]) {
          any = true;
          max_seen = std::max(max_seen, seen_to[j]);
        }
      }
      if (!any) continue;

      // 1. scores: row j's 16 in two vectors (rows past the tile re-read the last row)
      const float* q_rows[kRows];
      for (int j = 0; j < kRows; ++j) {
        q_rows[j] = s.query.data() + static_cast<int64_t>(std::min(first + j, num_rows - 1)) *
                                         kHeadDim;
      }
      __m256 lo[kRows], hi[kRows];
      for (int j = 0; j < kRows; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
      for (int d = 0; d < kHeadDim; ++d) {
        const __m256 k_lo = _mm256_loadu_ps(keys_t + d * 16);
        const __m256 k_hi = _mm256_loadu_ps(keys_t + d * 16 + 8);
        for (int j = 0; j < kRows; ++j) {
          const __m256 q = _mm256_broadcast_ss(q_rows[j] + d);
          lo[j] = _mm256_fmadd_ps(q, k_lo, lo[j]);
          hi[j] = _mm256_fmadd_ps(q, k_hi, hi[j]);
        }
      }

      // 2. online softmax: weights exp(score - new max) on the seen slots, 0 elsewhere
      const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      float rescale[kRows];
      for (int j = 0; j < kRows; ++j) {
        rescale[j] = 1.0f;
        if (seen_to[j] <= seen_from[j]) {
          _mm256_store_ps(weights[j], _mm256_setzero_ps());
          _mm256_store_ps(weights[j] + 8, _mm256_setzero_ps());
          continue;
        }
        const __m256 from = _mm256_set1_ps(static_cast<float>(seen_from[j]));
        const __m256 to = _mm256_set1_ps(static_cast<float>(seen_to[j]));
        const __m256 seen_lo = _mm256_and_ps(_mm256_cmp_ps(lane_lo, from, _CMP_GE_OQ),
                                             _mm256_cmp_ps(lane_lo, to, _CMP_LT_OQ));
        const __m256 seen_hi = _mm256_and_ps(_mm256_cmp_ps(lane_hi, from, _CMP_GE_OQ),
                                             _mm256_cmp_ps(lane_hi, to, _CMP_LT_OQ));
        const int row = first + j;
        const float old_max = s.row_max[row];
        const float new_max = std::max(
            old_max, hmax8(_mm256_max_ps(_mm256_blendv_ps(neg_inf, lo[j], seen_lo),
                                         _mm256_blendv_ps(neg_inf, hi[j], seen_hi))));
        const __m256 m = _mm256_set1_ps(new_max);
        const __m256 w_lo = _mm256_and_ps(seen_lo, exp8_nonpositive(_mm256_sub_ps(lo[j], m)));
        const __m256 w_hi = _mm256_and_ps(seen_hi, exp8_nonpositive(_mm256_sub_ps(hi[j], m)));
        _mm256_store_ps(weights[j], w_lo);
        _mm256_store_ps(weights[j] + 8, w_hi);
        rescale[j] = exp_nonpositive(old_max - new_max);
        s.row_sum[row] = s.row_sum[row] * rescale[j] + hsum8(_mm256_add_ps(w_lo, w_hi));
        s.row_max[row] = new_max;
      }

      // 3. two rows' accumulators, 32 channels at a time, in registers for the block
      for (int j = 0; j < kRows; j += 2) {
        if (first + j >= num_rows) break;
        const bool second = first + j + 1 < num_rows;
        float* a0 = s.acc.data() + static_cast<int64_t>(first + j) * kHeadDim;
        float* a1 = second ? a0 + kHeadDim : a0;  // a lone last row: the second set is dropped
        const __m256 r0 = _mm256_set1_ps(rescale[j]);
        const __m256 r1 = _mm256_set1_ps(second ? rescale[j + 1] : 1.0f);
        for (int pass = 0; pass < kHeadDim / 32; ++pass) {
          __m256 acc0[4], acc1[4];
          for (int c = 0; c < 4; ++c) {
            acc0[c] = _mm256_mul_ps(_mm256_loadu_ps(a0 + 32 * pass + 8 * c), r0);
            acc1[c] = _mm256_mul_ps(_mm256_loadu_ps(a1 + 32 * pass + 8 * c), r1);
          }
          for (int t = 0; t < max_seen; ++t) {
            const float* v = values + t * value_stride + 32 * pass;
            const __m256 w0 = _mm256_broadcast_ss(&weights[j][t]);
            const __m256 w1 = _mm256_broadcast_ss(&weights[second ? j + 1 : j][t]);
            for (int c = 0; c < 4; ++c) {
              const __m256 vc = _mm256_loadu_ps(v + 8 * c);
              acc0[c] = _mm256_fmadd_ps(w0, vc, acc0[c]);
              acc1[c] = _mm256_fmadd_ps(w1, vc, acc1[c]);
            }
          }
          for (int c = 0; c < 4; ++c) {
            if (second) _mm256_storeu_ps(a1 + 32 * pass + 8 * c, acc1[c]);
            _mm256_storeu_ps(a0 + 32 * pass + 8 * c, acc0[c]);
          }
        }
      }
    }
  });
  finish_rows(p, tile, s, kHeadDim);
}
#endif

#if defined(__AVX512F__)
// A 16 x 16 transpose in registers: afterwards r[k] holds what was lane k of r[0] .. r[15].
// Pairs of rows interleave (ps), then pairs of pairs (pd), then 128-bit lanes twice.
[[gnu::always_inline]] inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + m], 128-bit lane k: rows 4i .. 4i + 3 of column 4k + m
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xDD);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
  }
}

// The bits of lanes first .. end - 1 of 16 (none when end <= first).
inline __mmask16 lane_range(int first, int end) {
  if (end <= first) return 0;
  return static_cast<__mmask16>(((1u << end) - 1u) & ~((1u << first) - 1u));
}

// attend_tile for a tile of several tokens (prefill), a 16-slot block and head_dim a multiple
// of 16, in AVX-512. Per block, the keys are transposed (and widened) once for the tile; then
// kRows rows at a time score the block's 16 keys as one vector each (head_dim FMAs a row, each
// key vector loaded once for the kRows rows), update their online softmax in vector registers
// (a masked max, exp on 16 lanes, one horizontal sum) and add the weighted values into
// accumulators that stay in registers across the block's keys, each value row loaded (widened)
// once for the kRows rows. The same arithmetic as attend_tile's, in float32, keys and values
// read from the same slots: none past the context.
template <typename scalar_t, int kHeadDim>
void prefill_tile16_avx512(const Problem<scalar_t>& p, const Tile& tile, Scratch& s) {
  static_assert(kHeadDim % 16 == 0, "head_dim must be a multiple of 16");
  constexpr int kChunks = kHeadDim / 16;
  // accumulators kRows x kChunks + one block's value row: within the 32 vector registers
  constexpr int kRows = std::max(1, std::min(8, 16 / kChunks));
  const int group = p.group_size;
  const int num_rows = tile.num_tokens * group;
  start_rows(p, tile, s, kHeadDim, false);

  float* keys_t = s.keys.data();  // [kHeadDim, 16], 0 past the block's valid slots
  for_each_tile_block<scalar_t, kHeadDim>(p, tile, s, [&](int block_start, int num_valid,
                                                          const scalar_t* key_block,
                                                          const float* values,
                                                          int64_t value_stride) {
    for (int c = 0; c < kChunks; ++c) {
      __m512 rows[16];
      for (int t = 0; t < 16; ++t) {
        rows[t] = t < num_valid ? load16(key_block + t * p.cache_slot_stride + 16 * c)
                                : _mm512_setzero_ps();
      }
      transpose16(rows);
      for (int d = 0; d < 16; ++d) _mm512_storeu_ps(keys_t + (16 * c + d) * 16, rows[d]);
    }
    for (int first = 0; first < num_rows; first += kRows) {
      // which of the block's slots each row sees: causal, and from its window's first key
      __mmask16 seen[kRows];
      int max_seen = 0;
      bool any = false;
      for (int j = 0; j < kRows; ++j) {
        seen[j] = 0;
        if (first + j >= num_rows) continue;
        const auto [first_seen, num_seen] = seen_slots(p, tile, first + j, block_start, num_valid);
        seen[j] = lane_range(first_seen, num_seen);
        if (seen[j] != 0) {
          any = true;
          max_seen = std::max(max_seen, num_seen);
        }
      }
      if (!any) continue;

      // 1. scores: row j's 16 in one vector (rows past the tile re-read the last row)
      const float* q_rows[kRows];
      for (int j = 0; j < kRows; ++j) {
        q_rows[j] = s.query.data() + static_cast<int64_t>(std::min(first + j, num_rows - 1)) *
                                         kHeadDim;
      }
      __m512 scores[kRows];
      for (int j = 0; j < kRows; ++j) scores[j] = _mm512_setzero_ps();
      for (int d = 0; d < kHeadDim; ++d) {
        const __m512 k = _mm512_loadu_ps(keys_t + d * 16);
        for (int j = 0; j < kRows; ++j) {
          scores[j] = _mm512_fmadd_ps(_mm512_set1_ps(q_rows[j][d]), k, scores[j]);
        }
      }

      // 2. online softmax: weights exp(score - new max) on the seen slots, 0 elsewhere
      float rescale[kRows];
      __m512 weights[kRows];
      for (int j = 0; j < kRows; ++j) {
        rescale[j] = 1.0f;
        weights[j] = _mm512_setzero_ps();
        if (seen[j] == 0) continue;
        const int row = first + j;
        const float old_max = s.row_max[row];
        const float new_max = std::max(old_max, _mm512_mask_reduce_max_ps(seen[j], scores[j]));
        const __m512 w = _mm512_maskz_mov_ps(
            seen[j], exp16_nonpositive(_mm512_sub_ps(scores[j], _mm512_set1_ps(new_max))));
        weights[j] = w;
        // 1 when the max stays; ~1e-38 on a row's first block, where acc and sum are still 0
        rescale[j] = exp_nonpositive(old_max - new_max);
        s.row_sum[row] = s.row_sum[row] * rescale[j] + _mm512_reduce_add_ps(w);
        s.row_max[row] = new_max;
      }

      // 3. acc = rescale * acc + the weighted values, in registers for the block
      __m512 acc[kRows][kChunks];
      for (int j = 0; j < kRows; ++j) {
        const float* a =
            s.acc.data() + static_cast<int64_t>(std::min(first + j, num_rows - 1)) * kHeadDim;
        const __m512 r = _mm512_set1_ps(rescale[j]);
        for (int c = 0; c < kChunks; ++c) acc[j][c] = _mm512_mul_ps(_mm512_loadu_ps(a + 16 * c), r);
      }
      for (int t = 0; t < max_seen; ++t) {
        __m512 v[kChunks];
        for (int c = 0; c < kChunks; ++c) v[c] = _mm512_loadu_ps(values + t * value_stride + 16 * c);
        const __m512i lane = _mm512_set1_epi32(t);
        for (int j = 0; j < kRows; ++j) {
          const __m512 w = _mm512_permutexvar_ps(lane, weights[j]);
          for (int c = 0; c < kChunks; ++c) acc[j][c] = _mm512_fmadd_ps(w, v[c], acc[j][c]);
        }
      }
      for (int j = 0; j < kRows && first + j < num_rows; ++j) {
        float* a = s.acc.data() + static_cast<int64_t>(first + j) * kHeadDim;
        for (int c = 0; c < kChunks; ++c) _mm512_storeu_ps(a + 16 * c, acc[j][c]);
      }
    }
  });
  finish_rows(p, tile, s, kHeadDim);
}
#endif

// Packed prefill. A chunk of several tokens with no window, soft cap or sinks (the common
// prompt) runs as two products per tile, in the packed linears' register tiles
// (packed_tile.h) rather than block by block: each (sequence, kv head)'s keys and values are
// gathered from the cache once per call, widened to float32 and packed (keys as a weight of
// 64-key tiles, key_tiles[t][d][64]; values as 64-channel tiles, values[c][key][64]); then a
// tile of a few consecutive tokens' rows (row i * group + g, as above) computes
//   1. scores[row][key] = (scale * q[row]) . key, for every key up to its last token's,
//   2. one softmax per row over the keys it sees (causal), exp(score - max) as weights, 0 for
//      the keys after its position (the diagonal's upper corner, computed and discarded),
//   3. out[row] = (weights[row] . values) / sum(weights[row]).
// All float32, the same exp as the block-by-block tiles. Scores of a whole row at once: no
// running max or rescaled accumulator, and both products are the linears' 6-row x 64-column
// FMA tiles. A tile takes as many tokens as keep its score rows within kPackedScoreFloats.

// Score floats a packed tile may hold (its rows x its keys, 64-key padded): within L2.
constexpr int64_t kPackedScoreFloats = int64_t{1} << 16;
// Tokens a packed tile takes at most (fewer where its keys are many).
constexpr int64_t kPackedMaxTokens = 64;
// The fewest tokens a chunk has for a packed prefill: a shorter one takes the block-by-block
// tiles, where packing its context would cost more than the register-tiled products save
// (measured with `python -m benchmarks.prefill_attention --prompt-lens 32 64 96 128`).
constexpr int kPackedMinTokens = 96;

// One (sequence, kv head) of a packed prefill: its chunk, its context and where its packed
// keys and values lie in the call's buffer.
struct PackedHead {
  int seq;
  int kv_head;
  int64_t first_token;  // the chunk's first row in query / out
  int query_len;
  int context_len;  // cached prefix + chunk
  int64_t keys_at;  // key_tiles: [ceil(context / 64)][head_dim][64] floats from here
  int64_t values_at;  // values: [ceil(head_dim / 64)][context][64] floats from here
};

inline int64_t round_up64(int64_t n) { return (n + 63) / 64 * 64; }

#if defined(__AVX512F__)
// Tokens start .. start + num_tokens - 1 of a head's chunk.
struct PackedTile {
  int head;  // index into the call's PackedHead list
  int start;
  int num_tokens;
  int64_t cost;  // rows' keys, roughly the multiply-adds over head_dim
};

// The first n lanes of 16 (all of them from 16 on, none below 1).
inline __mmask16 first_lanes(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max(n, 0)) - 1u);
}

// 16 float32 lanes rounded to bfloat16 (to nearest even; finite values), as 16-bit lanes.
inline __m256i round16_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16));
}

// A head's keys and values from the cache, packed (see above), widened to float32 or, with
// kBf16Dot, kept in bfloat16 in the same tiles with pairs interleaved as the bfloat16 linears'
// are (keys: pairs of channels, key_tiles[t][d / 2][64][2]; values: pairs of keys,
// values[c][key / 2][64][2], the context padded to even). The padding is 0.
template <typename scalar_t, bool kBf16Dot>
void pack_head(const Problem<scalar_t>& p, const PackedHead& h, float* buffer) {
  using packed_t = std::conditional_t<kBf16Dot, c10::BFloat16, float>;
  const int head_dim = p.head_dim;
  const int64_t num_key_tiles = round_up64(h.context_len) / 64;
  const int64_t channel_tiles = round_up64(head_dim) / 64;
  const int64_t value_rows = kBf16Dot ? (h.context_len + 1) / 2 * 2 : h.context_len;
  packed_t* key_tiles = reinterpret_cast<packed_t*>(buffer + h.keys_at);
  packed_t* values = reinterpret_cast<packed_t*>(buffer + h.values_at);
  std::fill_n(key_tiles, num_key_tiles * head_dim * 64, packed_t(0.0f));
  if (head_dim % 64 != 0 || value_rows != h.context_len) {
    std::fill_n(values, channel_tiles * value_rows * 64, packed_t(0.0f));
  }
  const int32_t* table = p.block_tables + h.seq * p.table_stride;
  for (int t = 0; t < h.context_len; ++t) {
    const int64_t slot = static_cast<int64_t>(table[t / p.block_size]) * p.cache_block_stride +
                         (t % p.block_size) * p.cache_slot_stride +
                         static_cast<int64_t>(h.kv_head) * p.cache_head_stride;
    const scalar_t* key = p.key_cache + slot;
    const scalar_t* value = p.value_cache + slot;
    packed_t* key_tile = key_tiles + (t / 64) * head_dim * 64;
    for (int64_t c = 0; c < channel_tiles; ++c) {
      const int width = static_cast<int>(std::min<int64_t>(64, head_dim - 64 * c));
      if constexpr (kBf16Dot) {
        c10::BFloat16* row = values + c * value_rows * 64 + (t / 2) * 128 + t % 2;
        for (int d = 0; d < width; ++d) row[2 * d] = value[64 * c + d];
      } else {
        float* row = values + (c * value_rows + t) * 64;
#pragma omp simd
        for (int d = 0; d < width; ++d) row[d] = to_float(value[64 * c + d]);
      }
    }
    if constexpr (kBf16Dot) {
      for (int d = 0; d < head_dim; ++d) key_tile[(d / 2) * 128 + (t % 64) * 2 + d % 2] = key[d];
    } else {
      for (int d = 0; d < head_dim; ++d) key_tile[d * 64 + t % 64] = to_float(key[d]);
    }
  }
}

// Working memory of one thread's packed tiles, grown to the largest it meets.
struct PackedScratch {
  std::vector<float> query, scores, out, sums;
  std::vector<c10::BFloat16> query_bf16, weights_bf16;
};

// One packed tile: its rows' scores, softmax and weighted values, into the output. With
// kBf16Dot (bfloat16 caches, a CPU with AVX512_BF16) both products are vdpbf16ps tiles: the
// queries as given (scale applied to the scores), the weights rounded to bfloat16 for the
// second product and the sum taken of the rounded weights; float32 sums throughout.
template <typename scalar_t, bool kBf16Dot>
void packed_tile(const Problem<scalar_t>& p, const PackedHead& h, const PackedTile& tile,
                 const float* buffer, PackedScratch& s) {
  using namespace quire_cpu::packed_tile;
  const int head_dim = p.head_dim, group = p.group_size;
  const int num_rows = tile.num_tokens * group;
  const int prefix_len = h.context_len - h.query_len;
  const int key_end = prefix_len + tile.start + tile.num_tokens;  // keys the last row sees
  const int64_t score_stride = round_up64(key_end);
  const int64_t channel_tiles = round_up64(head_dim) / 64;
  const int64_t value_rows = kBf16Dot ? (h.context_len + 1) / 2 * 2 : h.context_len;
  const int64_t out_stride = channel_tiles * 64;
  s.scores.resize(static_cast<size_t>(num_rows * score_stride));
  s.out.resize(static_cast<size_t>(num_rows * out_stride));
  if constexpr (kBf16Dot) {
    s.query_bf16.resize(static_cast<size_t>(num_rows) * head_dim);
    s.weights_bf16.resize(static_cast<size_t>(num_rows * score_stride));
  } else {
    s.query.resize(static_cast<size_t>(num_rows) * head_dim);
  }
  for (int i = 0; i < tile.num_tokens; ++i) {
    for (int g = 0; g < group; ++g) {
      const scalar_t* q = p.query + (h.first_token + tile.start + i) * p.query_token_stride +
                          static_cast<int64_t>(h.kv_head * group + g) * p.query_head_stride;
      const int64_t row = static_cast<int64_t>(i * group + g) * head_dim;
      if constexpr (kBf16Dot) {
        std::copy_n(q, head_dim, s.query_bf16.data() + row);
      } else {
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) s.query[row + d] = p.scale * to_float(q[d]);
      }
    }
  }
  // 1. scores, 64 keys a tile
  for (int64_t kt = 0; kt < score_stride / 64; ++kt) {
    tile_all_rows(num_rows, [&](auto rows, int64_t row) {
      float* scores = s.scores.data() + row * score_stride + kt * 64;
      if constexpr (kBf16Dot) {
        tile_bf16<decltype(rows)::value, float>(
            s.query_bf16.data() + row * head_dim, head_dim,
            reinterpret_cast<const c10::BFloat16*>(buffer + h.keys_at) + kt * head_dim * 64,
            head_dim, nullptr, scores, score_stride, 64, false);
      } else {
        tile_float<decltype(rows)::value>(s.query.data() + row * head_dim, head_dim,
                                          buffer + h.keys_at + kt * head_dim * 64, head_dim,
                                          nullptr, scores, score_stride, 64, false);
      }
    });
  }
  // 2. each row's weights over the keys it sees, 0 after them (up to an even count for the
  // bfloat16 pairs); its sum kept for the end
  const int weight_end = kBf16Dot ? (key_end + 1) / 2 * 2 : key_end;
  const __m512 scale = _mm512_set1_ps(kBf16Dot ? p.scale : 1.0f);
  s.sums.resize(static_cast<size_t>(num_rows));
  for (int row = 0; row < num_rows; ++row) {
    float* r = s.scores.data() + row * score_stride;
    const int seen = prefix_len + tile.start + row / group + 1;
    __m512 max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int t = 0; t < seen; t += 16) {
      max = _mm512_mask_max_ps(max, first_lanes(seen - t), max, _mm512_loadu_ps(r + t));
    }
    const __m512 row_max = _mm512_set1_ps(_mm512_reduce_max_ps(max));
    __m512 sum = _mm512_setzero_ps();
    for (int t = 0; t < weight_end; t += 16) {
      const __mmask16 in_row = first_lanes(weight_end - t);
      __m512 w = _mm512_maskz_mov_ps(
          first_lanes(seen - t),
          exp16_nonpositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(r + t), row_max), scale)));
      if constexpr (kBf16Dot) {
        const __m256i rounded = round16_bf16(w);
        _mm256_mask_storeu_epi16(s.weights_bf16.data() + row * score_stride + t, in_row, rounded);
        w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
      } else {
        _mm512_mask_storeu_ps(r + t, in_row, w);
      }
      sum = _mm512_add_ps(sum, w);
    }
    s.sums[row] = _mm512_reduce_add_ps(sum);
  }
  // 3. weighted values, 64 channels a tile, then over the sums into the output
  for (int64_t c = 0; c < channel_tiles; ++c) {
    const int num_cols = static_cast<int>(std::min<int64_t>(64, head_dim - 64 * c));
    tile_all_rows(num_rows, [&](auto rows, int64_t row) {
      float* out = s.out.data() + row * out_stride + 64 * c;
      if constexpr (kBf16Dot) {
        tile_bf16<decltype(rows)::value, float>(
            s.weights_bf16.data() + row * score_stride, score_stride,
            reinterpret_cast<const c10::BFloat16*>(buffer + h.values_at) + c * value_rows * 64,
            weight_end, nullptr, out, out_stride, num_cols, false);
      } else {
        tile_float<decltype(rows)::value>(s.scores.data() + row * score_stride, score_stride,
                                          buffer + h.values_at + c * value_rows * 64, key_end,
                                          nullptr, out, out_stride, num_cols, false);
      }
    });
  }
  for (int i = 0; i < tile.num_tokens; ++i) {
    for (int g = 0; g < group; ++g) {
      const int row = i * group + g;
      const float inv_sum = 1.0f / s.sums[row];
      const float* acc = s.out.data() + row * out_stride;
      scalar_t* out = p.out + ((h.first_token + tile.start + i) * p.num_heads +
                               h.kv_head * group + g) *
                                  static_cast<int64_t>(head_dim);
      for (int d = 0; d < head_dim; ++d) out[d] = static_cast<scalar_t>(acc[d] * inv_sum);
    }
  }
}

// The packed prefill of `heads` (their keys_at / values_at laid out back to back): their
// keys and values packed, then their tiles, longest first, each thread taking the next.
template <typename scalar_t, bool kBf16Dot>
void run_packed_as(const Problem<scalar_t>& p, const std::vector<PackedHead>& heads,
                   int64_t buffer_floats) {
  std::vector<float> buffer(static_cast<size_t>(buffer_floats));
  std::vector<PackedTile> tiles;
  int64_t work = 0;
  for (int i = 0; i < static_cast<int>(heads.size()); ++i) {
    const PackedHead& h = heads[i];
    const int64_t keys = round_up64(h.context_len);
    const int tokens = static_cast<int>(
        std::clamp<int64_t>(kPackedScoreFloats / (keys * p.group_size), 1, kPackedMaxTokens));
    for (int start = 0; start < h.query_len; start += tokens) {
      const int num_tokens = std::min(tokens, h.query_len - start);
      const int64_t cost =
          static_cast<int64_t>(h.context_len - h.query_len + start + num_tokens) * num_tokens;
      tiles.push_back(PackedTile{i, start, num_tokens, cost});
      work += cost * p.group_size * p.head_dim * 2;
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const PackedTile& a, const PackedTile& b) { return a.cost > b.cost; });
  const int64_t threads = work < kMinParallelWork ? 1 : at::get_num_threads();
  std::atomic<int64_t> next_head{0}, next_tile{0};
  const int64_t num_heads = static_cast<int64_t>(heads.size());
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  at::parallel_for(0, std::min(threads, num_heads), 1, [&](int64_t begin, int64_t end) {
    for (int64_t worker = begin; worker < end; ++worker) {
      for (int64_t i = next_head++; i < num_heads; i = next_head++) {
        pack_head<scalar_t, kBf16Dot>(p, heads[i], buffer.data());
      }
    }
  });
  at::parallel_for(0, std::min(threads, num_tiles), 1, [&](int64_t begin, int64_t end) {
    PackedScratch scratch;
    for (int64_t worker = begin; worker < end; ++worker) {
      for (int64_t i = next_tile++; i < num_tiles; i = next_tile++) {
        packed_tile<scalar_t, kBf16Dot>(p, heads[tiles[i].head], tiles[i], buffer.data(),
                                        scratch);
      }
    }
  });
}

// run_packed_as with both products in vdpbf16ps where the cache is bfloat16, the head_dim even,
// the scale positive (the softmax takes the unscaled scores' max) and the CPU has AVX512_BF16;
// in float32 otherwise.
template <typename scalar_t>
void run_packed(const Problem<scalar_t>& p, const std::vector<PackedHead>& heads,
                int64_t buffer_floats) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (p.head_dim % 2 == 0 && p.scale > 0 && can_use_avx512_bf16()) {
      return run_packed_as<scalar_t, true>(p, heads, buffer_floats);
    }
  }
  run_packed_as<scalar_t, false>(p, heads, buffer_floats);
}
#endif

// kHeadDim, kBlockSize > 0 fix those sizes at compile time (unrolled inner loops, registers
// for accumulators); 0 reads them from the problem.
template <typename scalar_t, int kHeadDim, int kBlockSize>
void attend_tile(const Problem<scalar_t>& p, const Tile& tile, Scratch& s) {
  const int head_dim = kHeadDim > 0 ? kHeadDim : p.head_dim;
  const int block_size = kBlockSize > 0 ? kBlockSize : p.block_size;
  const int group = p.group_size;
  const int num_rows = tile.num_tokens * group;
  constexpr bool kCanTranspose = kHeadDim > 0 && kBlockSize > 0;
  constexpr bool kVector = kHasAvx512 && kBlockSize == 16 && kHeadDim > 0 && kHeadDim % 16 == 0;
  // bf16 caches score with vdpbf16ps where the CPU has it (head_dim a multiple of 32)
  constexpr bool kBf16Dot =
      kVector && std::is_same_v<scalar_t, c10::BFloat16> && kHeadDim % 32 == 0;
  const bool transpose_keys = kCanTranspose && num_rows >= kMinRowsToTranspose;
#if defined(__AVX512F__)
  if constexpr (kVector) {
    if (tile.num_tokens == 1) return decode_tile16_avx512<scalar_t, kHeadDim>(p, tile, s);
    if (p.soft_cap <= 0.0f) return prefill_tile16_avx512<scalar_t, kHeadDim>(p, tile, s);
  }
#elif defined(QUIRE_ATTENTION_AVX2)
  if constexpr (kBlockSize == 16 && kHeadDim > 0 && kHeadDim % 16 == 0) {
    if (tile.num_tokens == 1) return decode_tile16_avx2<scalar_t, kHeadDim>(p, tile, s);
    if constexpr (kHeadDim % 32 == 0) {
      if (p.soft_cap <= 0.0f) return prefill_tile16_avx2<scalar_t, kHeadDim>(p, tile, s);
    }
  }
#endif

  start_rows(p, tile, s, head_dim, kBf16Dot);
  // read only by the AVX-512 scoring below, which a build without AVX-512 leaves out
  [[maybe_unused]] const bool bf16_dot = kBf16Dot && !transpose_keys && can_use_avx512_bf16();

  const int32_t* table = p.block_tables + tile.seq * p.table_stride;
  const int num_keys = tile.end();  // what the tile's last row sees (a split: its end)
  const int first_block = tile.first_key / block_size;  // where row 0's keys start
  for (int b = first_block, block_start = first_block * block_size; block_start < num_keys;
       block_start += block_size, ++b) {
    // Only slots t < num_valid are ever read: past the context they may hold anything.
    const int num_valid = std::min(block_size, num_keys - block_start);
    const int64_t offset = table[b] * p.cache_block_stride + tile.kv_head * p.cache_head_stride;
    const scalar_t* key_block = p.key_cache + offset;
    const scalar_t* value_block = p.value_cache + offset;
    // The next block is wherever the block table says: no hardware prefetcher guesses it,
    // so ask for its rows now, while this block is computed.
    if (block_start + block_size < num_keys) {
      const int next_valid = std::min(block_size, num_keys - block_start - block_size);
      prefetch_rows(p.key_cache, p.value_cache,
                    table[b + 1] * p.cache_block_stride + tile.kv_head * p.cache_head_stride,
                    p.cache_slot_stride, next_valid, head_dim);
    }

    // 1. scores of every row against the block's keys
    if (transpose_keys) {
      if constexpr (kCanTranspose) {
        float* keys_t = s.keys.data();  // [kHeadDim, kBlockSize], zero past num_valid
        for (int t = 0; t < num_valid; ++t) {
          const scalar_t* k = key_block + t * p.cache_slot_stride;
          for (int d = 0; d < kHeadDim; ++d) keys_t[d * kBlockSize + t] = to_float(k[d]);
        }
        for (int d = 0; d < kHeadDim; ++d) {
          for (int t = num_valid; t < kBlockSize; ++t) keys_t[d * kBlockSize + t] = 0.0f;
        }
        score_block_transposed<kHeadDim, kBlockSize>(s.query.data(), num_rows, keys_t,
                                                     s.scores.data());
      }
    } else if constexpr (kVector) {
#if defined(__AVX512F__)
      if constexpr (kBf16Dot) {
        if (bf16_dot) {
          score_block16_bf16<kHeadDim>(s.query_bf16.data(), num_rows, key_block,
                                       p.cache_slot_stride, num_valid, p.scale,
                                       s.scores.data(), block_size);
        } else {
          score_block16_avx512<scalar_t, kHeadDim>(s.query.data(), num_rows, key_block,
                                                   p.cache_slot_stride, num_valid,
                                                   s.scores.data(), block_size);
        }
      } else {
        score_block16_avx512<scalar_t, kHeadDim>(s.query.data(), num_rows, key_block,
                                                 p.cache_slot_stride, num_valid,
                                                 s.scores.data(), block_size);
      }
#endif
    } else if constexpr (std::is_same_v<scalar_t, float>) {
      score_block<kHeadDim>(s.query.data(), num_rows, key_block, p.cache_slot_stride,
                            num_valid, head_dim, block_size, s.scores.data());
    } else {
      widen_rows(key_block, p.cache_slot_stride, num_valid, head_dim, s.keys.data());
      score_block<kHeadDim>(s.query.data(), num_rows, s.keys.data(), head_dim, num_valid,
                            head_dim, block_size, s.scores.data());
    }

    // Values are read in place when they are float32, else widened once into s.values for
    // all the tile's rows.
    constexpr bool widen_values = !std::is_same_v<scalar_t, float>;
    if constexpr (widen_values) {
      widen_rows(value_block, p.cache_slot_stride, num_valid, head_dim, s.values.data());
    }

    if (p.soft_cap > 0.0f) {
      soft_cap_scores(s.scores.data(), num_rows, block_size, num_valid, p.soft_cap);
    }

    // 2. and 3. per row: online softmax update, then the weighted values
    for (int i = 0; i < tile.num_tokens; ++i) {
      // Causal: token i sees this block's slots up to its own position, and from the first
      // of its window.
      const int pos = tile.first_pos + i;
      const int num_seen = std::min(num_valid, pos + 1 - block_start);
      const int first_seen = std::max(0, first_key_of(pos, p.window) - block_start);
      if (num_seen <= first_seen) continue;
      for (int g = 0; g < group; ++g) {
        const int row = i * group + g;
        float* weights = s.scores.data() + static_cast<int64_t>(row) * block_size;
        const float old_max = s.row_max[row];
        const auto [new_max, block_sum] =
            softmax_weights<kBlockSize>(weights, first_seen, num_seen, old_max);
        // 1 when the max stays; ~1e-38 on the first block (old_max = -inf), where the
        // accumulator and the sum are still 0.
        const float rescale = exp_nonpositive(old_max - new_max);
        s.row_sum[row] = s.row_sum[row] * rescale + block_sum;
        s.row_max[row] = new_max;
        float* acc = s.acc.data() + static_cast<int64_t>(row) * head_dim;
        if constexpr (widen_values) {
          accumulate<kHeadDim, kVector>(acc, rescale, weights, s.values.data(), head_dim,
                                        num_seen, head_dim);
        } else {
          accumulate<kHeadDim, kVector>(acc, rescale, weights, value_block,
                                        p.cache_slot_stride, num_seen, head_dim);
        }
      }
    }
  }

  finish_rows(p, tile, s, head_dim);
}

template <typename scalar_t, int kHeadDim, int kBlockSize>
void run_tiles(const Problem<scalar_t>& p, const std::vector<Tile>& tiles) {
  // tiles are sorted longest first; each thread takes the next one when it finishes one.
  std::atomic<int64_t> next{0};
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  int64_t work = 0;  // multiply-adds, roughly
  for (const Tile& tile : tiles) work += tile.cost() * p.group_size * p.head_dim * 2;
  // A parallel region costs a few microseconds, and far more when another process holds
  // the cores and a worker must wait for its time slice: small calls stay on this thread.
  const int64_t num_workers =
      work < kMinParallelWork ? 1 : std::min<int64_t>(at::get_num_threads(), num_tiles);
  at::parallel_for(0, num_workers, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(std::max(kMaxTileRows, p.group_size), p.head_dim, p.block_size);
    for (int64_t worker = begin; worker < end; ++worker) {
      for (int64_t i = next++; i < num_tiles; i = next++) {
        attend_tile<scalar_t, kHeadDim, kBlockSize>(p, tiles[i], scratch);
      }
    }
  });
}

// Compile-time sizes for the common shapes (head_dim 64 or 128, block_size 16).
template <typename scalar_t, int kHeadDim>
void run_for_block_size(const Problem<scalar_t>& p, const std::vector<Tile>& tiles) {
  if (p.block_size == 16) return run_tiles<scalar_t, kHeadDim, 16>(p, tiles);
  return run_tiles<scalar_t, kHeadDim, 0>(p, tiles);
}

template <typename scalar_t>
void run_for_shape(const Problem<scalar_t>& p, const std::vector<Tile>& tiles) {
  switch (p.head_dim) {
    case 64:
      return run_for_block_size<scalar_t, 64>(p, tiles);
    case 128:
      return run_for_block_size<scalar_t, 128>(p, tiles);
    default:
      return run_tiles<scalar_t, 0, 0>(p, tiles);
  }
}

// Shapes and dtypes are checked by the Python wrappers (checks.py); these guard memory
// safety: layouts the pointer arithmetic relies on and every index value.
void check_layout(const at::Tensor& query, const at::Tensor& key_cache,
                  const at::Tensor& value_cache, const at::Tensor& block_tables) {
  TORCH_CHECK_VALUE(query.dim() == 3 && key_cache.dim() == 4, "query must be 3-d, caches 4-d");
  TORCH_CHECK_VALUE(key_cache.sizes() == value_cache.sizes() &&
                        key_cache.strides() == value_cache.strides(),
                    "key_cache and value_cache must have one shape and one layout");
  TORCH_CHECK_VALUE(query.size(2) == key_cache.size(3), "query and cache head_dim differ");
  TORCH_CHECK_VALUE(query.scalar_type() == key_cache.scalar_type() &&
                        value_cache.scalar_type() == key_cache.scalar_type(),
                    "query and caches must share one dtype");
  TORCH_CHECK_VALUE(query.stride(2) == 1 && key_cache.stride(3) == 1,
                    "query and caches must have head_dim stride 1");
  TORCH_CHECK_VALUE(query.size(1) % key_cache.size(2) == 0,
                    "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK_VALUE(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 &&
                        block_tables.stride(1) == 1 && block_tables.size(1) > 0,
                    "block_tables must be [num_seqs, max_blocks_per_seq] int32 with unit "
                    "column stride");
  TORCH_CHECK_VALUE(query.device().is_cpu() && key_cache.device().is_cpu() &&
                        block_tables.device().is_cpu(),
                    "the C++ CPU kernels take CPU tensors");
}

void check_block_ids(const at::Tensor& block_tables, int64_t num_blocks) {
  const int32_t* ids = block_tables.data_ptr<int32_t>();
  for (int64_t seq = 0; seq < block_tables.size(0); ++seq) {
    for (int64_t col = 0; col < block_tables.size(1); ++col) {
      const int32_t id = ids[seq * block_tables.stride(0) + col];
      TORCH_CHECK_VALUE(id >= 0 && id < num_blocks, "block_tables holds block ids outside [0, ",
                        num_blocks, ")");
    }
  }
}

void check_context_len(int64_t context_len, int64_t min_len, const char* min_len_name,
                       int64_t max_blocks_per_seq, int64_t block_size) {
  TORCH_CHECK_VALUE(context_len >= min_len, "context_lens must be >= ", min_len_name);
  TORCH_CHECK_VALUE(context_len <= max_blocks_per_seq * block_size,
                    "context_lens exceed the block table's capacity of ", max_blocks_per_seq,
                    " blocks x ", block_size, " slots = ", max_blocks_per_seq * block_size,
                    " tokens");
}

template <typename scalar_t>
Problem<scalar_t> make_problem(const at::Tensor& query, const at::Tensor& key_cache,
                               const at::Tensor& value_cache, const at::Tensor& block_tables,
                               at::Tensor& out, double scale, int window, double soft_cap,
                               const float* sinks) {
  return Problem<scalar_t>{
      query.data_ptr<scalar_t>(),
      key_cache.data_ptr<scalar_t>(),
      value_cache.data_ptr<scalar_t>(),
      block_tables.data_ptr<int32_t>(),
      out.data_ptr<scalar_t>(),
      query.stride(0),
      query.stride(1),
      key_cache.stride(0),
      key_cache.stride(1),
      key_cache.stride(2),
      block_tables.stride(0),
      static_cast<int>(query.size(1)),
      static_cast<int>(query.size(1) / key_cache.size(2)),
      static_cast<int>(query.size(2)),
      static_cast<int>(key_cache.size(1)),
      static_cast<float>(scale),
      window,
      static_cast<float>(soft_cap),
      sinks,
  };
}

// The tiles of one token's rows for one kv head (decode, or a one-token prefill chunk): one
// tile, or the splits of its keys (see "Split decode"). The cut depends on the token's
// position, window and block size only, never on the batch or the thread count, so a
// sequence's output is the same whatever else runs beside it.
void add_one_token_tiles(std::vector<Tile>& tiles, std::vector<SplitGroup>& splits, int seq,
                         int kv_head, int64_t token, int pos, int window, int block_size) {
  const int first_key = first_key_of(pos, window);
  const int first_block = first_key / block_size;
  const int num_blocks = pos / block_size + 1 - first_block;
  const int split_blocks = std::max(1, kSplitKeys / block_size);
  const int count = num_blocks / split_blocks;
  if (count < 2) {
    tiles.push_back(Tile{seq, kv_head, token, 1, pos, first_key});
    return;
  }
  int first_partial = 0;
  if (!splits.empty()) first_partial = splits.back().first + splits.back().count;
  splits.push_back(SplitGroup{kv_head, token, first_partial, count});
  for (int j = 0; j < count; ++j) {
    // split j: its share of the blocks (the last one's up to the token itself)
    const int begin = (first_block + num_blocks * j / count) * block_size;
    const int end = (first_block + num_blocks * (j + 1) / count) * block_size;
    Tile tile{seq, kv_head, token, 1, pos, j == 0 ? first_key : begin};
    tile.key_end = std::min(end, pos + 1);
    tile.partial = first_partial + j;
    tiles.push_back(tile);
  }
}

// The output rows of split decodes: each group's partials merged (see "Split decode").
template <typename scalar_t>
void merge_splits(const Problem<scalar_t>& p, const std::vector<SplitGroup>& groups) {
  const int group = p.group_size;
  const int head_dim = p.head_dim;
  const int64_t stride = head_dim + 2;
  std::vector<float> acc(head_dim);
  for (const SplitGroup& split : groups) {
    for (int g = 0; g < group; ++g) {
      const float* first = p.partials + static_cast<int64_t>(split.first) * group * stride;
      float max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < split.count; ++j) {
        max = std::max(max, first[(j * group + g) * stride + head_dim]);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float sum = 0.0f;
      for (int j = 0; j < split.count; ++j) {
        const float* part = first + (j * group + g) * stride;
        const float weight = std::exp(part[head_dim] - max);
        sum += part[head_dim + 1] * weight;
        for (int d = 0; d < head_dim; ++d) acc[d] += part[d] * weight;
      }
      scalar_t* out =
          p.out + (split.token * p.num_heads + split.kv_head * group + g) *
                      static_cast<int64_t>(head_dim);
      const float inv_sum = 1.0f / sum;
      for (int d = 0; d < head_dim; ++d) out[d] = static_cast<scalar_t>(acc[d] * inv_sum);
    }
  }
}

at::Tensor run(const at::Tensor& query, const at::Tensor& key_cache,
               const at::Tensor& value_cache, const at::Tensor& block_tables,
               std::vector<Tile>& tiles, double scale, int window, double soft_cap,
               const std::optional<at::Tensor>& sink_tensor,
               const std::vector<SplitGroup>& splits = {},
               const std::vector<PackedHead>& packed = {}, int64_t packed_floats = 0) {
  at::Tensor out = at::empty(query.sizes(), query.options());
  int num_partials = 0;
  for (const SplitGroup& split : splits) num_partials += split.count;
  // [num_partials][group_size][head_dim + 2] (Problem::partials)
  std::vector<float> partials(static_cast<size_t>(num_partials) *
                              (query.size(1) / key_cache.size(2)) * (query.size(2) + 2));
  if (sink_tensor) {
    TORCH_CHECK_VALUE(sink_tensor->scalar_type() == at::kFloat && sink_tensor->dim() == 1 &&
                          sink_tensor->size(0) == query.size(1) &&
                          sink_tensor->is_contiguous() && sink_tensor->device().is_cpu(),
                      "sinks must be a contiguous [num_heads] float32 CPU tensor");
  }
  const float* sinks = sink_tensor ? sink_tensor->data_ptr<float>() : nullptr;
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.cost() > b.cost(); });
  if (tiles.empty() && packed.empty()) return out;
  const auto solve = [&](auto problem) {
    problem.partials = partials.empty() ? nullptr : partials.data();
#if defined(__AVX512F__)
    if (!packed.empty()) run_packed(problem, packed, packed_floats);
#endif
    if (tiles.empty()) return;
    run_for_shape(problem, tiles);
    merge_splits(problem, splits);
  };
  switch (query.scalar_type()) {
    case at::kFloat:
      solve(make_problem<float>(query, key_cache, value_cache, block_tables, out, scale, window,
                                soft_cap, sinks));
      break;
    case at::kBFloat16:
      solve(make_problem<c10::BFloat16>(query, key_cache, value_cache, block_tables, out, scale,
                                        window, soft_cap, sinks));
      break;
    case at::kHalf:
      solve(make_problem<c10::Half>(query, key_cache, value_cache, block_tables, out, scale,
                                    window, soft_cap, sinks));
      break;
    default:
      TORCH_CHECK_VALUE(false, "the C++ kernels take float32, bfloat16 or float16, got ",
                        query.scalar_type());
  }
  return out;
}

// sliding_window >= 1 or none; logits_soft_cap > 0 or none (the Python wrappers check both).
std::pair<int, double> window_and_cap(std::optional<int64_t> sliding_window,
                                      std::optional<double> logits_soft_cap) {
  TORCH_CHECK_VALUE(!sliding_window || (*sliding_window >= 1 && *sliding_window <= INT32_MAX),
                    "sliding_window must be none or in [1, 2^31)");
  TORCH_CHECK_VALUE(!logits_soft_cap || *logits_soft_cap > 0.0,
                    "logits_soft_cap must be none or > 0");
  return {sliding_window ? static_cast<int>(*sliding_window) : 0,
          logits_soft_cap ? *logits_soft_cap : 0.0};
}

}  // namespace

// query: [num_seqs, num_heads, head_dim]; context_lens: [num_seqs] int32, including the
// current token, whose key and value are already in the cache at position context_len - 1.
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale,
                                  std::optional<int64_t> sliding_window,
                                  std::optional<double> logits_soft_cap,
                                  const std::optional<at::Tensor>& sinks) {
  const auto [window, soft_cap] = window_and_cap(sliding_window, logits_soft_cap);
  check_layout(query, key_cache, value_cache, block_tables);
  const at::Tensor lens = context_lens.contiguous();
  TORCH_CHECK_VALUE(lens.scalar_type() == at::kInt && lens.dim() == 1 &&
                        lens.size(0) == query.size(0) && block_tables.size(0) == query.size(0),
                    "decode takes one query, one block table row and one length per sequence");
  check_block_ids(block_tables, key_cache.size(0));
  const int32_t* len = lens.data_ptr<int32_t>();
  const int num_kv_heads = static_cast<int>(key_cache.size(2));
  const int block_size = static_cast<int>(key_cache.size(1));
  std::vector<Tile> tiles;
  std::vector<SplitGroup> splits;
  tiles.reserve(query.size(0) * num_kv_heads);
  for (int seq = 0; seq < query.size(0); ++seq) {
    check_context_len(len[seq], 1, "1", block_tables.size(1), key_cache.size(1));
    for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
      add_one_token_tiles(tiles, splits, seq, kv_head, seq, len[seq] - 1, window, block_size);
    }
  }
  return run(query, key_cache, value_cache, block_tables, tiles, scale, window, soft_cap, sinks,
             splits);
}

// query: [num_tokens, num_heads, head_dim], the chunks of all sequences back to back;
// cu_query_lens: [num_seqs + 1] int32; context_lens: [num_seqs] int32, cached prefix + chunk.
at::Tensor paged_prefill_attention(const at::Tensor& query, const at::Tensor& key_cache,
                                   const at::Tensor& value_cache, const at::Tensor& block_tables,
                                   const at::Tensor& cu_query_lens,
                                   const at::Tensor& context_lens, double scale,
                                   std::optional<int64_t> sliding_window,
                                   std::optional<double> logits_soft_cap,
                                   const std::optional<at::Tensor>& sinks) {
  const auto [window, soft_cap] = window_and_cap(sliding_window, logits_soft_cap);
  check_layout(query, key_cache, value_cache, block_tables);
  const at::Tensor lens = context_lens.contiguous();
  const at::Tensor cu = cu_query_lens.contiguous();
  const int64_t num_seqs = lens.size(0);
  TORCH_CHECK_VALUE(lens.scalar_type() == at::kInt && cu.scalar_type() == at::kInt &&
                        lens.dim() == 1 && cu.dim() == 1 && cu.size(0) == num_seqs + 1 &&
                        block_tables.size(0) == num_seqs,
                    "prefill takes num_seqs + 1 cu_query_lens and one block table row and one "
                    "length per sequence");
  const int32_t* len = lens.data_ptr<int32_t>();
  const int32_t* bounds = cu.data_ptr<int32_t>();
  TORCH_CHECK_VALUE(bounds[0] == 0 && bounds[num_seqs] == query.size(0),
                    "cu_query_lens must run from 0 to num_tokens (", query.size(0), ")");
  check_block_ids(block_tables, key_cache.size(0));
  const int num_kv_heads = static_cast<int>(key_cache.size(2));
  const int group = static_cast<int>(query.size(1) / key_cache.size(2));
  const int tokens_per_tile = std::max(1, kMaxTileRows / group);
  const int block_size = static_cast<int>(key_cache.size(1));
  const int64_t head_dim = query.size(2);
  // Packed prefill (see there) for chunks of several tokens, where the call has none of what
  // only the block-by-block tiles do (a window, a soft cap, sinks) and the build has AVX-512.
  const bool packs = kHasAvx512 && window == 0 && soft_cap == 0 && !sinks.has_value();
  std::vector<PackedHead> packed;
  int64_t packed_floats = 0;
  std::vector<Tile> tiles;
  std::vector<SplitGroup> splits;
  for (int seq = 0; seq < num_seqs; ++seq) {
    const int query_len = bounds[seq + 1] - bounds[seq];
    TORCH_CHECK_VALUE(query_len >= 0, "cu_query_lens must be non-decreasing");
    check_context_len(len[seq], query_len, "the chunk lengths in cu_query_lens",
                      block_tables.size(1), key_cache.size(1));
    const int prefix_len = len[seq] - query_len;
    if (packs && query_len >= kPackedMinTokens) {
      for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
        const int64_t keys_at = packed_floats;
        const int64_t values_at = keys_at + round_up64(len[seq]) * head_dim;
        packed_floats = values_at + round_up64(head_dim) * len[seq];
        packed.push_back(
            PackedHead{seq, kv_head, bounds[seq], query_len, len[seq], keys_at, values_at});
      }
      continue;
    }
    for (int start = 0; start < query_len; start += tokens_per_tile) {
      const int num_tokens = std::min(tokens_per_tile, query_len - start);
      for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
        if (query_len == 1) {  // a decode in all but name: the same tiles, the same result
          add_one_token_tiles(tiles, splits, seq, kv_head, bounds[seq], prefix_len, window,
                              block_size);
          continue;
        }
        tiles.push_back(Tile{seq, kv_head, bounds[seq] + start, num_tokens, prefix_len + start,
                             first_key_of(prefix_len + start, window)});
      }
    }
  }
  return run(query, key_cache, value_cache, block_tables, tiles, scale, window, soft_cap, sinks,
             splits, packed, packed_floats);
}

TORCH_LIBRARY(quire_cpu, m) {
  m.def(
      "paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor context_lens, float scale, int? sliding_window=None, "
      "float? logits_soft_cap=None, Tensor? sinks=None) -> Tensor");
  m.def(
      "paged_prefill_attention(Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor cu_query_lens, Tensor context_lens, float scale, "
      "int? sliding_window=None, float? logits_soft_cap=None, Tensor? sinks=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(quire_cpu, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("paged_prefill_attention", &paged_prefill_attention);
}
