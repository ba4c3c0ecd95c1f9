#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/fast_divmod.cuh"
#include "kernels/common/row_copy.cuh"
#include "kernels/kv_cache.hpp"

namespace ferrum::kernels {
namespace {

template <class T>
struct KvAppendRows {
  T* cache_k;                // [nkv, capacity, hd]
  T* cache_v;                // [nkv, capacity, hd]
  const T* new_k;            // [nkv, new_tokens, hd]
  const T* new_v;            // [nkv, new_tokens, hd]
  long long cache_len;       // the first row written (without a decode state)
  const DecodeState* state;  // [1]: state->pos is the first row written (device-state mode; else null)
  long long capacity, nkv, hd;
  IndexDivider new_tokens;  // the rows appended per head, over r < nkv * new_tokens
  DeviceErrorLog* error_log;  // [1]

  // r enumerates [K | V] x [nkv] x [new_tokens].
  __device__ RowPtrs<T> operator()(long long r, long long c) const {
    const long long base = state != nullptr ? state->pos : cache_len;
    if (base < 0 || base > capacity - new_tokens.divisor) {
      // A row outside the cache: base when it is negative, else the run's last.
      report_device_error(error_log, kErrKvAppendPosition, base < 0 ? base : base + new_tokens.divisor - 1,
                          capacity);
      return {nullptr, nullptr};
    }
    const long long per_tensor = nkv * new_tokens.divisor;
    const bool is_v = r >= per_tensor;
    const long long rr = is_v ? r - per_tensor : r;
    const long long h = new_tokens.div(rr);
    const long long t = rr - h * new_tokens.divisor;
    const T* src = (is_v ? new_v : new_k) + rr * hd + c;
    T* dst = (is_v ? cache_v : cache_k) + (h * capacity + base + t) * hd + c;
    return {src, dst};
  }
};

}  // namespace

void launch_kv_cache_append(DType dtype, void* cache_k, void* cache_v, const void* new_k, const void* new_v,
                            long long cache_len, const DecodeState* state, long long capacity, long long new_tokens,
                            long long nkv, long long hd, DeviceErrorLog* error_log, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "kv_cache_append_head_major", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const KvAppendRows<T> map{static_cast<T*>(cache_k), static_cast<T*>(cache_v), static_cast<const T*>(new_k),
                              static_cast<const T*>(new_v), cache_len, state, capacity, nkv, hd,
                              IndexDivider(new_tokens, nkv * new_tokens), error_log};
    launch_copy_rows<T>("kv_cache_append_head_major", 2 * nkv * new_tokens, hd,
                        all_aligned16(cache_k, cache_v, new_k, new_v), map, stream);
  });
  check_launch("kv_cache_append_head_major");
}

}  // namespace ferrum::kernels
