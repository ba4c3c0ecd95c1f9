// attention_decode_workspace_bytes (cuda_backend.hpp): host arithmetic, in
// every build (a FERRUM_CUDA=OFF one too), so that an engine sizes
// CudaBackendConfig::attention_workspace_bytes the same way wherever it is
// built.
#include <cstddef>
#include <limits>
#include <optional>
#include <utility>

#include "common/fail.hpp"
#include "ferrum/cuda_backend.hpp"
#include "kernels/attention_split.hpp"

namespace ferrum {

std::size_t attention_decode_workspace_bytes(std::size_t batch, std::size_t num_heads, std::size_t head_dim,
                                             std::size_t kv_seq_stride) {
  constexpr auto kMost = static_cast<std::size_t>(std::numeric_limits<int>::max());
  for (const auto& [name, value] : {std::pair<const char*, std::size_t>{"batch", batch}, {"num_heads", num_heads},
                                    {"head_dim", head_dim}, {"kv_seq_stride", kv_seq_stride}}) {
    if (value == 0 || value > kMost) {
      detail::fail(ErrorCode::InvalidArgument,
                   "attention_decode_workspace_bytes: argument '{}' = {} is outside [1, {}]", name, value, kMost);
    }
  }
  const std::optional<std::size_t> floats =
      kernels::attention_decode_workspace_floats(batch, num_heads, head_dim, static_cast<long long>(kv_seq_stride));
  if (!floats || *floats > std::numeric_limits<std::size_t>::max() / sizeof(float)) {
    detail::fail(ErrorCode::InvalidArgument,
                 "attention_decode_workspace_bytes: batch = {} x num_heads = {} x {} splits x (head_dim = {} + 1) "
                 "floats pass 2^64 bytes",
                 batch, num_heads, kernels::attention_decode_splits(static_cast<long long>(kv_seq_stride)), head_dim);
  }
  return *floats * sizeof(float);
}

}  // namespace ferrum
