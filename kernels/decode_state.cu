#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {
namespace {

__global__ void set_decode_state_kernel(DecodeState* state,  // [1]
                                        std::int32_t token, std::int32_t pos, std::int32_t kv_len) {
  state->token = token;
  state->pos = pos;
  state->kv_len = kv_len;
}

__global__ void advance_decode_state_kernel(DecodeState* state,                // [1]
                                            const std::int32_t* next_token,    // [1]
                                            std::int32_t* token_log,           // [log_size]
                                            long long log_size, DeviceErrorLog* error_log) {  // [1]
  pdl_begin();
  const std::int32_t pos = state->pos;
  const long long at = static_cast<long long>(pos) + 1;
  if (at < 0 || at >= log_size) {
    report_device_error(error_log, kErrDecodeLogPosition, at, log_size);
    return;
  }
  const std::int32_t token = *next_token;
  token_log[at] = token;
  state->token = token;
  state->pos = pos + 1;
  state->kv_len += 1;
}

}  // namespace

void launch_advance_decode_state(DecodeState* state, const std::int32_t* next_token, std::int32_t* token_log,
                                 long long log_size, DeviceErrorLog* error_log, cudaStream_t stream) {
  launch_pdl("advance_decode_state", advance_decode_state_kernel, dim3(1), dim3(1), 0, stream, state, next_token,
             token_log, log_size, error_log);
  check_launch("advance_decode_state");
}

void launch_set_decode_state(DecodeState* state, std::int32_t token, std::int32_t pos, std::int32_t kv_len,
                             cudaStream_t stream) {
  set_decode_state_kernel<<<1, 1, 0, stream>>>(state, token, pos, kv_len);
  check_launch("set_decode_state");
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, set_decode_state_kernel);
  if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: answered, not raised
  return err;
}

}  // namespace ferrum::kernels
