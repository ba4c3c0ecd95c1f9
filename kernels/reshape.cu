#include "kernels/common/check.hpp"
#include "kernels/common/fast_divmod.cuh"
#include "kernels/common/row_copy.cuh"
#include "kernels/reshape.hpp"

namespace ferrum::kernels {
namespace {

// One pass over qkv: each vector goes to q, k or v by its column. Vectors
// never straddle a part because q_dim and kv_dim are multiples of VW.
template <class T>
struct SplitQkvRows {
  const T* qkv;  // [tokens, q_dim + 2*kv_dim]
  T* q;          // [tokens, q_dim]
  T* k;          // [tokens, kv_dim]
  T* v;          // [tokens, kv_dim]
  long long q_dim, kv_dim;

  __device__ RowPtrs<T> operator()(long long t, long long c) const {
    const T* src = qkv + t * (q_dim + 2 * kv_dim) + c;
    if (c < q_dim) return {src, q + t * q_dim + c};
    if (c < q_dim + kv_dim) return {src, k + t * kv_dim + (c - q_dim)};
    return {src, v + t * kv_dim + (c - q_dim - kv_dim)};
  }
};

template <class T>
struct HeadToTokenRows {
  const T* src;  // [heads, tokens, dim]
  T* dst;        // [tokens, heads, dim]
  long long tokens, dim;
  IndexDivider heads;  // over r < tokens * heads

  __device__ RowPtrs<T> operator()(long long r, long long c) const {  // r = t * heads + h
    const long long t = heads.div(r);
    const long long h = r - t * heads.divisor;
    return {src + (h * tokens + t) * dim + c, dst + r * dim + c};
  }
};

}  // namespace

void launch_split_qkv(DType dtype, const void* qkv, void* q, void* k, void* v, long long tokens, long long q_dim,
                      long long kv_dim, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "split_qkv", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = kVec16<T>;
    const bool wide_ok = q_dim % kWide == 0 && kv_dim % kWide == 0 && all_aligned16(qkv, q, k, v);
    const SplitQkvRows<T> map{static_cast<const T*>(qkv), static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v),
                              q_dim, kv_dim};
    launch_copy_rows<T>("split_qkv", tokens, q_dim + 2 * kv_dim, wide_ok, map, stream);
  });
  check_launch("split_qkv");
}

void launch_transpose_head_to_token(DType dtype, const void* src, void* dst, long long tokens, long long heads,
                                    long long dim, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "transpose_head_to_token", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const HeadToTokenRows<T> map{static_cast<const T*>(src), static_cast<T*>(dst), tokens, dim,
                                 IndexDivider(heads, tokens * heads)};
    launch_copy_rows<T>("transpose_head_to_token", tokens * heads, dim, all_aligned16(src, dst), map, stream);
  });
  check_launch("transpose_head_to_token");
}

}  // namespace ferrum::kernels
