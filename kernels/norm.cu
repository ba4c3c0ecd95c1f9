// Row norms: RMSNorm, fused residual-add + RMSNorm, LayerNorm.
//
// One kernel body serves all three (NormKind is a template parameter), so
// the loads, reductions and stores cannot drift apart. A row is handled by a
// group of G threads (G a power of two, up to 1024); each thread keeps NVEC
// vectors of VW elements in registers, so the row is read from memory once.
// Rows too long for registers take the row-loop kernel, which re-reads them.
#include <algorithm>
#include <type_traits>

#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/norm.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kMaxNvec = 8;
constexpr int kMaxGroup = 1024;

const char* norm_op_name(NormKind kind) {
  return kind == NormKind::Rms ? "rms_norm" : kind == NormKind::AddRms ? "fused_add_rms_norm" : "layer_norm";
}

// Sum of v over the G threads of this thread's row. For G > 32 this uses
// shared memory and __syncthreads, so every thread of the block must call it.
// kMaskIndex: G is a power of two, and the row's first warp comes by mask
// (norm_rows_kernel's latency-bound launches, see there).
template <bool kMaskIndex = false>
__device__ __forceinline__ float row_sum(float v, int group) {
  if (group <= 32) return group_sum_in_warp(v, group);
  __shared__ float warp_partials[kMaxGroup / 32];
  v = group_sum_in_warp(v, 32);
  const int warp = threadIdx.x / 32;
  const int warps_per_row = group / 32;
  const int first = kMaskIndex ? warp & ~(warps_per_row - 1) : (warp / warps_per_row) * warps_per_row;
  if ((threadIdx.x & 31) == 0) warp_partials[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps_per_row; ++w) total += warp_partials[first + w];
  __syncthreads();  // the partials are reused by the next reduction
  return total;
}

