// GPTQ INT4 x f16/bf16 GEMM on Hopper warpgroup MMA (wgmma.mma_async,
// sm_90a), for launches of up to 64 rows (Auto: from 9 rows where
// gptq_wgmma_preferred): out[m, n] = a[m, k] · W[k, n].
//
// At m = 64 the op is no longer a weight stream but a matrix product
// (docs/design/gptq_small_m.md §3): 8192 x 8192 is 8.6 GFLOP against 34 MB
// of INT4 weights. mma.sync tops out near two thirds of the tensor cores'
// rate on Hopper; wgmma reaches it. So the roles of the streaming kernel are
// kept (weights as the A operand, features along M) and the product moves to
// wgmma with A from registers:
//
//   * CTA = one warpgroup (128 threads), 4 column blocks of 64 features (one
//     per warp) x a k-range (split blockIdx.y of gridDim.y). Two CTAs per SM.
//   * A = dequantized weights. Repacked word j of lane (g, t) in a k16 tile
//     of a column block is one mma.sync A fragment of that block's features
//     16 j .. 16 j + 15 (src/quant/gptq_repack.hpp; Int4Math's (b0, b1, b2,
//     b3) are (a0, a2, a1, a3)), and wgmma's register A operand takes each
//     warp's rows in exactly that layout: warp w supplies rows 16 w .. 16 w
//     + 15. So one k16 step is 4 wgmma m64nNk16 (j = 0 .. 3), the 64 A rows
//     of wgmma j being features 16 j .. 16 j + 15 of each warp's block; each
//     lane's 16-byte word group of the step is its 4 A fragments.
//   * B = activations, N = 16, 32 or 64 rows (rows >= m zero; the least N
//     that holds m: the A operand's dequantization costs the same per step
//     whatever N, and at N = 16 its f16x2 arithmetic, which issues to the
//     pipe the tensor cores sit on, is the larger part), K-major in
//     shared memory with the 128-byte swizzle (kernels/common/wgmma.cuh).
//   * A ring of kRing shared-memory slots, one 64-row-of-k stage each,
//     filled by cp.async kRing - 1 stages ahead: the stage's activation rows
//     (columns >= k zero-filled), the 4 column blocks' weights (2 KiB each,
//     read back one 16-byte load per lane per k16 step) and the scale (and
//     zero) rows of the stage's groups for the CTA's 256 features. A slot is
//     refilled after the block barrier that follows the wgmma wait of the
//     step that last read it: the second of a stage's two barriers (the
//     first makes its activations visible to wgmma). No L2 prefetch ahead
//     of the ring: with 4 stages in flight it measured 0.6-9 % slower than
//     none at 34 of 35 shapes and m (session 46; a bulk prefetch of 8
//     stages per warp before). (A first version loaded the weights into
//     registers one stage ahead: latency-bound, ~680 cycles per k16 step.)
//   * Dequantization scale-before, as the fused kernel: (q - z) is exact and
//     one multiply by the scale rounds once, exactly as rounding the f32
//     weight to the activation dtype. Two A register sets (one k16 step
//     each) used in turn: the next step's dequantization overlaps this
//     step's wgmma, whose registers stay untouched until wgmma.wait_group
//     says they are done. (Two steps per set and commit group measured no
//     faster, session 17: 8192 x 28672, m = 17, 65.2 -> 64.7 us. Deeper
//     than one group in flight during a dequantization -- two or four
//     commit groups per step, or three register sets with wait_group 2 --
//     ptxas serializes the wgmma (advisory C7513: non-wgmma instructions
//     define wgmma inputs inside its pipeline stage); the group variants
//     measured 13-35 % slower, session 44.)
//   * f32 accumulators (4 x N / 2 per thread). The splits of a column group
//     (at most kGptqClusterMaxSplits) run as one thread-block cluster: each
//     leaves its [m][256] f32 partial in its shared memory and the cluster
//     sums them in split order through distributed shared memory
//     (cluster_sum_store); where such a cluster cannot be resident, every
//     split stores to the workspace and the last arriver sums them in the
//     same order (splitk_finish_last). Either way bitwise reproducible, and
//     the same bits.
#include "kernels/gptq_gemm.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/per_device.hpp"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_ops.cuh"
#include "kernels/gptq_int4.cuh"

