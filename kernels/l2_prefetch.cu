// prefetch_l2: bulk L2 prefetches (cp.async.bulk.prefetch.L2, sm_90), one
// 16 KB piece per thread. The decode step leaves DRAM idle while its small
// ops and attention run (~20 µs per llama3-8b layer); the next projection's
// weights can stream into L2 in that window, and its GEMM then reads them at
// L2 speed. The weight loads of the skinny GEMM are evict-first, so the
// prefetched (evict-normal) lines outlive the stream around them.
#include <cstdint>

#include "kernels/common/check.hpp"
#include "kernels/common/mma.cuh"
#include "kernels/l2_prefetch.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kThreads = 32;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const char* __restrict__ base,  // [bytes], 16-aligned
                                                               unsigned long long bytes) {     // a multiple of 16
  const unsigned long long piece = kL2PrefetchPieceBytes;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * kThreads * piece;
  for (unsigned long long off = (static_cast<unsigned long long>(blockIdx.x) * kThreads + threadIdx.x) * piece;
       off < bytes; off += stride) {
    const unsigned long long left = bytes - off;
    prefetch_l2_bulk(base + off, static_cast<std::uint32_t>(left < piece ? left : piece));
  }
}

}  // namespace

void launch_l2_prefetch(const void* ptr, std::size_t bytes, int num_sms, cudaStream_t stream) {
  if (bytes == 0) throw_bad_dispatch("prefetch_l2", "bytes", 0);
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr) & ~std::uintptr_t{15};
  const auto end = (reinterpret_cast<std::uintptr_t>(ptr) + bytes + 15) & ~std::uintptr_t{15};
  const unsigned long long span = end - begin;
  const unsigned long long pieces = (span + kL2PrefetchPieceBytes - 1) / kL2PrefetchPieceBytes;
  // One piece per thread where the SMs allow it: the requests go out at
  // once, from every SM's TMA unit, and the kernel is gone in a few µs.
  const unsigned long long max_blocks = static_cast<unsigned long long>(num_sms > 0 ? num_sms : 1);
  const unsigned long long blocks_needed = (pieces + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(blocks_needed < max_blocks ? blocks_needed : max_blocks);
  l2_prefetch_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const char*>(begin), span);
  check_launch("prefetch_l2");
}

}  // namespace ferrum::kernels
