// A C entry point into ferrum for benchmarks written in Python: it lets
// bench/gemm_interleaved.py time our gemm and torch.matmul alternately, in
// one process, on the same tensors, and scripts/sdpa_check.py compare our
// flash_attention with torch SDPA (torch owns the memory; Buffer::wrap
// hands it to the backend). Not part of the library.
#include <cstddef>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <ferrum/ferrum.hpp>

// The skinny-GEMM dispatch predicate (the header needs only ferrum/ and
// cudart, so no include path beyond the library's public one).
#include "kernels/gemm_skinny.hpp"

namespace {

int g_skinny_max_m = -1;  // set by ferrum_bench_init before the first call

// The config of every backend object here. The per-device settings (the
// workspaces among them) are decided by the first CudaBackend on the device
// and later ones must agree, so all objects share this and differ only in
// per-object fields. 1 GiB of decode split-K scratch: large-batch decode
// checks fit.
ferrum::CudaBackendConfig bench_config() {
  ferrum::CudaBackendConfig config;
  config.gemm_skinny_max_m = g_skinny_max_m;
  config.attention_workspace_bytes = std::size_t{1} << 30;
  return config;
}

ferrum::CudaBackend& backend() {
  static ferrum::CudaBackend be(bench_config());
  return be;
}

// flash_attention's backends, one per CudaBackendConfig::prefill_kernel
// (a per-object setting), made on first use.
ferrum::CudaBackend& attention_backend(ferrum::PrefillKernel kernel) {
  if (kernel == ferrum::PrefillKernel::MmaSync) {
    static ferrum::CudaBackend mma_sync = [] {
      ferrum::CudaBackendConfig config = bench_config();
      config.prefill_kernel = ferrum::PrefillKernel::MmaSync;
      return ferrum::CudaBackend(config);
    }();
    return mma_sync;
  }
  static ferrum::CudaBackend automatic = [] {
    ferrum::CudaBackendConfig config = bench_config();
    config.prefill_kernel = ferrum::PrefillKernel::Auto;
    return ferrum::CudaBackend(config);
  }();
  return automatic;
}

std::size_t checked_size(const char* name, long long value) {
  if (value < 0) {
    throw std::invalid_argument("ferrum_bench_flash_attention: argument '" + std::string(name) +
                                "' = " + std::to_string(value) + " is negative");
  }
  return static_cast<std::size_t>(value);
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

// out = flash_attention(q, k, v) on device memory the caller owns, queued on
// ferrum_bench_stream() (the caller synchronizes). Scale 1/sqrt(head_dim).
//   q, out: [batch, heads, q_len, head_dim]
//   k, v:   [batch, kv_heads, kv_seq_stride, head_dim] (0: kv_len); keys
//           0 .. kv_len-1 are valid; query i sits at position pos_offset + i
//           (causal: sees keys j <= pos_offset + i).
// dtype: 0 = f16, 1 = bf16. prefill_kernel: 0 = PrefillKernel::Auto, 1 =
// PrefillKernel::MmaSync (q_len > 1 only; decode runs one kernel either
// way). Returns 0, or -1 with the error text in err.
int ferrum_bench_flash_attention(void* q, void* k, void* v, void* out, long long batch, long long q_len,
                                 long long kv_len, long long pos_offset, long long heads, long long kv_heads,
                                 long long head_dim, long long kv_seq_stride, int causal, int dtype,
                                 int prefill_kernel, char* err, int err_len) {
  try {
    if (dtype != 0 && dtype != 1) {
      throw std::invalid_argument("ferrum_bench_flash_attention: argument 'dtype' = " + std::to_string(dtype) +
                                  " is not 0 (f16) or 1 (bf16)");
    }
    if (prefill_kernel != 0 && prefill_kernel != 1) {
      throw std::invalid_argument("ferrum_bench_flash_attention: argument 'prefill_kernel' = " +
                                  std::to_string(prefill_kernel) + " is not 0 (Auto) or 1 (MmaSync)");
    }
    const ferrum::DType dt = dtype == 0 ? ferrum::DType::F16 : ferrum::DType::BF16;
    const std::size_t ub = checked_size("batch", batch), uq = checked_size("q_len", q_len),
                      ukv = checked_size("kv_len", kv_len), upos = checked_size("pos_offset", pos_offset);
    ferrum::AttnConfig cfg;
    cfg.num_heads = checked_size("heads", heads);
    cfg.num_kv_heads = checked_size("kv_heads", kv_heads);
    cfg.head_dim = checked_size("head_dim", head_dim);
    cfg.kv_seq_stride = checked_size("kv_seq_stride", kv_seq_stride);
    cfg.causal = causal != 0;
    const std::size_t stride = cfg.kv_seq_stride > 0 ? cfg.kv_seq_stride : ukv;
    ferrum::CudaBackend& be = attention_backend(prefill_kernel == 1 ? ferrum::PrefillKernel::MmaSync
                                                                    : ferrum::PrefillKernel::Auto);
    const std::size_t qn = ub * cfg.num_heads * uq * cfg.head_dim;
    const std::size_t kvn = ub * cfg.num_kv_heads * stride * cfg.head_dim;
    ferrum::Buffer qb = ferrum::Buffer::wrap(be, q, dt, qn);
    ferrum::Buffer kb = ferrum::Buffer::wrap(be, k, dt, kvn);
    ferrum::Buffer vb = ferrum::Buffer::wrap(be, v, dt, kvn);
    ferrum::Buffer ob = ferrum::Buffer::wrap(be, out, dt, qn);
    be.flash_attention(qb, kb, vb, ob, ub, uq, ukv, upos, cfg);
    return 0;
  } catch (const std::exception& e) {
    return report(e, err, err_len);
  }
}

}  // extern "C"
