// sm_90a warpgroup MMA (wgmma.mma_async): shared-memory matrix descriptors
// and the fence / commit / wait that bracket a batch of wgmma. The mma
// wrappers themselves are generated (kernels/common/wgmma_ops.cuh).
//
// Shared-memory tiles use the 128-byte swizzle: a tile of R rows x C 16-bit
// columns (C a multiple of 64) is stored as C / 64 column blocks, each
// [R rows][128 B], block after block; 16-byte chunk c of row r sits at chunk
// c ^ (r & 7) of the row (what a TMA box of 64 columns with
// CU_TENSOR_MAP_SWIZZLE_128B writes). Every block starts on a 1024-byte
// boundary, so the hardware's swizzle phase (address bits 7..9) is the row
// index's low bits. The same physical layout serves
//   - a K-major operand (rows = M or N, columns = K: Q and K of Q Kᵀ):
//     8-row groups 1024 B apart (SBO), a k16 step = 32 B inside the 128-byte
//     row, the next 64 columns one block further;
//   - an MN-major operand (rows = K, columns = N: V of P V, imm-trans-b 1):
//     8-row (k) groups 1024 B apart (SBO), 64-column (n) blocks one block
//     apart (LBO), a k16 step = 16 rows = 2048 B.
// (The canonical layouts of the PTX ISA's "matrix descriptor" section; the
// CUTLASS names are Layout_K_SW128_Atom / Layout_MN_SW128_Atom.)
#pragma once

#include <cstdint>

namespace ferrum::kernels {

// Descriptor of a 128-byte-swizzled operand at shared address `smem_addr`
// (1024-byte aligned block start, plus k-step offsets). Fields (in 16-byte
// units): start address bits 0..13, leading byte offset 16..29, stride byte
// offset 32..45, base offset 49..51 (0: blocks 1024-aligned), layout type
// 62..63 (1: 128-byte swizzle).
__device__ __forceinline__ std::uint64_t wgmma_desc_sw128(std::uint32_t smem_addr, std::uint32_t lbo_bytes,
                                                          std::uint32_t sbo_bytes) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((smem_addr >> 4) & 0x3FFFu);
  d |= static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= std::uint64_t{1} << 62;
  return d;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Orders this thread's earlier register writes (accumulators, A fragments)
// before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across a
// wgmma fence / wait (the asm above does not name them).
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace ferrum::kernels
