// Compile-time element types and the one dispatch helper from a runtime
// DType to a CUDA type. Math is always done in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ferrum/dtype.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/int_list.hpp"

namespace ferrum::kernels {

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }

// The bf16 in the high (else low) 16 bits of a 32-bit word as fp32: bf16 is
// the upper half of an fp32, so a mask or a shift (exact; a NaN keeps its
// bits).
__device__ __forceinline__ float bf16_in_word_as_float(std::uint32_t word, bool high) {
  return __uint_as_float(high ? (word & 0xffff0000u) : (word << 16));
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<__half>{}) or f(TypeTag<__nv_bfloat16>{}); any other dtype
// is a bug upstream (the validating layer refuses it) and names the value.
template <class F>
void dispatch_half_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F16:
      f(TypeTag<__half>{});
      return;
    case DType::BF16:
      f(TypeTag<__nv_bfloat16>{});
      return;
    default:
      throw_bad_dispatch(op, "activation dtype (expected f16 or bf16)", static_cast<long long>(dtype));
  }
}

// Calls f(std::integral_constant<int, V>{}) for V in Values that equals
// `value`; anything else is a bug upstream and names the value.
template <int... Values, class F>
void dispatch_int(int value, const char* op, const char* what, F&& f) {
  const bool hit = ((value == Values ? (f(std::integral_constant<int, Values>{}), true) : false) || ...);
  if (!hit) throw_bad_dispatch(op, what, value);
}
// The same over a named list (kernels/common/int_list.hpp).
template <int... Values, class F>
void dispatch_int(IntList<Values...>, int value, const char* op, const char* what, F&& f) {
  dispatch_int<Values...>(value, op, what, static_cast<F&&>(f));
}

}  // namespace ferrum::kernels