namespace ferrum::kernels {

namespace {

using namespace gptq;

constexpr int kWgThreads = 128;
constexpr int kWgBlocks = 4;                        // 64-feature column blocks per CTA, one per warp
constexpr int kWgCols = kWgBlocks * kGptqTileN;     // 256 features per CTA
static_assert(kWgCols == kGptqWgmmaBlockN, "gptq_wgmma_preferred counts column groups of kGptqWgmmaBlockN");
constexpr int kStageK = 64;                         // k rows per ring stage: one 128-byte swizzle atom
constexpr int kStageK16 = kStageK / 16;             // 4
constexpr int kStageGroups = kStageK / 16;          // most scale rows a stage touches (groups of 16)
constexpr int kRing = 5;                            // slots
constexpr int kAhead = kRing - 1;                   // stages in flight: every slot but the one being read
static_assert(kStageK16 >= 2, "the slot of stage s - 1 is freed by a barrier at k16 step 1");
constexpr int kBlockStageBytes = kStageK16 * 512;   // one column block's weights of a stage
constexpr int kScaleBytes = kStageGroups * kWgCols * 2;
constexpr int kZeroBytes = kStageGroups * kWgCols;
constexpr int kMinBlocksPerSm = 2;
constexpr int kMaxSplits = kGptqClusterMaxSplits;
// The cluster reduce's partial tile: [kN][kTilePitch] f32 (4 floats of
// padding per row: the accumulator stores of lanes 2 t apart hit other banks).
constexpr int kTilePitch = kWgCols + 4;

static_assert(kGptqTileK % kStageK == 0, "k_pad (a multiple of kGptqTileK) must be whole stages");

// Shared-memory slot: activation rows [kN][64 k] (128 B each, swizzled),
// the 4 column blocks' weights [4][4 k16][32 lanes][16 B], then the stage's
// scale rows [kStageGroups][256] and zero rows, padded to 1024 bytes (the
// swizzle's phase is the row index only when every slot starts 1024-aligned).
template <int kN>
struct WgmmaSlot {
  static constexpr int kActBytes = kN * kStageK * 2;
  static constexpr int kWeightOffset = kActBytes;
  static constexpr int kScaleOffset = kWeightOffset + kWgBlocks * kBlockStageBytes;
  static constexpr int kZeroOffset = kScaleOffset + kScaleBytes;
  static constexpr int kBytes = (kZeroOffset + kZeroBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kRing * kBytes + 1024;  // + alignment slack
  static_assert(kN * kTilePitch * 4 <= kRing * kBytes, "the cluster reduce's tile reuses the ring");
};

struct WgmmaParams {
  const std::uint32_t* qweight;  // [n_pad/64][k_pad/16][32][4] u32 (gptq_repack.hpp layout)
  const void* scales;            // [scale_rows][n_pad] T, permuted columns
  const std::uint8_t* zeros;     // [scale_rows][n_pad] u8 true zeros, permuted columns, or null
  const void* a;                 // [m, k] T row-major, 16-byte aligned (act-order: already gathered)
  void* out;                     // [m, n] T row-major
  float* partials;               // [splits][n_ctas][m][256] f32
  int* counters;                 // [n_ctas] ints, zero between launches
  int m, k, n, k_pad, n_pad;
  int zero_value;
  int group_rows;                // rows per scale row: 16, 32, 64 or a multiple of 64
  int stages_per_split;          // 64-row stages per CTA along k (the last split may have fewer)
  int splits;
  bool cluster_reduce;           // the splits of a column group are one cluster (dims 1 x splits)
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

template <class T, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], const std::uint32_t (&a)[4], std::uint64_t desc) {
  if constexpr (kN == 16) {
    wgmma_rs_m64n16k16<T>(d, a, desc, 1);
  } else if constexpr (kN == 32) {
    wgmma_rs_m64n32k16<T>(d, a, desc, 1);
  } else {
    static_assert(kN == 64, "N is 16, 32 or 64");
    wgmma_rs_m64n64k16<T>(d, a, desc, 1);
  }
}

#endif

template <class T, int kN, bool kZeros>
__global__ void __launch_bounds__(kWgThreads, kMinBlocksPerSm) gptq_wgmma_kernel(const WgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Slot = WgmmaSlot<kN>;
  using M = Int4Math<T>;
  constexpr int kAcc = kN / 2;  // f32 per thread per wgmma
  extern __shared__ unsigned char smem_raw[];
  // 1024-aligned by an offset from the array itself (not through an integer
  // cast), so the compiler keeps the shared address space: LDS, not LD.
  unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const std::uint32_t smem_base = smem_u32(smem);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2;
  const int m = p.m;

  // Rows m .. kN - 1 of every slot are never copied into: zero them once
  // (no global access, so before the PDL wait).
  for (int i = tid; i < kRing * (kN - m) * 8; i += kWgThreads) {
    const int slot = i / ((kN - m) * 8), rem = i % ((kN - m) * 8);
    *reinterpret_cast<uint4*>(smem + slot * Slot::kBytes + (m + rem / 8) * 128 + (rem % 8) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
  pdl_begin();

  const int cta_n = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
  const int n_ctas = static_cast<int>(gridDim.x);
  const int col0 = cta_n * kWgCols;  // first feature of the CTA
  const int k16_total = p.k_pad / 16;
  const int stage0 = split * p.stages_per_split;
  const int stages = max(0, min(p.stages_per_split, p.k_pad / kStageK - stage0));
  const int cb = cta_n * kWgBlocks + warp;  // this warp's column block
  const bool live = cb * kGptqTileN < p.n_pad;
  const int groups_per_stage = p.group_rows >= kStageK ? 1 : kStageK / p.group_rows;

  const T* a = static_cast<const T*>(p.a);
  const T* scales = static_cast<const T*>(p.scales);
  // This warp's column block of the weights: [k_pad / 16][32][4] u32.
  const std::uint32_t* wblock = p.qweight + static_cast<std::size_t>(live ? cb : 0) * k16_total * 128;

  // load_stage: the next stage into its slot: activation rows < m (columns
  // >= k zero), the 4 column blocks' weights, the scale (zero) rows of the
  // stage's groups for the CTA's 256 features (features >= n_pad zero). One
  // commit group per stage, empty past the end. Each thread's roles are
  // fixed for the whole k-range:
  //   activations: rows act_row + 16 i (i < 4), 16-byte column piece act_c
  //   (the swizzle phase row & 7 is the same for every i);
  //   weights: pieces lane + 32 i of the warp's block;
  //   scale rows: each warp copies its own 64 features' 128 bytes of each of
  //   the stage's groups, lane = 8 g + piece (zero rows: 64 bytes, lane =
  //   4 g + piece).
  // So a warp's weights and scales (and zeros) are its own copies: the
  // warp dequantizes a stage's first step after its own cp.async wait and a
  // __syncwarp, before the stage's first block barrier, which only the
  // activations (read by wgmma) need; the slot's reuse waits for the second.
  const int act_row = tid >> 3, act_c = tid & 7;
  const std::uint32_t act_dst = static_cast<std::uint32_t>(act_row * 128 + ((act_c ^ (act_row & 7)) << 4));
  const std::size_t act_step = static_cast<std::size_t>(16) * p.k;  // 16 rows further
  // Rows act_row + 16 i < m are copied: i < act_rows.
  const int act_rows = m > act_row ? (m - act_row + 15) / 16 : 0;
  const std::uint32_t w_dst = static_cast<std::uint32_t>(Slot::kWeightOffset + warp * kBlockStageBytes + lane * 16);
  const int feat0 = col0 + warp * kGptqTileN;  // the warp's first feature (its 64 are < n_pad where live)
  const int scale_g = lane >> 3, scale_piece = lane & 7;
  const int zero_g = lane >> 2, zero_piece = lane & 3;
  const int stages_per_group = p.group_rows >= kStageK ? p.group_rows / kStageK : 1;
  // Copy cursors, advanced one stage per load_stage call (stages are loaded
  // in order): the slot, the activation column, the weights, the scale row.
  // Kept as running values so that a stage's copies cost a few adds, not
  // the address arithmetic from scratch (ncu, session 19: the copy issue
  // was a third of the kernel's stall samples).
  int fill_s = 0;
  std::uint32_t fill_slot = smem_base;
  int act_col = stage0 * kStageK + act_c * 8;
  const T* act_cur = a + static_cast<std::size_t>(act_row) * p.k + act_col;
  const std::uint32_t* w_cur = wblock + static_cast<std::size_t>(stage0) * (kStageK16 * 128) + lane * 4;
  int scale_row = stage0 / stages_per_group * groups_per_stage;  // the stage's first group
  int group_left = stages_per_group - stage0 % stages_per_group;       // stages until the next scale row
  auto load_stage = [&]() {
    if (fill_s < stages) {
      const bool col_valid = act_col < p.k;
#pragma unroll
      for (int i = 0; i < kN / 16; ++i) {
        if (i < act_rows) cp_async_16(fill_slot + act_dst + i * 2048, col_valid ? act_cur + i * act_step : a, col_valid);
      }
      if (live) {
#pragma unroll
        for (int i = 0; i < kBlockStageBytes / 16 / 32; ++i) cp_async_16(fill_slot + w_dst + i * 512, w_cur + i * 128);
      }
      if (scale_g < groups_per_stage) {
        cp_async_16(fill_slot + Slot::kScaleOffset + scale_g * (kWgCols * 2) + warp * 128 + scale_piece * 16,
                    scales + static_cast<std::size_t>(scale_row + scale_g) * p.n_pad +
                        (live ? feat0 + scale_piece * 8 : 0),
                    live);
      }
      if constexpr (kZeros) {
        if (zero_g < groups_per_stage) {
          cp_async_16(fill_slot + Slot::kZeroOffset + zero_g * kWgCols + warp * 64 + zero_piece * 16,
                      p.zeros + static_cast<std::size_t>(scale_row + zero_g) * p.n_pad +
                          (live ? feat0 + zero_piece * 16 : 0),
                      live);
        }
      }
      act_col += kStageK;
      act_cur += kStageK;
      w_cur += kStageK16 * 128;
      if (--group_left == 0) {
        group_left = stages_per_group;
        scale_row += groups_per_stage;
      }
      ++fill_s;
      fill_slot += Slot::kBytes;
      if (fill_slot == smem_base + kRing * Slot::kBytes) fill_slot = smem_base;
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_stage();

  float acc[4][kAcc];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[j][i] = 0.0f;
  }
  // Two sets of A fragments used in turn, one k16 step each: one step's
  // wgmma run while the next step is dequantized.
  std::uint32_t afrag[2][4][4];
  std::uint32_t sc[8];
  std::uint32_t lo[kZeros ? 8 : 1], hi[kZeros ? 8 : 1];
  if constexpr (!kZeros) M::biases(p.zero_value, lo[0], hi[0]);

  int slot_off = 0;  // the slot of stage s
  for (int s = 0; s < stages; ++s) {
    // Stage s landed (this thread's copies); the warp's weights and scales
    // are its own copies, visible to the whole warp after __syncwarp. The
    // block barrier comes after step 0's dequantization (below), so that a
    // warp dequantizes while the others arrive.
    cp_async_wait<kAhead - 1>();
    __syncwarp();
    const std::uint32_t act = smem_base + static_cast<std::uint32_t>(slot_off);
    // This lane's weights of step kk, read one step ahead of their use.
    auto weights_of = [&](int kk) {
      return *reinterpret_cast<const uint4*>(smem + slot_off + Slot::kWeightOffset + warp * kBlockStageBytes +
                                             kk * 512 + lane * 16);
    };
    uint4 w_next = weights_of(0);
#pragma unroll
    for (int kk = 0; kk < kStageK16; ++kk) {
      const uint4 w = w_next;
      if (kk + 1 < kStageK16) w_next = weights_of(kk + 1);
      // The scale row of this k16 step: the stage's local group kk * gps / 4.
      const int g = (kk * groups_per_stage) >> 2;
      if (kk == 0 || g != (((kk - 1) * groups_per_stage) >> 2)) {
        unpack_scales(*reinterpret_cast<const uint4*>(smem + slot_off + Slot::kScaleOffset + g * (kWgCols * 2) +
                                                       warp * 128 + gid * 16),
                      sc);
        if constexpr (kZeros) {
          unpack_zeros<T>(*reinterpret_cast<const uint2*>(smem + slot_off + Slot::kZeroOffset + g * kWgCols +
                                                           warp * 64 + gid * 8),
                          lo, hi);
        }
      }
      std::uint32_t(&af)[4][4] = afrag[kk & 1];
      const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t b[4];
        constexpr int kZ = kZeros ? 1 : 0;
        dequant_scaled<T>(words[j], sc[2 * j], lo[kZ * 2 * j], hi[kZ * 2 * j], sc[2 * j + 1], lo[kZ * (2 * j + 1)],
                          hi[kZ * (2 * j + 1)], b);
        af[j][0] = b[0];
        af[j][1] = b[2];
        af[j][2] = b[1];
        af[j][3] = b[3];
      }
      if (kk == 0) {
        // Every thread's activation copies of stage s visible to wgmma
        // (async proxy).
        fence_proxy_async_shared();
        __syncthreads();
      } else if (kk == 1) {
        // Every thread has waited (at the end of step 0) for the last wgmma
        // of stage s - 1, so its slot is free for stage s + kAhead: kRing - 1
        // stages in flight, not kRing - 2 as with the one barrier above
        // (the barrier of step 0 cannot free slot s - 1: stage s - 1's last
        // group may still run then).
        __syncthreads();
      }
      // Step kk: 4 wgmma, one commit group.
      wgmma_fence();
      const std::uint64_t desc = wgmma_desc_sw128(act + kk * 32, 16, 1024);
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_rs<T, kN>(acc[j], af[j], desc);
      wgmma_commit();
      if (kk == 1) {
        // The stage's copies go out behind the step's wgmma, not ahead of
        // them: the tensor pipe restarts as soon as the barrier lets it.
        load_stage();
      }
      // The previous step's wgmma are done: its A registers (the other set)
      // may be overwritten by the next dequantization.
      wgmma_wait<1>();
    }
    slot_off = slot_off + Slot::kBytes == kRing * Slot::kBytes ? 0 : slot_off + Slot::kBytes;
  }
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < 4; ++j) wgmma_fence_operands(acc[j]);

  // This split's [m][256] f32 partial. Accumulator i of wgmma j: feature
  // 16 j + 8 r + gid of the warp's block, row 8 jj + 2 t + c (i = 4 jj + 2 r + c).
  const int t = lane & 3;
  if (p.cluster_reduce) {
    // Into this CTA's shared memory (the ring: every copy landed, every
    // wgmma done; the barrier keeps the last stage's readers ahead of it).
    cp_async_wait<0>();
    __syncthreads();
    float* tile = reinterpret_cast<float*>(smem);  // [kN][kTilePitch]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int jj = i >> 2, r = (i >> 1) & 1, c = i & 1;
        tile[(8 * jj + 2 * t + c) * kTilePitch + warp * kGptqTileN + 16 * j + 8 * r + gid] = acc[j][i];
      }
    }
    cluster_sum_store<T, kWgThreads, 4>(tile, kTilePitch, p.splits, m, kWgCols, col0, p.n, static_cast<T*>(p.out));
    return;
  }
  float* part = p.partials + (static_cast<std::size_t>(split) * n_ctas + cta_n) * m * kWgCols;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int jj = i >> 2, r = (i >> 1) & 1, c = i & 1;
      const int row = 8 * jj + 2 * t + c;
      if (row < m) __stcg(part + row * kWgCols + warp * kGptqTileN + 16 * j + 8 * r + gid, acc[j][i]);
    }
  }
  constexpr int kPer = (kN * (kWgCols / 4) + kWgThreads - 1) / kWgThreads;
  splitk_finish_last<T, kWgThreads, kPer>(p.partials, p.counters, cta_n, n_ctas, p.splits, m, kWgCols, col0, p.n,
                                          static_cast<T*>(p.out));
