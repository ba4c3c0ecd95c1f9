// CudaBackend: RoPE (qk_norm_rope, and qkv_rope_append and its ragged
// form, which also append to the KV cache).
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/rope.hpp"

namespace ferrum {

using detail::ptr;

// The RoPE kernels keep a head in registers up to kRopeMaxHeadDim: larger
// heads are Unsupported here (CpuBackend takes any).
void CudaBackend::check_rope_head_dim(const char* op, const char* arg, std::size_t head_dim) {
  if (kernels::rope_head_dim_supported(head_dim)) return;
  abandon_capture();
  detail::fail(ErrorCode::Unsupported, "{}: argument '{}' = {} exceeds the CUDA kernel's limit {}", op, arg, head_dim,
               kernels::kRopeMaxHeadDim);
}

void CudaBackend::do_qk_norm_rope(const Buffer& input, const Buffer* norm_w, const Buffer& cos, const Buffer& sin,
                                  Buffer& output, std::size_t tokens, std::size_t heads, std::size_t head_dim,
                                  std::size_t pos_offset, std::size_t max_pos, float eps, RopeMode mode,
                                  bool use_decode_state) {
  check_rope_head_dim("qk_norm_rope", "head_dim", head_dim);
  detail::activate_device(device_);
  kernels::RopeArgs a;
  a.dtype = input.dtype();
  a.input = ptr(input);
  a.norm_w = mode == RopeMode::NormAndRope ? norm_w->data() : nullptr;
  a.cos = ptr<float>(cos);
  a.sin = ptr<float>(sin);
  a.output = ptr(output);
  a.tokens = static_cast<int>(tokens);
  a.heads = static_cast<int>(heads);
  a.head_dim = static_cast<int>(head_dim);
  a.pos_offset = static_cast<long long>(pos_offset);
  a.state = use_decode_state ? rt_->decode_state : nullptr;
  a.max_pos = static_cast<long long>(max_pos);
  a.eps = eps;
  a.error_log = rt_->error_device;
  kernels::launch_qk_norm_rope(a, rt_->stream);
}

namespace {

// The launch arguments both qkv_rope_append forms share (positions, pos_offset
// and state are the caller's); release_next: the attention_kv_before_wait
// promise (the decode attention after the append starts early).
kernels::QkvRopeAppendArgs qkv_rope_append_args(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm,
                                                const Buffer& cos, const Buffer& sin, Buffer& q_out, Buffer& k_cache,
                                                Buffer& v_cache, std::size_t tokens, const QkvRopeAppendConfig& cfg,
                                                kernels::DeviceErrorLog* error_log, bool release_next) {
  const bool norm = cfg.mode == RopeMode::NormAndRope;
  kernels::QkvRopeAppendArgs a;
  a.dtype = qkv.dtype();
  a.qkv = ptr(qkv);
  a.q_norm = norm ? q_norm->data() : nullptr;
  a.k_norm = norm ? k_norm->data() : nullptr;
  a.cos = ptr<float>(cos);
  a.sin = ptr<float>(sin);
  a.q_out = ptr(q_out);
  a.k_cache = ptr(k_cache);
  a.v_cache = ptr(v_cache);
  a.tokens = static_cast<int>(tokens);
  a.heads = static_cast<int>(cfg.heads);
  a.kv_heads = static_cast<int>(cfg.kv_heads);
  a.head_dim = static_cast<int>(cfg.head_dim);
  a.capacity = static_cast<long long>(cfg.capacity);
  a.max_pos = static_cast<long long>(cfg.max_pos);
  a.eps = cfg.eps;
  a.error_log = error_log;
  a.release_next = release_next;
  return a;
}

}  // namespace

void CudaBackend::do_qkv_rope_append(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                                     const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache,
                                     std::size_t tokens, std::size_t pos_offset, const QkvRopeAppendConfig& cfg,
                                     bool use_decode_state) {
  check_rope_head_dim("qkv_rope_append", "cfg.head_dim", cfg.head_dim);
  detail::activate_device(device_);
  kernels::QkvRopeAppendArgs a =
      qkv_rope_append_args(qkv, q_norm, k_norm, cos, sin, q_out, k_cache, v_cache, tokens, cfg, rt_->error_device,
                           rt_->attention_kv);
  a.pos_offset = static_cast<long long>(pos_offset);
  a.state = use_decode_state ? rt_->decode_state : nullptr;
  kernels::launch_qkv_rope_append(a, rt_->stream);
}

void CudaBackend::do_qkv_rope_append_ragged(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm,
                                            const Buffer& cos, const Buffer& sin, Buffer& q_out, Buffer& k_cache,
                                            Buffer& v_cache, const Buffer& positions, std::size_t batch,
                                            const QkvRopeAppendConfig& cfg) {
  check_rope_head_dim("qkv_rope_append_ragged", "cfg.head_dim", cfg.head_dim);
  detail::activate_device(device_);
  kernels::QkvRopeAppendArgs a =
      qkv_rope_append_args(qkv, q_norm, k_norm, cos, sin, q_out, k_cache, v_cache, batch, cfg, rt_->error_device,
                           rt_->attention_kv);
  a.positions = ptr<std::int32_t>(positions);
  kernels::launch_qkv_rope_append(a, rt_->stream);
}

}  // namespace ferrum
