#include "kernels/common/check.hpp"
#include "kernels/common/row_copy.cuh"
#include "kernels/reshape.hpp"

namespace ferrum::kernels {
namespace {

// One pass over qkv: each vector goes to q, k or v by its column. Vectors
// never straddle a part because q_dim and kv_dim are multiples of VW.
template <class T, int VW>
__global__ void split_qkv_kernel(const T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ k,
                                 T* __restrict__ v, long long tokens, long long q_dim, long long kv_dim) {
  using V = vec_t<T, VW>;
  const long long row = q_dim + 2 * kv_dim;
  const long long vec_per_row = row / VW;
  const long long total = tokens * vec_per_row;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x * kRowCopyItems + threadIdx.x;
  V data[kRowCopyItems];
  T* dst[kRowCopyItems];
#pragma unroll
  for (int it = 0; it < kRowCopyItems; ++it) {
    const long long vi = first + static_cast<long long>(it) * blockDim.x;
    dst[it] = nullptr;
    if (vi < total) {
      const long long t = vi / vec_per_row;
      const long long c = (vi - t * vec_per_row) * VW;
      data[it].load(qkv + t * row + c);
      if (c < q_dim) {
        dst[it] = q + t * q_dim + c;
      } else if (c < q_dim + kv_dim) {
        dst[it] = k + t * kv_dim + (c - q_dim);
      } else {
        dst[it] = v + t * kv_dim + (c - q_dim - kv_dim);
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kRowCopyItems; ++it) {
    if (dst[it] != nullptr) data[it].store(dst[it]);
  }
}

template <class T>
struct HeadToTokenRows {
  const T* src;  // [heads, tokens, dim]
  T* dst;        // [tokens, heads, dim]
  long long tokens, heads, dim;

  __device__ RowPtrs<T> operator()(long long r) const {  // r = t * heads + h
    const long long t = r / heads;
    const long long h = r - t * heads;
    return {src + (h * tokens + t) * dim, dst + r * dim};
  }
};

}  // namespace

void launch_split_qkv(DType dtype, const void* qkv, void* q, void* k, void* v, long long tokens, long long q_dim,
                      long long kv_dim, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "split_qkv", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = kVec16<T>;
    const bool wide = q_dim % kWide == 0 && kv_dim % kWide == 0 && all_aligned16(qkv, q, k, v);
    const long long vec_per_row = (q_dim + 2 * kv_dim) / (wide ? kWide : 1);
    const long long per_block = static_cast<long long>(kRowCopyThreads) * kRowCopyItems;
    const auto blocks = static_cast<unsigned>((tokens * vec_per_row + per_block - 1) / per_block);
    auto* qkv_t = static_cast<const T*>(qkv);
    if (wide) {
      split_qkv_kernel<T, kWide><<<blocks, kRowCopyThreads, 0, stream>>>(
          qkv_t, static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), tokens, q_dim, kv_dim);
    } else {
      split_qkv_kernel<T, 1><<<blocks, kRowCopyThreads, 0, stream>>>(
          qkv_t, static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), tokens, q_dim, kv_dim);
    }
  });
  check_launch("split_qkv");
}

void launch_transpose_head_to_token(DType dtype, const void* src, void* dst, long long tokens, long long heads,
                                    long long dim, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "transpose_head_to_token", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const HeadToTokenRows<T> map{static_cast<const T*>(src), static_cast<T*>(dst), tokens, heads, dim};
    launch_copy_rows<T>(tokens * heads, dim, all_aligned16(src, dst), map, stream);
  });
  check_launch("transpose_head_to_token");
}

}  // namespace ferrum::kernels
