// Launcher for embedding_lookup. The caller (CudaBackend) has validated.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

// out[t, :] = table[id(t), :] with id(t) = ids[t], or state->token when
// `state` is non-null (tokens == 1). An id outside [0, vocab) writes a zero
// row and reports kErrEmbeddingId (value the id, limit vocab).
void launch_embedding_lookup(DType dtype, const void* table /*[vocab, dim]*/,
                             const std::int32_t* ids /*[tokens] i32; null when state is set*/,
                             const DecodeState* state /*[1] DecodeState in device memory (token read); null: ids*/,
                             void* out /*[tokens, dim]*/, long long tokens, long long dim, long long vocab,
                             DeviceErrorLog* error_log /*[1] DeviceErrorLog (host-mapped); null: none*/,
                             cudaStream_t stream);

}  // namespace ferrum::kernels
