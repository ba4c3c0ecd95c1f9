// Kernels of ferrum_bench_l2_residency (bench/l2_residency.cpp): a weight
// filler and the staging kernels.
#include "l2_residency.cuh"

#include "kernels/common/mma.cuh"  // prefetch_l2_bulk

namespace ferrum::bench {
namespace {

// Small finite f16 values (the GEMM's result is not looked at).
__global__ void fill_f16_kernel(std::uint16_t* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const auto h = static_cast<std::uint32_t>(i * 2654435761u);
    p[i] = static_cast<std::uint16_t>(0x1C00u | (h >> 22) | ((h & 1u) << 15));
  }
}

// The hint: a 4 KiB piece per thread, consecutive pieces on different CTAs
// (one CTA per SM), so every SM's copy unit takes a share (session 56's first
// form gave an 8 MB weight's 16 KiB pieces to two CTAs: 0.44 TB/s). The
// reads: 2 CTAs per SM, 8 loads in flight per thread.
constexpr int kHintThreads = 32;
constexpr std::uint32_t kHintBytes = 4096;
constexpr int kLoadCtasPerSm = 2;
constexpr int kLoadThreads = 256;

__global__ void empty_kernel() {}

// The per-thread form of the hint: prefetch.global.L2, one 128-byte line per
// instruction, issued by the SMs' load units rather than their copy units
// (the bulk hint measured slower than nothing in session 56); the same grid
// as the reads.
__global__ void prefetch_lines_kernel(const unsigned char* src, std::size_t bytes) {
  constexpr std::size_t kLine = 128;
  const std::size_t lines = (bytes + kLine - 1) / kLine;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < lines;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(src + i * kLine) : "memory");
  }
}

__global__ void prefetch_hint_kernel(const unsigned char* src, std::size_t bytes) {
  const std::size_t pieces = (bytes + kHintBytes - 1) / kHintBytes;
  for (std::size_t i = threadIdx.x * static_cast<std::size_t>(gridDim.x) + blockIdx.x; i < pieces;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t at = i * kHintBytes;
    kernels::prefetch_l2_bulk(src + at, static_cast<std::uint32_t>(bytes - at < kHintBytes ? bytes - at : kHintBytes));
  }
}

// `passes` reads of the whole weight; pass t rotates the CTAs' ranges by
// t / passes of the grid plus t CTAs (the odd shift keeps a line's readers
// off one SM where the grid is a multiple of the SM count), so each line is
// read from `passes` CTAs on different SMs. Written to test whether an L2
// partition serves its lines only to the SMs wired to it; the serial rows
// (loadS: one pass, hot speed) say it does not.
__global__ void prefetch_load_kernel(const uint4* src, std::size_t vecs, int passes, std::uint32_t* sink) {
  std::uint32_t acc = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (int t = 0; t < passes; ++t) {
    const std::size_t shift = static_cast<std::size_t>(t) * gridDim.x / passes + t;
    const std::size_t block = (blockIdx.x + shift) % gridDim.x;
    for (std::size_t base = block * blockDim.x + threadIdx.x; base < vecs; base += stride * 8) {
      uint4 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::size_t at = base + i * stride;
        if (at < vecs) {
          asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w)
                       : "l"(src + at));
        } else {
          v[i] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

}  // namespace

void launch_fill_f16(void* p, std::size_t numel, cudaStream_t stream) {
  fill_f16_kernel<<<264, 256, 0, stream>>>(static_cast<std::uint16_t*>(p), numel);
}

void launch_l2_stage(L2Stage what, const void* weight, std::size_t bytes, std::uint32_t* sink, int num_sms,
                     cudaStream_t stream) {
  switch (what) {
    case L2Stage::Empty:
      empty_kernel<<<1, 32, 0, stream>>>();
      break;
    case L2Stage::Hint:
      prefetch_hint_kernel<<<num_sms, kHintThreads, 0, stream>>>(static_cast<const unsigned char*>(weight), bytes);
      break;
    case L2Stage::Lines:
      prefetch_lines_kernel<<<num_sms * kLoadCtasPerSm, kLoadThreads, 0, stream>>>(
          static_cast<const unsigned char*>(weight), bytes);
      break;
    case L2Stage::Load:
    case L2Stage::Load4:
      prefetch_load_kernel<<<num_sms * kLoadCtasPerSm, kLoadThreads, 0, stream>>>(
          static_cast<const uint4*>(weight), bytes / 16, what == L2Stage::Load ? 1 : 4, sink);
      break;
  }
}

}  // namespace ferrum::bench