#else
  (void)p;
  __trap();  // launched only where gptq_wgmma_supported() (an sm_90a build on a 9.0 device)
#endif
}

template <class T, int kN, bool kZeros>
auto wgmma_kernel_ptr() {
  return &gptq_wgmma_kernel<T, kN, kZeros>;
}

// One instance of the kernel, as a value (for_each_wgmma_instance); `index`
// numbers the instances 0 .. kNumWgmmaInstances - 1.
constexpr int kNumWgmmaInstances = 12;
template <class T, int kN, bool kZeros>
struct WgmmaInstance {
  static_assert(kN == 16 || kN == 32 || kN == 64, "index below numbers N = 16, 32, 64 only");
  using type = T;
  static constexpr int n = kN;
  static constexpr bool zeros = kZeros;
  static constexpr int index =
      (std::is_same_v<T, __nv_bfloat16> ? 6 : 0) + (kN == 16 ? 0 : (kN == 32 ? 2 : 4)) + (kZeros ? 1 : 0);
  static_assert(index < kNumWgmmaInstances);
};

// Calls f(WgmmaInstance<T, N, zeros>{}) for every instance compiled: the
// one list of them.
template <class F>
void for_each_wgmma_instance(F&& f) {
  auto per_type = [&](auto dtype) {
    using T = typename decltype(dtype)::type;
    f(WgmmaInstance<T, 16, false>{});
    f(WgmmaInstance<T, 16, true>{});
    f(WgmmaInstance<T, 32, false>{});
    f(WgmmaInstance<T, 32, true>{});
    f(WgmmaInstance<T, 64, false>{});
    f(WgmmaInstance<T, 64, true>{});
  };
  per_type(TypeTag<__half>{});
  per_type(TypeTag<__nv_bfloat16>{});
}

