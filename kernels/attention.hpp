// Launcher for flash_attention. The caller (CudaBackend) has validated.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

// Launch knobs of the tensor-core decode. The defaults are the library's
// choice and every caller leaves them; bench/attention_tuning.cpp sweeps
// them (the A/B runs of docs/design/decode_attention.md). launch_attention
// throws ferrum::Error naming a knob set to a value not allowed.
struct DecodeTuning {
  // These three change no result (the slices, their order and the merge
  // order stay the same):
  //
  // Sub-tiles per key warp asked into L2 beyond the cp.async ring, in
  // launches too large for the whole-slice prefetch. 0: none.
  int l2_ahead = 0;
  // Launch footprint (K + V bytes over batch x kv heads x capacity) up to
  // which every block prefetches its whole slice into L2 (H200: 50 MiB L2).
  // 0: never. Measured on the H200 (ferrum_attention_tuning, 2026-11-30):
  // at 36 MiB, B=1 L=4k took 13.8 µs against 12.4 without, L=8k 17.8
  // against 15.4; no shape gained. Kept as a knob for other GPUs.
  double l2_prefetch_bytes = 0.0;
  // The last block of a row merges its slices (else a second kernel does).
  bool fused_merge = true;

  // These two choose the slice geometry (attention_decode_slice_keys), so
  // other slices and other bits -- still a function of the capacity and the
  // knobs alone: deterministic and independent of the batch. For
  // measurement (docs/design/decode_attention.md §3 step 2 and E3); the
  // defaults are the library's geometry.
  //
  // Most slices per head above kAttnDecodeShortCapacity: 16 or 32.
  int long_splits = 16;
  // Keys of a slice at a capacity up to kAttnDecodeShortCapacity, doubled
  // until at most kAttnDecodeMaxSplits slices cover it: 128 or 64 (64:
  // 64-key slices up to a 2k capacity, 128-key ones up to 4k).
  int min_slice_keys = 128;
};

// Decode (q_len == 1) cuts the key range into slices of
// attention_decode_slice_keys(kv_stride, tuning) keys, one block each. By
// default 128 keys for a cache capacity up to 4096 (up to 32 slices: many
// blocks for a short cache, where latency rules), beyond that the smallest
// power of two that cuts the capacity into at most 16 slices (128 blocks for
// a batch-1 decode of 8 kv heads on the H200's 132 SMs; long slices stream
// without draining and keep the merge small at large batch). It depends on
// the capacity and the tuning alone -- never on kv_len, the batch or the
// launch size -- so a result is bitwise the same whatever the batch, and
// run to run. Every user of the geometry in a call (grid, kernel, combine)
// takes it from the same AttentionArgs::decode_tuning.
inline constexpr long long kAttnDecodeShortCapacity = 4096;
inline constexpr int kAttnDecodeMaxSplits = 32;  // under every allowed tuning
inline constexpr int kAttnDecodeLongSplitsAllowed[] = {16, 32};
inline constexpr int kAttnDecodeMinSliceKeysAllowed[] = {64, 128};  // whole 64-key tiles
// `t` must hold allowed values (launch_attention checks them; others may
// not terminate, or exceed kAttnDecodeMaxSplits).
constexpr long long attention_decode_slice_keys(long long kv_stride, const DecodeTuning& t) {
  const long long most = kv_stride <= kAttnDecodeShortCapacity ? kAttnDecodeMaxSplits : t.long_splits;
  long long keys = t.min_slice_keys;
  while (keys * most < kv_stride) keys *= 2;
  return keys;
}
constexpr int attention_decode_splits(long long kv_stride, const DecodeTuning& t) {
  const long long keys = attention_decode_slice_keys(kv_stride, t);
  return static_cast<int>((kv_stride + keys - 1) / keys);  // <= kAttnDecodeMaxSplits
}
// The most slices any allowed tuning gives this capacity: what the split-K
// workspace is sized for, so a caller may change the tuning without
// resizing it.
constexpr int attention_decode_max_splits(long long kv_stride) {
  int most = 1;
  for (const int long_splits : kAttnDecodeLongSplitsAllowed) {
    for (const int min_keys : kAttnDecodeMinSliceKeysAllowed) {
      DecodeTuning t;
      t.long_splits = long_splits;
      t.min_slice_keys = min_keys;
      const int s = attention_decode_splits(kv_stride, t);
      most = s > most ? s : most;
    }
  }
  return most;
}
// The default is the geometry before the knobs existed.
static_assert(attention_decode_slice_keys(4096, DecodeTuning{}) == 128 &&
              attention_decode_slice_keys(4097, DecodeTuning{}) == 512 &&
              attention_decode_slice_keys(32768, DecodeTuning{}) == 2048 &&
              attention_decode_splits(131072, DecodeTuning{}) == 16);
static_assert(attention_decode_max_splits(1024) == 16 && attention_decode_max_splits(2048) == 32 &&
              attention_decode_max_splits(2049) == 17 && attention_decode_max_splits(4096) == 32 &&
              attention_decode_max_splits(8192) == 32 && attention_decode_max_splits(1 << 20) == 32);

struct AttentionArgs {
  DType dtype = DType::F16;
  const void* q = nullptr;  // [batch, num_heads, q_len, head_dim]
  const void* k = nullptr;  // [batch, num_kv_heads, kv_stride, head_dim]
  const void* v = nullptr;  // [batch, num_kv_heads, kv_stride, head_dim]
  void* out = nullptr;      // [batch, num_heads, q_len, head_dim]; 16-byte aligned like q, k, v
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
  // partial outputs and [batch * num_heads][splits] log-sum-exps (base 2),
  // f32, splits = attention_decode_splits(kv_stride, decode_tuning). Only
  // slices holding a valid key are written and read.
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  DecodeTuning decode_tuning;  // q_len == 1 (the slice geometry also for the CUDA-core fallback)
};

// Floats of split-K scratch a decode call needs (0 for prefill), under any
// allowed DecodeTuning: batch * num_heads * (head_dim + 1) *
// attention_decode_max_splits(kv_stride) (at most 32 splits).
std::size_t attention_workspace_floats(int batch, int num_heads, int q_len, int head_dim, long long kv_stride);

// Points a.partial_out and a.partial_lse into `workspace` (f32, `floats` of
// them, at least attention_workspace_floats): the outputs first, then the
// log-sum-exps. a.head_dim must be set.
inline void set_decode_workspace(AttentionArgs& a, float* workspace, std::size_t floats) {
  const std::size_t rows = floats / static_cast<std::size_t>(a.head_dim + 1);  // (sequence, head, slice) rows
  a.partial_out = workspace;
  a.partial_lse = workspace + rows * static_cast<std::size_t>(a.head_dim);
}

void launch_attention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace ferrum::kernels
