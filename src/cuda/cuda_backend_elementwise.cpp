// CudaBackend: the elementwise ops (gelu, add_bias, add_inplace,
// fused_silu_mul_split).
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/elementwise.hpp"

namespace ferrum {

using detail::ptr;

void CudaBackend::do_gelu(const Buffer& x, Buffer& out, std::size_t len, GeluApproximation approx) {
  detail::activate_device(device_);
  kernels::launch_gelu(x.dtype(), ptr(x), ptr(out), static_cast<long long>(len), approx == GeluApproximation::Tanh,
                       rt_->stream);
}

void CudaBackend::do_add_bias(Buffer& data, const Buffer& bias, std::size_t rows, std::size_t cols) {
  detail::activate_device(device_);
  kernels::launch_add_bias(data.dtype(), ptr(data), ptr(bias), static_cast<long long>(rows),
                           static_cast<long long>(cols), rt_->stream);
}

void CudaBackend::do_add_inplace(Buffer& residual, const Buffer& x, std::size_t len) {
  detail::activate_device(device_);
  kernels::launch_add_inplace(residual.dtype(), ptr(residual), ptr(x), static_cast<long long>(len), rt_->stream);
}

void CudaBackend::do_fused_silu_mul_split(const Buffer& gate_up, Buffer& out, std::size_t tokens, std::size_t im) {
  detail::activate_device(device_);
  kernels::launch_silu_mul_split(gate_up.dtype(), ptr(gate_up), ptr(out), static_cast<long long>(tokens),
                                 static_cast<long long>(im), rt_->stream);
}

}  // namespace ferrum
