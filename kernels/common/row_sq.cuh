// The row_sq arithmetic (Backend::gemm_gptq_add_residual, row_sum_squares,
// rms_norm_gemm_gptq; docs/design/gptq_small_m.md §13.6), shared by the GPTQ
// streaming kernel's fused forms and the standalone kernels of norm.cu, so
// that the two give the same bits.
//
// row_sq [rows, ceil(cols / 16)] f32: per row, the sum of squares of each 16
// columns. A quad (4 consecutive columns) is one thread's; the 4 quads of a
// 16-column group sit in 4 consecutive lanes 4i .. 4i + 3 of one warp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/reduce.cuh"

namespace ferrum::kernels {

inline constexpr int kRowSqCols = 16;

// One quad's squares: ((v0² + v1²) + v2²) + v3², each v as stored.
__device__ __forceinline__ float row_sq_quad(const float4& v) {
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, v.x * v.x)));
}

// The 16-column group's sum in every lane of its 4 (two shuffles; every lane
// of the warp calls it, a quad outside the row with 0).
__device__ __forceinline__ float row_sq_group(float quad_sq) { return group_sum_in_warp(quad_sq, 4); }

// 4 T at p (8 bytes) as f32, and back (one rounding each).
template <class T>
__device__ __forceinline__ float4 load_quad_f32(const T* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const T* v = reinterpret_cast<const T*>(&raw);
  return make_float4(to_float(v[0]), to_float(v[1]), to_float(v[2]), to_float(v[3]));
}
template <class T>
__device__ __forceinline__ void store_quad_f32(T* p, const float4& v) {
  *reinterpret_cast<uint2*>(p) = make_uint2(pack2<T>(v.x, v.y), pack2<T>(v.z, v.w));
}

// residual + out, each quad value rounded to T as fused_add_rms_norm's add:
// the new residual as stored.
template <class T>
__device__ __forceinline__ float4 residual_add_quad(const float4& residual, const float4& out_rounded) {
  return make_float4(to_float(from_float<T>(residual.x + out_rounded.x)),
                     to_float(from_float<T>(residual.y + out_rounded.y)),
                     to_float(from_float<T>(residual.z + out_rounded.z)),
                     to_float(from_float<T>(residual.w + out_rounded.w)));
}

// rsqrt(mean of the row's squares + eps) from its row_sq (groups floats),
// in every lane of the calling warp: lane l sums groups l, l + 32, ... in
// order, then a butterfly (every lane, warp and CTA gets the same bits).
__device__ __forceinline__ float rms_inv_from_row_sq(const float* row_sq_row, int groups, int cols, float eps,
                                                     int lane) {
  float s = 0.0f;
  for (int g = lane; g < groups; g += 32) s += __ldcg(row_sq_row + g);
  s = group_sum_in_warp(s, 32);
  return rsqrtf(s / static_cast<float>(cols) + eps);
}

// One normalized value, as the norm kernels: (x * inv) * w, rounded once by the caller.
__device__ __forceinline__ float rms_scaled(float x, float inv, float w) { return (x * inv) * w; }

}  // namespace ferrum::kernels
