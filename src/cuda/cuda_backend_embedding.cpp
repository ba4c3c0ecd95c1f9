// CudaBackend: embedding_lookup.
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/embedding.hpp"

namespace ferrum {

using detail::ptr;

void CudaBackend::do_embedding_lookup(const Buffer& table, const Buffer& ids, Buffer& out, std::size_t tokens,
                                      std::size_t dim, std::size_t vocab, bool use_decode_state) {
  detail::activate_device(device_);
  kernels::launch_embedding_lookup(table.dtype(), ptr(table), use_decode_state ? nullptr : ptr<std::int32_t>(ids),
                                   use_decode_state ? rt_->decode_state : nullptr, ptr(out),
                                   static_cast<long long>(tokens), static_cast<long long>(dim),
                                   static_cast<long long>(vocab), rt_->error_device, rt_->stream);
}

}  // namespace ferrum