// Never launched: what cudaOccupancyMaxActiveClusters is asked about for
// clusters at one CTA per SM (WgmmaPlacement::single). How many clusters of s
// CTAs fit with no two on one SM is the device's (its GPCs' SM counts), the
// same for any 128-thread kernel that fills an SM's shared memory.
__global__ void one_cta_per_sm_probe() {}

// Where a device puts the kernel's clusters of s CTAs (dims 1 x s, index
// s = 1 .. kMaxSplits; index 0 unused), made once per device:
//   * instance[i][s]: clusters of instance i resident at once (0: a cluster
//     of s cannot be resident at all, and the launch sums its splits through
//     the workspace instead: the same bits);
//   * resident[s]: the least of those over every instance (the split rule
//     must not depend on the instance);
//   * single[s]: clusters the device holds with no two CTAs on one SM (the
//     probe asked with all the shared memory one CTA may opt into).
// Making it sets every instance's shared-memory limit on the device, which
// the cluster queries need.
struct WgmmaPlacement {
  std::array<GptqClusterCounts, kNumWgmmaInstances> instance{};
  GptqClusterCounts resident{};
  GptqClusterCounts single{};
};

// Clusters of s CTAs of `kernel` (kWgThreads threads, `smem` bytes, its
// shared-memory opt-in done) the current device holds at once, s = 1 ..
// kMaxSplits.
template <class... Params>
GptqClusterCounts cluster_counts(void (*kernel)(Params...), std::size_t smem) {
  GptqClusterCounts counts{};
  for (int s = 1; s <= kMaxSplits; ++s) {
    const cudaError_t err =
        max_active_clusters(&counts[s], kernel, dim3(1, static_cast<unsigned>(s), 1), dim3(kWgThreads), smem);
    if (err != cudaSuccess) throw_cuda_error("gemm_gptq", "cudaOccupancyMaxActiveClusters", err);
  }
  return counts;
}

