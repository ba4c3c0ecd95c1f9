// sm_90 bulk copies global -> shared memory (the TMA engine, without a
// tensor map and with one) and the mbarriers that complete them. A copy of `bytes` bytes lands in
// shared memory asynchronously and counts its bytes off the barrier's
// transaction count; a thread that waits on the barrier's phase then sees the
// data. What the GPTQ streaming kernel uses to keep many KiB per SM in
// flight without holding them in registers.
//
// Below sm_90 these compile to a trap: callers launch them only on an sm_90+
// device running code built for sm_90 (device_is_sm90_or_later and
// has_sm90_code, kernels/common/check.hpp and launch.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: no driver call from here)

#include <cstdint>

#include "kernels/common/mma.cuh"

namespace ferrum::kernels {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FERRUM_BULK_COPY_UNAVAILABLE 1
#endif

// Initializes a barrier that completes a phase after `arrivals` arrivals (and
// every expected transaction byte).
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, std::uint32_t arrivals) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
#endif
}

// Makes initialized barriers visible to the async proxy (the copy engine).
__device__ __forceinline__ void fence_mbarrier_init() {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival that also announces `bytes` more transaction bytes to come.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#endif
}

// One arrival (no transaction bytes).
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// Spins until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait_parity(std::uint64_t* bar, std::uint32_t parity) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

// Orders this thread's earlier shared-memory accesses (generic proxy) before
// later bulk copies into the same bytes (async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// dst[0, bytes) = src[0, bytes), completing on `bar` (16-byte aligned
// addresses, bytes a multiple of 16). The caller has announced the bytes
// with mbarrier_arrive_expect_tx on the same phase.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, std::uint32_t bytes,
                                                    std::uint64_t* bar) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}

// The same copy with an L2 cache policy for its reads (evict_first_policy,
// kernels/common/mma.cuh).
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, std::uint32_t bytes,
                                                    std::uint64_t* bar, std::uint64_t policy) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
#endif
}

// The box of a 3-d tensor map at coordinates (c0 innermost, c1, c2) into
// shared memory at `dst` (laid out and swizzled as the map says; 128-byte
// aligned, 1024 for the 128-byte swizzle), completing on `bar`; elements
// outside the tensor's extents are zero-filled. `map` is a kernel parameter
// (__grid_constant__) or lives in global memory. The caller has announced
// the box's bytes with mbarrier_arrive_expect_tx on the same phase.
__device__ __forceinline__ void tma_load_3d(std::uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            std::uint64_t* bar) {
#ifdef FERRUM_BULK_COPY_UNAVAILABLE
  __trap();
#else
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
#endif
}

#undef FERRUM_BULK_COPY_UNAVAILABLE

}  // namespace ferrum::kernels
