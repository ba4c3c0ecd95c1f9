// The norm launchers' arguments from validated Buffers, shared by the norm
// ops (cuda_backend.cpp) and the GPTQ pre-norm (cuda_backend_gptq.cpp), which
// must ask for the same plan.
#pragma once

#include <cstddef>

#include "ferrum/buffer.hpp"
#include "kernels/norm.hpp"
#include "cuda/buffer_ptr.hpp"

namespace ferrum::detail {

inline kernels::NormArgs norm_args(kernels::NormKind kind, const Buffer& x, const Buffer& weight, float eps,
                                   Buffer& out, std::size_t tokens, std::size_t dim, int num_sms) {
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

}  // namespace ferrum::detail
