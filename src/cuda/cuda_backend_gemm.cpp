// CudaBackend: dense GEMM (the skinny kernel for decode, cuBLAS otherwise).
#include "ferrum/cuda_backend.hpp"

#include <fmt/format.h>

#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gemm_skinny.hpp"

namespace ferrum {

using detail::ptr;
using detail::check_cublas;

// ── GEMM ───────────────────────────────────────────────────────────────────

void CudaBackend::do_gemm(const Buffer& a, const Buffer& b, Buffer& out, std::size_t m, std::size_t n,
                          std::size_t k) {
  detail::activate_device(device_);
  // Decode (small m): the skinny kernel where it measured faster than
  // cuBLAS (the table and the per-shape rule are in kernels/gemm_skinny.hpp;
  // CudaBackendConfig::gemm_skinny_max_m overrides). It declines (returns false,
  // launches nothing) for unaligned a / b or k % 8 != 0, and cuBLAS runs
  // instead; likewise for host-memory weights (alloc_host, or wrapped
  // page-locked memory), which its optional bulk L2 prefetch
  // (gemm_prefetch_before_wait) must not be pointed at. Both paths are
  // launch-only: capture-safe.
  if (!b.host_memory() &&
      kernels::gemm_skinny_wanted(gemm_skinny_max_m_, a.dtype(), static_cast<long long>(m), static_cast<long long>(n),
                                  static_cast<long long>(k)) &&
      kernels::launch_gemm_skinny(a.dtype(), ptr(a), ptr(b), ptr(out), static_cast<long long>(m),
                                  static_cast<long long>(n), static_cast<long long>(k), rt_->num_sms, rt_->stream)) {
    return;
  }
  const cudaDataType_t type = a.dtype() == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  // Row-major out[m,n] = a[m,k] · b[n,k]ᵀ is column-major outᵀ[n,m] =
  // (b viewed as [k,n] col-major)ᵀ · (a viewed as [k,m] col-major).
  check_cublas(cublasGemmEx(rt_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), rt_->one_zero, ptr(b), type, static_cast<int>(k), ptr(a), type,
                            static_cast<int>(k), rt_->one_zero + 1, ptr(out), type, static_cast<int>(n),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "gemm", "cublasGemmEx");
}

// Decode (m <= 2, where the skinny kernel is wanted and applies): one
// launch, the silu·mul in the GEMM's epilogue. Otherwise gemm into the
// workspace and the pairs kernel: the same bits either way.
void CudaBackend::do_gemm_silu_mul(const Buffer& a, const Buffer& w, Buffer& gate_up, Buffer& act, std::size_t m,
                                   std::size_t im, std::size_t k) {
  detail::activate_device(device_);
  const auto mm = static_cast<long long>(m), ii = static_cast<long long>(im), kk = static_cast<long long>(k);
  if (!w.host_memory() && kernels::gemm_skinny_wanted(gemm_skinny_max_m_, a.dtype(), mm, 2 * ii, kk) &&
      kernels::launch_gemm_skinny_silu_mul(a.dtype(), ptr(a), ptr(w), ptr(act), mm, ii, kk, rt_->num_sms,
                                           rt_->stream)) {
    return;
  }
  do_gemm(a, w, gate_up, m, 2 * im, k);
  kernels::launch_silu_mul_pairs("gemm_silu_mul", a.dtype(), ptr(gate_up), ptr(act), mm * ii, rt_->stream);
}

}  // namespace ferrum
