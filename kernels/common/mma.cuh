// Tensor-core building blocks shared by the kernels that use mma.sync
// (attention decode and prefill, the skinny GEMM, the GPTQ INT4 GEMM):
// sm_80+ PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16), the 16-byte
// chunk swizzle of shared-memory rows, fp32 -> f16/bf16 packing, and the
// host-side opt-in to large dynamic shared memory.
//
// Fragment layouts (m16n8k16, per PTX ISA), lane = 4 * g + tig:
//   A (16x16, row)  a0: (g, 2tig..+1)  a1: (g+8, 2tig..+1)
//                   a2: (g, 2tig+8..)  a3: (g+8, 2tig+8..)
//   B (16x8, col)   b0: (k 2tig..+1, n g)  b1: (k 2tig+8.., n g)
//   C (16x8)        c0,c1: (g, 2tig..+1)  c2,c3: (g+8, 2tig..+1)
// so the C fragments of two adjacent n8 tiles are exactly one A fragment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/check.hpp"
#include "kernels/common/per_device.hpp"

namespace ferrum::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;

// ── PTX wrappers (sm_80+) ────────────────────────────────────────────────────

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, L2 only; valid == false writes 16 zero bytes and
// reads nothing.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// 16 bytes global -> shared, L2 only, always read.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// L2 policy for a weight stream (read once, larger than L2): evict first,
// so that it does not push out what the small ops between the GEMMs reuse.
// sm_80 and later; 0 (no policy) below.
__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}
// A float4 store to global memory with its L2 lines kept ahead of streamed
// data (evict last): for scratch that the same launch reads back soon after
// while larger streams pass through L2. Pair it with discard_l2_lines once
// the scratch is read, or its lines linger as evict last. (The policy's
// fraction must lie in (0, 1]: a plain store is the way to opt out.) A
// plain store below sm_80.
__device__ __forceinline__ void store_f4_l2_keep(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.L2::evict_unchanged.b64 %0, %1;" : "=l"(policy) : "f"(1.0f));
  asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(dst), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w), "l"(policy)
               : "memory");
#else
  *reinterpret_cast<float4*>(dst) = v;
#endif
}
// Drops the L2 lines that lie wholly inside [begin, end) without writing
// them back to DRAM (discard.global.L2): their contents become undefined.
// For dead scratch only; lines that straddle an end are kept, so bytes
// outside the range never change. Thread i of n takes every n-th line. A
// no-op below sm_80.
__device__ __forceinline__ void discard_l2_lines(const void* begin, const void* end, int i, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr std::uintptr_t kLine = 128;
  const std::uintptr_t first = (reinterpret_cast<std::uintptr_t>(begin) + kLine - 1) & ~(kLine - 1);
  const std::uintptr_t last = reinterpret_cast<std::uintptr_t>(end) & ~(kLine - 1);
  for (std::uintptr_t p = first + static_cast<std::uintptr_t>(i) * kLine; p < last;
       p += static_cast<std::uintptr_t>(n) * kLine) {
    asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(p) : "memory");
  }
#else
  (void)begin;
  (void)end;
  (void)i;
  (void)n;
