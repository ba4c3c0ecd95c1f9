// The read ceiling of a shape: how long an ideal kernel takes only to read
// `bytes` of weights once from HBM (16-byte read-only loads that skip L1,
// 8 in flight per thread, 4 blocks of 256 threads per SM, a grid-stride
// loop, one XOR per word). No GEMM on these bytes can be faster, so
// cuBLAS time / this time bounds the speedup any INT4 kernel can show at
// that size (docs/design/gptq_small_m.md §0, "step 0").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferrum::bench {

// Reads src (16-byte aligned, bytes a multiple of 16) once; each block
// writes one word of its XOR into sink[blockIdx.x] (sink holds
// read_ceiling_blocks(num_sms) words), so the loads cannot be dropped.
void launch_read_ceiling(const void* src, std::size_t bytes, std::uint32_t* sink, int num_sms, cudaStream_t stream);
int read_ceiling_blocks(int num_sms);

// The copy ceiling of a size: dst = src over `bytes` (16-byte aligned, a
// multiple of 16) with 16-byte loads, 4 in flight per thread, a grid-stride
// loop over 4 blocks of 256 threads per SM. Beside a cudaMemcpyAsync of the
// same bytes, it shows what a plain kernel moves at that size.
void launch_copy_ceiling(const void* src, void* dst, std::size_t bytes, int num_sms, cudaStream_t stream);

}  // namespace ferrum::bench