// PREFETCH_W: load weight (and bias) with x, before the reduction. That
// removes a dependent DRAM round trip when the grid is too small to hide
// latency (decode shapes); on large grids the weight is L2-hot and the extra
// registers would cost occupancy, so it is loaded after the reduction.
//
// Launch bounds: blocks of up to 1024 threads must fit the register file, so
// the compiler keeps these kernels at 64 registers (bf16 otherwise unpacks
// everything to fp32 and halves occupancy); the 8-vector variant is only
// launched with 256 threads and may use more.
template <NormKind K, class T, int VW, int NVEC, bool PREFETCH_W>
__global__ void __launch_bounds__(NVEC == 8 ? 256 : 1024) norm_rows_kernel(const T* __restrict__ x,       // [rows, dim]
                                 T* residual,                    // [rows, dim] (AddRms)
                                 const T* __restrict__ weight,  // [dim]
                                 const T* __restrict__ bias,    // [dim] (Layer)
                                 T* out,                         // [rows, dim]
                                 int rows, int dim, float eps, int group, PdlTrigger trigger) {
  pdl_begin_with_trigger(trigger);  // the A/B switches of launch.cuh
  using V = vec_t<T, VW>;
  // PREFETCH_W launches (at most a block per SM: latency-bound) find row
  // and lane by shift and mask (group is a power of two, norm_launch_plan),
  // not by division routines ahead of their first load: [1..16 x 4096]
  // under graph replay 3-7 % faster. The large grids keep the divisions:
  // with shifts the compiler's schedule of f16 fused_add_rms_norm
  // [32768 x 4096] came out 2.8 % slower (H200, session 42).
  const auto by_shift = group_row_lane(group);  // the launchers keep rows below 2^31
  const int rows_per_block = blockDim.x / group;
  const int row = PREFETCH_W ? static_cast<int>(by_shift.row) : blockIdx.x * rows_per_block + threadIdx.x / group;
  const int lane = PREFETCH_W ? by_shift.g : threadIdx.x % group;
  const bool row_ok = row < rows;
  const int nvec = dim / VW;
  const long long base = static_cast<long long>(row) * dim;

  // Issue every load before the first use, so that no load waits behind a
  // store the compiler cannot prove independent (LayerNorm's weight and bias
  // without PREFETCH_W excepted: see kLoadPerVector below).
  V data[NVEC], w[NVEC], b[NVEC];
  auto load_weight_vector = [&](int i, int vi) {  // vector vi of weight (and bias) into slot i
    w[i].load(weight + static_cast<long long>(vi) * VW);
    if constexpr (K == NormKind::Layer) b[i].load(bias + static_cast<long long>(vi) * VW);
  };
  auto load_weights = [&] {
#pragma unroll
    for (int i = 0; i < NVEC; ++i) {
      const int vi = lane + i * group;
      if (row_ok && vi < nvec) load_weight_vector(i, vi);
    }
  };
#pragma unroll
  for (int i = 0; i < NVEC; ++i) {
    const int vi = lane + i * group;
    if (row_ok && vi < nvec) data[i].load(x + base + static_cast<long long>(vi) * VW);
  }
  if constexpr (PREFETCH_W) load_weights();
  if constexpr (K == NormKind::AddRms) {
    V r[NVEC];
#pragma unroll
    for (int i = 0; i < NVEC; ++i) {
      const int vi = lane + i * group;
      if (row_ok && vi < nvec) r[i].load(residual + base + static_cast<long long>(vi) * VW);
    }
#pragma unroll
    for (int i = 0; i < NVEC; ++i) {
      const int vi = lane + i * group;
      if (row_ok && vi < nvec) {
#pragma unroll
        for (int j = 0; j < VW; ++j) data[i].set(j, data[i].f(j) + r[i].f(j));  // rounded to T, as stored
        data[i].store(residual + base + static_cast<long long>(vi) * VW);
      }
    }
  }

  float mean = 0.0f;
  if constexpr (K == NormKind::Layer) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NVEC; ++i) {
      if (row_ok && lane + i * group < nvec) {
#pragma unroll
        for (int j = 0; j < VW; ++j) s += data[i].f(j);
      }
    }
    mean = row_sum<PREFETCH_W>(s, group) / static_cast<float>(dim);
  }
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < NVEC; ++i) {
    if (row_ok && lane + i * group < nvec) {
#pragma unroll
      for (int j = 0; j < VW; ++j) {
        const float d = data[i].f(j) - mean;
        sq += d * d;
      }
    }
  }
  // The row (and a prefetched weight) kept packed across the reduction, the
  // fp32 conversions redone after it (vec_t::keep_packed). bf16 -> fp32 is a
  // shift, so the compiler held fp32 copies live instead: 46 registers
  // against f16's 32 for fused_add_rms_norm at 2 vectors (fewer warps per
  // SM: [32768 x 4096] 273.7 -> 265.8 us with this) and spills at 4 vectors
  // with the prefetch. For f16 only the prefetching fused_add_rms_norm
  // gains ([1..16 x 4096] under graph replay 2.61-2.74 -> 1.91-2.10 us);
  // at [32768 x 4096] f16 went 259.7 -> 264.5 us, so it keeps the
  // compiler's own schedule elsewhere (H200, session 39).
  constexpr bool kKeepPacked = std::is_same_v<T, __nv_bfloat16> || (PREFETCH_W && K == NormKind::AddRms);
  if constexpr (kKeepPacked) {
#pragma unroll
    for (int i = 0; i < NVEC; ++i) {
      if (row_ok && lane + i * group < nvec) {  // the vectors that were loaded
        data[i].keep_packed();
        if constexpr (PREFETCH_W) w[i].keep_packed();
        if constexpr (PREFETCH_W && K == NormKind::Layer) b[i].keep_packed();
      }
    }
  }
  const float inv = rsqrtf(row_sum<PREFETCH_W>(sq, group) / static_cast<float>(dim) + eps);

  if (!row_ok) return;  // after the last block-wide reduction
  // LayerNorm reads weight and bias per vector here, not all up front: with
  // both arrays live, bf16 at 4 vectors per thread spilled past the
  // 64-register bound (61 registers this way, f16 48 instead of 64).
  constexpr bool kLoadPerVector = !PREFETCH_W && K == NormKind::Layer;
  if constexpr (!PREFETCH_W && !kLoadPerVector) load_weights();
#pragma unroll
  for (int i = 0; i < NVEC; ++i) {
    const int vi = lane + i * group;
    if (vi < nvec) {
      if constexpr (kLoadPerVector) load_weight_vector(i, vi);
      V o;
#pragma unroll
      for (int j = 0; j < VW; ++j) {
        if constexpr (K == NormKind::Layer) {
          o.set(j, ((data[i].f(j) - mean) * inv) * w[i].f(j) + b[i].f(j));
        } else {
          o.set(j, (data[i].f(j) * inv) * w[i].f(j));
        }
      }
      o.store(out + base + static_cast<long long>(vi) * VW);
    }
  }
}

