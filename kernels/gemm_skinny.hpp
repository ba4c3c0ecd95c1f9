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
inline constexpr int kSkinnyMaxM = 16;

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
// = torch.matmul on the same stream, interleaved; copy 4248 GB/s), commit
// e22416e: SIMT kernel at m = 1, 2, tensor-core kernel at m = 4, 8:
//   n x k            m=1 ours/cuBLAS  m=2        m=4        m=8
//   4096 x 4096      2383/2076        2370/2064  2305/2052  2248/2040
//   14336 x 4096     3469/3495        3403/3459  3312/3428  3265/3425
//   4096 x 14336     3539/3409        3519/3393  3482/3386  3412/3078
//   8192 x 8192      3478/3236        3582/3192  3441/3212  3387/3161
//   128256 x 4096    4235/4203        4250/4200  4210/4184  4254/4141
// m = 1, 2: ahead or level everywhere (14336 x 4096 is within run-to-run
// spread: 1.004x and 0.992x in two runs). m = 3..8: ahead except on
// 14336 x 4096 (0.95-0.97x), the one measured shape with 2k <= n < 16k;
// such shapes (an MLP's up projection, n/k = 3.5) stay on cuBLAS there.
//
// At k >= 8192 cuBLAS's GEMV reads the weight faster than the copy rate
// (session 6, ours / cuBLAS µs at m = 1): f16 8192 x 8192 38.1 / 40.0, but
// f16 28672 x 8192 115.7 / 110.8, bf16 8192 x 8192 37.8 / 36.4 (cuBLAS's
// bf16 GEMV beats its own f16 one) and bf16 28672 x 8192 115.5 / 110.5.
// At m <= 2 (the SIMT kernel against cuBLAS's GEMV; m = 2 bf16 8192 x 8192
// on cuBLAS measured 0.981 of torch) those shapes (k >= 8192 and n >= 16384,
// or n >= 8192 in bf16) go to cuBLAS; m = 3..8 keep the table above (f16
// 8192 x 8192 at m = 4, 8: ours 1.07x cuBLAS). m = 9..16 (two groups of 8
// rows, session 8, for batch decoding) stays on cuBLAS by default: against
// torch.matmul at m = 16 (gemm_interleaved.py, f16 / bf16, torch µs over
// ours) it won only at 4096 x 4096 (1.043 / 1.053) and lost at 6144, 14336,
// 28672 x 4096, 4096 x 14336 and 8192 x 8192 (0.886-0.969; it keeps half
// the weight bytes in flight of m <= 8), lm_head level (1.004 / 0.967).
// Through the engine at batch 16 (llama3-8b f16, graph) gemm_skinny_max_m
// = 16 measured 3355 against 2965 tok/s (64 steps) and 3326 against 3269
// (160 steps), but CudaBackend's own cuBLAS path at m = 16 is within 0-2.4 %
// of torch.matmul on every shape above, and the default's batch-16 runs
// spread from 59 to 74 % of the bound between calls: not settled, so the
// default stays.
inline constexpr int kSkinnyDefaultMaxM = 8;

// The default policy (CudaBackendConfig::gemm_skinny_max_m = -1).
inline bool gemm_skinny_default(DType dtype, long long m, long long n, long long k) {
  if (m < 1 || m > kSkinnyDefaultMaxM) return false;
  if (m <= 2) {
    const long long cublas_min_n = dtype == DType::BF16 ? 8192 : 16384;
    return !(k >= 8192 && n >= cublas_min_n);
  }
  return !(n >= 2 * k && n < 16 * k);
}

// Whether CudaBackend::do_gemm picks the skinny kernel for this shape, given
// CudaBackendConfig::gemm_skinny_max_m (-1: the default policy above).
inline bool gemm_skinny_wanted(int max_m, DType dtype, long long m, long long n, long long k) {
  return max_m < 0 ? gemm_skinny_default(dtype, m, n, k) : m >= 1 && m <= max_m;
}

// out[m, n] = a[m, k] · b[n, k]ᵀ, fp32 accumulation, one rounding per output
// element. Deterministic: the summation order depends only on (m, n, k) and
// num_sms, so repeated calls give bitwise identical results. No allocation,
// no synchronization (capture-safe). Returns false, launching nothing, when
// gemm_skinny_applicable() is false; the caller then uses cuBLAS. Runs for
// every applicable m (the caller decides by CudaBackendConfig::
// gemm_skinny_max_m). m <= 2: SIMT fp32 FMA kernel; m = 3..16: mma.sync tensor-core
// kernel, one or two groups of 8 rows of a (fp32 accumulators; the k order
// inside one mma is the hardware's, fixed, so still deterministic).
bool launch_gemm_skinny(DType dtype,
                        const void* a,  // [m, k] row-major, 16-byte aligned
                        const void* b,  // [n, k] row-major, 16-byte aligned (the weight)
                        void* out,      // [m, n] row-major
                        long long m, long long n, long long k,
                        int num_sms,  // multiprocessors of the device (picks the block shape)
                        cudaStream_t stream);

// gemm_silu_mul fused for m <= 2 rows (the SIMT kernel with a SwiGLU
// epilogue): act[m, j] = silu(g) * u with g, u the rounded outputs of b's rows
// 2j (gate) and 2j + 1 (up). Bitwise the result of launch_gemm_skinny into
// [m, 2 im] followed by launch_silu_mul_pairs. Returns false, launching
// nothing, for m > 2 or where gemm_skinny_applicable(dtype, a, b, m, 2 im, k)
// is false; the caller then runs those two steps.
bool launch_gemm_skinny_silu_mul(DType dtype,
                                 const void* a,  // [m, k] row-major, 16-byte aligned
                                 const void* b,  // [2 im, k] row-major, (gate, up) rows interleaved, 16-byte aligned
                                 void* act,      // [m, im] row-major
                                 long long m, long long im, long long k, int num_sms, cudaStream_t stream);

}  // namespace ferrum::kernels
