// Launchers for the elementwise family: gelu, add_inplace, add_bias,
// fused_silu_mul_split. The caller (CudaBackend) has validated.
#pragma once

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

// approx_tanh: false = erf formula (torch default), true = tanh approximation.
void launch_gelu(DType dtype, const void* x /*[n]*/, void* out /*[n]*/, long long n, bool approx_tanh,
                 cudaStream_t stream);
// residual += x
void launch_add_inplace(DType dtype, void* residual /*[n]*/, const void* x /*[n]*/, long long n,
                        cudaStream_t stream);
// data[r, c] += bias[c]
void launch_add_bias(DType dtype, void* data /*[rows, cols]*/, const void* bias /*[cols]*/, long long rows,
                     long long cols, cudaStream_t stream);
// out[t, j] = silu(gate_up[t, j]) * gate_up[t, im + j]
void launch_silu_mul_split(DType dtype, const void* gate_up /*[tokens, 2*im]*/, void* out /*[tokens, im]*/,
                           long long tokens, long long im, cudaStream_t stream);
// out[i] = silu(gate_up[2 i]) * gate_up[2 i + 1]: gate and up interleaved in
// pairs (the unfused path of Backend::gemm_silu_mul and gemm_silu_mul_gptq,
// n = tokens * im outputs); op names the calling op in errors.
void launch_silu_mul_pairs(const char* op, DType dtype, const void* gate_up /*[n, 2] (gate, up)*/, void* out /*[n]*/, long long n,
                           cudaStream_t stream);

}  // namespace ferrum::kernels
