// The decode's split of the key range and the size of its split-K scratch:
// host arithmetic without the CUDA headers, shared by the launcher
// (attention.hpp) and the public attention_decode_workspace_bytes, which a
// FERRUM_CUDA=OFF build has too (src/decode_workspace.cpp).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>

namespace ferrum::kernels {

// Decode (q_len == 1) cuts the key range into slices of
// attention_decode_slice_keys(kv_stride) keys, one block each: the smallest
// power-of-two multiple of 128 keys that cuts the cache capacity into at
// most 16 slices (a capacity up to 2048: 128 keys; 4096: 256; 8192: 512;
// 128k: 8192). Short caches get many blocks, where latency rules (128 for a
// batch-1 decode of 8 kv heads on the H200's 132 SMs); long slices stream
// without draining and keep the merge small at large batch. It depends on
// the capacity alone -- never on kv_len, the batch or the launch size -- so
// a result is bitwise the same whatever the batch, and run to run.
// (Until session 35 caches up to 4096 positions kept 128-key slices, up to
// 32; at 4096, 256-key slices measured level at B = 1 and 3-6 % faster at
// B = 4..64: docs/design/decode_attention.md §4.13.)
//
// FERRUM_DECODE_MIN_SLICE_KEYS (a CMake cache variable, experiments only:
// 128 by default, 256 or 512) sets the smallest slice, so that one call can
// measure the trade between a batch-1 decode's many short blocks and a large
// batch's fewer slice boundaries (scripts/gpu_suite.sh slicegeom; docs/
// design/decode_attention.md §4.12-4.13). Caches past 16 times it keep
// their slices.
#ifndef FERRUM_DECODE_MIN_SLICE_KEYS
#define FERRUM_DECODE_MIN_SLICE_KEYS 128
#endif
inline constexpr long long kAttnDecodeMinSliceKeys = FERRUM_DECODE_MIN_SLICE_KEYS;
static_assert(kAttnDecodeMinSliceKeys == 128 || kAttnDecodeMinSliceKeys == 256 || kAttnDecodeMinSliceKeys == 512,
              "FERRUM_DECODE_MIN_SLICE_KEYS: 128, 256 or 512");
inline constexpr int kAttnDecodeMaxSplits = 16;  // slices per row, at most (the merge's bound)
// Always a power of two: the decode kernels count a row's used slices with a
// shift (used_slices in attention.cu).
constexpr long long attention_decode_slice_keys(long long kv_stride) {
  long long keys = kAttnDecodeMinSliceKeys;
  while (keys * kAttnDecodeMaxSplits < kv_stride) keys *= 2;
  return keys;
}
constexpr int attention_decode_splits(long long kv_stride) {
  const long long keys = attention_decode_slice_keys(kv_stride);
  return static_cast<int>((kv_stride + keys - 1) / keys);  // <= kAttnDecodeMaxSplits
}

// The decode's split-K scratch in floats, the one formula both the launcher
// and the public attention_decode_workspace_bytes (this times 4) use:
// batch * num_heads * attention_decode_splits(kv_stride) * (head_dim + 1),
// at most kAttnDecodeMaxSplits (16) splits; nullopt where the product
// passes size_t.
inline std::optional<std::size_t> attention_decode_workspace_floats(std::size_t batch, std::size_t num_heads,
                                                                    std::size_t head_dim, long long kv_stride) {
  std::size_t floats = 1;
  for (const std::size_t factor : {batch, num_heads, static_cast<std::size_t>(attention_decode_splits(kv_stride)),
                                   head_dim + 1}) {
    if (factor != 0 && floats > static_cast<std::size_t>(-1) / factor) return std::nullopt;
    floats *= factor;
  }
  return floats;
}

}  // namespace ferrum::kernels
