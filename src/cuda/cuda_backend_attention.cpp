// CudaBackend: flash_attention (kernels/attention.hpp).
#include "ferrum/cuda_backend.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/attention.hpp"

namespace ferrum {

using detail::ptr;

// ── Attention ──────────────────────────────────────────────────────────────

void CudaBackend::do_flash_attention(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                     std::size_t batch, std::size_t q_len, std::size_t kv_len, std::size_t pos_offset,
                                     const AttnConfig& cfg, bool use_decode_state) {
  auto refuse = [&](ErrorCode code, const std::string& message) {
    abandon_capture();
    detail::fail(code, "flash_attention: {}", message);
  };
  if (cfg.head_dim != 64 && cfg.head_dim != 128 && cfg.head_dim != 256) {
    refuse(ErrorCode::Unsupported,
           fmt::format("cfg.head_dim = {} is not one of the CUDA kernel's 64, 128, 256", cfg.head_dim));
  }
  // Rows are read and written as 16-byte vectors.
  const std::pair<const char*, const Buffer*> buffers[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}};
  for (const auto& [name, b] : buffers) {
    if ((reinterpret_cast<std::uintptr_t>(b->data()) & 15u) != 0) {
      refuse(ErrorCode::Misaligned, fmt::format("argument '{}' at {} is not 16-byte aligned", name, b->data()));
    }
  }
  const auto stride = static_cast<long long>(cfg.kv_seq_stride > 0 ? cfg.kv_seq_stride : kv_len);
  const std::size_t need = kernels::attention_workspace_floats(static_cast<int>(batch), static_cast<int>(cfg.num_heads),
                                                               static_cast<int>(q_len), static_cast<int>(cfg.head_dim),
                                                               stride);
  if (need * sizeof(float) > rt_->attention_workspace_bytes) {
    refuse(ErrorCode::CapacityExceeded,
           fmt::format("decode split-K scratch needs {} bytes, more than CudaBackendConfig::attention_workspace_bytes = {}",
                       need * sizeof(float), rt_->attention_workspace_bytes));
  }
  detail::activate_device(device_);
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
  a.kv_len = static_cast<int>(kv_len);
  a.pos_offset = static_cast<long long>(pos_offset);
  a.state = use_decode_state ? rt_->decode_state : nullptr;
  a.causal = cfg.causal;
  a.scale = cfg.scale > 0.0f ? cfg.scale : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  // Partial outputs first, then the log-sum-exps ([rows][splits] floats).
  a.partial_out = rt_->attention_workspace;
  a.partial_lse = rt_->attention_workspace + (need / (cfg.head_dim + 1)) * cfg.head_dim;
  kernels::launch_attention(a, rt_->stream);
}

}  // namespace ferrum
