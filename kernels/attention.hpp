// Launcher for flash_attention. The caller (CudaBackend) has validated.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

// Keys per split of the KV range. Fixed, so that a result never depends on
// the batch or on how many blocks a launch has: run to run bitwise equal.
inline constexpr int kAttnSplitKeys = 512;

struct AttentionArgs {
  DType dtype = DType::F16;
  const void* q = nullptr;  // [batch, num_heads, q_len, head_dim]
  const void* k = nullptr;  // [batch, num_kv_heads, kv_stride, head_dim]
  const void* v = nullptr;  // [batch, num_kv_heads, kv_stride, head_dim]
  void* out = nullptr;      // [batch, num_heads, q_len, head_dim]
  int batch = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int q_len = 0;
  int head_dim = 0;          // 64, 128 or 256
  long long kv_stride = 0;   // positions per kv head in k / v
  int kv_len = 0;            // valid keys (ignored when state is set)
  long long pos_offset = 0;  // position of query 0 (state: kv_len - 1)
  const DecodeState* state = nullptr;  // q_len == 1: kv_len from the decode state
  const int* kv_lens = nullptr;        // [batch] (q_len == 1): per-sequence kv_len; wins over state
  std::uint32_t* error_flag = nullptr; // device error word (a device-side kv_len out of range)
  bool causal = true;
  float scale = 0.0f;  // softmax scale (already resolved: > 0)
  // Split-K scratch for decode (q_len == 1): [batch * num_heads][splits][head_dim]
  // partial outputs and [batch * num_heads][splits] log-sum-exps, f32.
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
};

// Floats of split-K scratch a decode call needs (0 for prefill).
std::size_t attention_workspace_floats(int batch, int num_heads, int q_len, int head_dim, long long kv_stride);

void launch_attention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace ferrum::kernels