template <class T, int kN, bool kZeros>
GptqClusterCounts instance_clusters() {
  (void)opt_in_blocks_per_sm("gemm_gptq", wgmma_kernel_ptr<T, kN, kZeros>(), kWgThreads, WgmmaSlot<kN>::kSmemBytes);
  return cluster_counts(wgmma_kernel_ptr<T, kN, kZeros>(), WgmmaSlot<kN>::kSmemBytes);
}

GptqClusterCounts single_cta_clusters(int device) {
  int smem = 0;
  cudaError_t err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(one_cta_per_sm_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  if (err != cudaSuccess) throw_cuda_error("gemm_gptq", "the one-CTA-per-SM cluster query", err);
  return cluster_counts(one_cta_per_sm_probe, static_cast<std::size_t>(smem));
}

// The current device's placement (a failed query throws and is asked
// again next time). Every launch reads it, also one whose split count the
// caller forced: made on a device's first launch (12 x 8 + 8 queries), it
// is what sets the instances' shared-memory opt-in there.
const WgmmaPlacement& wgmma_placement() {
  static PerDevice<WgmmaPlacement> per_device;
  return per_device.current("gemm_gptq", [](int device) {
    WgmmaPlacement p;
    p.resident.fill(std::numeric_limits<int>::max());
    for_each_wgmma_instance([&p](auto inst) {
      using I = decltype(inst);
      p.instance[I::index] = instance_clusters<typename I::type, I::n, I::zeros>();
      for (int s = 1; s <= kMaxSplits; ++s) p.resident[s] = std::min(p.resident[s], p.instance[I::index][s]);
    });
    p.resident[0] = 0;
    p.single = single_cta_clusters(device);
    return p;
  });
}

template <class T, int kN, bool kZeros>
void launch_instance(WgmmaParams p, bool cluster_requested, dim3 grid, cudaStream_t stream) {
  auto kernel = wgmma_kernel_ptr<T, kN, kZeros>();
  // The current device's placement: making it set the instance's
  // shared-memory opt-in there.
  const WgmmaPlacement& placement = wgmma_placement();
  p.cluster_reduce = cluster_requested && p.splits >= 2 && p.splits <= kGptqClusterMaxSplits &&
                     placement.instance[WgmmaInstance<T, kN, kZeros>::index][p.splits] > 0;
  const dim3 cluster(1, p.cluster_reduce ? static_cast<unsigned>(p.splits) : 1u, 1);
  launch_pdl_clustered("gemm_gptq (wgmma)", cluster, kernel, grid, dim3(kWgThreads), WgmmaSlot<kN>::kSmemBytes,
                       stream, p);
}

template <class T, int kN>
void launch_typed(const GptqGemmArgs& args, const GptqPlan& plan, cudaStream_t stream) {
  WgmmaParams p{};
  p.qweight = args.w.qweight;
  p.scales = args.w.scales;
  p.zeros = args.w.zeros;
  p.a = args.a;
  p.out = args.out;
  p.partials = args.partials;
  p.counters = args.counters;
  p.m = args.m;
  p.k = args.w.k;
  p.n = args.w.n;
  p.k_pad = args.w.k_pad;
  p.n_pad = args.w.n_pad;
  p.zero_value = args.w.zero_value;
  p.group_rows = args.w.group_rows;
  p.splits = plan.splits;
  const int stages = args.w.k_pad / kStageK;
  p.stages_per_split = (stages + plan.splits - 1) / plan.splits;
  const dim3 grid(static_cast<unsigned>(plan.n_ctas), static_cast<unsigned>(plan.splits));
  if (args.w.zeros != nullptr) {
    launch_instance<T, kN, true>(p, args.cluster_reduce, grid, stream);
  } else {
    launch_instance<T, kN, false>(p, args.cluster_reduce, grid, stream);
  }
}

}  // namespace

