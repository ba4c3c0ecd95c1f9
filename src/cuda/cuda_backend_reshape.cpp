// CudaBackend: the reshapes (split_qkv, transpose_head_to_token).
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/reshape.hpp"

namespace ferrum {

using detail::ptr;

void CudaBackend::do_split_qkv(const Buffer& qkv, Buffer& q, Buffer& k, Buffer& v, std::size_t tokens,
                               std::size_t q_dim, std::size_t kv_dim) {
  detail::activate_device(device_);
  kernels::launch_split_qkv(qkv.dtype(), ptr(qkv), ptr(q), ptr(k), ptr(v), static_cast<long long>(tokens),
                            static_cast<long long>(q_dim), static_cast<long long>(kv_dim), rt_->stream);
}

void CudaBackend::do_transpose_head_to_token(const Buffer& src, Buffer& dst, std::size_t tokens, std::size_t heads,
                                             std::size_t dim) {
  detail::activate_device(device_);
  kernels::launch_transpose_head_to_token(src.dtype(), ptr(src), ptr(dst), static_cast<long long>(tokens),
                                          static_cast<long long>(heads), static_cast<long long>(dim), rt_->stream);
}

}  // namespace ferrum
