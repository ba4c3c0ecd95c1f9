// The device-side decode state that `_dyn` kernels read, and the flag
// through which kernels report bad device-side values.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ferrum::kernels {

// Lives in device memory for the life of the process (graphs point at it).
struct DecodeState {
  std::int32_t token;   // the token fed to embedding_lookup
  std::int32_t pos;     // its position: RoPE position and KV append row
  std::int32_t kv_len;  // keys attention sees (pos + 1)
};

// Bits a kernel sets in the device error word (host-mapped memory, read at
// synchronize()). Plain stores: if two errors race, one of them is reported.
enum DeviceErrorBits : std::uint32_t {
  kErrEmbeddingIdOutOfRange = 1u << 0,
  kErrRopePositionOutOfRange = 1u << 1,
  kErrKvAppendOverCapacity = 1u << 2,
  kErrAttnKvLenOutOfRange = 1u << 3,
  kErrDecodeLogOverCapacity = 1u << 4,
};

// Writes the decode state with one tiny kernel: the values travel as kernel
// arguments, so there is no host buffer to race with and nothing pageable.
void launch_set_decode_state(DecodeState* state,  // [1] DecodeState in device memory: every field overwritten
                             std::int32_t token, std::int32_t pos, std::int32_t kv_len, cudaStream_t stream);

// The decode step on the device (Backend::advance_decode_state):
// token_log[pos + 1] = *next_token, token = *next_token, pos += 1,
// kv_len += 1; with pos + 1 outside [0, log_size) nothing changes and
// kErrDecodeLogOverCapacity is set. Launched with PDL (it waits for the
// argmax in front of it).
void launch_advance_decode_state(DecodeState* state,              // [1] DecodeState in device memory: read, advanced
                                 const std::int32_t* next_token,  // [1] i32 token id (device): the one just chosen
                                 std::int32_t* token_log,         // [log_size] i32 token ids: slot pos + 1 written
                                 long long log_size,
                                 std::uint32_t* error_flag,       // [1] u32 device error word (DeviceErrorBits; null:
                                                                  // none): kErrDecodeLogOverCapacity stored into it
                                 cudaStream_t stream);

// Whether the current device can run this build's kernels: cudaSuccess, or
// the runtime's answer for one of them (cudaFuncGetAttributes) -- e.g.
// cudaErrorNoKernelImageForDevice when CMAKE_CUDA_ARCHITECTURES does not
// cover the device (the default 90a runs on compute capability 9.0 only).
cudaError_t probe_kernel_image();

}  // namespace ferrum::kernels