#endif
}
// Asks L2 to fetch [src, src + bytes) (sm_90; 16-byte aligned, bytes a
// multiple of 16). Fire and forget: no completion to wait for. A no-op below
// sm_90.
__device__ __forceinline__ void prefetch_l2_bulk(const void* src, std::uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#else
  (void)src;
  (void)bytes;
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Barrier ID (1..15; 0 is __syncthreads) over `threads` threads (a
// multiple of 32). Orders memory accesses like __syncthreads among the
// participants. ID is a literal so ptxas reserves only the barriers used.
template <int ID>
__device__ __forceinline__ void named_barrier(int threads) {
  static_assert(ID >= 1 && ID < 16, "barrier 0 is __syncthreads; 16 per block");
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "r"(threads) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulate.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The same on 4 consecutive floats of a larger accumulator array.
template <class T>
__device__ __forceinline__ void mma_16816_at(float* c, const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
  mma_16816<T>(*reinterpret_cast<float(*)[4]>(c), a, b0, b1);
}

// 2^x with one MUFU op (ex2.approx, |rel err| < 2^-22; subnormal results
// flush to 0, far below what a probability can contribute). -inf gives 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One online-softmax step over the two rows (g, g + 8) of an m16 tile that a
// thread holds: s holds raw scores of NT n8 key tiles (-inf where masked) and
// becomes p = 2^(s * scale_log2 - max); the running max m_run (raw units),
// this thread's share of the row sums l_run, and the output accumulators o
// are rescaled (a row whose max did not move keeps its o: alpha is exactly
// 1, the same bits). The quad (4 lanes) of a row agrees on the max.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_step(float (&s)[NT][4], float (&m_run)[2], float (&l_run)[2],
                                                    float (&o)[DT][4], float scale_log2) {
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m_run[r];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with no visible key so far keeps m = -inf: subtract 0, not inf.
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;
    // Unchanged max (also -inf -> -inf): exactly 1, not exp2 of the rounding
    // error a contracted FMA leaves in m * scale_log2 - base; -inf -> finite: 0.
    // So a key tile fully masked for a row (s = -inf) is an exact no-op for
    // it (alpha = 1, p = 0, P V adds exact zeros): a kernel may walk such
    // tiles or skip them (e.g. per warp of a block shape picked at launch)
    // without changing a bit.
    alpha[r] = m_run[r] == mx ? 1.0f : fast_exp2(m_run[r] * scale_log2 - base);
    m_run[r] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float p = fast_exp2(fmaf(s[nt][2 * r + c], scale_log2, -base));  // masked: exp2(-inf) = 0
        s[nt][2 * r + c] = p;
        sum += p;
      }
    }
    l_run[r] = l_run[r] * alpha[r] + sum;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (alpha[r] != 1.0f) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        o[dt][2 * r] *= alpha[r];
        o[dt][2 * r + 1] *= alpha[r];
      }
    }
  }
}

// Two floats rounded to T, `lo` in the low half (the lower column).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
}

// Element offset of 16-byte chunk `chunk` of shared row `row` (rows of HD
// elements). XOR-swizzling the chunk with row & 7 keeps 8 consecutive rows'
// same chunk in distinct banks: cp.async stores and ldmatrix reads (8 rows
// per 8x8 matrix) are conflict-free.
template <int HD>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * HD + ((chunk ^ (row & 7)) << 3);
}

// ── Host side ────────────────────────────────────────────────────────────────

// Makes `kernel` launchable with `smem_bytes` of dynamic shared memory on
// `device` (the current one). False when the device cannot run it (below
// sm_80, or less opt-in shared memory than the kernel needs). A failed query
// throws naming `op`.
inline bool opt_in_dynamic_smem(const char* op, const void* kernel, int smem_bytes, int device) {
  int major = 0;
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaDeviceGetAttribute", err);
  if (major < 8 || optin < smem_bytes) return false;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaFuncSetAttribute (dynamic shared memory)", err);
  return true;
}

// opt_in_dynamic_smem for Kernel on the current device, once per device (the
// opt-in is the device's: a process driving several GPUs sets it on each).
// Each Kernel is always asked with the same bytes on one device.
template <auto Kernel>
bool prepare_kernel(const char* op, int smem_bytes) {
  static PerDevice<bool> prepared;
  return prepared.current(op, [&](int device) {
    return opt_in_dynamic_smem(op, reinterpret_cast<const void*>(Kernel), smem_bytes, device);
  });
}

// prepare_kernel for a launch that has no fallback: a device that cannot
// run Kernel is a dispatch bug, named with `what` and the bytes asked for.
template <auto Kernel>
void require_prepared(const char* op, const char* what, int smem_bytes) {
  if (!prepare_kernel<Kernel>(op, smem_bytes)) throw_bad_dispatch(op, what, smem_bytes);
}

}  // namespace ferrum::kernels
