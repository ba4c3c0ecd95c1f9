// argmax over rows: one block of 1024 threads per row (a decode step has one
// row of vocab_size logits; a vocabulary of 128k halves is 256 KB, which one
// block reads in about 2 µs). Values compare in fp32 (exact for f16 and
// bf16). The winner is unique (the first maximum, NaN above every number),
// so the result does not depend on the reduction order.
#include <cstdint>

#include "kernels/argmax.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {
namespace {

constexpr int kThreads = 1024;

struct Candidate {
  float value;
  int index;
};

// Whether a beats b: a NaN beats a number; between equal values (or two
// NaNs) the smaller index wins.
__device__ __forceinline__ bool beats(const Candidate& a, const Candidate& b) {
  const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

__device__ __forceinline__ void offer(Candidate& best, float value, int index) {
  const Candidate c{value, index};
  if (beats(c, best)) best = c;
}

// The best candidate of the warp, in every lane (butterfly).
__device__ __forceinline__ Candidate warp_best_of(Candidate best) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const Candidate other{__shfl_xor_sync(0xffffffffu, best.value, o), __shfl_xor_sync(0xffffffffu, best.index, o)};
    if (beats(other, best)) best = other;
  }
  return best;
}

// VW elements per access: 16-byte vectors when the row allows, else 1.
template <class T, int VW>
__global__ void __launch_bounds__(kThreads) argmax_kernel(const T* __restrict__ x,  // [rows, cols]
                                                          std::int32_t* __restrict__ out,  // [rows]
                                                          int cols) {
  pdl_begin();
  const T* row = x + static_cast<long long>(blockIdx.x) * cols;
  Candidate best{-INFINITY, cols};  // beaten by any real column (index < cols)
  const int nvec = cols / VW;
  for (int v = threadIdx.x; v < nvec; v += kThreads) {
    vec_t<T, VW> chunk;
    chunk.load_stream(row + static_cast<long long>(v) * VW);
#pragma unroll
    for (int j = 0; j < VW; ++j) offer(best, chunk.f(j), v * VW + j);
  }
  for (int c = nvec * VW + static_cast<int>(threadIdx.x); c < cols; c += kThreads) offer(best, to_float(row[c]), c);

  // Warp, then block: every step keeps the better of two candidates.
  best = warp_best_of(best);
  __shared__ Candidate warp_best[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = warp_best_of(warp_best[lane]);  // kThreads / 32 == 32 warps
    if (lane == 0) out[blockIdx.x] = best.index;
  }
}
static_assert(kThreads / 32 == 32, "the block step reduces one candidate per warp in one warp");

template <class T>
void launch_typed(const void* x, std::int32_t* out, long long rows, long long cols, cudaStream_t stream) {
  constexpr int kWide = kVec16<T>;
  const auto* xt = static_cast<const T*>(x);
  const dim3 grid(static_cast<unsigned>(rows));
  // Every row starts 16-byte aligned when the base is and cols is a multiple of the vector.
  if (aligned16(x) && cols % kWide == 0) {
    launch_pdl("argmax", argmax_kernel<T, kWide>, grid, kThreads, 0, stream, xt, out, static_cast<int>(cols));
  } else {
    launch_pdl("argmax", argmax_kernel<T, 1>, grid, kThreads, 0, stream, xt, out, static_cast<int>(cols));
  }
}

}  // namespace

void launch_argmax(DType dtype, const void* x, std::int32_t* out, long long rows, long long cols,
                   cudaStream_t stream) {
  switch (dtype) {
    case DType::F16: launch_typed<__half>(x, out, rows, cols, stream); break;
    case DType::BF16: launch_typed<__nv_bfloat16>(x, out, rows, cols, stream); break;
    case DType::F32: launch_typed<float>(x, out, rows, cols, stream); break;
    default: throw_bad_dispatch("argmax", "dtype (expected f16, bf16 or f32)", static_cast<long long>(dtype));
  }
  check_launch("argmax");
}

}  // namespace ferrum::kernels
