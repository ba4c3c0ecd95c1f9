// A C entry point into ferrum for benchmarks written in Python: it lets
// bench/gemm_interleaved.py time our gemm and torch.matmul alternately, in
// one process, on the same tensors (torch owns the memory; Buffer::wrap
// hands it to the backend). Not part of the library.
#include <cstdio>
#include <exception>

#include <ferrum/ferrum.hpp>

// The skinny-GEMM dispatch predicate (the header needs only ferrum/ and
// cudart, so no include path beyond the library's public one).
#include "kernels/gemm_skinny.hpp"

namespace {

int g_skinny_max_m = -1;  // set by ferrum_bench_init before the first call

ferrum::CudaBackend& backend() {
  static ferrum::CudaBackend be = [] {
    ferrum::CudaBackendConfig config;
    config.gemm_skinny_max_m = g_skinny_max_m;
    return ferrum::CudaBackend(config);
  }();
  return be;
}

int report(const std::exception& e, char* err, int err_len) {
  if (err != nullptr && err_len > 0) std::snprintf(err, static_cast<std::size_t>(err_len), "%s", e.what());
  return -1;
}

}  // namespace

extern "C" {

// Chooses CudaBackendConfig::gemm_skinny_max_m (-1: the library default;
// 8: every m <= 8 on the skinny kernel). Call before anything else.
void ferrum_bench_init(int skinny_max_m) { g_skinny_max_m = skinny_max_m; }

// The stream ferrum queues its work on, or null without a GPU.
void* ferrum_bench_stream() {
  if (ferrum::cuda_device_count() == 0) return nullptr;
  return backend().stream();
}

// out[m, n] = a[m, k] · b[n, k]ᵀ on device memory the caller owns.
// dtype: 0 = f16, 1 = bf16. Returns 0, or -1 with the error text in err.
int ferrum_bench_gemm(void* a, void* b, void* out, long long m, long long n, long long k, int dtype, char* err,
                      int err_len) {
  try {
    const ferrum::DType dt = dtype == 0 ? ferrum::DType::F16 : ferrum::DType::BF16;
    const auto um = static_cast<std::size_t>(m), un = static_cast<std::size_t>(n), uk = static_cast<std::size_t>(k);
    ferrum::Buffer ab = ferrum::Buffer::wrap(backend(), a, dt, um * uk);
    ferrum::Buffer bb = ferrum::Buffer::wrap(backend(), b, dt, un * uk);
    ferrum::Buffer ob = ferrum::Buffer::wrap(backend(), out, dt, um * un);
    backend().gemm(ab, bb, ob, um, un, uk);
    return 0;
  } catch (const std::exception& e) {
    return report(e, err, err_len);
  }
}

// Which kernel ferrum_bench_gemm runs for these arguments: 1 = the skinny
// decode kernel (kernels/gemm_skinny.cu), 0 = cuBLAS. Mirrors the dispatch
// in CudaBackend::do_gemm (gemm_skinny_max_m, then applicability).
int ferrum_bench_gemm_is_skinny(const void* a, const void* b, long long m, long long n, long long k, int dtype) {
  const ferrum::DType dt = dtype == 0 ? ferrum::DType::F16 : ferrum::DType::BF16;
  return ferrum::kernels::gemm_skinny_wanted(g_skinny_max_m, dt, m, n, k) &&
                 ferrum::kernels::gemm_skinny_applicable(dt, a, b, m, n, k)
             ? 1
             : 0;
}

}  // extern "C"
