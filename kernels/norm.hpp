// Launchers for the norm family: rms_norm, fused_add_rms_norm, layer_norm.
// Raw pointers, sizes and a stream; the caller (CudaBackend) has validated.
#pragma once

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

enum class NormKind { Rms, AddRms, Layer };

struct NormArgs {
  NormKind kind = NormKind::Rms;
  DType dtype = DType::F16;
  const void* x = nullptr;       // [rows, dim]
  void* residual = nullptr;      // [rows, dim], in/out (AddRms: residual += x)
  const void* weight = nullptr;  // [dim] (gamma for Layer)
  const void* bias = nullptr;    // [dim] (beta, Layer only)
  void* out = nullptr;           // [rows, dim]
  int rows = 0;
  int dim = 0;
  float eps = 0.0f;
  int num_sms = 0;  // multiprocessors of the device (picks the small-grid variant)
  // Launch shape: vectors each thread aims to hold (the group of threads per
  // row grows until a row fits; 0 or less: the tuned value of the kind and
  // dtype, see norm.cu), and the smallest block. Defaults are the tuned values
  // (bench/norm_tuning.cpp sweeps them); callers leave them.
  int target_vectors_per_thread = 0;
  int min_block_threads = 256;
};

void launch_norm(const NormArgs& args, cudaStream_t stream);

// How norm_rows_kernel splits one row of `dim` elements: `group` threads,
// each summing its `vectors_per_thread` vectors of `vector_width` elements
// (vectors lane, lane + group, ...) in order with fmaf, then the group's
// sums: butterfly within each warp (group_sum_in_warp), then the warps'
// sums in warp order from 0.0f. row_loop: the row is too long for
// registers and norm_rows_loop_kernel runs instead. The GPTQ streaming
// kernel's norm epilogue (launch_gptq_gemm_add_rms_norm) repeats this order
// from the plan, so both give the same bits. `aligned`: every pointer of the
// launch is 16-byte aligned (the wide vectors need it too).
struct NormRowPlan {
  int vector_width = 1;
  int group = 1;
  int vectors_per_thread = 1;
  bool row_loop = false;
};
NormRowPlan norm_row_plan(const NormArgs& args, bool aligned);

}  // namespace ferrum::kernels
