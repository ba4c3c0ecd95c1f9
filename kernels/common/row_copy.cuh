// Row copies with an index map: the shared engine of embedding lookup,
// split_qkv, transpose_head_to_token and the KV-cache append. A map functor
// turns (row, column) of the vector being copied into {src, dst} element
// pointers: dst == nullptr skips it, src == nullptr writes zeros.
#pragma once

#include "kernels/common/fast_divmod.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {

template <class T>
struct RowPtrs {
  const T* src;
  T* dst;
};

inline constexpr int kRowCopyThreads = 256;
inline constexpr int kRowCopyItems = 2;

// vec_per_row: row_len / VW, as a divider over the launch's vector indices
// (a 64-bit division per vector was a large share of the instructions of a
// copy that moves 16 bytes per vector).
template <class T, int VW, class Map>
__global__ void copy_rows_kernel(long long rows, IndexDivider vec_per_row, Map map) {
  pdl_begin();
  using V = vec_t<T, VW>;
  const long long total = rows * vec_per_row.divisor;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x * kRowCopyItems + threadIdx.x;
  V data[kRowCopyItems];
  T* dst[kRowCopyItems];
#pragma unroll
  for (int it = 0; it < kRowCopyItems; ++it) {
    const long long vi = first + static_cast<long long>(it) * blockDim.x;
    dst[it] = nullptr;
    if (vi < total) {
      const long long r = vec_per_row.div(vi);
      const long long c = (vi - r * vec_per_row.divisor) * VW;
      const RowPtrs<T> p = map(r, c);
      if (p.dst != nullptr) {
        dst[it] = p.dst;
        if (p.src != nullptr) {
          data[it].load(p.src);
        } else {
#pragma unroll
          for (int j = 0; j < VW; ++j) data[it].set(j, 0.0f);
        }
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kRowCopyItems; ++it) {
    if (dst[it] != nullptr) data[it].store(dst[it]);
  }
}

// Launches with 16-byte vectors when row_len allows it and `wide_ok` says
// every base pointer is 16-byte aligned and every split point the map makes
// falls on a vector boundary.
template <class T, class Map>
void launch_copy_rows(const char* op, long long rows, long long row_len, bool wide_ok, Map map, cudaStream_t stream) {
  constexpr int kWide = kVec16<T>;
  const bool wide = wide_ok && row_len % kWide == 0;
  const long long vec_per_row = wide ? row_len / kWide : row_len;
  const long long per_block = static_cast<long long>(kRowCopyThreads) * kRowCopyItems;
  const long long blocks = (rows * vec_per_row + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned>(blocks));
  const IndexDivider vec_div(vec_per_row, blocks * per_block);  // every vi the grid forms
  if (wide) {
    launch_pdl(op, copy_rows_kernel<T, kWide, Map>, grid, kRowCopyThreads, 0, stream, rows, vec_div, map);
  } else {
    launch_pdl(op, copy_rows_kernel<T, 1, Map>, grid, kRowCopyThreads, 0, stream, rows, vec_div, map);
  }
}

}  // namespace ferrum::kernels
