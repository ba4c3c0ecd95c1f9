#include "read_ceiling.cuh"

#include "load_once.cuh"

#include <cstdio>
#include <cstdlib>

namespace ferrum::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;
constexpr int kInFlight = 8;  // 16-byte loads per thread before any is used

// The grid-stride walk both kernels share: each thread loads kN vectors
// (zero past the end) before any is used, then use(v, base, stride) consumes
// them (vector i of the batch is at base + i * stride).
template <int kN, class Use>
__device__ __forceinline__ void for_each_batch(const uint4* __restrict__ src, long long vecs, Use&& use) {
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long base = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; base < vecs;
       base += stride * kN) {
    uint4 v[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const long long at = base + i * stride;
      v[i] = at < vecs ? load_once(src + at) : make_uint4(0u, 0u, 0u, 0u);
    }
    use(v, base, stride);
  }
}

__global__ void __launch_bounds__(kThreads) read_ceiling_kernel(const uint4* __restrict__ src, long long vecs,
                                                                std::uint32_t* __restrict__ sink) {
  std::uint32_t acc = 0;
  for_each_batch<kInFlight>(src, vecs, [&](const uint4(&v)[kInFlight], long long, long long) {
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  });
  // One word per block: a warp-level XOR, then lane 0 of warp 0 publishes
  // (the other warps' words are folded through shared memory).
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ std::uint32_t warp_acc[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t all = 0;
    for (int w = 0; w < kThreads / 32; ++w) all ^= warp_acc[w];
    sink[blockIdx.x] = all;
  }
}

constexpr int kCopyInFlight = 4;

__global__ void __launch_bounds__(kThreads) copy_ceiling_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                                long long vecs) {
  for_each_batch<kCopyInFlight>(src, vecs, [&](const uint4(&v)[kCopyInFlight], long long base, long long stride) {
#pragma unroll
    for (int i = 0; i < kCopyInFlight; ++i) {
      const long long at = base + i * stride;
      if (at < vecs) dst[at] = v[i];
    }
  });
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s launch: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

}  // namespace

void launch_copy_ceiling(const void* src, void* dst, std::size_t bytes, int num_sms, cudaStream_t stream) {
  copy_ceiling_kernel<<<num_sms * kBlocksPerSm, kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), static_cast<long long>(bytes / 16));
  check_launch("copy_ceiling_kernel");
}

int read_ceiling_blocks(int num_sms) { return num_sms * kBlocksPerSm; }

void launch_read_ceiling(const void* src, std::size_t bytes, std::uint32_t* sink, int num_sms, cudaStream_t stream) {
  read_ceiling_kernel<<<read_ceiling_blocks(num_sms), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<long long>(bytes / 16), sink);
  check_launch("read_ceiling_kernel");
}

}  // namespace ferrum::bench
