// Launcher for the tensor-core prefill path of flash_attention (q_len > 1).
// The caller (launch_attention) has validated; this only decides whether the
// call is one the kernel handles.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention.hpp"

namespace ferrum::kernels {

// Whether a call is one the tensor-core prefill kernels handle at all (both
// kernels below also need their head_dim, device and shared memory): q_len
// >= 2 without decode state or kv_lens, f16 / bf16, batch and heads within
// the grid limits, a consistent GQA ratio, 0 <= kv_len <= kv_stride, kv_len
// <= INT_MAX - 256 (key indices are int in the kernels), pos_offset >= 0,
// scale > 0, every pointer 16-byte aligned.
bool prefill_tc_applies(const AttentionArgs& args);

// FlashAttention-2-style prefill on tensor cores (mma.sync m16n8k16, fp32
// accumulate): f16 / bf16, head_dim 64 / 128 / 256, GQA, causal with
// pos_offset, kv_stride >= kv_len, any q_len / kv_len. Deterministic: the
// query-block shape (64 or 128 rows, picked from the grid size and the
// device's SM count) does not change a bit of the output.
//
// Returns false and launches nothing when the call is not one it handles
// (!prefill_tc_applies, a device below sm_80 or without the shared memory it
// needs), so the caller can fall back. Throws ferrum::Error
// (ErrorCode::Cuda) when a CUDA call or the launch fails.
bool launch_attention_prefill_tc(const AttentionArgs& args, cudaStream_t stream);

// The same computation on Hopper warpgroup MMA (wgmma, sm_90a;
// kernels/attention_prefill_wgmma.cu): head_dim 64 / 128, blocks of one or
// two warpgroups (64 or 128 query rows, picked from the grid size; the same
// bits either way). Deterministic, not bitwise equal to the mma.sync kernel.
// Returns false and launches nothing unless the library was built with
// sm_90a code (CMAKE_CUDA_ARCHITECTURES holding 90a, the default), the
// device is compute capability 9.0, head_dim is 64 or 128 and
// prefill_tc_applies; throws like launch_attention_prefill_tc.
bool launch_attention_prefill_wgmma(const AttentionArgs& args, cudaStream_t stream);
// Whether this build holds the wgmma kernel's sm_90a code.
bool attention_prefill_wgmma_built();

}  // namespace ferrum::kernels
