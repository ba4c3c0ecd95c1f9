// The row_sq family (kernels/row_sq.hpp): the standalone kernels of
// Backend::row_sum_squares, and of gemm_gptq_add_residual and
// rms_norm_gemm_gptq where the GPTQ streaming kernel does not take them.
// Their per-quad and per-row arithmetic is kernels/common/row_sq.cuh's, as
// the streaming kernel's fused forms, so fused and composed give the same
// bits (for the GEMM shapes: cols a multiple of 4).
#include <cstdint>

#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/row_sq.cuh"
#include "kernels/row_sq.hpp"

namespace ferrum::kernels {

namespace {

constexpr int kQuadThreads = 128;  // quads of one row per block (whole warps: a group's 4 lanes in one warp)
constexpr int kNormThreads = 128;

// A quad of columns 4q .. 4q + 3 of row `row`, those >= cols read as 0
// (element loads: any cols, any alignment).
template <class T>
__device__ __forceinline__ float4 load_quad_any(const T* row, int c, int cols) {
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = c + i < cols ? to_float(row[c + i]) : 0.0f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

// grid (rows, ceil(quads / kQuadThreads)) (rows along x: up to 2^31 - 1):
// thread t of block (row, by) takes quad by * kQuadThreads + t of the row. kAdd: residual = T(residual + out)
// first (x is out, the new residual is summed); else the squares of x.
template <class T, bool kAdd>
__global__ void __launch_bounds__(kQuadThreads) row_sq_kernel(const T* x /*[rows, cols]*/,
                                                              T* residual /*[rows, cols] (kAdd)*/,
                                                              float* row_sq /*[rows, groups]*/, int cols) {
  pdl_begin();
  const int row = static_cast<int>(blockIdx.x);
  const int q = static_cast<int>(blockIdx.y) * kQuadThreads + static_cast<int>(threadIdx.x);
  const int c = q * 4;
  const std::size_t at = static_cast<std::size_t>(row) * cols;
  float sq = 0.0f;
  if (c < cols) {
    float4 h = load_quad_any(x + at, c, cols);
    if constexpr (kAdd) {
      h = residual_add_quad<T>(load_quad_any(residual + at, c, cols), h);
      const float v[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (c + i < cols) residual[at + c + i] = from_float<T>(v[i]);
      }
    }
    sq = row_sq_quad(h);
  }
  const float group = row_sq_group(sq);  // every lane (shuffles)
  if (c < cols && c % kRowSqCols == 0) {
    row_sq[static_cast<std::size_t>(row) * ((cols + kRowSqCols - 1) / kRowSqCols) + c / kRowSqCols] = group;
  }
}

// One block per row; every warp takes inv from row_sq (the same bits), the
// block's threads stride over the row's columns.
template <class T>
__global__ void __launch_bounds__(kNormThreads) rms_norm_from_row_sq_kernel(const T* x /*[rows, cols]*/,
                                                                            const float* row_sq /*[rows, groups]*/,
                                                                            const T* norm_w /*[cols]*/, float eps,
                                                                            T* normed /*[rows, cols]*/, int cols) {
  pdl_begin();
  const int row = static_cast<int>(blockIdx.x);
  const int groups = (cols + kRowSqCols - 1) / kRowSqCols;
  const float inv =
      rms_inv_from_row_sq(row_sq + static_cast<std::size_t>(row) * groups, groups, cols, eps, threadIdx.x & 31);
  const std::size_t at = static_cast<std::size_t>(row) * cols;
  for (int c = static_cast<int>(threadIdx.x); c < cols; c += kNormThreads) {
    normed[at + c] = from_float<T>(rms_scaled(to_float(x[at + c]), inv, to_float(norm_w[c])));
  }
}

// x: [rows, cols]; residual: [rows, cols] (kAdd: residual += x, then its
// squares; else null); row_sq: [rows, ceil(cols / 16)] f32, written.
template <bool kAdd>
void launch_row_sq(const char* op, DType dtype, const void* x, void* residual, float* row_sq, int rows, int cols,
                   cudaStream_t stream) {
  if (rows < 1) throw_bad_dispatch(op, "rows", rows);
  if (cols < 1) throw_bad_dispatch(op, "cols", cols);
  // Strips of 4 * kQuadThreads columns along grid.y (at most 65535).
  static_assert(kRowSqMaxCols == 65535 * 4 * kQuadThreads, "row_sq.hpp's limit is this launch's");
  if (cols > kRowSqMaxCols) throw_size_limit(op, "cols", cols, kRowSqMaxCols);
  const int quads = (cols + 3) / 4;
  const int strips = (quads + kQuadThreads - 1) / kQuadThreads;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(strips));
  dispatch_half_dtype(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_pdl(op, row_sq_kernel<T, kAdd>, grid, dim3(kQuadThreads), 0, stream, static_cast<const T*>(x),
               static_cast<T*>(residual), row_sq, cols);
  });
}

}  // namespace

void launch_row_sum_squares(DType dtype, const void* x, float* row_sq, int rows, int cols, cudaStream_t stream) {
  launch_row_sq<false>("row_sum_squares", dtype, x, nullptr, row_sq, rows, cols, stream);
}

void launch_add_residual_row_sq(DType dtype, const void* out, void* residual, float* row_sq, int rows, int cols,
                                cudaStream_t stream) {
  launch_row_sq<true>("gemm_gptq_add_residual", dtype, out, residual, row_sq, rows, cols, stream);
}

void launch_rms_norm_from_row_sq(const char* op, DType dtype, const void* x, const float* row_sq, const void* norm_w,
                                 float eps, void* normed, int rows, int cols, cudaStream_t stream) {
  if (rows < 1) throw_bad_dispatch(op, "rows", rows);
  if (cols < 1) throw_bad_dispatch(op, "cols", cols);
  dispatch_half_dtype(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_pdl(op, rms_norm_from_row_sq_kernel<T>, dim3(static_cast<unsigned>(rows)),
               dim3(kNormThreads), 0, stream, static_cast<const T*>(x), row_sq, static_cast<const T*>(norm_w), eps,
               static_cast<T*>(normed), cols);
  });
}

}  // namespace ferrum::kernels
