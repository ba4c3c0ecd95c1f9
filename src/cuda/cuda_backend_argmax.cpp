// CudaBackend: argmax.
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/argmax.hpp"

namespace ferrum {

using detail::ptr;

void CudaBackend::do_argmax(const Buffer& x, Buffer& out, std::size_t rows, std::size_t cols) {
  detail::activate_device(device_);
  kernels::launch_argmax(x.dtype(), ptr(x), ptr<std::int32_t>(out), static_cast<long long>(rows),
                         static_cast<long long>(cols), rt_->stream);
}

}  // namespace ferrum
