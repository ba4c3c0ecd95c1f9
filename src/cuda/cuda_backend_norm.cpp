// CudaBackend: the norms (rms_norm, fused_add_rms_norm, layer_norm).
// Each do_* turns validated Buffers into raw pointers and calls the kernel
// family's launcher on the device's one stream (the checks are Backend's,
// src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/norm.hpp"

namespace ferrum {

using detail::ptr;

namespace {

kernels::NormArgs norm_args(kernels::NormKind kind, const Buffer& x, const Buffer& weight, float eps, Buffer& out,
                            std::size_t tokens, std::size_t dim, int num_sms) {
  kernels::NormArgs a;
  a.kind = kind;
  a.dtype = x.dtype();
  a.x = ptr(x);
  a.weight = ptr(weight);
  a.out = ptr(out);
  a.rows = static_cast<int>(tokens);
  a.dim = static_cast<int>(dim);
  a.eps = eps;
  a.num_sms = num_sms;
  return a;
}

}  // namespace

void CudaBackend::do_rms_norm(const Buffer& x, const Buffer& w, float eps, Buffer& out, std::size_t tokens,
                              std::size_t dim) {
  detail::activate_device(device_);
  kernels::launch_norm(norm_args(kernels::NormKind::Rms, x, w, eps, out, tokens, dim, rt_->num_sms), rt_->stream);
}

void CudaBackend::do_fused_add_rms_norm(Buffer& residual, const Buffer& x, const Buffer& w, float eps, Buffer& out,
                                        std::size_t tokens, std::size_t dim) {
  detail::activate_device(device_);
  kernels::NormArgs a = norm_args(kernels::NormKind::AddRms, x, w, eps, out, tokens, dim, rt_->num_sms);
  a.residual = ptr(residual);
  kernels::launch_norm(a, rt_->stream);
}

void CudaBackend::do_layer_norm(const Buffer& x, const Buffer& gamma, const Buffer& beta, float eps, Buffer& out,
                                std::size_t tokens, std::size_t dim) {
  detail::activate_device(device_);
  kernels::NormArgs a = norm_args(kernels::NormKind::Layer, x, gamma, eps, out, tokens, dim, rt_->num_sms);
  a.bias = ptr(beta);
  kernels::launch_norm(a, rt_->stream);
}

}  // namespace ferrum
