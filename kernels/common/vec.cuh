// vec_t: N elements moved with one wide access (16 bytes for 8 halves).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/dtype.cuh"

namespace ferrum::kernels {

template <class T, int N>
struct alignas(sizeof(T) * N) vec_t {
  T v[N];

  __device__ __forceinline__ void load(const T* p) { *this = *reinterpret_cast<const vec_t*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<vec_t*>(p) = *this; }
  // Streaming load: data read once, keep it out of L1.
  __device__ __forceinline__ void load_stream(const T* p) {
    if constexpr (sizeof(vec_t) == 16) {
      const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(p));
      *this = *reinterpret_cast<const vec_t*>(&raw);
    } else {
      load(p);
    }
  }
  // Element i as fp32. bf16 converts from the packed word (f_from_word):
  // through v[i] the compiler split every loaded word into two 16-bit
  // registers at the load, so a vector took 8 registers instead of 4 until
  // its use (bf16 add_bias and fused_silu_mul_split [large] 11 % faster this
  // way, PERFORMANCE.md session 40). f16 keeps v[i]: from the word it ran
  // 0.7-2 % slower on the large norms and elementwise ops.
  __device__ __forceinline__ float f(int i) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16> && sizeof(vec_t) % 4 == 0) {
      return f_from_word(i);
    } else {
      return f_from_element(i);
    }
  }
  // Element i converted through v[i]. For bf16 this measured faster than the
  // word in qk_norm_rope, 2-6 % (PERFORMANCE.md, session 40); the norms,
  // which also use their values on both sides of a reduction, gained from the
  // word with keep_packed, so it is no general rule.
  __device__ __forceinline__ float f_from_element(int i) const { return to_float(v[i]); }
  // Element i converted from the 32-bit word holding it and its neighbour,
  // which stays whole until here: bf16 a shift or a mask (the same bits as
  // __bfloat162float but perhaps for a NaN's payload), f16 __low2float /
  // __high2float (which split the word inside their own asm). The word is
  // read through a pointer cast, as cuda_fp16's own __HALF2_TO_CUI does, over
  // elements that may have been written one by one.
  __device__ __forceinline__ float f_from_word(int i) const {
    static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "f_from_word: 16-bit floats only");
    static_assert(sizeof(vec_t) % 4 == 0, "f_from_word: whole 32-bit words only");
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const uint32_t word = reinterpret_cast<const uint32_t*>(v)[i / 2];
      return bf16_in_word_as_float(word, (i & 1) != 0);
    } else {
      const __half2 pair = reinterpret_cast<const __half2*>(v)[i / 2];
      return (i & 1) ? __high2float(pair) : __low2float(pair);
    }
  }
  __device__ __forceinline__ void set(int i, float x) { v[i] = from_float<T>(x); }
  // An empty asm that claims to change the packed registers: fp32 copies the
  // compiler made of the elements before this point cannot be reused after
  // it, so they are not held live across (a reduction, say); they are
  // converted again from the packed words, which take half the registers.
  // (A pointer cast, as load() and store() use: a memcpy round trip compiles
  // to other PTX than the code measured on the H200.)
  __device__ __forceinline__ void keep_packed() {
    static_assert(sizeof(vec_t) % 4 == 0 || sizeof(vec_t) == 2, "keep_packed: 2 bytes or whole 32-bit words");
    if constexpr (sizeof(vec_t) % 4 == 0) {
      uint32_t* words = reinterpret_cast<uint32_t*>(v);
#pragma unroll
      for (int k = 0; k < static_cast<int>(sizeof(vec_t) / 4); ++k) asm volatile("" : "+r"(words[k]));
    } else {
      unsigned short* half_word = reinterpret_cast<unsigned short*>(v);
      asm volatile("" : "+h"(*half_word));
    }
  }
};

// Elements per 16-byte access.
template <class T>
inline constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// True when every pointer is 16-byte aligned, so vec_t<T, kVec16<T>> is legal.
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
template <class... P>
inline bool all_aligned16(const P*... ps) {
  return (aligned16(ps) && ...);
}

}  // namespace ferrum::kernels
