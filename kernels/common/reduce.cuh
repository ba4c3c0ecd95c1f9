// Sums across a group of threads working on one row.
#pragma once

namespace ferrum::kernels {

// Sum over aligned groups of `width` lanes (a power of two <= 32).
__device__ __forceinline__ float group_sum_in_warp(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace ferrum::kernels
