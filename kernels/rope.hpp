// Launcher for qk_norm_rope. The caller (CudaBackend) has validated.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

inline constexpr int kRopeMaxHeadDim = 512;

struct RopeArgs {
  DType dtype = DType::F16;
  const void* input = nullptr;   // [tokens, heads, head_dim] token-major
  const void* norm_w = nullptr;  // [head_dim]; null: rope only (no norm)
  const float* cos = nullptr;    // [max_pos, head_dim / 2]
  const float* sin = nullptr;    // [max_pos, head_dim / 2]
  void* output = nullptr;        // [heads, tokens, head_dim] head-major
  int tokens = 0;
  int heads = 0;
  int head_dim = 0;              // even, <= kRopeMaxHeadDim
  long long pos_offset = 0;      // position of token 0 (ignored when state is set)
  const DecodeState* state = nullptr;  // non-null: position of token 0 is state->pos
  long long max_pos = 0;
  float eps = 0.0f;
  std::uint32_t* error_flag = nullptr;  // kErrRopePositionOutOfRange
};

void launch_qk_norm_rope(const RopeArgs& args, cudaStream_t stream);

}  // namespace ferrum::kernels