bool gptq_wgmma_supported() {
#if defined(FERRUM_HAVE_SM90A)
  return device_is_sm90a();
#else
  return false;
#endif
}

bool gptq_wgmma_applies(int group_rows) {
  // Groups of 16, 32 or 64 rows, or any multiple of 64 (every fused layout:
  // group_rows divides 128 or is a multiple of it).
  return gptq_wgmma_supported() && group_rows >= 16 &&
         (group_rows >= kStageK ? group_rows % kStageK == 0 : kStageK % group_rows == 0);
}

int gptq_wgmma_splits(int n_ctas, int stages, const GptqClusterCounts& resident_clusters,
                      const GptqClusterCounts& single_clusters) {
  // The most splits whose clusters are all resident in one wave. Fewer cut
  // the f32 partials (256 x m floats per CTA) the cluster sums, but leave
  // SMs idle; more put part of the launch in a second wave of clusters.
  int most = 1;
  for (int s = std::min(stages, kMaxSplits); s > 1; --s) {
    if (n_ctas <= resident_clusters[s]) {
      most = s;
      break;
    }
  }
  // An SM that holds two CTAs of the launch finishes last, at ~1.4-1.5x one
  // CTA's time; so fewer splits with no two CTAs on one SM win when they are
  // more than 1 / 1.4 of the most. At 16 column groups on the H200, 16
  // clusters of 8 put two CTAs on 8 SMs, 16 of 6 on none: 6 splits were
  // 6-14 % faster than 8 at m = 16-64 (sessions 45-47; 7, doubling 6 SMs,
  // the slowest). The margin (3/4): at 24 column groups 4 splits (no
  // doubling) lose to 8 by 0-8 %.
  for (int s = most; s > 1 && 4 * s >= 3 * most; --s) {
    if (n_ctas <= single_clusters[s]) return s;
  }
  return most;
}

