#include "kernels/common/check.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {
namespace {

__global__ void set_decode_state_kernel(DecodeState* state, std::int32_t token, std::int32_t pos,
                                        std::int32_t kv_len) {
  state->token = token;
  state->pos = pos;
  state->kv_len = kv_len;
}

}  // namespace

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
