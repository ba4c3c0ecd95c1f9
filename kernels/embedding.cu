#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/row_copy.cuh"
#include "kernels/embedding.hpp"

namespace ferrum::kernels {
namespace {

template <class T>
struct EmbeddingRows {
  const T* table;  // [vocab, dim]
  const std::int32_t* ids;  // [tokens] (null when reading the decode state)
  const DecodeState* state;  // [1]: state->token is the one id (device-state mode; else null)
  T* out;  // [tokens, dim]
  long long dim;
  long long vocab;
  DeviceErrorLog* error_log;  // [1]

  __device__ RowPtrs<T> operator()(long long t, long long c) const {
    const long long id = state != nullptr ? state->token : ids[t];
    if (id < 0 || id >= vocab) {
      report_device_error(error_log, kErrEmbeddingId, id, vocab);
      return {nullptr, out + t * dim + c};
    }
    return {table + id * dim + c, out + t * dim + c};
  }
};

}  // namespace

void launch_embedding_lookup(DType dtype, const void* table, const std::int32_t* ids, const DecodeState* state,
                             void* out, long long tokens, long long dim, long long vocab, DeviceErrorLog* error_log,
                             cudaStream_t stream) {
  dispatch_half_dtype(dtype, "embedding_lookup", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const EmbeddingRows<T> map{static_cast<const T*>(table), ids, state, static_cast<T*>(out), dim, vocab, error_log};
    launch_copy_rows<T>("embedding_lookup", tokens, dim, all_aligned16(table, out), map, stream);
  });
  check_launch("embedding_lookup");
}

}  // namespace ferrum::kernels
