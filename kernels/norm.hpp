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

// The longest row launch_norm takes (its row-loop kernel's int column
// index passes dim by up to one block); longer throws Unsupported naming dim.
inline constexpr int kNormMaxDim = 1 << 30;

// How launch_norm runs `args` (host only; exposed so the CPU tests can check
// every size plans in bounded time and within the grid).
struct NormLaunchPlan {
  bool wide = false;             // 16-byte vectors (dim % 8 == 0, every pointer aligned)
  bool row_loop = false;         // the row-loop kernel: a block per row, re-reading it
  bool prefetch_weight = false;  // at most a block per SM: the weight loaded with x
  int group = 0;                 // threads per row, a power of two (the kernel shifts by it)
  int threads = 0;               // per block
  int blocks = 0;
  long long vectors_per_thread = 0;  // held in registers (past 8: row_loop)
};
// Throws Unsupported naming dim past kNormMaxDim.
NormLaunchPlan norm_launch_plan(const NormArgs& args);

void launch_norm(const NormArgs& args, cudaStream_t stream);

}  // namespace ferrum::kernels
