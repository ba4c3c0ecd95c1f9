// Launcher for qk_norm_rope. The caller (CudaBackend) has validated.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

inline constexpr int kRopeMaxHeadDim = 512;
// The head sizes the RoPE kernels take (a head in registers; evenness is a
// rule of the op itself, checked for every backend).
constexpr bool rope_head_dim_supported(std::size_t head_dim) {
  return head_dim <= static_cast<std::size_t>(kRopeMaxHeadDim);
}

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
  const DecodeState* state = nullptr;  // [1] DecodeState in device memory; non-null: position of token 0 is state->pos
  long long max_pos = 0;
  float eps = 0.0f;
  DeviceErrorLog* error_log = nullptr;  // [1] DeviceErrorLog (host-mapped), null: none; a position outside
                                        // [0, max_pos) is reported as kErrRopePosition (that row not written)
};

// More than kFastDivmodMax (2^31 - 1) head rows (tokens x heads) on the
// 16-byte path: a named Unsupported (its index math is 32-bit).
void launch_qk_norm_rope(const RopeArgs& args, cudaStream_t stream);

// qkv_rope_append in one launch: the rope rows of qk_norm_rope for q (to
// q_out) and k (to the K cache at pos), and v copied to the V cache at pos,
// pos = base + t with base = state->pos when state is non-null, else
// pos_offset; with positions (qkv_rope_append_ragged), token t is sequence
// t at pos = positions[t] in its own caches. A position past the tables
// (base + tokens > max_pos, or a positions[t] outside [0, max_pos)) reports
// kErrRopePosition, one past the caches (base > capacity - tokens, or a
// positions[t] outside [0, capacity)) kErrKvAppendPosition; either way no
// row is written (q_out and every cache unchanged, as CpuBackend
// refuses the whole op).
struct QkvRopeAppendArgs {
  DType dtype = DType::F16;
  const void* qkv = nullptr;     // [tokens, (heads + 2 kv_heads) * head_dim]: q | k | v per token
  const void* q_norm = nullptr;  // [head_dim]; null (with k_norm): rope only
  const void* k_norm = nullptr;  // [head_dim]
  const float* cos = nullptr;    // [max_pos, head_dim / 2]
  const float* sin = nullptr;    // [max_pos, head_dim / 2]
  void* q_out = nullptr;         // [heads, tokens, head_dim]; with positions [tokens = batch, heads, head_dim]
  void* k_cache = nullptr;       // [kv_heads, capacity, head_dim]; with positions [batch, kv_heads, capacity, head_dim]
  void* v_cache = nullptr;       // [kv_heads, capacity, head_dim]; with positions [batch, kv_heads, capacity, head_dim]
  // Batch decode (qkv_rope_append_ragged): token t is sequence t, at
  // positions[t] in its own caches; wins over pos_offset and state.
  const int* positions = nullptr;  // [tokens] i32
  int tokens = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;              // even, <= kRopeMaxHeadDim
  long long capacity = 0;
  long long pos_offset = 0;
  const DecodeState* state = nullptr;  // [1] DecodeState in device memory; non-null: base = state->pos
  long long max_pos = 0;
  float eps = 0.0f;
  DeviceErrorLog* error_log = nullptr;  // [1] DeviceErrorLog (host-mapped), null: none; gets
                                        // kErrRopePosition / kErrKvAppendPosition (above)
  // Release the next PDL kernel right after this one's own wait
  // (CudaBackendConfig::attention_kv_before_wait: the decode attention after
  // it then requests its older K / V rows while this runs).
  bool release_next = false;
};

// More than kFastDivmodMax (2^31 - 1) rows (tokens x (heads + 2 kv_heads)):
// a named Unsupported (both paths' index math is 32-bit).
void launch_qkv_rope_append(const QkvRopeAppendArgs& args, cudaStream_t stream);

}  // namespace ferrum::kernels
