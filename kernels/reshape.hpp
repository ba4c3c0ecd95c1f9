// Launchers for the reshaping family: split_qkv, transpose_head_to_token.
#pragma once

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

void launch_split_qkv(DType dtype, const void* qkv /*[tokens, q_dim + 2*kv_dim]*/, void* q /*[tokens, q_dim]*/,
                      void* k /*[tokens, kv_dim]*/, void* v /*[tokens, kv_dim]*/, long long tokens, long long q_dim,
                      long long kv_dim, cudaStream_t stream);

// dst[t, h, :] = src[h, t, :]
void launch_transpose_head_to_token(DType dtype, const void* src /*[heads, tokens, dim]*/,
                                    void* dst /*[tokens, heads, dim]*/, long long tokens, long long heads,
                                    long long dim, cudaStream_t stream);

}  // namespace ferrum::kernels
