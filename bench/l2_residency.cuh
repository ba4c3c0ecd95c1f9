// Kernels of ferrum_bench_l2_residency (bench/l2_residency.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferrum::bench {

// Small finite f16 values over numel elements of p.
void launch_fill_f16(void* p, std::size_t numel, cudaStream_t stream);

// What a staging kernel does with a weight's bytes: nothing (an empty kernel:
// a fork's own cost), the bulk L2 prefetch hint, the per-thread line
// prefetch (prefetch.global.L2), or real reads through L2 whose results are
// dropped (`sink`: one word, stored only if the reads' XOR equals a key),
// once or from four CTAs per line spread over the grid. Grids are sized from
// num_sms.
enum class L2Stage { Empty, Hint, Lines, Load, Load4 };
void launch_l2_stage(L2Stage what, const void* weight, std::size_t bytes, std::uint32_t* sink, int num_sms,
                     cudaStream_t stream);

}  // namespace ferrum::bench
