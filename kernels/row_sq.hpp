// Launchers for the row_sq family (Backend::row_sum_squares and the
// compositions of gemm_gptq_add_residual and rms_norm_gemm_gptq where the
// GPTQ streaming kernel does not take them; kernels/common/row_sq.cuh has
// the arithmetic they share with that kernel, so both give the same bits).
// Raw pointers, sizes and a stream; the caller (CudaBackend) has validated.
// row_sq: [rows, ceil(cols / 16)] f32, per row the sum of squares of each 16
// columns as stored.
#pragma once

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

// The most columns launch_row_sum_squares and launch_add_residual_row_sq
// take (strips of 512 columns along grid.y, at most 65535); more throws
// Unsupported naming cols.
inline constexpr int kRowSqMaxCols = 65535 * 512;

// row_sq of x [rows, cols].
void launch_row_sum_squares(DType dtype, const void* x /*[rows, cols]*/,
                            float* row_sq /*[rows, ceil(cols / 16)] f32, written*/, int rows, int cols,
                            cudaStream_t stream);
// residual = T(residual + out) (out as stored), then row_sq of the new residual.
void launch_add_residual_row_sq(DType dtype, const void* out /*[rows, cols]*/, void* residual /*[rows, cols]*/,
                                float* row_sq /*[rows, ceil(cols / 16)] f32, written*/, int rows, int cols,
                                cudaStream_t stream);
// normed = T((x * inv) * norm_w) with inv = rsqrt(sum of row_sq's row / cols + eps);
// errors name `op` (the public op it serves).
void launch_rms_norm_from_row_sq(const char* op, DType dtype, const void* x /*[rows, cols]*/,
                                 const float* row_sq /*[rows, ceil(cols / 16)] f32: x's, as the launches above write*/,
                                 const void* norm_w /*[cols]*/, float eps, void* normed /*[rows, cols]*/, int rows,
                                 int cols, cudaStream_t stream);

}  // namespace ferrum::kernels
