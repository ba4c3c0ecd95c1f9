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

}  // namespace ferrum::kernels
