// argmax over rows, for greedy decoding: a step reads one row (or a few) of
// vocab_size logits. One block of 1024 threads per row was latency bound:
// [1 x 128256] f16 (256 KB) took 13.9 µs on the H200 under graph replay with
// a cold L2, its one SM waiting on one round of loads after another. So each
// row is split over a cluster of kCluster blocks (sm_90; one block per row on
// older devices), every thread has a batch of 16-byte loads in flight before
// its first compare, and the blocks' candidates meet in distributed shared
// memory: one launch, no workspace, no atomics. Values compare in fp32 (exact for f16 and bf16). The winner is
// unique (the first maximum, NaN above every number), so the result does not
// depend on the reduction order.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "kernels/argmax.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/cluster.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/per_device.hpp"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {
namespace {

namespace cg = cooperative_groups;

// Blocks per row: 8 is the largest portable cluster (16 needs the
// non-portable opt-in, and fewer such clusters fit in a GPC at once).
constexpr int kCluster = 8;
// Two blocks fit on an SM (<= 64 registers): a cluster of one-block SMs
// needs 8 free SMs in one GPC, and 16 rows' clusters might not all be
// resident at once (1024 threads: one block per SM).
constexpr int kThreads = 512;
constexpr int kBlocksPerSm = 2;
constexpr int kWarps = kThreads / 32;
// Vectors a thread loads before its first compare (40 KB in flight per
// block): a row of up to 160k halves (llama3 128256, qwen3 151936) or 80k
// floats is one batch, so one memory latency. 6 spills bf16 at 64 registers.
constexpr int kBatch = 5;
struct alignas(8) Candidate {  // alignas: one 8-byte read across the cluster
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

// offer() for a column after best's (or at it, while best is a thread's
// {-inf, first column} start): beats() then reduces to "a larger value, or
// the first NaN", branch-free and about half the instructions (the hot
// loop). !(value <= best.value) holds for a larger value or a NaN on either side.
__device__ __forceinline__ void offer_later(Candidate& best, float value, int index) {
  if (!(value <= best.value) && best.value == best.value) best = Candidate{value, index};
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

// One row per group of kBlocks blocks: kClustered (sm_90), a cluster of
// kCluster blocks, block rank r reducing its contiguous segment of the row
// and rank 0 the kCluster block candidates; otherwise (older devices) one
// block per row. VW elements per access: 16-byte vectors when the row
// allows, else 1.
template <class T, int VW, bool kClustered>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    argmax_kernel(const T* __restrict__ x,         // [rows, cols]
                  std::int32_t* __restrict__ out,  // [rows]
                  long long rows, int cols) {
  pdl_begin();
  constexpr int kBlocks = kClustered ? kCluster : 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kClustered) {
    __trap();  // never launched: the launcher clusters only on sm_90+
  }
  const int rank = 0;
#else
  const int rank = kClustered ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
#endif
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const Candidate none{-INFINITY, cols};  // beaten by any real column (index < cols)

  // This block's vectors [begin, begin + count): segments start at multiples
  // of VW elements, so 16-byte loads stay aligned; a block past the row's
  // end has none and offers `none`. The last block also takes the columns
  // past the last whole vector (some only when a single row is vectorized).
  const int nvec = cols / VW;
  const int per_block = nvec / kBlocks + (nvec % kBlocks != 0);  // ceil, without overflow near 2^31
  const int begin = min(nvec, rank * per_block);
  const int count = min(per_block, nvec - begin);
  const int tail = rank == kBlocks - 1 ? cols - nvec * VW : 0;

  __shared__ Candidate warp_best[kWarps];
  __shared__ Candidate block_best;  // read by rank 0 through distributed shared memory

  for (long long row = blockIdx.x / kBlocks; row < rows; row += gridDim.x / kBlocks) {
    const T* xr = x + row * cols;
    // A thread meets its vector columns in increasing order, so it starts
    // from {-inf, its first column} (what a run of -inf yields) and takes
    // them through offer_later.
    Candidate best = tid < count ? Candidate{-INFINITY, (begin + tid) * VW} : none;
    // Offsets from `begin` (< count + kThreads * kBatch) cannot overflow.
    for (int i = tid; i < count; i += kThreads * kBatch) {
      // Every load of the batch is issued before the first compare.
      vec_t<T, VW> chunk[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int k = i + b * kThreads;
        if (k < count) chunk[b].load_stream(xr + static_cast<long long>(begin + k) * VW);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int k = i + b * kThreads;
        if (k < count) {
#pragma unroll
          for (int j = 0; j < VW; ++j) offer_later(best, chunk[b].f(j), (begin + k) * VW + j);
        }
      }
    }
    if (tid < tail) offer(best, to_float(xr[nvec * VW + tid]), nvec * VW + tid);

    // Warp, block, then cluster: every step keeps the better of two candidates.
    best = warp_best_of(best);
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) {
      best = warp_best_of(lane < kWarps ? warp_best[lane] : none);
      if (lane == 0) {
        if constexpr (kClustered) {
          block_best = best;
        } else {
          out[row] = best.index;
        }
      }
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if constexpr (kClustered) {
      const cg::cluster_group cluster = cg::this_cluster();
      // Publishes every block_best to the cluster (release / acquire); also,
      // a block's shared memory may be read only once the block is known to run.
      cluster.sync();
      if (rank == 0 && warp == 0) {
        best = warp_best_of(lane < kCluster ? *cluster.map_shared_rank(&block_best, lane) : none);
        if (lane == 0) out[row] = best.index;
      }
      // No block exits, or overwrites its candidates for a next row, while
      // rank 0 may still read them (its reads are complete: warp 0 reduced
      // them before the barrier).
      cluster_sync_after_reads();
    }
#endif
    if constexpr (!kClustered) __syncthreads();  // warp_best is rewritten for the next row
  }
}
static_assert(kWarps <= 32 && kCluster <= 32, "the block and cluster steps reduce one candidate per lane of one warp");

// Whether one cluster of kCluster blocks of `Kernel` can be resident at all:
// not on a GPU partition (MIG, an MPS SM limit) with fewer than kCluster
// free SMs of one GPC, where a clustered launch fails. There the launch
// takes one block per row instead (the same result: the winner is unique).
// Asked once per kernel and device; a failed query throws naming argmax.
template <auto Kernel>
bool argmax_cluster_fits() {
  static PerDeviceAnswers<bool, 1> known;
  const int device = current_device_index("argmax");
  return *known.get(device, 0, [&]() -> std::optional<bool> {
    return cluster_resident("argmax", Kernel, dim3(kCluster, 1, 1), dim3(kThreads), 0);
  });
}

// One launch of argmax_kernel<T, kVec>: a cluster of kCluster blocks per row
// where the grouping asks for it and the device can run one (sm_90 code in
// the build, a cluster resident), else one block per row. x: [rows, cols];
// out: [rows] (so in launch_typed).
template <class T, int kVec>
void launch_grouped(const T* x, std::int32_t* out, long long rows, long long cols, long long max_row_groups,
                    ArgmaxGrouping grouping, cudaStream_t stream) {
  constexpr auto kClustered = argmax_kernel<T, kVec, true>;
  const bool clustered = grouping == ArgmaxGrouping::ClusterWhereResident && device_is_sm90_or_later() &&
                         has_sm90_code<kClustered>() && argmax_cluster_fits<kClustered>();
  const int blocks_per_row = clustered ? kCluster : 1;
  const dim3 grid(static_cast<unsigned>(std::min(rows, max_row_groups) * blocks_per_row));
  launch_pdl_clustered("argmax", dim3(static_cast<unsigned>(blocks_per_row), 1, 1),
                       clustered ? kClustered : argmax_kernel<T, kVec, false>, grid, kThreads, 0, stream, x, out,
                       rows, static_cast<int>(cols));
}

template <class T>
void launch_typed(const void* x, std::int32_t* out, long long rows, long long cols, long long max_row_groups,
                  ArgmaxGrouping grouping, cudaStream_t stream) {
  constexpr int kWide = kVec16<T>;
  const auto* xt = static_cast<const T*>(x);
  // Every row starts 16-byte aligned when the base is and cols is a
  // multiple of the vector, or when there is one row.
  if (aligned16(x) && (cols % kWide == 0 || rows == 1)) {
    launch_grouped<T, kWide>(xt, out, rows, cols, max_row_groups, grouping, stream);
  } else {
    launch_grouped<T, 1>(xt, out, rows, cols, max_row_groups, grouping, stream);
  }
}

}  // namespace

void launch_argmax(DType dtype, const void* x, std::int32_t* out, long long rows, long long cols,
                   cudaStream_t stream) {
  launch_argmax(dtype, x, out, rows, cols, kArgmaxMaxRowGroups, ArgmaxGrouping::ClusterWhereResident, stream);
}

void launch_argmax(DType dtype, const void* x, std::int32_t* out, long long rows, long long cols,
                   long long max_row_groups, ArgmaxGrouping grouping, cudaStream_t stream) {
  if (max_row_groups < 1 || max_row_groups > kArgmaxMaxRowGroups) {
    throw_bad_dispatch("argmax", "max_row_groups (1 .. kArgmaxMaxRowGroups)", max_row_groups);
  }
  switch (dtype) {
    case DType::F16: launch_typed<__half>(x, out, rows, cols, max_row_groups, grouping, stream); break;
    case DType::BF16: launch_typed<__nv_bfloat16>(x, out, rows, cols, max_row_groups, grouping, stream); break;
    case DType::F32: launch_typed<float>(x, out, rows, cols, max_row_groups, grouping, stream); break;
    default: throw_bad_dispatch("argmax", "dtype (expected f16, bf16 or f32)", static_cast<long long>(dtype));
  }
  check_launch("argmax");
}

}  // namespace ferrum::kernels
