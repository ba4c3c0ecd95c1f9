// CudaBackend: the KV-cache append (kv_cache_append_head_major).
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/kv_cache.hpp"

namespace ferrum {

using detail::ptr;

void CudaBackend::do_kv_cache_append_head_major(Buffer& cache_k, Buffer& cache_v, std::size_t cache_len,
                                                std::size_t capacity, const Buffer& new_k, const Buffer& new_v,
                                                std::size_t new_tokens, std::size_t nkv, std::size_t hd,
                                                bool use_decode_state) {
  detail::activate_device(device_);
  kernels::launch_kv_cache_append(cache_k.dtype(), ptr(cache_k), ptr(cache_v), ptr(new_k), ptr(new_v),
                                  static_cast<long long>(cache_len), use_decode_state ? rt_->decode_state : nullptr,
                                  static_cast<long long>(capacity), static_cast<long long>(new_tokens),
                                  static_cast<long long>(nkv), static_cast<long long>(hd), rt_->error_device,
                                  rt_->stream);
}

}  // namespace ferrum
