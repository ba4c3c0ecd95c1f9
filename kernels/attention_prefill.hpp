// Launcher for the tensor-core prefill path of flash_attention (q_len > 1).
// The caller (launch_attention) has validated; this only decides whether the
// call is one the kernel handles.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention.hpp"

namespace ferrum::kernels {

// FlashAttention-2-style prefill on tensor cores (mma.sync m16n8k16, fp32
// accumulate): f16 / bf16, head_dim 64 / 128 / 256, GQA, causal with
// pos_offset, kv_stride >= kv_len, any q_len / kv_len. Deterministic: the
// query-block shape (64 or 128 rows, picked from the grid size and the
// device's SM count) does not change a bit of the output.
//
// Returns false and launches nothing when the call is not one it handles
// (decode state or kv_lens set, q_len < 2, another head_dim or dtype, a device below
// sm_80 or without the shared memory it needs, a grid dimension too large,
// kv_len > INT_MAX - 256, a pointer not 16-byte aligned), so the caller can
// fall back. Throws
// ferrum::Error (ErrorCode::Cuda) when a CUDA call or the launch fails.
bool launch_attention_prefill_tc(const AttentionArgs& args, cudaStream_t stream);

}  // namespace ferrum::kernels
