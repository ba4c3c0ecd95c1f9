// Launcher for the skinny dense GEMM used by decode: out = a · bᵀ with few
// rows of a (m <= kSkinnyMaxM). Raw pointers, sizes and a stream; the caller
// (CudaBackend::do_gemm) has validated the op and falls back to cuBLAS when
// the launcher reports the kernel not applicable.
//
// This header includes only the CUDA runtime API and ferrum/dtype.hpp, so
// tests and benchmarks can ask gemm_skinny_applicable() without the kernel
// sources on their include path.
#pragma once

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

// Largest m the skinny kernel is compiled for.
inline constexpr int kSkinnyMaxM = 8;

// True when launch_gemm_skinny would run (and not decline) for these
// arguments: dtype f16 or bf16, 1 <= m <= kSkinnyMaxM, n >= 1, k >= 1,
// k % 8 == 0, and a and b 16-byte aligned (with k % 8 == 0 every row of a
// and b then starts on a 16-byte boundary). out needs only element
// alignment: it is written with 2-byte stores, so odd n is fine.
bool gemm_skinny_applicable(DType dtype, const void* a /*[m, k] row-major*/, const void* b /*[n, k] row-major*/,
                            long long m, long long n, long long k);

// ── Dispatch policy: skinny kernel or cuBLAS ────────────────────────────────
//
// gemm_skinny_applicable() says whether the kernel CAN run; this says
// whether it SHOULD (is faster than cuBLAS). CudaBackend::do_gemm runs the
// skinny kernel only when both hold.
//
// Measured on an H200 (f16, weight GB/s, bench/gemm_interleaved.py: cuBLAS
// = torch.matmul on the same stream, interleaved; copy ceiling 4254 GB/s),
// with the all-SIMT kernel (before the tensor-core path for m >= 3):
//   n x k            m=1 ours/cuBLAS  m=2        m=4        m=8
//   4096 x 4096      2530/2203        2497/2182  2114/2166  1759/2138
//   14336 x 4096     3544/3531        3482/3541  3248/3512  2402/3489
//   4096 x 14336     3593/3467        3575/3479  2902/3444  2499/3251
//   8192 x 8192      3582/3425        3631/3388  3326/3384  2529/3350
//   128256 x 4096    4241/4235        4261/4208  4130/4203  2754/4160
// m = 1, 2: ahead or level everywhere (the one deficit, 1.7 % at m = 2,
// 14336 x 4096, is within run-to-run spread; the gain at 4096 x 4096 is
// 14 %), so no shape rule. m = 4, 8: behind cuBLAS on every shape, hence
// cuBLAS. m = 3..8 now take a tensor-core kernel that has NOT been measured
// yet; until it is, the policy keeps them on cuBLAS.
//
// CudaBackendConfig::gemm_skinny_max_m overrides this per backend (tests
// and benchmarks set 8 to measure the m = 3..8 kernel against cuBLAS).
inline constexpr int kSkinnyPreferredMaxM = 2;

// out[m, n] = a[m, k] · b[n, k]ᵀ, fp32 accumulation, one rounding per output
// element. Deterministic: the summation order depends only on (m, n, k) and
// num_sms, so repeated calls give bitwise identical results. No allocation,
// no synchronization (capture-safe). Returns false, launching nothing, when
// gemm_skinny_applicable() is false; the caller then uses cuBLAS. Runs for
// every applicable m (the caller decides by CudaBackendConfig::
// gemm_skinny_max_m). m <= 2: SIMT fp32 FMA kernel; m = 3..8: mma.sync tensor-core
// kernel (fp32 accumulators; the k order inside one mma is the hardware's,
// fixed, so still deterministic).
bool launch_gemm_skinny(DType dtype,
                        const void* a,  // [m, k] row-major, 16-byte aligned
                        const void* b,  // [n, k] row-major, 16-byte aligned (the weight)
                        void* out,      // [m, n] row-major
                        long long m, long long n, long long k,
                        int num_sms,  // multiprocessors of the device (picks the block shape)
                        cudaStream_t stream);

}  // namespace ferrum::kernels
