// Host loops with x86 vector forms picked at run time (the CPU is asked
// once): the f16 -> f32 decode of a buffer (CpuBackend's decode and the
// validating layer's download), and the f64 dot products of CpuBackend's
// gemm. Each vector form gives the bits of its plain form exactly, so the
// reference does not depend on the machine (tests/cpu/test_host_simd.cpp
// checks every f16 value and the dot sums). They are what CpuBackend's
// decode-size gemm runs on: qwen3-0.6b f16 on two
// threads decoded 1.5-2.0 tokens/s with the plain forms, 5.0 with these
// (docs/PERFORMANCE.md, session 76).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferrum/half.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define FERRUM_CPU_X86_SIMD 1
#else
#define FERRUM_CPU_X86_SIMD 0
#endif

namespace ferrum::detail {

// ── f16 -> f32 ──────────────────────────────────────────────────────────────

inline void f16_to_f32_block_plain(const std::uint16_t* s /*[count]*/, std::size_t count, float* dst /*[count]*/) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
}

#if FERRUM_CPU_X86_SIMD
// vcvtph2ps is exact for every value but a NaN, which it quiets: a group of
// 8 holding one goes through f16_to_f32, so NaN payloads keep their bits.
__attribute__((target("avx,f16c"))) inline void f16_to_f32_block_f16c(const std::uint16_t* s /*[count]*/,
                                                                      std::size_t count, float* dst /*[count]*/) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    // |h| > 0x7c00 (exponent all ones, mantissa not zero): a NaN. |h| <= 0x7fff fits the signed compare.
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    if (_mm_movemask_epi8(nan) != 0) {
      f16_to_f32_block_plain(s + i, 8, dst + i);
    } else {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
  f16_to_f32_block_plain(s + i, count - i, dst + i);
}

// F16C is read from CPUID leaf 1 (ECX bit 29): Clang before 16 has no
// __builtin_cpu_supports("f16c"). "avx" also says the OS saves the YMM
// registers the 256-bit convert writes.
inline bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}
#endif

// dst[i] = f16_to_f32(s[i]), bit for bit.
inline void f16_to_f32_block(const std::uint16_t* s /*[count]*/, std::size_t count, float* dst /*[count]*/) {
#if FERRUM_CPU_X86_SIMD
  if (cpu_has_f16c()) {
    f16_to_f32_block_f16c(s, count, dst);
    return;
  }
#endif
  f16_to_f32_block_plain(s, count, dst);
}

// ── f64 dot products ────────────────────────────────────────────────────────

// sums[r] = a_r · b for kRows rows a_r = a + r * lda, each in f64. Loading each
// element of b once for several rows of a, and keeping several independent
// partial sums per row (so the adds need not wait on each other), is what
// makes this usable at 4096³. The order is fixed: lane l sums the elements
// i ≡ l (mod 4) below the last multiple of 4, the lanes add as
// (0 + 1) + (2 + 3), then the tail in order.
template <std::size_t kRows>
void dot_rows_plain(const float* a /*[kRows, lda]*/, std::size_t lda, const float* b /*[k]*/, std::size_t k,
                    double* sums /*[kRows]*/) {
  constexpr std::size_t kLanes = 4;
  double partial[kRows][kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (std::size_t r = 0; r < kRows; ++r) {
      const float* a_row = a + r * lda + i;
      for (std::size_t l = 0; l < kLanes; ++l) {
        partial[r][l] += static_cast<double>(a_row[l]) * static_cast<double>(b[i + l]);
      }
    }
  }
  for (std::size_t r = 0; r < kRows; ++r) {
    double sum = (partial[r][0] + partial[r][1]) + (partial[r][2] + partial[r][3]);
    for (std::size_t j = i; j < k; ++j) sum += static_cast<double>(a[r * lda + j]) * static_cast<double>(b[j]);
    sums[r] = sum;
  }
}

#if FERRUM_CPU_X86_SIMD
// The same sums, bit for bit: the four lanes are one AVX register, and the
// fused multiply-add equals the multiply and the add above because the
// product of two floats is exact in f64.
template <std::size_t kRows>
__attribute__((target("avx2,fma"))) void dot_rows_avx2(const float* a /*[kRows, lda]*/, std::size_t lda,
                                                       const float* b /*[k]*/, std::size_t k,
                                                       double* sums /*[kRows]*/) {
  __m256d partial[kRows];
  for (std::size_t r = 0; r < kRows; ++r) partial[r] = _mm256_setzero_pd();
  std::size_t i = 0;
  for (; i + 4 <= k; i += 4) {
    const __m256d bv = _mm256_cvtps_pd(_mm_loadu_ps(b + i));
    for (std::size_t r = 0; r < kRows; ++r) {
      partial[r] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + r * lda + i)), bv, partial[r]);
    }
  }
  for (std::size_t r = 0; r < kRows; ++r) {
    alignas(32) double p[4];
    _mm256_store_pd(p, partial[r]);
    double sum = (p[0] + p[1]) + (p[2] + p[3]);
    for (std::size_t j = i; j < k; ++j) sum += static_cast<double>(a[r * lda + j]) * static_cast<double>(b[j]);
    sums[r] = sum;
  }
}

inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

// dot_rows_plain's sums, bit for bit.
template <std::size_t kRows>
void dot_rows(const float* a /*[kRows, lda]*/, std::size_t lda, const float* b /*[k]*/, std::size_t k,
              double* sums /*[kRows]*/) {
#if FERRUM_CPU_X86_SIMD
  if (cpu_has_avx2_fma()) {
    dot_rows_avx2<kRows>(a, lda, b, k, sums);
    return;
  }
#endif
  dot_rows_plain<kRows>(a, lda, b, k, sums);
}

}  // namespace ferrum::detail
