// Launcher for kv_cache_append_head_major. The caller has validated.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

// cache[h, base + t, :] = new[h, t, :] for K and V in one launch, with
// base = state->pos when `state` is non-null, else cache_len. A base past
// capacity - new_tokens writes nothing and reports kErrKvAppendPosition.
void launch_kv_cache_append(DType dtype, void* cache_k /*[nkv, capacity, hd]*/, void* cache_v /*[nkv, capacity, hd]*/,
                            const void* new_k /*[nkv, new_tokens, hd]*/, const void* new_v /*[nkv, new_tokens, hd]*/,
                            long long cache_len,
                            const DecodeState* state /*[1] DecodeState in device memory (pos read); null: cache_len*/,
                            long long capacity, long long new_tokens, long long nkv, long long hd,
                            DeviceErrorLog* error_log /*[1] DeviceErrorLog (host-mapped); null: none*/,
                            cudaStream_t stream);

}  // namespace ferrum::kernels
