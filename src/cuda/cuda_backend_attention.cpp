// CudaBackend: flash_attention and flash_decode_ragged (kernels/attention.hpp).
#include "ferrum/cuda_backend.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/attention.hpp"

namespace ferrum {

using detail::ptr;

namespace {

// What the CUDA kernels need beyond the base class's checks: a head dim they
// were built for, 16-byte aligned rows, and split-K scratch that fits the
// preallocated workspace. Sets *need to the workspace floats the call uses;
// returns the problem, if any, for the caller to raise.
struct Problem {
  ErrorCode code;
  std::string message;
};
std::optional<Problem> cuda_attention_problem(const AttnConfig& cfg,
                                              std::initializer_list<std::pair<const char*, const Buffer*>> buffers,
                                              const Buffer* kv_lens, std::size_t batch, std::size_t q_len,
                                              long long stride, std::size_t workspace_bytes, std::size_t* need) {
  if (std::string host = detail::host_memory_argument(buffers); !host.empty()) {
    return Problem{ErrorCode::InvalidArgument, std::move(host)};
  }
  if (kv_lens != nullptr) {
    if (std::string host = detail::host_memory_argument({{"kv_lens", kv_lens}}); !host.empty()) {
      return Problem{ErrorCode::InvalidArgument, std::move(host)};
    }
  }
  if (!kernels::attention_head_dim_supported(cfg.head_dim)) {
    return Problem{ErrorCode::Unsupported,
                   fmt::format("cfg.head_dim = {} is not one of the CUDA kernel's {}", cfg.head_dim,
                               kernels::int_list_text(kernels::AttentionHeadDims{}))};
  }
  constexpr std::size_t kGridYZ = kernels::kAttentionMaxGridYZ;
  if (cfg.num_heads > kGridYZ) {
    return Problem{ErrorCode::Unsupported,
                   fmt::format("cfg.num_heads = {} exceeds the CUDA kernels' limit of {}", cfg.num_heads, kGridYZ)};
  }
  if (q_len > 1 && batch > kGridYZ) {
    return Problem{ErrorCode::Unsupported,
                   fmt::format("batch = {} exceeds the CUDA prefill kernels' limit of {}", batch, kGridYZ)};
  }
  if (std::string misaligned = detail::misaligned_16(buffers); !misaligned.empty()) {
    return Problem{ErrorCode::Misaligned, std::move(misaligned)};
  }
  *need = kernels::attention_workspace_floats(static_cast<int>(batch), static_cast<int>(cfg.num_heads),
                                              static_cast<int>(q_len), static_cast<int>(cfg.head_dim), stride);
  if (*need > workspace_bytes / sizeof(float)) {
    const std::string bytes = *need > std::numeric_limits<std::size_t>::max() / sizeof(float)
                                  ? std::string("more than 2^64")
                                  : fmt::format("{}", *need * sizeof(float));
    return Problem{ErrorCode::CapacityExceeded,
                   fmt::format("decode split-K scratch needs {} bytes, more than "
                               "CudaBackendConfig::attention_workspace_bytes = {}",
                               bytes, workspace_bytes)};
  }
  return std::nullopt;
}

kernels::AttentionArgs attention_args(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                      std::size_t batch, std::size_t q_len, const AttnConfig& cfg, long long stride,
                                      float* workspace, std::size_t workspace_floats, bool kv_before_wait) {
  kernels::AttentionArgs a;
  a.dtype = q.dtype();
  a.q = ptr(q);
  a.k = ptr(k);
  a.v = ptr(v);
  a.out = ptr(out);
  a.batch = static_cast<int>(batch);
  a.num_heads = static_cast<int>(cfg.num_heads);
  a.num_kv_heads = static_cast<int>(cfg.num_kv_heads);
  a.q_len = static_cast<int>(q_len);
  a.head_dim = static_cast<int>(cfg.head_dim);
  a.kv_stride = stride;
  a.causal = cfg.causal;
  a.scale = cfg.scale > 0.0f ? cfg.scale : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  kernels::set_decode_workspace(a, workspace, workspace_floats);
  a.kv_before_wait = kv_before_wait;
  return a;
}

}  // namespace

PrefillKernel CudaBackend::checked_prefill_kernel(PrefillKernel requested) {
  switch (requested) {
    case PrefillKernel::Auto:
    case PrefillKernel::MmaSync:
      return requested;
  }
  detail::fail(ErrorCode::InvalidArgument,
               "CudaBackend: CudaBackendConfig::prefill_kernel = {} is not Auto (0) or MmaSync (1)",
               static_cast<int>(requested));
}

void CudaBackend::do_flash_attention(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                     std::size_t batch, std::size_t q_len, std::size_t kv_len, std::size_t pos_offset,
                                     const AttnConfig& cfg, bool use_decode_state) {
  const auto stride = static_cast<long long>(cfg.kv_seq_stride > 0 ? cfg.kv_seq_stride : kv_len);
  std::size_t need = 0;
  if (auto problem = cuda_attention_problem(cfg, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}, nullptr, batch,
                                            q_len, stride, rt_->attention_workspace_bytes, &need)) {
    abandon_capture();
    detail::fail(problem->code, "flash_attention: {}", problem->message);
  }
  detail::activate_device(device_);
  // The promise concerns the decode kernel (q_len == 1) only; prefill launches carry it off.
  kernels::AttentionArgs a = attention_args(q, k, v, out, batch, q_len, cfg, stride, rt_->attention_workspace, need,
                                            rt_->attention_kv && q_len == 1);
  a.kv_len = static_cast<int>(kv_len);
  // pos_offset only places the causal mask. A non-causal call's may be any
  // value (the shared checks bound it only when causal), and one past 2^63
  // would reach the kernels negative, which the tensor-core prefills refuse.
  a.pos_offset = cfg.causal ? static_cast<long long>(pos_offset) : 0;
  a.prefill_wgmma = prefill_kernel_ == PrefillKernel::Auto;
  if (use_decode_state) {
    a.state = rt_->decode_state;
    a.error_log = rt_->error_device;
  }
  kernels::launch_attention(a, rt_->stream);
}

void CudaBackend::do_flash_decode_ragged(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                         const Buffer& kv_lens, std::size_t batch, const AttnConfig& cfg) {
  const auto stride = static_cast<long long>(cfg.kv_seq_stride);
  std::size_t need = 0;
  if (auto problem = cuda_attention_problem(cfg, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}, &kv_lens, batch,
                                            1, stride, rt_->attention_workspace_bytes, &need)) {
    abandon_capture();
    detail::fail(problem->code, "flash_decode_ragged: {}", problem->message);
  }
  detail::activate_device(device_);
  kernels::AttentionArgs a = attention_args(q, k, v, out, batch, 1, cfg, stride, rt_->attention_workspace, need,
                                            rt_->attention_kv);
  a.kv_len = 0;  // per sequence, from kv_lens on the device
  a.kv_lens = ptr<int>(kv_lens);
  a.error_log = rt_->error_device;
  kernels::launch_attention(a, rt_->stream);
}

}  // namespace ferrum