// Block per row, rows longer than registers hold: accumulate, then re-read.
template <NormKind K, class T>
__global__ void __launch_bounds__(1024) norm_rows_loop_kernel(const T* __restrict__ x,       // [rows, dim]
                                                              T* residual,                    // [rows, dim] (AddRms)
                                                              const T* __restrict__ weight,  // [dim]
                                                              const T* __restrict__ bias,    // [dim] (Layer)
                                                              T* out,                         // [rows, dim]
                                                              int dim, float eps, PdlTrigger trigger) {
  pdl_begin_with_trigger(trigger);  // the A/B switches of launch.cuh
  const long long base = static_cast<long long>(blockIdx.x) * dim;
  auto value = [&](int d) {
    if constexpr (K == NormKind::AddRms) return to_float(residual[base + d]);
    return to_float(x[base + d]);
  };
  float mean = 0.0f;
  float s = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    if constexpr (K == NormKind::AddRms) {
      const T sum = from_float<T>(to_float(x[base + d]) + to_float(residual[base + d]));
      residual[base + d] = sum;  // read back below by this same thread
    }
    s += value(d);
  }
  if constexpr (K == NormKind::Layer) mean = row_sum(s, blockDim.x) / static_cast<float>(dim);
  float sq = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    const float c = value(d) - mean;
    sq += c * c;
  }
  const float inv = rsqrtf(row_sum(sq, blockDim.x) / static_cast<float>(dim) + eps);
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float o = ((value(d) - mean) * inv) * to_float(weight[d]);
    if constexpr (K == NormKind::Layer) o += to_float(bias[d]);
    out[base + d] = from_float<T>(o);
  }
}

// In 64 bits: an int version never returned for v past 2^30 (p wrapped to 0).
long long next_pow2(long long v) {
  long long p = 1;
  while (p < v) p *= 2;
  return p;
}

// Vectors per thread when the caller leaves it to us (bench/norm_tuning.cpp
// on the H200, 2026-11-30, [32768 | 4096 x 4096] at the 256-thread minimum
// block every caller uses):
//   rms      f16  t2 136.42 | 23.55 µs   t4 133.92 | 25.25   -> 2
//   rms      bf16 t2 146.18 | 24.99      t4 135.30 | 24.86   -> 4
//   add_rms  f16  t2 261.86 | 39.87      t4 281.31 | 42.30   -> 2
//   add_rms  bf16 t2 278.85 | 41.41      t4 292.51 | 42.88   -> 2
//   layer    f16  t2 190.91 | 31.55      t4 144.80 | 25.92   -> 4
//   layer    bf16 t2 193.66 | 31.71      t4 229.63 | 36.29   -> then 2: at
//            4 it hit the 64-register launch bound and spilled (session 7's
//            512-thread bound, 97 registers, no spill: 190.2 µs at 128
//            threads, 202.6 at 256). Session 8: weight and bias read per
//            vector after the reduction (61 registers, no spill) -> 4.
// Through CudaBackend (ferrum_bench): layer f16 140.0 µs, rms bf16 133.1;
// session 8 (per-vector weight loads, t4 for both): layer f16 134.5 µs
// (93.8 % of copy), bf16 142.0 (88.9 %; was 181.6).
// Session 39 (bf16 rows kept packed, 39-56 registers), the bf16 sweep again,
// single launches: add_rms 32768 rows t2 270.1 | t4 268.1 | t8 266.7 µs,
// 4096 rows t2 41.7 | t4 40.9 | t8 44.5 (chained t2 36.00 | t4 36.04);
// layer 32768 t4 144.6 | t8 140.1, 4096 t4 28.5 | t8 30.9. Within one run's
// noise or split by size: left as they were.
int tuned_vectors_per_thread(NormKind kind, DType dtype) {
  if (kind == NormKind::Layer) return 4;
  if (kind == NormKind::Rms) return dtype == DType::F16 ? 2 : 4;
  return 2;
}

}  // namespace