GptqPlan gptq_wgmma_plan(int k_pad, int n_pad, int num_sms, int splits_override) {
  GptqPlan plan;
  plan.config = -2;
  plan.m_tile = 64;
  plan.block_n = kWgCols;
  plan.n_ctas = (n_pad + kWgCols - 1) / kWgCols;
  const int stages = std::max(k_pad / kStageK, 1);
  if (splits_override > 0) {
    plan.splits = std::min(splits_override, stages);
  } else if (gptq_wgmma_supported()) {
    const WgmmaPlacement& placement = wgmma_placement();
    plan.splits = gptq_wgmma_splits(plan.n_ctas, stages, placement.resident, placement.single);
  } else {
    GptqClusterCounts resident{}, single{};
    const int sms = std::max(num_sms, 1);
    for (int s = 1; s <= kMaxSplits; ++s) {
      resident[s] = sms * kMinBlocksPerSm / s;
      single[s] = sms / s;
    }
    plan.splits = gptq_wgmma_splits(plan.n_ctas, stages, resident, single);
  }
  // Splits that would own no stage are dropped (the stages per split are
  // rounded up).
  const int per_split = (stages + plan.splits - 1) / plan.splits;
  plan.splits = (stages + per_split - 1) / per_split;
  return plan;
}

bool launch_gptq_wgmma(const GptqGemmArgs& args, cudaStream_t stream) {
  if (args.m < 1 || args.m > kGptqMaxM) throw_bad_dispatch("gemm_gptq (wgmma)", "rows per launch m", args.m);
  if (args.stream_splits < 0 || args.stream_splits > kGptqMaxStreamSplits) {
    throw_bad_dispatch("gemm_gptq (wgmma)", "stream_splits (CTAs along k)", args.stream_splits);
  }
  if (!gptq_wgmma_applies(args.w.group_rows)) return false;
  const GptqPlan plan = gptq_wgmma_plan(args.w.k_pad, args.w.n_pad, args.num_sms, args.stream_splits);
  dispatch_half_dtype(args.dtype, "gemm_gptq", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (args.m <= 16) {
      launch_typed<T, 16>(args, plan, stream);
    } else if (args.m <= 32) {
      launch_typed<T, 32>(args, plan, stream);
    } else {
      launch_typed<T, 64>(args, plan, stream);
    }
  });
  return true;
}

}  // namespace ferrum::kernels
