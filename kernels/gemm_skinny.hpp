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
inline constexpr long long kSkinnyMaxM = 8;

// True when launch_gemm_skinny would run (and not decline) for these
// arguments: dtype f16 or bf16, 1 <= m <= kSkinnyMaxM, n >= 1, k >= 1,
// k % 8 == 0, and a and b 16-byte aligned (with k % 8 == 0 every row of a
// and b then starts on a 16-byte boundary). out needs only element
// alignment: it is written with 2-byte stores, so odd n is fine.
bool gemm_skinny_applicable(DType dtype, const void* a /*[m, k] row-major*/, const void* b /*[n, k] row-major*/,
                            long long m, long long n, long long k);

// out[m, n] = a[m, k] · b[n, k]ᵀ, fp32 accumulation, one rounding per output
// element. Deterministic: the summation order depends only on (m, n, k) and
// num_sms, so repeated calls give bitwise identical results. No allocation,
// no synchronization (capture-safe). Returns false, launching nothing, when
// gemm_skinny_applicable() is false; the caller then uses cuBLAS.
bool launch_gemm_skinny(DType dtype,
                        const void* a,  // [m, k] row-major, 16-byte aligned
                        const void* b,  // [n, k] row-major, 16-byte aligned (the weight)
                        void* out,      // [m, n] row-major
                        long long m, long long n, long long k,
                        int num_sms,  // multiprocessors of the device (picks the block shape)
                        cudaStream_t stream);

}  // namespace ferrum::kernels