NormLaunchPlan norm_launch_plan(const NormArgs& a) {
  // The row loop kernel's int column index passes dim by up to a block.
  if (a.dim > kNormMaxDim) throw_size_limit(norm_op_name(a.kind), "dim", a.dim, kNormMaxDim);
  constexpr int kWide = 8;  // 16-byte vectors of 2-byte elements (f16, bf16)
  NormLaunchPlan plan;
  plan.wide = a.dim % kWide == 0 && aligned16(a.x) && aligned16(a.weight) && aligned16(a.out) &&
              (a.kind != NormKind::AddRms || aligned16(a.residual)) && (a.kind != NormKind::Layer || aligned16(a.bias));
  const long long nvec = a.dim / (plan.wide ? kWide : 1);
  // In 64 bits: near 2^31 rows or columns the int sums wrapped (a plan of
  // one vector per thread over a 2^31-column row, a negative grid, or
  // next_pow2 doubling past INT_MAX forever).
  auto plan_for = [&](int target) {
    plan.group = static_cast<int>(std::min<long long>(kMaxGroup, next_pow2((nvec + target - 1) / target)));
    plan.vectors_per_thread = next_pow2((nvec + plan.group - 1) / plan.group);
    plan.threads = std::max(plan.group, std::min(kMaxGroup, std::max(32, a.min_block_threads)));
    const long long rows_per_block = plan.threads / plan.group;
    plan.blocks = static_cast<int>((static_cast<long long>(a.rows) + rows_per_block - 1) / rows_per_block);
  };
  const int target = a.target_vectors_per_thread > 0 ? a.target_vectors_per_thread
                                                     : tuned_vectors_per_thread(a.kind, a.dtype);
  plan_for(target);
  // At most one block per SM: latency-bound. Then spread the row over more
  // threads (fewer registers each) and prefetch the weight with x.
  plan.prefetch_weight = plan.blocks <= a.num_sms;
  if (plan.prefetch_weight && target > 2) plan_for(2);  // fewer registers for the prefetched weight
  // 8 vectors per thread need up to ~230 registers: at most 256 threads.
  plan.row_loop = plan.vectors_per_thread > kMaxNvec || (plan.vectors_per_thread == kMaxNvec && plan.threads > 256);
  if (plan.row_loop) {
    plan.group = kMaxGroup;
    plan.threads = kMaxGroup;
    plan.blocks = a.rows;
  }
  return plan;
}

namespace {

template <NormKind K, class T>
void launch_typed(const NormArgs& a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  T* residual = static_cast<T*>(a.residual);
  const T* weight = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out);
  constexpr int kWide = kVec16<T>;
  static_assert(kWide == 8, "norm_launch_plan's vectors are 16 bytes of 2-byte elements");

  const NormLaunchPlan plan = norm_launch_plan(a);
  const bool wide = plan.wide;
  const bool prefetch_w = plan.prefetch_weight;
  const int group = plan.group;
  const long long nvec_per_thread = plan.vectors_per_thread;
  const int threads = plan.threads;
  const int blocks = plan.blocks;
  const PdlTrigger trigger = small_op_trigger();
  if (plan.row_loop) {
    launch_pdl("norm", norm_rows_loop_kernel<K, T>, dim3(blocks), threads, 0, stream, x, residual, weight, bias, out,
               a.dim, a.eps, trigger);
    return;
  }
  auto go = [&](auto vw_c, auto nvec_c) {
    constexpr int kVw = decltype(vw_c)::value;
    constexpr int kNvec = decltype(nvec_c)::value;
    if (prefetch_w) {
      launch_pdl("norm", norm_rows_kernel<K, T, kVw, kNvec, true>, dim3(blocks), threads, 0, stream, x, residual,
                 weight, bias, out, a.rows, a.dim, a.eps, group, trigger);
    } else {
      launch_pdl("norm", norm_rows_kernel<K, T, kVw, kNvec, false>, dim3(blocks), threads, 0, stream, x, residual,
                 weight, bias, out, a.rows, a.dim, a.eps, group, trigger);
    }
  };
  dispatch_int<1, 2, 4, 8>(static_cast<int>(nvec_per_thread), "norm", "vectors per thread", [&](auto nvec_c) {
    if (wide) {
      go(std::integral_constant<int, kWide>{}, nvec_c);
    } else {
      go(std::integral_constant<int, 1>{}, nvec_c);
    }
  });
}

}  // namespace

void launch_norm(const NormArgs& args, cudaStream_t stream) {
  dispatch_half_dtype(args.dtype, "norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (args.kind) {
      case NormKind::Rms: launch_typed<NormKind::Rms, T>(args, stream); break;
      case NormKind::AddRms: launch_typed<NormKind::AddRms, T>(args, stream); break;
      case NormKind::Layer: launch_typed<NormKind::Layer, T>(args, stream); break;
      default: throw_bad_dispatch("norm", "kind", static_cast<int>(args.kind));
    }
  });
  check_launch(norm_op_name(args.kind));
}

}  // namespace ferrum::kernels
