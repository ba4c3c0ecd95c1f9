// Launcher for argmax (greedy sampling on the device). The caller
// (CudaBackend) has validated: dtype f16, bf16 or f32; rows, cols >= 1;
// rows, cols < 2^31. On sm_90+ a row is reduced by a thread-block cluster;
// older devices take one block per row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

// out[r] = the first column of row r holding its largest value; NaN beats
// every number (torch.argmax).
void launch_argmax(DType dtype, const void* x /*[rows, cols]*/, std::int32_t* out /*[rows]*/, long long rows,
                   long long cols, cudaStream_t stream);

}  // namespace ferrum::kernels
