// Sums across a group of threads working on one row.
#pragma once

#include <cstdint>

namespace ferrum::kernels {

// The row a thread of a 1-D block works on when each row takes `group`
// consecutive lanes (a power of two), and its lane g in the row: a shift and
// a mask, in 32 bits (callers keep every row below 2^31), not division
// routines ahead of the thread's first load.
struct GroupRowLane {
  std::uint32_t row;
  int g;
};

__device__ __forceinline__ GroupRowLane group_row_lane(int group) {
  const unsigned group_log2 = __ffs(group) - 1;
  return {blockIdx.x * (blockDim.x >> group_log2) + (threadIdx.x >> group_log2),
          static_cast<int>(threadIdx.x & (group - 1))};
}

// Sum over aligned groups of `width` lanes (a power of two <= 32).
__device__ __forceinline__ float group_sum_in_warp(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace ferrum::kernels
