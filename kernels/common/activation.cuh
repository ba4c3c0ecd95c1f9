// Activation formulas shared by every kernel that applies them, so a fused
// path and the op it fuses give the same bits. gelu_erf is also compiled by
// the host compiler: tests/cpu/kernels/test_gelu_erf.cpp checks it on the CPU.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define FERRUM_ACTIVATION_HD __host__ __device__ __forceinline__
#else
#define FERRUM_ACTIVATION_HD inline
#endif

namespace ferrum::kernels {

#if defined(__CUDACC__)
// SwiGLU's silu(gate) * up in fp32 (__expf: the fast exponential, as every
// silu of the library).
__device__ __forceinline__ float silu_mul(float gate, float up) { return (gate / (1.0f + __expf(-gate))) * up; }
#endif

// The two special-function-unit approximations gelu_erf uses: on the device
// one MUFU instruction each, documented to be within 1 ulp (rcp.approx) and
// 2 ulp (ex2.approx, = CUDA's exp2f) of the exact result. .ftz: the divisor
// is in [2, 10], and a 2^a below 2^-126 only occurs where |gelu| < 2^-125.
// On the host: 1 / v and exp2f. The CPU test bounds gelu_erf over
// every result the documented device errors allow (a custom Sfu).
struct SfuApprox {
  FERRUM_ACTIVATION_HD float rcp(float v) const {
#if defined(__CUDA_ARCH__)
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
#else
    return 1.0f / v;
#endif
  }
  FERRUM_ACTIVATION_HD float exp2(float a) const {
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
#else
    return std::exp2(a);
#endif
  }
};

// Exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch's default),
// in fp32 with 17 SASS instructions (2 of them MUFU) and no branch, where
// 0.5 x (1 + erff(x / sqrt 2)) takes 25 (libdevice erff selects one of two
// coefficient sets per element): gelu on 2-byte data is issue-bound.
//
// With t = |x| and Q(t) = 1 - Phi(t) (the upper tail), gelu(x) = max(x, 0)
// - t Q(t) for either sign, which needs no 1 + erf cancellation: x < 0
// keeps full relative accuracy down to the fp32 underflow (-13.1), where
// the erf form is 0 below -5.9. The tail is an erfc-style fit around a
// Gaussian in a rational variable (one reciprocal instead of two polynomial
// ranges):
//   w = t / (2 + K t),   t Q(t) = w * 2^(A(w) - t^2 / (2 ln 2)),
// A(w) = log2(t Q(t) / w) + t^2 / (2 ln 2) being smooth and bounded on
// t in [0, 14] (w in [0, 1.456]), where a degree-8 minimax polynomial with
// A(0) = 0 fits it to 6.9e-8 (log2 units, i.e. 4.8e-8 relative; Remez
// exchange in long double, coefficients rounded to float from the lowest
// up, each time refitting the rest; K = 0.544 gave the smallest error).
// t is clamped at 14, where 2^(.) has long flushed to 0, so that +inf gives
// +inf and -inf gives -0 (not inf * 0); x * x keeps NaN a NaN.
//
// Error (tests/cpu/kernels/test_gelu_erf.cpp, over all f16 and bf16 inputs and a
// dense f32 sweep, for every SFU result within the documented error):
// |gelu_erf(x) - gelu(x)| <= (5e-7 + 6e-8 x^2) |gelu(x)| + 2^-124, and
// rounded to f16 / bf16 it is within 1 ulp of the correctly rounded gelu
// (bf16 below 2^-120: flushed). Nearest SFU results: <= 3e-7 for |x| <= 2.
template <class Sfu>
FERRUM_ACTIVATION_HD float gelu_erf_with(float x, Sfu sfu) {
  constexpr float kK = 0x1.16872cp-1f;  // 0.544
  constexpr float kC = 0x1.715476p-1f;  // 1 / (2 ln 2)
  constexpr float kClamp = 14.0f;
  const float t = fminf(fabsf(x), kClamp);
  const float w = t * sfu.rcp(fmaf(kK, t, 2.0f));
  float a = fmaf(-0x1.59871ap-9f, w, 0x1.fee958p-7f);
  a = fmaf(a, w, -0x1.c22ccap-6f);
  a = fmaf(a, w, -0x1.1977e8p-10f);
  a = fmaf(a, w, 0x1.83ca3cp-7f);
  a = fmaf(a, w, 0x1.e6de7p-4f);
  a = fmaf(a, w, 0x1.348552p-7f);
  a = fmaf(a, w, -0x1.8472c8p+0f);
  a *= w;
  const float tail = sfu.exp2(fmaf(-kC, x * x, a));  // t Q(t) / w
  return fmaf(-w, tail, fmaxf(x, -0.0f));            // -0.0f: x << 0 gives -0, as x * Phi(x)
}

FERRUM_ACTIVATION_HD float gelu_erf(float x) { return gelu_erf_with(x, SfuApprox{}); }

}  // namespace ferrum::kernels

#undef FERRUM_ACTIVATION_HD
