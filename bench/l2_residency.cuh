// Kernels of ferrum_bench_l2_residency (bench/l2_residency.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferrum::bench {

// Small finite f16 values over numel elements of p.
void launch_fill_f16(void* p, std::size_t numel, cudaStream_t stream);

// What the graph branch does with a weight: nothing (an empty kernel, the
// fork's own cost), the bulk L2 prefetch hint over its bytes, or real reads
// through L2 whose results are dropped (sink: one word, written never), once
// or four times from CTAs spread over the grid.
enum class L2Branch { Empty, Hint, Load, Load4 };
void launch_l2_branch(L2Branch what, const void* weight, std::size_t bytes, std::uint32_t* sink, cudaStream_t stream);

}  // namespace ferrum::bench
