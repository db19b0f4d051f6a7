// Which vector instructions the CPU kernels may use: what the build targets, and what the CPU
// adds at run time.
//
// The library is built once per x86-64 level (cpp_build.py): x86-64-v3 (AVX2 + FMA) and
// x86-64-v4 (AVX-512), and the loader picks the newest one the CPU runs. AVX-512 code (its
// intrinsics, and every declaration that mentions __m512 or __mmask16) exists only in a build
// where the compiler defines __AVX512F__, inside `#if defined(__AVX512F__)`. Code outside those
// regions must compile for every level and may only name what is declared outside them, such as
// the two below. `make kernels-check` (a prerequisite of `make test`) compiles every level.
#pragma once

namespace quire_cpu {

#if defined(__AVX512F__)
// Whether the hand-written AVX-512 paths are compiled in.
inline constexpr bool kHasAvx512 = true;

// Whether vdpbf16ps (AVX512_BF16) runs here: x86-64-v4 does not include it, so the CPU is asked
// once, at the first call.
inline bool can_use_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#else
inline constexpr bool kHasAvx512 = false;

inline bool can_use_avx512_bf16() { return false; }
#endif

}  // namespace quire_cpu
