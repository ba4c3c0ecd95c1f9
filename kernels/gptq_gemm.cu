// GPTQ INT4 x f16/bf16 GEMM: out[m, n] = a[m, k] · dequant(W)[k, n].
//
// Fused kernel (m <= kGptqMaxM per launch; three configurations by m, see
// FusedConfigOf):
//   * CTA = 256 threads = 8 warps over a block of NB x 64 columns. Warp w owns
//     column block w % NB and k-group w / NB: the KG = 8 / NB k-groups split
//     each 128-row pipeline stage (KS = 8 / KG k16 steps each) and are summed
//     through shared memory at the end, in k-group order.
//   * A kStages-deep cp.async ring streams, per stage, the weight tiles (4 KiB
//     contiguous per column block, 16 bytes per thread), the live activation
//     rows (rows >= m are zeroed once and never requested; XOR-swizzled for
//     conflict-free ldmatrix), and the scale / zero rows of the stage's groups.
//     Ahead of the ring, cp.async.bulk.prefetch.L2 requests kL2Ahead more
//     stages of weights per column block (one instruction per 4 KiB), so DRAM
//     sees ~64 KiB more in flight per CTA than shared memory holds and the
//     ring's cp.async are served from L2.
//   * Dequantization in registers: one 16-byte shared load gives a lane the
//     nibbles of its B fragments for 8 n tiles of one k16 step (layout:
//     src/quant/gptq_repack.hpp). f16: (w & 0x000F000F) | 0x64006400 is the
//     half2 (1024 + q0, 1024 + q1); the next nibble up, | 0x64006400, is
//     1024 + 16q, scaled by 1/16 in the same fma that removes the bias.
//     bf16: ((w >> 4i) & 0x000F000F) | 0x43004300 is (128 + q0, 128 + q1).
//     Subtracting (magic + zero) is exact; one multiply by the scale rounds
//     once, exactly as rounding the f32 weight to the activation dtype.
//   * mma.sync m16n8k16 with f32 accumulators, only over the live m16 tiles.
//   * Split over k (grid.y, a function of the shape and device only) when the
//     columns alone do not fill the GPU. Each split writes the live rows of its
//     f32 partial tile to the workspace; the CTA that arrives last at the
//     tile's counter sums the partials with all its threads, in split order
//     0, 1, ..., S-1 (fixed, so bitwise reproducible), and resets the counter.
//
// Streaming kernel for m <= 16 (GptqKernelKind::Stream / StreamBulk, the
// latter CudaBackend's default for launches of m <= kGptqStreamAutoMaxM; see
// its section below),
// then the gather (act-order) and dequantize (cuBLAS path) kernels.
#include "kernels/gptq_gemm.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/common/activation.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/fast_divmod.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/per_device.hpp"
#include "kernels/gptq_int4.cuh"

namespace ferrum::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kK16PerStage = kGptqTileK / 16;  // 8
constexpr int kMaxGroupsPerStage = kK16PerStage;  // group_rows >= 16

// cp.async, ldmatrix and mma.sync come from kernels/common/mma.cuh; the INT4
// dequantization, scale / zero unpacking, the split-K reduction and the
// weight-stream load from kernels/gptq_int4.cuh (shared with the wgmma kernel,
// kernels/gptq_gemm_wgmma.cu). The fused kernel's weight stream uses plain
// cp.async.cg: the L2::cache_hint (evict-first) form trapped as an illegal
// instruction on the H200. The streaming kernel's bulk copies do take the hint
// (StreamParams::weights_evict_first).
using namespace gptq;

// ── Fused kernel ────────────────────────────────────────────────────────────

// What both kernels read and write, filled from the launch arguments once.
struct GemmOperands {
  const std::uint32_t* qweight;  // [n_pad/64][k_pad/16][32][4] u32 (gptq_repack.hpp layout)
  const void* scales;            // [scale_rows][n_pad] T, permuted columns
  const std::uint8_t* zeros;     // [scale_rows][n_pad] u8, permuted columns, or null
  const void* a;                 // [m, k] T row-major, 16-byte aligned (act-order: already gathered)
  void* out;                     // [m, n] T row-major
  int m, k, n, k_pad, n_pad;
  int zero_value;
};

GemmOperands gemm_operands(const GptqGemmArgs& args) {
  return {args.w.qweight, args.w.scales, args.w.zeros, args.a,         args.out,
          args.m,         args.w.k,      args.w.n,     args.w.k_pad,   args.w.n_pad,
          args.w.zero_value};
}

// Split s of a launch's `splits` covers k tiles (128 rows: the fused kernel's
// tiles, the streaming kernel's chunks) [s * tiles / splits, (s + 1) * tiles /
// splits): quotients through a FastDivmod fixed at launch, not division
// routines ahead of the first weight copy. Its numerators reach splits x
// tiles, which must stay within FastDivmod's range.
struct SplitRange {
  int begin, end;
};

__device__ __forceinline__ SplitRange split_k_range(const FastDivmod& splits, int split, int tiles) {
  return {static_cast<int>(splits.div(static_cast<std::uint32_t>(split * tiles))),
          static_cast<int>(splits.div(static_cast<std::uint32_t>((split + 1) * tiles)))};
}

// The launchers' divisor for split_k_range. A backstop: the planners take at
// most 32 splits and k_pad is an int, so splits x tiles stays below 2^29 today;
// past FastDivmod's range a named size-limit error.
FastDivmod split_range_divisor(const char* op, int splits, int k_pad) {
  const long long products = static_cast<long long>(splits) * (k_pad / kGptqTileK);
  if (products > kFastDivmodMax) {
    throw_size_limit(op, "splits x k tiles (k_pad / 128)", products, kFastDivmodMax);
  }
  return FastDivmod(static_cast<std::uint32_t>(splits));
}

struct FusedParams : GemmOperands {
  float* partials;               // [splits][n_ctas][m][block_n] f32: the live rows only
  int* counters;                 // [n_ctas] ints, zero between launches
  int groups_per_stage;  // 128 / group_rows when group_rows <= 128, else 1
  // Launch-fixed divisors (no division routine per stage or at entry):
  FastDivmod stages_per_group;  // group_rows / 128 when group_rows >= 128, else 1
  FastDivmod splits;            // split s covers k tiles [s * k_tiles / splits, (s + 1) * k_tiles / splits)
};

template <int MT, int NB, bool kZeros, int kStagesN>
struct FusedShape {
  static constexpr int kStages = kStagesN;               // cp.async ring depth
  static constexpr int kKG = kWarps / NB;                // k-groups of warps
  static constexpr int kKS = kK16PerStage / kKG;         // k16 steps per warp per stage
  static constexpr int kBN = NB * kGptqTileN;            // columns per CTA
  static constexpr int kRows = MT * 16;                  // activation rows per CTA
  static constexpr int kBlockBytes = (kGptqTileK / 16) * 512;  // one column block's weights per stage
  static constexpr int kWBytes = NB * kBlockBytes;
  static constexpr int kABytes = kRows * kGptqTileK * 2;
  static constexpr int kSBytes = kMaxGroupsPerStage * kBN * 2;
  static constexpr int kZBytes = kZeros ? kMaxGroupsPerStage * kBN : 0;
  static constexpr int kStageBytes = kWBytes + kABytes + kSBytes + kZBytes;
  static constexpr int kSmemBytes = kStageBytes * kStages;
  // Stages of weights requested into L2 (bulk prefetch) beyond the cp.async
  // ring, about 64 KiB per CTA: DRAM sees far more bytes in flight than
  // shared memory could hold, and the ring's cp.async then hit L2.
  static constexpr int kL2Ahead = 16 / NB;
  static constexpr int kFrag = MT * 8 * 4;  // accumulator floats per thread
  static constexpr int kRedBytes = (kKG - 1) * NB * kFrag * 32 * 4;
  static_assert(kKG * kKS == kK16PerStage, "k16 steps must split evenly over the k-groups");
  static_assert(kRedBytes <= kSmemBytes, "the k-group reduction reuses the pipeline's shared memory");
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
  static_assert(kBlockBytes == kThreads * 16, "one 16-byte cp.async per thread per column block");
};

template <class T, int MT, int NB, bool kZeros, int kStagesN, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gptq_fused_kernel(const FusedParams p) {
  using Shape = FusedShape<MT, NB, kZeros, kStagesN>;
  using M = Int4Math<T>;
  constexpr int kStages = Shape::kStages;
  constexpr int kKG = Shape::kKG, kKS = Shape::kKS, kBN = Shape::kBN, kFrag = Shape::kFrag;
  extern __shared__ __align__(16) unsigned char smem[];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int nbl = warp % NB, kg = warp / NB;
  const int cta_n = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
  const int n_ctas = static_cast<int>(gridDim.x);
  const int nb_first = cta_n * NB;
  const int nb_total = p.n_pad / kGptqTileN;
  const int nb_live = min(NB, nb_total - nb_first);  // column blocks of this CTA that exist
  const bool warp_active = nbl < nb_live;
  const int k_tiles = p.k_pad / kGptqTileK;
  const int k16_total = p.k_pad / 16;
  const int splits = static_cast<int>(p.splits.divisor);
  const SplitRange k_range = split_k_range(p.splits, split, k_tiles);
  const int kt_begin = k_range.begin, kt_end = k_range.end;
  const int num_kt = kt_end - kt_begin;
  const int live_rows = min(p.m, Shape::kRows);
  const T* a = static_cast<const T*>(p.a);
  const T* scales = static_cast<const T*>(p.scales);

  // Weights of column block l (< nb_live) of this CTA at k tile kt.
  auto w_stage = [&](int l, int kt) {
    return p.qweight + (static_cast<std::size_t>(nb_first + l) * k16_total + static_cast<std::size_t>(kt) * kK16PerStage) * 128;
  };

  // Activation rows >= m: zeroed once in every slot; the pipeline never
  // writes them (no global request for rows that do not exist).
  {
    const int dead_chunks = (Shape::kRows - live_rows) * 16;
    for (int c = tid; c < kStages * dead_chunks; c += kThreads) {
      const int s = c / dead_chunks, r = c - s * dead_chunks;
      *reinterpret_cast<uint4*>(smem + s * Shape::kStageBytes + Shape::kWBytes + live_rows * 256 + r * 16) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  }

  auto load_stage = [&](int slot, int kt) {
    unsigned char* st = smem + slot * Shape::kStageBytes;
    // Weights: per column block 8 consecutive 512-byte k16 tiles (4 KiB contiguous), 16 bytes per thread.
#pragma unroll
    for (int l = 0; l < NB; ++l) {
      if (l < nb_live) cp_async_16(smem_u32(st + l * Shape::kBlockBytes + tid * 16), w_stage(l, kt) + tid * 4);
    }
    // Activations: live rows x 128, 16 chunks of 16 bytes per row, chunk c at c ^ (row & 7).
    unsigned char* as = st + Shape::kWBytes;
#pragma unroll
    for (int i = 0; i < (Shape::kRows * 16 + kThreads - 1) / kThreads; ++i) {
      const int c = tid + i * kThreads;
      if (c < live_rows * 16) {
        const int row = c >> 4, ch = c & 15;
        const int col = kt * kGptqTileK + ch * 8;
        const bool ok = col < p.k;
        const T* src = ok ? a + static_cast<std::size_t>(row) * p.k + col : a;
        cp_async_16(smem_u32(as + row * 256 + ((ch ^ (row & 7)) << 4)), src, ok);
      }
    }
    // Scale (and zero) rows of the stage's groups (columns < n_pad: whole column blocks).
    const int g0 = static_cast<int>(p.stages_per_group.div(static_cast<std::uint32_t>(kt * p.groups_per_stage)));
    unsigned char* ss = as + Shape::kABytes;
#pragma unroll
    for (int i = 0; i < (kMaxGroupsPerStage * (kBN / 8) + kThreads - 1) / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int gi = c / (kBN / 8), cc = c % (kBN / 8);
      if (gi < p.groups_per_stage && cc < nb_live * (kGptqTileN / 8)) {
        cp_async_16(smem_u32(ss + (gi * kBN + cc * 8) * 2),
                    scales + static_cast<std::size_t>(g0 + gi) * p.n_pad + nb_first * kGptqTileN + cc * 8);
      }
    }
    if constexpr (kZeros) {
      unsigned char* zs = ss + Shape::kSBytes;
#pragma unroll
      for (int i = 0; i < (kMaxGroupsPerStage * (kBN / 16) + kThreads - 1) / kThreads; ++i) {
        const int c = tid + i * kThreads;
        const int gi = c / (kBN / 16), cc = c % (kBN / 16);
        if (gi < p.groups_per_stage && cc < nb_live * (kGptqTileN / 16)) {
          cp_async_16(smem_u32(zs + gi * kBN + cc * 16),
                      p.zeros + static_cast<std::size_t>(g0 + gi) * p.n_pad + nb_first * kGptqTileN + cc * 16);
        }
      }
    }
  };

  // Stages [first, first + count) of this CTA's k range into L2: one bulk
  // request per column block (its k range is contiguous).
  auto prefetch_l2 = [&](int first, int count) {
    if (tid < nb_live && count > 0) {
      prefetch_l2_bulk(w_stage(tid, kt_begin + first), static_cast<std::uint32_t>(count * Shape::kBlockBytes));
    }
  };

  float acc[kFrag];
#pragma unroll
  for (int i = 0; i < kFrag; ++i) acc[i] = 0.0f;

  // Per-n-tile scale and negated biases of the current group (registers).
  std::uint32_t sc[8], blo[8], bhi[8];
  int cur_group = -1;
  auto set_group = [&](const unsigned char* st, int gl) {
    const unsigned char* ss = st + Shape::kWBytes + Shape::kABytes;
    unpack_scales(*reinterpret_cast<const uint4*>(ss + (gl * kBN + nbl * kGptqTileN + gid * 8) * 2), sc);
    if constexpr (kZeros) {
      const unsigned char* zs = ss + Shape::kSBytes;
      unpack_zeros<T>(*reinterpret_cast<const uint2*>(zs + gl * kBN + nbl * kGptqTileN + gid * 8), blo, bhi);
    }
  };
  if constexpr (!kZeros) {
#pragma unroll
    for (int t = 0; t < 8; ++t) M::biases(p.zero_value, blo[t], bhi[t]);
  }

  // One stage of this warp: kTiles m16 tiles (the live ones; no per-mma
  // branches, so dequantization and mma interleave freely).
  auto compute_stage = [&](auto tiles, int slot) {
    constexpr int kTiles = decltype(tiles)::value;
    const unsigned char* st = smem + slot * Shape::kStageBytes;
    const unsigned char* ws = st + nbl * Shape::kBlockBytes;
    const unsigned char* as = st + Shape::kWBytes;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      const int kk = kg * kKS + ks;
      const int gl = (kk * p.groups_per_stage) / kK16PerStage;
      if (ks == 0 || gl != cur_group) {
        cur_group = gl;
        set_group(st, gl);
      }
      const uint4 wq = *reinterpret_cast<const uint4*>(ws + kk * 512 + lane * 16);
      std::uint32_t af[kTiles][4];
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) {
        const int row = mt * 16 + (lane & 15);
        const int chunk = kk * 2 + (lane >> 4);
        ldmatrix_x4(af[mt], smem_u32(as + row * 256 + ((chunk ^ (row & 7)) << 4)));
      }
      const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t b[4];
        dequant_scaled<T>(words[j], sc[2 * j], blo[2 * j], bhi[2 * j], sc[2 * j + 1], blo[2 * j + 1], bhi[2 * j + 1], b);
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) {
          mma_16816_at<T>(&acc[(mt * 8 + 2 * j) * 4], af[mt], b[0], b[1]);
          mma_16816_at<T>(&acc[(mt * 8 + 2 * j + 1) * 4], af[mt], b[2], b[3]);
        }
      }
    }
  };

  // ── Pipeline ──
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_kt) load_stage(s, kt_begin + s);
    cp_async_commit();
  }
  prefetch_l2(kStages - 1, min(Shape::kL2Ahead, num_kt - (kStages - 1)));
  for (int it = 0; it < num_kt; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = it + kStages - 1;
    if (next < num_kt) load_stage(next % kStages, kt_begin + next);
    cp_async_commit();
    if (next + Shape::kL2Ahead < num_kt) prefetch_l2(next + Shape::kL2Ahead, 1);
    if (warp_active) {
      if constexpr (MT >= 3) {
        // The top tile is all padding for m <= (MT - 1) * 16 (zero rows): skip its mma.
        if (live_rows > (MT - 1) * 16) {
          compute_stage(std::integral_constant<int, MT>{}, it % kStages);
        } else {
          compute_stage(std::integral_constant<int, MT - 1>{}, it % kStages);
        }
      } else {
        compute_stage(std::integral_constant<int, MT>{}, it % kStages);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ── k-groups -> k-group 0, in k-group order ──
  if constexpr (kKG > 1) {
    float* red = reinterpret_cast<float*>(smem);
    if (kg > 0 && warp_active) {
      float* mine = red + ((kg - 1) * NB + nbl) * kFrag * 32;
#pragma unroll
      for (int i = 0; i < kFrag; ++i) mine[i * 32 + lane] = acc[i];
    }
    __syncthreads();
    if (kg == 0 && warp_active) {
#pragma unroll
      for (int g = 1; g < kKG; ++g) {
        const float* theirs = red + ((g - 1) * NB + nbl) * kFrag * 32;
#pragma unroll
        for (int i = 0; i < kFrag; ++i) acc[i] += theirs[i * 32 + lane];
      }
    }
  }

  T* out = static_cast<T*>(p.out);
  if (splits == 1) {
    if (kg == 0 && warp_active) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int col = (nb_first + nbl) * kGptqTileN + t * 8 + tig * 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = mt * 16 + gid + 8 * h;
            if (row < live_rows && col < p.n) {
              const int i = (mt * 8 + t) * 4 + 2 * h;
              *reinterpret_cast<std::uint32_t*>(out + static_cast<std::size_t>(row) * p.n + col) =
                  pack2<T>(acc[i], acc[i + 1]);
            }
          }
        }
      }
    }
    return;
  }

  // ── Split-K: the live rows of the partial tile, [row][kBN] f32, to the
  // workspace; the CTA that arrives last sums them in split order ──
  const std::size_t tile_floats = static_cast<std::size_t>(live_rows) * kBN;
  if (kg == 0 && warp_active) {
    float* part = p.partials + (static_cast<std::size_t>(split) * n_ctas + cta_n) * tile_floats;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const int col = nbl * kGptqTileN + t * 8 + tig * 2;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = mt * 16 + gid + 8 * h;
          if (row < live_rows) {
            const int i = (mt * 8 + t) * 4 + 2 * h;
            __stcg(reinterpret_cast<float2*>(part + static_cast<std::size_t>(row) * kBN + col),
                   make_float2(acc[i], acc[i + 1]));
          }
        }
      }
    }
  }
  constexpr int kPer = (Shape::kRows * (kBN / 4) + kThreads - 1) / kThreads;
  splitk_finish_last<T, kThreads, kPer, /*kChunked=*/true>(p.partials, p.counters, cta_n, n_ctas, splits, live_rows, kBN,
                                        nb_first * kGptqTileN, p.n, out);
}

// ── Configurations ──────────────────────────────────────────────────────────

// m16 tiles, 64-column blocks per CTA, cp.async stages, CTAs per SM asked of
// the register allocator. Shared memory (symmetric / with zeros): 84 / 90,
// 90 / 95, 180 / 190 KiB, so 2, 2 and 1 CTAs per SM.
template <int Config>
struct FusedConfigOf;
template <>
struct FusedConfigOf<0> {  // m <= 16
  static constexpr int kMT = 1, kNB = 2, kStages = 6, kMinBlocks = 2;
};
template <>
struct FusedConfigOf<1> {  // m <= 32
  static constexpr int kMT = 2, kNB = 2, kStages = 5, kMinBlocks = 2;
};
template <>
struct FusedConfigOf<2> {  // m <= 64 (three live m16 tiles up to m = 48)
  static constexpr int kMT = 4, kNB = 4, kStages = 5, kMinBlocks = 1;
};
constexpr int kNumConfigs = 3;

int config_for_m(int m) { return m <= 16 ? 0 : (m <= 32 ? 1 : 2); }

template <class T, int Config, bool kZeros>
auto fused_kernel_ptr() {
  using C = FusedConfigOf<Config>;
  return &gptq_fused_kernel<T, C::kMT, C::kNB, kZeros, C::kStages, C::kMinBlocks>;
}
template <int Config, bool kZeros>
constexpr int fused_smem_bytes() {
  using C = FusedConfigOf<Config>;
  return FusedShape<C::kMT, C::kNB, kZeros, C::kStages>::kSmemBytes;
}

// A configuration that needs more shared memory than the device lets one
// block have (`smem_optin`; config 2 on an A100: 180 / 190 of 163 KiB) is
// not made there: 0 blocks (gptq_fused_max_rows keeps launches off it).
template <class T, int Config, bool kZeros>
void prepare_one(int& blocks_per_sm, int smem_optin) {
  if (fused_smem_bytes<Config, kZeros>() > smem_optin) {
    blocks_per_sm = 0;
    return;
  }
  blocks_per_sm = opt_in_blocks_per_sm("gemm_gptq", fused_kernel_ptr<T, Config, kZeros>(), kThreads,
                                       fused_smem_bytes<Config, kZeros>());
}

// Blocks per SM of each (dtype, config), the zero-array variant (the plan
// must not depend on it; it needs the most shared memory, so where it fits
// both do). Made once per device, which sets the shared-memory limits of
// every instance there.
struct Occupancy {
  int blocks[2][kNumConfigs] = {};
};

template <class T>
void prepare_dtype(int (&blocks)[kNumConfigs], int smem_optin) {
  int unused = 0;
  prepare_one<T, 0, false>(unused, smem_optin);
  prepare_one<T, 0, true>(blocks[0], smem_optin);
  prepare_one<T, 1, false>(unused, smem_optin);
  prepare_one<T, 1, true>(blocks[1], smem_optin);
  prepare_one<T, 2, false>(unused, smem_optin);
  prepare_one<T, 2, true>(blocks[2], smem_optin);
}

const Occupancy& occupancy() {
  static PerDevice<Occupancy> per_device;
  return per_device.current("gemm_gptq", [](int device) {
    int smem_optin = 0;
    const cudaError_t err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) throw_cuda_error("gemm_gptq", "cudaDeviceGetAttribute", err);
    Occupancy occ;
    prepare_dtype<__half>(occ.blocks[0], smem_optin);
    prepare_dtype<__nv_bfloat16>(occ.blocks[1], smem_optin);
    return occ;
  });
}

bool config_available(const Occupancy& occ, int config) {
  return occ.blocks[0][config] > 0 && occ.blocks[1][config] > 0;
}

constexpr int config_nb(int config) {
  return config == 0 ? FusedConfigOf<0>::kNB : (config == 1 ? FusedConfigOf<1>::kNB : FusedConfigOf<2>::kNB);
}
constexpr int config_mt(int config) {
  return config == 0 ? FusedConfigOf<0>::kMT : (config == 1 ? FusedConfigOf<1>::kMT : FusedConfigOf<2>::kMT);
}

GptqPlan plan_for(int dtype_index, int config, int k_pad, int n_pad, int num_sms) {
  GptqPlan plan;
  plan.config = config;
  plan.m_tile = config_mt(config) * 16;
  plan.block_n = config_nb(config) * kGptqTileN;
  plan.n_ctas = (n_pad + plan.block_n - 1) / plan.block_n;
  const int k_tiles = k_pad / kGptqTileK;
  const int blocks = occupancy().blocks[dtype_index][config];
  if (blocks < 1) {
    throw_bad_dispatch("gemm_gptq", "fused kernel configuration (more shared memory than the device has)", config);
  }
  const long long slots = static_cast<long long>(std::max(num_sms, 1)) * blocks;
  // Time model: waves x (k tiles per CTA + a fixed cost of ~2 tiles for the
  // pipeline fill and the epilogue). Fewest splits among the best.
  constexpr int kFixedTiles = 2;
  constexpr int kMaxSplits = 32;
  long long best = -1;
  for (int s = 1; s <= std::min(k_tiles, kMaxSplits); ++s) {
    const long long waves = (static_cast<long long>(plan.n_ctas) * s + slots - 1) / slots;
    const long long cost = waves * ((k_tiles + s - 1) / s + kFixedTiles);
    if (best < 0 || cost < best) {
      best = cost;
      plan.splits = s;
    }
  }
  return plan;
}

// The instance's shared-memory opt-in on the current device (occupancy()
// sets it too, but a launch does not depend on a plan having been made there).
template <class T, int Config, bool kZeros>
void prepare_fused() {
  using C = FusedConfigOf<Config>;
  constexpr auto kernel = &gptq_fused_kernel<T, C::kMT, C::kNB, kZeros, C::kStages, C::kMinBlocks>;
  require_prepared<kernel>("gemm_gptq", "fused kernel's shared-memory bytes (device opt-in shared memory)",
                           fused_smem_bytes<Config, kZeros>());
}

template <class T, int Config>
void launch_fused(const GptqGemmArgs& args, const GptqPlan& plan, cudaStream_t stream) {
  FusedParams p{};
  static_cast<GemmOperands&>(p) = gemm_operands(args);
  p.partials = args.partials;
  p.counters = args.counters;
  const int rows = args.w.group_rows;
  p.groups_per_stage = rows <= kGptqTileK ? kGptqTileK / rows : 1;
  p.stages_per_group = FastDivmod(static_cast<std::uint32_t>(rows >= kGptqTileK ? rows / kGptqTileK : 1));
  p.splits = split_range_divisor("gemm_gptq", plan.splits, args.w.k_pad);
  const dim3 grid(static_cast<unsigned>(plan.n_ctas), static_cast<unsigned>(plan.splits));
  if (args.w.zeros != nullptr) {
    prepare_fused<T, Config, true>();
    fused_kernel_ptr<T, Config, true>()<<<grid, kThreads, fused_smem_bytes<Config, true>(), stream>>>(p);
  } else {
    prepare_fused<T, Config, false>();
    fused_kernel_ptr<T, Config, false>()<<<grid, kThreads, fused_smem_bytes<Config, false>(), stream>>>(p);
  }
  check_launch("gemm_gptq");
}

// ── Streaming kernel (m <= kGptqStreamMaxM) ─────────────────────────────────
//
// docs/design/gptq_small_m.md §2. At m <= 16 the op is a stream of the INT4
// weights; what limits it is the bytes in flight per SM, so:
//   * mma.sync m16n8k16 with A = 16 features x 16 k (dequantized weights) and
//     B = 16 k x 8 activation rows (rows >= m zero), D = features x rows.
//     A repacked word j of lane (g, t) is one A fragment of features
//     16j .. 16j + 15 of its column block: Int4Math::dequant_unscaled's
//     (b0, b1, b2, b3) are (a0, a2, a1, a3). NT = ceil(m / 8) B tiles.
//   * CTA = 4 warps over one 64-feature column block and one k-range (split
//     s of S, grid.y; S from the plan below, so every shape fills the GPU in
//     about one wave). Warp q takes the 128-row chunks q, q + 4, ... of the
//     range (4 KiB contiguous each). No barrier spans warps in the loop.
//   * Two sources of a warp's chunks (template kSource, StreamSource):
//     - registers (Stream): per lane a chunk is 8 16-byte loads straight into
//       registers; the next chunk's are issued before the current one is
//       consumed, and lane 0 asks L2 (bulk prefetch) for the kStreamL2Ahead
//       chunks after that. Activations are read as B fragments from global
//       (L1/L2 hits).
//     - bulk copies (StreamBulk, sm_90): a warp-private ring of p.ring slots
//       in shared memory; per chunk one 4 KiB bulk copy of the weights, one
//       per live activation row (its 128 columns) and one per scale (zero)
//       row of the groups the chunk touches (the column block's 128 (64)
//       bytes), completing on the slot's mbarrier. The warp waits on the
//       slot, reads its weights (one 16-byte load per lane per k16 step),
//       activations (ldmatrix, two k16 steps per load; rows >= m and columns
//       >= k zero in shared memory) and scales, and its lanes refill the
//       slot with the chunk p.ring on. No registers hold data in flight (95
//       registers at NT = 1 without zeros; with the default two slots per
//       warp 4 CTAs per SM, see stream_ring_for), no global loads
//       in the loop. Same chunks, same order, same math as the register
//       source: the same bits for the same split plan. Groups of 32 rows or
//       more (a slot has room for 4 group rows).
//   * Register source: the scale (and zero) row of the next chunk's first
//     group is loaded with the next chunk, so a group change at a chunk
//     start (g128: every chunk) does not wait on L2. (The bulk source's
//     scale rows arrive with the chunk: session 10 measured the loads
//     issued one chunk ahead at 8 % of the time at 8192 x 28672, m = 1.)
//   * Scale-after: the mma runs on the exact integers q - z
//     (Int4Math::dequant_unscaled, 4 fewer instructions per word than
//     scaling first), into per-group f32 sums that are multiplied by the
//     feature's scale and added at each group's end (g128: once per chunk).
//     More exact than the fused kernel's scale-before (no rounding of the
//     scaled weight); both are exact on the tests' power-of-two scales.
//   * Register source: two register buffers used in turn (no copies between them).
//   * Warps summed through shared memory in warp order (every thread its
//     own tile elements: cta_sums_to_tile), then the splits through the
//     workspace in split order (splitk_finish_last):
//     fixed order, bitwise reproducible. With GptqGemmArgs::cluster_reduce
//     (bulk source, 2..8 splits) the splits of a column block are one
//     cluster and sum the same way through distributed shared memory
//     (cluster_sum_store): no workspace round trip, fence or atomic.
constexpr int kStreamThreads = 128;
constexpr int kStreamWarps = kStreamThreads / 32;
constexpr int kChunkK16 = kGptqTileK / 16;  // k16 steps per chunk (8)
constexpr int kChunkWords = kChunkK16 * 128;  // u32 of one column block's chunk (4 KiB)
constexpr int kStreamL2Ahead = 2;           // chunks per warp requested into L2 beyond the register pair
// StreamParams::splits divides split * chunks (chunks = k_pad / 128, k_pad an int).
static_assert(static_cast<long long>(kGptqMaxStreamSplits) * (INT_MAX / kGptqTileK) <= kFastDivmodMax,
              "the chunk range's numerators fit FastDivmod");
// Bulk source: bytes from one activation row to the next in a ring slot
// (256 + 16: rows 8 apart land 4 banks apart, so a B-fragment load is
// conflict-free), and one slot: a chunk's weights and NT * 8 activation rows.
constexpr int kStreamActPitch = kGptqTileK * 2 + 16;
// After the activation rows, a chunk's scale rows (its column block's 64
// scales, 128 bytes each) and zero rows (64 bytes each): one per group the
// chunk touches, at most 4 (groups of 32 rows; the bulk source does not take
// groups of 16, whose 8 rows would not fit the deepest ring at NT = 2 in
// the 227 KiB a CTA may have).
constexpr int kSlotGroupRows = 4;
static_assert(kGptqBulkMinGroupRows == kGptqTileK / kSlotGroupRows, "a slot holds the group rows of a chunk");
// Lane roles of a chunk's copies: lanes 0 .. m - 1 the activation rows,
// 16 .. 16 + kSlotGroupRows - 1 the group rows, 31 the weights.
static_assert(kGptqStreamMaxM <= 16 && 16 + kSlotGroupRows <= 31, "the copy lanes' roles must not overlap");
constexpr int kScaleRowBytes = kGptqTileN * 2;
constexpr int kZeroRowBytes = kGptqTileN;
constexpr int stream_slot_scales_at(int nt) { return kChunkWords * 4 + nt * 8 * kStreamActPitch; }
constexpr int stream_slot_zeros_at(int nt) { return stream_slot_scales_at(nt) + kSlotGroupRows * kScaleRowBytes; }
constexpr int stream_slot_bytes(int nt) { return stream_slot_zeros_at(nt) + kSlotGroupRows * kZeroRowBytes; }

// CTAs per SM asked of the register allocator, the most without spills
// (ptxas). Register source: two 4 KiB buffers, the running and the group
// sums, the biases. Bulk source (no weight registers): 5 at NT = 1 without
// zeros (<= 96 registers), else 4 (<= 128).
template <int NT, bool kZeros, bool kBulk>
constexpr int kStreamMinBlocks = kBulk ? (NT == 1 ? (kZeros ? 4 : 5) : 4) : (NT == 1 ? 3 : 2);

// Where a warp's chunks come from (see above). (A third source, the bulk
// source with its first ring of weight copies issued before the PDL wait,
// and a stream-K form of the bulk source were measured slower in session 10
// and removed: docs/design/gptq_small_m.md §7. The early weight copies came
// back in session 20 as a runtime flag of the bulk source,
// StreamParams::weights_before_wait, behind the caller's promise: §12.)
enum class StreamSource { Registers, Bulk };

struct StreamParams : GemmOperands {
  float* partials;  // [splits][n_pad / 64][m][64] f32 (splits > 1)
  int* counters;    // [n_pad / 64] ints, zero between launches
  // The divisors of the kernel's chunk math, fixed at launch. As division
  // routines they cost the long streams 1-2 % (one per chunk and refill);
  // the two 64-bit ones ahead of the first weight copy measured nothing
  // (session 42):
  FastDivmod k16_per_group;  // group_rows / 16: 1, 2, 4 or a multiple of 8 (gptq_repack.hpp)
  int group_step_mask;  // min(k16_per_group, 8) - 1: a new group starts at k16 steps s & mask == 0
  FastDivmod splits;    // split s covers chunks [s * chunks / splits, (s + 1) * chunks / splits)
  int ring;  // bulk source: chunk slots per warp in shared memory (1 .. kGptqStreamMaxRing)
  int group_rows_per_chunk;  // bulk source: scale (zero) rows a chunk touches, max(1, 8 / k16_per_group)
  bool cluster_reduce;  // bulk source, 2 .. kGptqClusterMaxSplits splits launched as one cluster per column block
  bool weights_before_wait;  // bulk source: gemm_weights_before_wait (the first fills' weights before the PDL wait)
  bool weights_evict_first;  // bulk source: gptq_weights_evict_first (the weight and scale copies' L2 policy)
  bool release_next;  // bulk source: pdl_chain_release (trigger the next kernel right after the PDL wait)
  GptqResidualOut residual_out;
#if defined(FERRUM_GPTQ_TIMELINE)
  int timeline_slot;  // this launch's slot of g_gptq_timeline
#endif
};

// FERRUM_GPTQ_TIMELINE's recorder (gptq_gemm.hpp): thread 0 of each CTA
// stores the stamps; without the option it holds nothing and its calls
// compile to nothing. The Entry stamp is taken first and stored with the
// wait's (nothing global is written before the PDL wait).
#if defined(FERRUM_GPTQ_TIMELINE)
__device__ GptqTimelineStamp g_gptq_timeline[kGptqTimelineLaunches][kGptqTimelineCtas][kGptqTimelinePoints];

__device__ __forceinline__ GptqTimelineStamp gptq_timeline_now() {
  unsigned long long ns;
  unsigned sm;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return GptqTimelineStamp{ns, static_cast<unsigned long long>(clock64()), sm};
}
#endif

class StreamTimeline {
 public:
  __device__ explicit StreamTimeline(const StreamParams& p) {
#if defined(FERRUM_GPTQ_TIMELINE)
    slot_ = p.timeline_slot;
    entry_ = gptq_timeline_now();
#else
    (void)p;
#endif
  }
  // Right after the PDL wait: the Entry and WaitReturned stamps.
  __device__ void mark_wait_returned() const {
#if defined(FERRUM_GPTQ_TIMELINE)
    store(GptqTimelinePoint::Entry, entry_);
    store(GptqTimelinePoint::WaitReturned, gptq_timeline_now());
#endif
  }
  __device__ void mark(GptqTimelinePoint point) const {
#if defined(FERRUM_GPTQ_TIMELINE)
    store(point, gptq_timeline_now());
#else
    (void)point;
#endif
  }

 private:
#if defined(FERRUM_GPTQ_TIMELINE)
  __device__ void store(GptqTimelinePoint point, const GptqTimelineStamp& stamp) const {
    const unsigned cta = blockIdx.y * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0 && cta < static_cast<unsigned>(kGptqTimelineCtas)) {
      g_gptq_timeline[slot_][cta][static_cast<int>(point)] = stamp;
    }
  }
  int slot_;
  GptqTimelineStamp entry_;
#endif
};

// Bytes of the warp sums (every warp's acc, [warps][NT * 16][32] f32) at the
// start of the bulk source's ring memory, and the CTA's [NT * 8][64] f32 sum
// tile after them.
template <int NT>
constexpr int kStreamRedBytes = static_cast<int>(sizeof(float)) * kStreamWarps * NT * 16 * 32;
template <int NT>
constexpr int kStreamTileBytes = static_cast<int>(sizeof(float)) * NT * 8 * kGptqTileN;

// The CTA's sums, every thread at once (after a barrier that follows every
// warp's red[warp] = acc): tile[r][f] = red[0] + red[1] + ... in warp order
// (the order warp 0 once summed them in, so the bits are unchanged) for the
// live rows r < m. Warp w's acc holds row r, feature f of the CTA's
// [NT * 8][64] tile at D fragment (nt, j) = (r / 8, f / 16), element
// e = (r & 1) + (f % 16 >= 8 ? 2 : 0), of lane 4 (f % 8) + (r % 8) / 2.
// Spread over the CTA, so that no single warp walks the whole tile (the
// SiLU·mul epilogue alone took ~1.2 us in warp 0: session 25's profile).
template <int NT>
__device__ __forceinline__ void cta_sums_to_tile(const float (*red)[NT * 16][32], float* tile /* [NT * 8][64] */,
                                                 int m) {
  const int live = min(m, NT * 8) * kGptqTileN;
  for (int idx = static_cast<int>(threadIdx.x); idx < live; idx += kStreamThreads) {
    const int r = idx / kGptqTileN, f = idx % kGptqTileN;
    const int i = ((r / 8) * 4 + f / 16) * 4 + (r & 1) + ((f % 16) >= 8 ? 2 : 0);
    const int lane = (f % 8) * 4 + (r % 8) / 2;
    float v = red[0][i][lane];
#pragma unroll
    for (int w = 1; w < kStreamWarps; ++w) v += red[w][i][lane];
    tile[idx] = v;
  }
}


// kSiluOut (launch_gptq_gemm_silu_mul; bulk source, NT = 1, one split): the
// output columns are (gate, up) pairs and p.out is act [m, n / 2].
template <class T, int NT, bool kZeros, StreamSource kSource, bool kSiluOut = false>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks<NT, kZeros, kSource != StreamSource::Registers>)
    gptq_stream_kernel(const StreamParams p) {
  constexpr bool kBulk = kSource != StreamSource::Registers;
  static_assert(!kSiluOut || (kBulk && NT == 1), "silu·mul epilogue: the bulk source with one row tile");
  const StreamTimeline timeline(p);
  using M = Int4Math<T>;
  constexpr int kAcc = NT * 4 * 4;  // [nt][j][4] f32
  // The bulk source's rings (dynamic shared memory; none for the register
  // source), where every warp leaves its sums (red) and the CTA's sum tile:
  // the bulk source reuses its rings (after a barrier), the register source
  // has its own.
  extern __shared__ __align__(128) unsigned char ring_smem[];  // [warps][p.ring][stream_slot_bytes(NT)]
  float(*red)[kAcc][32];
  float* tile;  // [NT * 8][kGptqTileN]
  if constexpr (kBulk) {
    static_assert(kStreamRedBytes<NT> == sizeof(float) * kStreamWarps * kAcc * 32, "one layout of the sums");
    static_assert(kStreamRedBytes<NT> + kStreamTileBytes<NT> <= kStreamWarps * stream_slot_bytes(NT),
                  "the warp sums and the sum tile fit in the smallest ring (one slot per warp)");
    red = reinterpret_cast<float(*)[kAcc][32]>(ring_smem);
    tile = reinterpret_cast<float*>(ring_smem + kStreamRedBytes<NT>);
  } else {
    __shared__ float red_own[kStreamWarps][kAcc][32];
    __shared__ __align__(16) float tile_own[NT * 8 * kGptqTileN];  // read as float4 (the residual epilogue)
    red = red_own;
    tile = tile_own;
  }

  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int nb = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
  const int nb_total = static_cast<int>(gridDim.x);
  const int chunks = p.k_pad / kGptqTileK;
  const int splits = static_cast<int>(p.splits.divisor);
  // splits * chunks <= 2^31 - 1 (kGptqMaxStreamSplits' static_assert; the launcher checks it too).
  const SplitRange chunk_range = split_k_range(p.splits, split, chunks);
  const int c_begin = chunk_range.begin, c_end = chunk_range.end;
  // This column block's weight stream: chunk c at wblock + c * kChunkWords; lane's 16 bytes of k16 step s at + s * 128 + lane * 4.
  const std::uint32_t* wblock = p.qweight + static_cast<std::size_t>(nb) * (p.k_pad / 16) * 128;
  const std::uint32_t* wlane = wblock + lane * 4;
  const T* scales = static_cast<const T*>(p.scales);
  // Activations as pairs: row r, columns 2c, 2c + 1 at act[r * k / 2 + c] (k is even).
  const std::uint32_t* act = static_cast<const std::uint32_t*>(p.a);
  const int half_k = p.k >> 1;
  // Lane gid's slice of a scale / zero row (8 features of the column block).
  const std::size_t sz_col = static_cast<std::size_t>(nb) * kGptqTileN + gid * 8;

  // acc: the CTA's running sums; part: this group's unscaled sums (q - z)·a,
  // folded into acc (times the feature's scale) at each group's end.
  float acc[kAcc], part[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = part[i] = 0.0f;

  // The current group: the 8 features' scales (feature 8t + gid: scf[t]) and
  // the negated biases of their zeros.
  float scf[8];
  std::uint32_t blo[8], bhi[8];
  if constexpr (!kZeros) {
#pragma unroll
    for (int t = 0; t < 8; ++t) M::biases(p.zero_value, blo[t], bhi[t]);
  }
  // The group of chunk c's first row.
  auto first_group = [&](int c) { return p.k16_per_group.div(static_cast<std::uint32_t>(c * kChunkK16)); };
  // Scale (zero) row of group g, lane gid's 8 features.
  auto load_group_row = [&](int g, uint4& s_raw, uint2& z_raw) {
    const std::size_t at = static_cast<std::size_t>(g) * p.n_pad + sz_col;
    s_raw = __ldg(reinterpret_cast<const uint4*>(scales + at));
    if constexpr (kZeros) z_raw = __ldg(reinterpret_cast<const uint2*>(p.zeros + at));
  };
  auto set_group = [&](const uint4& s_raw, const uint2& z_raw) {
    const T* sv = reinterpret_cast<const T*>(&s_raw);
#pragma unroll
    for (int t = 0; t < 8; ++t) scf[t] = to_float(sv[t]);
    if constexpr (kZeros) unpack_zeros<T>(z_raw, blo, bhi);
  };
  // D fragment (nt, j): d0 / d1 are feature 16j + g (scale scf[2j]), d2 / d3 feature 16j + 8 + g (scf[2j + 1]).
  auto fold = [&] {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      acc[i] = fmaf(scf[2 * ((i / 4) % 4) + ((i % 4) >= 2 ? 1 : 0)], part[i], acc[i]);
      part[i] = 0.0f;
    }
  };
  // B fragment rows 8nt + gid; rows >= m read nothing (zero): pairs past
  // `limit` (0 for a dead row, k / 2 otherwise) are zero, which also zeroes
  // columns >= k (padded q dequantizes to -z, not 0).
  const std::uint32_t* arow[NT];
  int limit[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = nt * 8 + gid;
    arow[nt] = act + static_cast<std::size_t>(row < p.m ? row : 0) * half_k;
    limit[nt] = row < p.m ? half_k : 0;
  }

  // One chunk: 8 k16 steps of 16 weight bytes per lane (weight_word(s)),
  // whose first group's scale / zero row is s_raw / z_raw.
  // act_frags(s, bf) sets bf[nt][0 / 1], the B fragments of k16 step s of
  // the chunk (b0 = a[8 nt + gid][16 s + 2 tig ..+1], b1 = 8 columns on),
  // zero for rows >= m and columns >= k.
  // group_row(g, s_raw, z_raw): the scale (zero) row of group g, a group
  // that starts inside the chunk.
  auto process = [&](auto&& weight_word, auto&& act_frags, auto&& group_row, int c, const uint4& s_raw,
                     const uint2& z_raw) {
    set_group(s_raw, z_raw);
    int g = static_cast<int>(first_group(c));  // groups of >= 128 rows start at chunks
#pragma unroll
    for (int s = 0; s < kChunkK16; ++s) {
      if (s > 0 && (s & p.group_step_mask) == 0) {  // warp-uniform; groups of 16-64 rows only
        fold();
        uint4 s2;
        uint2 z2 = make_uint2(0u, 0u);
        group_row(++g, s2, z2);
        set_group(s2, z2);
      }
      std::uint32_t bf[NT][2];
      act_frags(s, bf);
      const uint4 w = weight_word(s);
      const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t b[4];
        M::dequant_unscaled(words[j], blo[2 * j], bhi[2 * j], blo[2 * j + 1], bhi[2 * j + 1], b);
        const std::uint32_t af[4] = {b[0], b[2], b[1], b[3]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_16816_at<T>(&part[(nt * 4 + j) * 4], af, bf[nt][0], bf[nt][1]);
      }
    }
    fold();
  };
  // Register source: B fragments straight from global (L1 / L2 hits).
  auto act_global = [&](int c, int s, std::uint32_t (&bf)[NT][2]) {
    const int pair = (c * kChunkK16 + s) * 8 + tig;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      bf[nt][0] = pair < limit[nt] ? __ldg(arow[nt] + pair) : 0u;
      bf[nt][1] = pair + 4 < limit[nt] ? __ldg(arow[nt] + pair + 4) : 0u;
    }
  };
  auto load_chunk = [&](uint4 (&w)[kChunkK16], int c) {
#pragma unroll
    for (int s = 0; s < kChunkK16; ++s) w[s] = load_stream_16(wlane + static_cast<std::size_t>(c) * kChunkWords + s * 128);
  };
  auto prefetch_chunk = [&](int c) {
    if (lane == 0 && c < c_end) prefetch_l2_bulk(wblock + static_cast<std::size_t>(c) * kChunkWords, kChunkWords * 4u);
  };

  if constexpr (kBulk) {
    // Bulk source: warp-private rings of p.ring slots in shared memory, filled
    // by the copy engine. A slot holds one chunk: its 4 KiB of weights, the
    // live activation rows' 128 columns (row r at r * kStreamActPitch bytes;
    // the pitch staggers rows across banks) and the scale (zero) rows of its
    // groups. The warp keeps p.ring of its chunks in flight and refills a
    // slot as soon as it has read it; no registers hold data in flight, no
    // barrier spans warps, and the loop makes no global loads.
    __shared__ __align__(8) std::uint64_t ring_full[kStreamWarps][kGptqStreamMaxRing];
    constexpr int kSlotBytes = stream_slot_bytes(NT);
    unsigned char* const ring = ring_smem + static_cast<std::size_t>(warp) * p.ring * kSlotBytes;
    std::uint64_t* const full = ring_full[warp];
    if (lane == 0) {
      for (int r = 0; r < p.ring; ++r) mbarrier_init(&full[r], 1);
      fence_mbarrier_init();
    }
    const int live_rows = min(p.m, NT * 8);
    // Rows >= m of every slot are zeroed once (no copy ever writes them):
    // hygiene, not correctness (output column n depends only on B row n, and
    // output rows >= m are never stored).
    for (int r = 0; r < p.ring; ++r) {
      for (int i = lane; i < (NT * 8 - live_rows) * (kGptqTileK / 8); i += 32) {
        *reinterpret_cast<uint4*>(ring + r * kSlotBytes + kChunkWords * 4 +
                                  (live_rows + i / (kGptqTileK / 8)) * kStreamActPitch + (i % (kGptqTileK / 8)) * 16) =
            make_uint4(0u, 0u, 0u, 0u);
      }
    }
    __syncwarp();
    const T* const act_rows = static_cast<const T*>(p.a);
    // A slot's fill: lane 0 announces the slot's bytes, then lanes 0 ..
    // live_rows copy one activation row each (the valid columns of the chunk:
    // k is a multiple of 8, so 16-byte multiples), lanes 16 .. 16 +
    // group_rows_per_chunk the column block's scale (and zero) rows of the
    // chunk's groups, and lane 31 the weights. `weights` issues the
    // announcement, the weights and the scale rows; `activations` the rows of
    // a (the previous kernel's output).
    const std::uint32_t group_row_bytes = kScaleRowBytes + (kZeros ? kZeroRowBytes : 0);
    // gptq_weights_evict_first: the weight stream (read once, larger than
    // L2) does not push out what the small ops between GEMMs reuse.
    const std::uint64_t policy = p.weights_evict_first ? evict_first_policy() : 0;
    auto copy_weights = [&](void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
      if (p.weights_evict_first) {
        bulk_copy_to_shared(dst, src, bytes, bar, policy);
      } else {
        bulk_copy_to_shared(dst, src, bytes, bar);
      }
    };
    auto issue = [&](int slot, int chunk, bool weights, bool activations) {
      const int col0 = chunk * kGptqTileK;
      const std::uint32_t row_bytes = static_cast<std::uint32_t>(min(kGptqTileK, p.k - col0)) * 2u;
      unsigned char* const dst = ring + slot * kSlotBytes;
      if (weights) {
        if (lane == 0) {
          mbarrier_arrive_expect_tx(&full[slot], kChunkWords * 4u + live_rows * row_bytes +
                                                     p.group_rows_per_chunk * group_row_bytes);
        }
        __syncwarp();
        if (lane == 31) {
          copy_weights(dst, wblock + static_cast<std::size_t>(chunk) * kChunkWords, kChunkWords * 4u, &full[slot]);
        } else if (lane >= 16 && lane < 16 + p.group_rows_per_chunk) {
          const int i = lane - 16;
          const std::size_t at = static_cast<std::size_t>(first_group(chunk) + i) * p.n_pad +
                                 static_cast<std::size_t>(nb) * kGptqTileN;
          copy_weights(dst + stream_slot_scales_at(NT) + i * kScaleRowBytes, scales + at, kScaleRowBytes, &full[slot]);
          if constexpr (kZeros) {
            copy_weights(dst + stream_slot_zeros_at(NT) + i * kZeroRowBytes, p.zeros + at, kZeroRowBytes, &full[slot]);
          }
        }
      }
      if (activations && lane < live_rows) {
        bulk_copy_to_shared(dst + kChunkWords * 4 + lane * kStreamActPitch,
                            act_rows + static_cast<std::size_t>(lane) * p.k + col0, row_bytes, &full[slot]);
      }
    };
    int c = c_begin + warp;
    // gemm_weights_before_wait (the caller's promise that no kernel before
    // this one writes the weight): the first fills' weights and scale rows
    // are requested before the wait, so their DRAM latency overlaps the
    // previous kernel's tail; the activations only after it.
    if (p.weights_before_wait) {
      for (int r = 0; r < p.ring && c + r * kStreamWarps < c_end; ++r) issue(r, c + r * kStreamWarps, true, false);
    }
    // Launched with PDL: everything above touched only shared memory (and,
    // under the promise, the weight's words and scale / zero rows); from here
    // on global memory.
    pdl_begin();
    timeline.mark_wait_returned();
    // The gate|up GEMM with the SiLU·mul epilogue, under the promise: the
    // next kernel is the down projection, whose CTAs then sit resident and
    // request their first weights before their own wait, during this GEMM
    // (session 22: 439-446 -> 467-469 tok/s; the trigger alone gains nothing).
    // pdl_chain_release: every bulk launch releases the next kernel here (a
    // norm, which releases the GEMM after it before its own wait).
    if (p.release_next || (kSiluOut && p.weights_before_wait)) pdl_trigger_dependents();
    for (int r = 0; r < p.ring && c + r * kStreamWarps < c_end; ++r) {
      issue(r, c + r * kStreamWarps, !p.weights_before_wait, true);
    }
    int slot = 0;
    std::uint32_t phase = 0;
    for (; c < c_end; c += kStreamWarps) {
      mbarrier_wait_parity(&full[slot], phase);
      if (c == c_begin) timeline.mark(GptqTimelinePoint::FirstChunk);  // warp 0's first (thread 0 stores)
      if (c == c_begin + kStreamWarps) timeline.mark(GptqTimelinePoint::SecondChunk);
      unsigned char* const base = ring + slot * kSlotBytes;
      const int tail = p.k - c * kGptqTileK;  // < 128: the last chunk, whose columns >= k were not copied
      if (tail < kGptqTileK) {
        for (int i = lane; i < live_rows * (kGptqTileK / 8); i += 32) {
          const int col = (i % (kGptqTileK / 8)) * 8;
          if (col >= tail) {
            *reinterpret_cast<uint4*>(base + kChunkWords * 4 + (i / (kGptqTileK / 8)) * kStreamActPitch + col * 2) =
                make_uint4(0u, 0u, 0u, 0u);
          }
        }
        __syncwarp();
      }
      const uint4* const words = reinterpret_cast<const uint4*>(base) + lane;
      // ldmatrix x4: lane l addresses row l % 8 of 8-column block l / 8, so
      // one load gives the B fragments of steps s and s + 1.
      const std::uint32_t act_lane =
          smem_u32(base + kChunkWords * 4 + (lane % 8) * kStreamActPitch + (lane / 8) * 16);
      std::uint32_t pairs[NT][4];
      // Lane gid's 8 scales (zeros) of the chunk's group rows, in group order:
      // process asks for the groups after the first one in turn.
      const unsigned char* const scale_rows = base + stream_slot_scales_at(NT) + gid * 16;
      const unsigned char* const zero_rows = base + stream_slot_zeros_at(NT) + gid * 8;
      auto group_row_at = [&](int i, uint4& s_raw, uint2& z_raw) {
        s_raw = *reinterpret_cast<const uint4*>(scale_rows + i * kScaleRowBytes);
        if constexpr (kZeros) z_raw = *reinterpret_cast<const uint2*>(zero_rows + i * kZeroRowBytes);
      };
      uint4 s_first = make_uint4(0u, 0u, 0u, 0u);
      uint2 z_first = make_uint2(0u, 0u);
      group_row_at(0, s_first, z_first);
      int row_in_chunk = 0;
      process([&](int s) { return words[s * 32]; },
              [&](int s, std::uint32_t (&bf)[NT][2]) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                  if (s % 2 == 0) ldmatrix_x4(pairs[nt], act_lane + nt * 8 * kStreamActPitch + s * 32);
                  bf[nt][0] = pairs[nt][(s % 2) * 2];
                  bf[nt][1] = pairs[nt][(s % 2) * 2 + 1];
                }
              },
              [&](int, uint4& s_raw, uint2& z_raw) { group_row_at(++row_in_chunk, s_raw, z_raw); }, c, s_first,
              z_first);
      if (c == c_begin) timeline.mark(GptqTimelinePoint::FirstChunkDone);
      // Every lane has read the slot before it is refilled.
      __syncwarp();
      const int c_refill = c + p.ring * kStreamWarps;
      if (c_refill < c_end) {
        fence_proxy_async_shared();
        issue(slot, c_refill, true, true);
      }
      if (++slot == p.ring) {
        slot = 0;
        phase ^= 1u;
      }
    }
  } else {
    pdl_begin();  // launched with PDL: before any global access
    timeline.mark_wait_returned();
    // Two register buffers in turn (no copies): while one chunk is consumed
    // the next one's loads are in flight, and L2 holds the kStreamL2Ahead after.
    uint4 wa[kChunkK16], wb[kChunkK16];
    uint4 sa = make_uint4(0u, 0u, 0u, 0u), sb = sa;
    uint2 za = make_uint2(0u, 0u), zb = za;
    int c = c_begin + warp;
    if (c < c_end) {
      load_chunk(wa, c);
      load_group_row(static_cast<int>(first_group(c)), sa, za);
#pragma unroll
      for (int i = 1; i <= kStreamL2Ahead; ++i) prefetch_chunk(c + i * kStreamWarps);
    }
    for (; c < c_end; c += 2 * kStreamWarps) {
      const int c1 = c + kStreamWarps, c2 = c1 + kStreamWarps;
      if (c1 < c_end) {
        load_chunk(wb, c1);
        load_group_row(static_cast<int>(first_group(c1)), sb, zb);
      }
      prefetch_chunk(c + (kStreamL2Ahead + 1) * kStreamWarps);
      process([&](int s) { return wa[s]; }, [&](int s, std::uint32_t (&bf)[NT][2]) { act_global(c, s, bf); },
              load_group_row, c, sa, za);
      if (c1 >= c_end) break;
      if (c2 < c_end) {
        load_chunk(wa, c2);
        load_group_row(static_cast<int>(first_group(c2)), sa, za);
      }
      prefetch_chunk(c1 + (kStreamL2Ahead + 1) * kStreamWarps);
      process([&](int s) { return wb[s]; }, [&](int s, std::uint32_t (&bf)[NT][2]) { act_global(c1, s, bf); },
              load_group_row, c1, sb, zb);
    }
  }

  timeline.mark(GptqTimelinePoint::ChunksDone);
  // Every warp's sums -> the CTA's tile, summed by every thread.
  if constexpr (kBulk) __syncthreads();  // every warp is done with its ring before red overwrites it
#pragma unroll
  for (int i = 0; i < kAcc; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  cta_sums_to_tile<NT>(red, tile, p.m);
  timeline.mark(GptqTimelinePoint::WarpsSummed);
  T* out = static_cast<T*>(p.out);
  if constexpr (kBulk) {
    // Cluster reduce (StreamParams::cluster_reduce; grid-uniform): the
    // splits of one column block are one cluster (dims 1 x S), so they sum
    // their tiles through distributed shared memory in split order, the bits
    // of the workspace reduction (cluster_sum_store, gptq_int4.cuh, whose
    // first cluster barrier publishes the tiles; it traps below sm_90, where
    // neither clusters nor the bulk source run).
    if (p.cluster_reduce) {
      cluster_sum_store<T, kStreamThreads, 1>(tile, kGptqTileN, splits, p.m, kGptqTileN, nb * kGptqTileN, p.n, out,
                                              p.residual_out);
      timeline.mark(GptqTimelinePoint::Exit);
      return;
    }
  }
  __syncthreads();  // the tile is whole
  // One split: the output directly, one element (SiLU·mul: one pair) per
  // thread, consecutive threads on consecutive columns. Otherwise this
  // split's [m][64] f32 partial.
  const int col0 = nb * kGptqTileN;
  const int live_rows = min(p.m, NT * 8);
  if constexpr (kSiluOut) {
    // Columns 2q, 2q + 1 of the block are gate_q and up_q (act column
    // (col0 + 2q) / 2), each rounded to T first, as the unfused GEMM stores gate_up.
    for (int idx = static_cast<int>(threadIdx.x); idx < live_rows * (kGptqTileN / 2); idx += kStreamThreads) {
      const int r = idx / (kGptqTileN / 2), q = idx % (kGptqTileN / 2);
      const float gate = tile[r * kGptqTileN + 2 * q], up = tile[r * kGptqTileN + 2 * q + 1];
      if (col0 + 2 * q < p.n) {
        out[static_cast<std::size_t>(r) * (p.n / 2) + col0 / 2 + q] =
            from_float<T>(silu_mul(to_float(from_float<T>(gate)), to_float(from_float<T>(up))));
      }
    }
    timeline.mark(GptqTimelinePoint::Exit);
    return;
  }
  if (splits == 1) {  // grid-uniform
    if (p.residual_out.residual != nullptr) {
      // A quad per thread (store_quad_out: the same out bits), every thread
      // of the CTA in every iteration.
      constexpr int kQuadsPerRow = kGptqTileN / 4;
      for (int base_q = 0; base_q < live_rows * kQuadsPerRow; base_q += kStreamThreads) {
        const int q = base_q + static_cast<int>(threadIdx.x);
        const int r = q / kQuadsPerRow, c4 = (q % kQuadsPerRow) * 4;
        const bool stored = q < live_rows * kQuadsPerRow && col0 + c4 < p.n;
        const float4 sum = stored ? *reinterpret_cast<const float4*>(tile + r * kGptqTileN + c4)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        store_quad_out(out, p.n, r, col0 + c4, sum, stored, p.residual_out);
      }
    } else {
      for (int idx = static_cast<int>(threadIdx.x); idx < live_rows * kGptqTileN; idx += kStreamThreads) {
        const int r = idx / kGptqTileN, f = idx % kGptqTileN;
        if (col0 + f < p.n) out[static_cast<std::size_t>(r) * p.n + col0 + f] = from_float<T>(tile[idx]);
      }
    }
    timeline.mark(GptqTimelinePoint::Exit);
    return;
  }
  float* const split_part = p.partials + (static_cast<std::size_t>(split) * nb_total + nb) * p.m * kGptqTileN;
  for (int idx = static_cast<int>(threadIdx.x); idx < live_rows * kGptqTileN; idx += kStreamThreads) {
    __stcg(split_part + idx, tile[idx]);
  }
  constexpr int kPer = (NT * 8 * (kGptqTileN / 4) + kStreamThreads - 1) / kStreamThreads;
  splitk_finish_last<T, kStreamThreads, kPer>(p.partials, p.counters, nb, nb_total, splits, p.m, kGptqTileN,
                                              nb * kGptqTileN, p.n, out, p.residual_out);
  timeline.mark(GptqTimelinePoint::Exit);
}

#if defined(FERRUM_GPTQ_TIMELINE)
// The launches' records, one per slot of g_gptq_timeline (gptq_gemm.hpp).
std::mutex g_gptq_timeline_mutex;
long long g_gptq_timeline_launches = 0;
std::array<GptqTimelineLaunch, kGptqTimelineLaunches> g_gptq_timeline_records;

// The next slot, with this launch's record.
int gptq_timeline_claim(const GptqGemmArgs& args, int grid_x, int splits, int ring, bool cluster_reduce,
                        bool silu_out) {
  std::lock_guard<std::mutex> lock(g_gptq_timeline_mutex);
  const long long sequence = g_gptq_timeline_launches++;
  const int slot = static_cast<int>(sequence % kGptqTimelineLaunches);
  GptqTimelineLaunch& r = g_gptq_timeline_records[static_cast<std::size_t>(slot)];
  r.sequence = sequence;
  r.m = args.m;
  r.k = args.w.k;
  r.n = args.w.n;
  r.grid_x = grid_x;
  r.splits = splits;
  r.ring = ring;
  r.cluster_reduce = cluster_reduce;
  r.silu_out = silu_out;
  return slot;
}
#endif

template <class T, int NT, bool kZeros, StreamSource kSource, bool kSiluOut = false>
auto stream_kernel_ptr() {
  return &gptq_stream_kernel<T, NT, kZeros, kSource, kSiluOut>;
}

// Dynamic shared memory of the bulk source: `ring` slots per warp.
constexpr int stream_ring_bytes(int nt, int ring) { return kStreamWarps * ring * stream_slot_bytes(nt); }

// Whether a cluster of `splits` CTAs of `kernel` (its shared-memory opt-in
// done) with `smem` bytes each can be resident at all
// (cudaOccupancyMaxActiveClusters > 0). Where not (a GPU partition too
// small for one), the launch takes the workspace reduction instead of
// failing: the same bits. Asked once per device, instance, cluster size
// and ring; a failed query throws and is asked again next time.
template <class T, int NT, bool kZeros, StreamSource kSource, bool kSiluOut = false>
bool stream_cluster_fits(int splits, int ring, std::size_t smem) {
  static PerDeviceAnswers<bool, (kGptqClusterMaxSplits + 1) * (kGptqStreamMaxRing + 1)> known;
  if (splits < 0 || splits > kGptqClusterMaxSplits) throw_bad_dispatch("gemm_gptq", "cluster splits", splits);
  if (ring < 0 || ring > kGptqStreamMaxRing) throw_bad_dispatch("gemm_gptq", "ring", ring);
  const int device = current_device_index("gemm_gptq");
  return *known.get(device, splits * (kGptqStreamMaxRing + 1) + ring, [&]() -> std::optional<bool> {
    return cluster_resident("gemm_gptq", stream_kernel_ptr<T, NT, kZeros, kSource, kSiluOut>(),
                            dim3(1, static_cast<unsigned>(splits), 1), dim3(kStreamThreads), smem);
  });
}

template <class T, int NT, StreamSource kSource, bool kSiluOut = false>
void launch_stream_nt(const GptqGemmArgs& args, int splits, int ring, cudaStream_t stream) {
  constexpr bool kBulk = kSource != StreamSource::Registers;
  constexpr const char* kOp = kSiluOut ? "gemm_silu_mul_gptq" : "gemm_gptq";  // as errors name it
  constexpr const char* kLaunch = kSiluOut ? "gemm_silu_mul_gptq (stream)" : "gemm_gptq (stream)";
  StreamParams p{};
  static_cast<GemmOperands&>(p) = gemm_operands(args);
  p.partials = args.partials;
  p.counters = args.counters;
  const int k16_per_group = args.w.group_rows / 16;
  p.k16_per_group = FastDivmod(static_cast<std::uint32_t>(k16_per_group));
  p.group_step_mask = std::min(k16_per_group, kChunkK16) - 1;
  p.splits = split_range_divisor(kOp, splits, args.w.k_pad);
  p.ring = kBulk ? ring : 0;
  p.group_rows_per_chunk = std::max(1, kChunkK16 / k16_per_group);
  const dim3 grid(static_cast<unsigned>(args.w.n_pad / kGptqTileN), static_cast<unsigned>(splits));
  const std::size_t smem = kBulk ? static_cast<std::size_t>(stream_ring_bytes(NT, ring)) : 0;
  if constexpr (kBulk) {  // the shared-memory opt-in, once per device (cheap after the first call)
    constexpr const char* kWhat = "bulk rings' bytes (device opt-in shared memory)";
    if (args.w.zeros != nullptr) {
      require_prepared<&gptq_stream_kernel<T, NT, true, kSource, kSiluOut>>(kOp, kWhat, stream_ring_bytes(NT, kGptqStreamMaxRing));
    } else {
      require_prepared<&gptq_stream_kernel<T, NT, false, kSource, kSiluOut>>(kOp, kWhat, stream_ring_bytes(NT, kGptqStreamMaxRing));
    }
  }
  p.cluster_reduce =
      kBulk && gptq_cluster_reduces(args.cluster_reduce, splits, static_cast<long long>(grid.x) * splits, args.num_sms);
  if (p.cluster_reduce) {
    p.cluster_reduce = args.w.zeros != nullptr ? stream_cluster_fits<T, NT, true, kSource, kSiluOut>(splits, ring, smem)
                                               : stream_cluster_fits<T, NT, false, kSource, kSiluOut>(splits, ring, smem);
  }
  const LaunchSwitches switches = launch_switches();
  p.weights_before_wait = kBulk && switches.gemm_weights_before_wait;
  p.weights_evict_first = kBulk && switches.gptq_weights_evict_first;
  p.release_next = kBulk && switches.pdl_chain_release;
  p.residual_out = args.residual_out;
#if defined(FERRUM_GPTQ_TIMELINE)
  p.timeline_slot = gptq_timeline_claim(args, static_cast<int>(grid.x), splits, p.ring, p.cluster_reduce, kSiluOut);
#endif
  const dim3 cluster(1, p.cluster_reduce ? static_cast<unsigned>(splits) : 1u, 1);
  if (args.w.zeros != nullptr) {
    launch_pdl_clustered(kLaunch, cluster,
                         stream_kernel_ptr<T, NT, true, kSource, kSiluOut>(), grid,
                         dim3(kStreamThreads), smem, stream, p);
  } else {
    launch_pdl_clustered(kLaunch, cluster,
                         stream_kernel_ptr<T, NT, false, kSource, kSiluOut>(), grid,
                         dim3(kStreamThreads), smem, stream, p);
  }
}

// CTAs per SM of each streaming kernel instance, queried once per device:
// registers[dtype][zeros][NT - 1] for the register source,
// bulk[dtype][zeros][NT - 1][ring - 1] for the bulk source (whose shared
// memory grows with the ring).
struct StreamOccupancy {
  int registers[2][2][2] = {};
  int bulk[2][2][2][kGptqStreamMaxRing] = {};
  bool bulk_supported = false;
};

template <class T, int NT, bool kZeros, StreamSource kSource>
int stream_blocks_per_sm(int ring) {
  int blocks = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, stream_kernel_ptr<T, NT, kZeros, kSource>(), kStreamThreads,
      kSource != StreamSource::Registers ? static_cast<std::size_t>(stream_ring_bytes(NT, ring)) : 0);
  if (err != cudaSuccess) throw_cuda_error("gemm_gptq", "cudaOccupancyMaxActiveBlocksPerMultiprocessor", err);
  return std::max(blocks, 1);
}

template <class T, int NT, bool kZeros>
void stream_blocks_of(StreamOccupancy& occ, int dtype_index) {
  occ.registers[dtype_index][kZeros ? 1 : 0][NT - 1] = stream_blocks_per_sm<T, NT, kZeros, StreamSource::Registers>(0);
  if (!occ.bulk_supported) return;
  // A device with less opt-in shared memory than the deepest ring takes the
  // register source (and the bulk source is never planned).
  if (!prepare_kernel<&gptq_stream_kernel<T, NT, kZeros, StreamSource::Bulk>>("gemm_gptq", stream_ring_bytes(NT, kGptqStreamMaxRing))) {
    occ.bulk_supported = false;
    return;
  }
  for (int ring = 1; ring <= kGptqStreamMaxRing; ++ring) {
    occ.bulk[dtype_index][kZeros ? 1 : 0][NT - 1][ring - 1] = stream_blocks_per_sm<T, NT, kZeros, StreamSource::Bulk>(ring);
  }
}

template <class T>
void stream_blocks_of_dtype(StreamOccupancy& occ, int dtype_index) {
  stream_blocks_of<T, 1, false>(occ, dtype_index);
  stream_blocks_of<T, 2, false>(occ, dtype_index);
  stream_blocks_of<T, 1, true>(occ, dtype_index);
  stream_blocks_of<T, 2, true>(occ, dtype_index);
}

const StreamOccupancy& stream_occupancy() {
  static PerDevice<StreamOccupancy> per_device;
  return per_device.current("gemm_gptq", [](int) {
    StreamOccupancy occ;
    occ.bulk_supported =
        device_is_sm90_or_later() && has_sm90_code<&gptq_stream_kernel<__half, 1, false, StreamSource::Bulk>>();
    stream_blocks_of_dtype<__half>(occ, 0);
    stream_blocks_of_dtype<__nv_bfloat16>(occ, 1);
    return occ;
  });
}

int stream_nt(int m) { return m <= 8 ? 1 : 2; }

// gptq_bulk_source_applies on the device whose occupancy `occ` is.
bool bulk_source_applies(const StreamOccupancy& occ, int group_rows) {
  return occ.bulk_supported && group_rows >= kGptqBulkMinGroupRows;
}

// Whether a streaming launch of `kind` on a weight of k rows in groups of
// group_rows takes the bulk source: bulk copies on the device, activation
// rows copied in 16-byte units (k % 8 == 0: always true of a repacked
// checkpoint; a hand-built weight may differ), and groups whose scale rows
// fit a slot (kGptqBulkMinGroupRows). Otherwise the register source runs.
bool stream_uses_bulk(const StreamOccupancy& occ, GptqKernelKind kind, int k, int group_rows) {
  return kind == GptqKernelKind::StreamBulk && k % 8 == 0 && bulk_source_applies(occ, group_rows);
}

// CTAs per SM (16 warps) a default ring keeps where a single slot has that
// many. Measured (session 10, H200, 7 shapes x m = 1, 8, 16): two slots per
// warp at 4 CTAs per SM beat one slot at 5 at every NT = 1 point (8192 x
// 28672 m = 1: 38.6 against 42.1 us, 4096 x 14336: 17.5 against 21.9),
// while three slots (2 CTAs per SM) won at two shapes and lost badly where
// the plan then needs a second wave; at NT = 2 two slots (3 CTAs per SM)
// lost at the wide shapes (8192 x 28672 m = 16: 77.8 against 61.1 us).
constexpr int kStreamRingMinCtasPerSm = 4;

// The ring slots per warp of a bulk launch: `requested` when it names one,
// else the most slots that keep kStreamRingMinCtasPerSm CTAs per SM (or, on
// a device where one slot keeps fewer, the CTAs per SM of one slot).
int stream_ring_for(const StreamOccupancy& occ, int dtype_index, bool zeros, int nt, int requested) {
  if (requested > 0) return requested;
  const int(&per_ring)[kGptqStreamMaxRing] = occ.bulk[dtype_index][zeros ? 1 : 0][nt - 1];
  const int keep = std::min(per_ring[0], kStreamRingMinCtasPerSm);
  int ring = 1;
  while (ring < kGptqStreamMaxRing && per_ring[ring] >= keep) ++ring;
  return ring;
}

// The streaming kernel's split count over k: a function of the shape and
// the device only. The kernel is memory-bound, so what matters is one wave
// of CTAs that fills every slot: the CTA count nearest to the resident
// slots (ties: fewer splits), every warp with at least one chunk. (A
// waves x chunks model picked 4 splits at 8192 x 28672 and measured 61.9 us
// at m = 1 where one split, 1.13 waves, measured 49.9 us.)
// ctas_per_sm > 0 caps the slots at that many per SM (GptqGemmArgs::stream_ctas_per_sm).
GptqPlan stream_plan_for(const StreamOccupancy& occ, int dtype_index, bool zeros, int nt, bool bulk, int ring,
                         int k_pad, int n_pad,
                         int num_sms, int ctas_per_sm) {
  GptqPlan plan;
  plan.config = -1;
  plan.m_tile = 8 * nt;
  plan.block_n = kGptqTileN;
  plan.n_ctas = n_pad / kGptqTileN;
  const int chunks = k_pad / kGptqTileK;
  const int z = zeros ? 1 : 0;
  const int resident = bulk ? occ.bulk[dtype_index][z][nt - 1][ring - 1] : occ.registers[dtype_index][z][nt - 1];
  // Fewer slots give fewer splits (the nearest CTA count moves down), so the
  // default's workspace (gptq_partials_floats) covers every cap.
  const int per_sm = ctas_per_sm > 0 ? std::min(ctas_per_sm, resident) : resident;
  const long long slots = static_cast<long long>(std::max(num_sms, 1)) * per_sm;
  long long best = -1;
  for (int s = 1; s <= std::min(kGptqMaxStreamSplits, chunks); ++s) {
    // The smallest split still gives every warp a chunk (bulk source: two,
    // so that a CTA's fixed costs, its ring's first fill and the split-K
    // partials, are spread over more than one chunk per warp).
    if (s > 1 && chunks / s < kStreamWarps * (bulk ? 2 : 1)) break;
    const long long distance = std::llabs(static_cast<long long>(plan.n_ctas) * s - slots);
    if (best < 0 || distance < best) {
      best = distance;
      plan.splits = s;
    }
  }
  return plan;
}

// How the streaming kernel runs a launch: row tiles, source, ring and
// splits. One derivation for the launcher and gptq_stream_plan.
struct StreamLaunch {
  int nt;
  bool bulk;
  int ring;  // 0 for the register source
  GptqPlan plan;
};

StreamLaunch stream_launch_for(DType dtype, bool zeros, int m, int k, int k_pad, int n_pad, int group_rows,
                               int num_sms, GptqKernelKind kind, int ring, int ctas_per_sm) {
  const int dtype_index = dtype == DType::BF16 ? 1 : 0;
  StreamLaunch l{};
  l.nt = stream_nt(m);
  const StreamOccupancy& occ = stream_occupancy();  // the current device's, asked once per launch
  l.bulk = stream_uses_bulk(occ, kind, k, group_rows);
  l.ring = l.bulk ? stream_ring_for(occ, dtype_index, zeros, l.nt, ring) : 0;
  l.plan = stream_plan_for(occ, dtype_index, zeros, l.nt, l.bulk, l.ring, k_pad, n_pad, num_sms, ctas_per_sm);
  return l;
}

// args' launch, with a benchmark's splits override (stream_splits) applied to the plan.
StreamLaunch stream_launch_for(const GptqGemmArgs& args) {
  StreamLaunch l = stream_launch_for(args.dtype, args.w.zeros != nullptr, args.m, args.w.k, args.w.k_pad,
                                     args.w.n_pad, args.w.group_rows, args.num_sms, args.kernel, args.stream_ring,
                                     args.stream_ctas_per_sm);
  if (args.stream_splits > 0) l.plan.splits = std::min(args.stream_splits, args.w.k_pad / kGptqTileK);
  return l;
}

template <class T>
void launch_stream(const GptqGemmArgs& args, cudaStream_t stream) {
  const StreamLaunch l = stream_launch_for(args);
  const int splits = l.plan.splits;
  dispatch_int<1, 2>(l.nt, "gemm_gptq", "streaming kernel's activation tiles (NT)", [&](auto nt) {
    constexpr int kNT = decltype(nt)::value;
    if (l.bulk) {
      launch_stream_nt<T, kNT, StreamSource::Bulk>(args, splits, l.ring, stream);
    } else {
      launch_stream_nt<T, kNT, StreamSource::Registers>(args, splits, 0, stream);
    }
  });
}

// The streaming kernel covers this launch (otherwise the fused kernel runs):
// m <= 16 and a fused layout (gptq_repack.hpp: groups of 16-row multiples
// that divide 128 rows or are multiples of it).
bool stream_applies(const GptqGemmArgs& args) {
  const int rows = args.w.group_rows;
  // Groups of 16-row multiples that divide a chunk or are whole chunks: the
  // kernel finds group changes by step mask (group_step_mask).
  const bool chunk_aligned_groups = rows > 0 && rows % 16 == 0 && (kGptqTileK % rows == 0 || rows % kGptqTileK == 0);
  const bool streaming = args.kernel == GptqKernelKind::Stream || args.kernel == GptqKernelKind::StreamBulk;
  return streaming && args.m >= 1 && args.m <= kGptqStreamMaxM && chunk_aligned_groups &&
         args.w.k % 2 == 0 && args.w.k_pad % kGptqTileK == 0 && args.w.n_pad % kGptqTileN == 0;
}

// ── Gather (act-order) ──────────────────────────────────────────────────────

// out[r][j] = a[r][perm[j]] (16-bit elements of either dtype).
__global__ void gather_columns_kernel(const std::uint16_t* a,     // [m, k]
                                      const std::int32_t* perm,   // [k]
                                      std::uint16_t* out,         // [m, k]
                                      int m, int k) {
  const long long total = static_cast<long long>(m) * k;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = e / k;
    const int j = static_cast<int>(e - row * k);
    out[e] = a[row * k + __ldg(perm + j)];
  }
}

// ── Dequantize (cuBLAS path) ────────────────────────────────────────────────

constexpr int kDequantPitch = kGptqTileN + 8;  // halves per staged row (16-byte multiple, fewer conflicts)

template <class T>
__global__ void __launch_bounds__(kThreads) gptq_dequant_kernel(const GptqDeviceWeight w, int n0, int cols,
                                                                 T* scratch) {  // [k, cols]: columns n0 ..
  __shared__ __align__(16) T stage[kWarps][16][kDequantPitch];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int k16_total = w.k_pad / 16;
  const int k16_used = (w.k + 15) / 16;
  const int blocks_n = cols / kGptqTileN;
  const long long tiles = static_cast<long long>(blocks_n) * k16_used;
  const T* scales = static_cast<const T*>(w.scales);
  for (long long tile = static_cast<long long>(blockIdx.x) * kWarps + warp; tile < tiles;
       tile += static_cast<long long>(gridDim.x) * kWarps) {
    // k tiles fastest: a block reads one column block's packed weight in
    // order. (Column blocks fastest, so that a block's warps write adjacent
    // pieces of the same scratch rows, measured 1-8 % slower on the H200.)
    const int nb = n0 / kGptqTileN + static_cast<int>(tile / k16_used);
    const int kt = static_cast<int>(tile % k16_used);
    if (nb * kGptqTileN >= w.n) continue;  // warp-uniform
    const uint4 wq = __ldcs(reinterpret_cast<const uint4*>(
        w.qweight + ((static_cast<std::size_t>(nb) * k16_total + kt) * 32 + lane) * 4));
    const std::uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
    // The fused layout (groups of 16-row multiples): the tile's 16 rows share
    // one scale row, and a lane's 8 columns (gid * 8 + t in the permuted
    // order) are 8 adjacent scales and zeros: one 16-byte and one 8-byte
    // load per tile instead of a dependent scale-row, scale and zero load
    // per element (which held this kernel near 1.2 TB/s on the H200).
    // Rows past k are computed but never stored. Same values either way.
    const bool uniform = w.group_rows > 0;
    T s8[8];
    int z8[8];
    if (uniform) {
      const std::size_t base =
          static_cast<std::size_t>(kt * 16 / w.group_rows) * w.n_pad + nb * kGptqTileN + gid * 8;
      const uint4 sv = __ldg(reinterpret_cast<const uint4*>(scales + base));
      const std::uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
      std::uint32_t zw[2] = {0u, 0u};
      if (w.zeros != nullptr) {
        const uint2 zv = __ldg(reinterpret_cast<const uint2*>(w.zeros + base));
        zw[0] = zv.x;
        zw[1] = zv.y;
      }
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const std::uint16_t bits = static_cast<std::uint16_t>(sw[t / 2] >> (16 * (t % 2)));
        s8[t] = *reinterpret_cast<const T*>(&bits);
        z8[t] = w.zeros != nullptr ? static_cast<int>((zw[t / 4] >> (8 * (t % 4))) & 0xFFu) : w.zero_value;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int slot = 0; slot < 8; ++slot) {
        const int r = 2 * tig + (slot >= 4 ? 1 : 0) + ((slot & 1) != 0 ? 8 : 0);
        const int t = 2 * j + ((slot >> 1) & 1);
        const int row = kt * 16 + r;
        const int q = static_cast<int>((words[j] >> (4 * slot)) & 0xFu);
        float v = 0.0f;
        if (uniform) {
          v = static_cast<float>(q - z8[t]) * to_float(s8[t]);
        } else if (row < w.k) {
          const std::size_t at = static_cast<std::size_t>(__ldg(w.row_group + row)) * w.n_pad + nb * kGptqTileN +
                                 gid * 8 + t;
          const int z = w.zeros != nullptr ? static_cast<int>(__ldg(w.zeros + at)) : w.zero_value;
          v = static_cast<float>(q - z) * to_float(scales[at]);
        }
        stage[warp][r][t * 8 + gid] = from_float<T>(v);
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = lane + 32 * i;
      const int r = idx >> 3, ch = idx & 7;
      const int row = kt * 16 + r;
      const int col = nb * kGptqTileN + ch * 8;
      if (row < w.k && col < w.n) {
        const int dst_row = w.perm != nullptr ? __ldg(w.perm + row) : row;
        *reinterpret_cast<uint4*>(scratch + static_cast<std::size_t>(dst_row) * cols + (col - n0)) =
            *reinterpret_cast<const uint4*>(&stage[warp][r][ch * 8]);
      }
    }
    __syncwarp();
  }
}

}  // namespace

GptqPlan gptq_plan(DType dtype, int m, int k_pad, int n_pad, int num_sms) {
  return plan_for(dtype == DType::BF16 ? 1 : 0, config_for_m(m), k_pad, n_pad, num_sms);
}

std::size_t gptq_partials_floats(int k_pad, int n_pad, int num_sms) {
  std::size_t most = 0;
  if (gptq_wgmma_supported()) {
    // Even one split stores its partial where no cluster sums them.
    const GptqPlan plan = gptq_wgmma_plan(k_pad, n_pad, num_sms);
    most = static_cast<std::size_t>(plan.splits) * plan.n_ctas * plan.block_n * plan.m_tile;
  }
  const StreamOccupancy& occ = stream_occupancy();
  const Occupancy& fused = occupancy();
  for (int d = 0; d < 2; ++d) {
    for (int c = 0; c < kNumConfigs; ++c) {
      if (!config_available(fused, c)) continue;  // never launched on this device
      const GptqPlan plan = plan_for(d, c, k_pad, n_pad, num_sms);
      if (plan.splits > 1) {
        most = std::max(most, static_cast<std::size_t>(plan.splits) * plan.n_ctas * plan.block_n * plan.m_tile);
      }
    }
    for (int nt = 1; nt <= 2; ++nt) {
      for (bool zeros : {false, true}) {
        // ring 0: the register source; 1 ..: the bulk source's ring sizes.
        for (int ring = 0; ring <= (occ.bulk_supported ? kGptqStreamMaxRing : 0); ++ring) {
          const GptqPlan plan = stream_plan_for(occ, d, zeros, nt, ring > 0, ring, k_pad, n_pad, num_sms, 0);
          if (plan.splits > 1) {
            most = std::max(most, static_cast<std::size_t>(plan.splits) * plan.n_ctas * plan.block_n * plan.m_tile);
          }
        }
      }
    }
  }
  return most;
}

std::size_t gptq_counter_ints(int n_pad) {
  // The streaming kernel has a tile per 64-column block: the most along n.
  return static_cast<std::size_t>((n_pad + kGptqTileN - 1) / kGptqTileN);
}

bool gptq_bulk_copy_supported() { return stream_occupancy().bulk_supported; }

int gptq_fused_max_rows() {
  const Occupancy& occ = occupancy();
  int rows = 0;
  for (int c = 0; c < kNumConfigs && config_available(occ, c); ++c) rows = config_mt(c) * 16;
  return rows;
}

bool gptq_cluster_reduces(bool requested, int splits, long long ctas, int num_sms) {
  return requested && splits >= 2 && splits <= kGptqClusterMaxSplits &&
         ctas <= static_cast<long long>(kGptqClusterMaxCtasPerSm) * num_sms;
}

bool gptq_bulk_source_applies(int group_rows) { return bulk_source_applies(stream_occupancy(), group_rows); }

GptqPlan gptq_stream_plan(DType dtype, bool zeros, int m, int k, int k_pad, int n_pad, int group_rows, int num_sms,
                          GptqKernelKind kind, int ring, int ctas_per_sm) {
  return stream_launch_for(dtype, zeros, m, k, k_pad, n_pad, group_rows, num_sms, kind, ring, ctas_per_sm)
      .plan;  // as launch_stream
}

namespace {

// The launch knobs every entry point checks (a benchmark may set them).
void check_launch_knobs(const GptqGemmArgs& args) {
  if (args.m < 1 || args.m > kGptqMaxM) throw_bad_dispatch("gemm_gptq", "rows per launch m", args.m);
  if (args.w.group_rows <= 0) throw_bad_dispatch("gemm_gptq", "fused group_rows", args.w.group_rows);
  if (args.stream_ring < 0 || args.stream_ring > kGptqStreamMaxRing) {
    throw_bad_dispatch("gemm_gptq", "stream_ring (chunk slots per warp)", args.stream_ring);
  }
  if (args.stream_splits < 0 || args.stream_splits > kGptqMaxStreamSplits) {
    throw_bad_dispatch("gemm_gptq", "stream_splits (CTAs along k)", args.stream_splits);
  }
  if (args.stream_ctas_per_sm < 0 || args.stream_ctas_per_sm > kGptqStreamMaxCtasPerSm) {
    throw_bad_dispatch("gemm_gptq", "stream_ctas_per_sm (CTAs per SM the plan fills)", args.stream_ctas_per_sm);
  }
}

}  // namespace

bool launch_gptq_gemm_silu_mul(const GptqGemmArgs& args, cudaStream_t stream) {
  check_launch_knobs(args);
  if (args.residual_out.residual != nullptr) throw_bad_dispatch("gemm_silu_mul_gptq", "residual_out (not an epilogue of it)", 0);
  if (!stream_applies(args) || args.m > kGptqSiluMulMaxM || args.w.n % 2 != 0) return false;
  const StreamLaunch l = stream_launch_for(args);
  static_assert(kGptqSiluMulMaxM <= 8, "one row tile");
  if (!l.bulk || l.plan.splits != 1) return false;
  dispatch_half_dtype(args.dtype, "gemm_silu_mul_gptq", [&](auto tag) {
    launch_stream_nt<typename decltype(tag)::type, 1, StreamSource::Bulk, true>(args, 1, l.ring, stream);
  });
  check_launch("gemm_silu_mul_gptq (stream)");
  return true;
}

bool launch_gptq_gemm_row_sq(const GptqGemmArgs& args, cudaStream_t stream) {
  check_launch_knobs(args);
  if (!stream_applies(args)) return false;
  dispatch_half_dtype(args.dtype, "gemm_gptq", [&](auto tag) { launch_stream<typename decltype(tag)::type>(args, stream); });
  check_launch("gemm_gptq (stream, row_sq)");
  return true;
}

void launch_gptq_gemm(const GptqGemmArgs& args, cudaStream_t stream) {
  if (args.residual_out.residual != nullptr) {
    throw_bad_dispatch("gemm_gptq", "residual_out (launch_gptq_gemm_row_sq takes it)", 0);
  }
  check_launch_knobs(args);
  if (stream_applies(args)) {
    dispatch_half_dtype(args.dtype, "gemm_gptq", [&](auto tag) { launch_stream<typename decltype(tag)::type>(args, stream); });
    check_launch("gemm_gptq (stream)");
    return;
  }
  if (args.kernel == GptqKernelKind::Wgmma && launch_gptq_wgmma(args, stream)) {
    check_launch("gemm_gptq (wgmma)");
    return;
  }
  const GptqPlan plan = gptq_plan(args.dtype, args.m, args.w.k_pad, args.w.n_pad, args.num_sms);
  dispatch_half_dtype(args.dtype, "gemm_gptq", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<0, 1, 2>(plan.config, "gemm_gptq", "fused kernel configuration",
                          [&](auto config) { launch_fused<T, decltype(config)::value>(args, plan, stream); });
  });
}

void launch_gptq_gather(DType dtype, const void* a, const std::int32_t* perm, void* a_perm, int m, int k,
                        cudaStream_t stream) {
  (void)dtype;  // 16-bit elements either way
  const long long total = static_cast<long long>(m) * k;
  const long long blocks = std::min<long long>((total + 255) / 256, 65535);
  gather_columns_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<const std::uint16_t*>(a), perm, static_cast<std::uint16_t*>(a_perm), m, k);
  check_launch("gemm_gptq (act-order gather)");
}

void launch_gptq_dequant(DType dtype, const GptqDeviceWeight& w, int n0, int cols, void* scratch,
                         cudaStream_t stream) {
  const long long tiles = static_cast<long long>(cols / kGptqTileN) * ((w.k + 15) / 16);
  const long long blocks = std::min<long long>((tiles + kWarps - 1) / kWarps, 65535);
  dispatch_half_dtype(dtype, "gemm_gptq", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gptq_dequant_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(w, n0, cols,
                                                                                   static_cast<T*>(scratch));
  });
  check_launch("gemm_gptq (dequantize)");
}

#if defined(FERRUM_GPTQ_TIMELINE)
void gptq_timeline_reset() { zero_device_symbol("gptq_timeline", g_gptq_timeline); }

std::vector<GptqTimelineLaunch> gptq_timeline_read() {
  std::vector<std::array<std::array<GptqTimelineStamp, kGptqTimelinePoints>, kGptqTimelineCtas>> stamps(
      kGptqTimelineLaunches);
  const cudaError_t err = cudaMemcpyFromSymbol(stamps.data(), g_gptq_timeline, sizeof(g_gptq_timeline));
  if (err != cudaSuccess) throw_cuda_error("gptq_timeline", "cudaMemcpyFromSymbol", err);
  std::vector<GptqTimelineLaunch> launches;
  {
    std::lock_guard<std::mutex> lock(g_gptq_timeline_mutex);
    launches.assign(g_gptq_timeline_records.begin(), g_gptq_timeline_records.end());
  }
  for (std::size_t slot = 0; slot < launches.size(); ++slot) {
    GptqTimelineLaunch& l = launches[slot];
    const std::size_t ctas = std::min<std::size_t>(static_cast<std::size_t>(l.grid_x) * l.splits, kGptqTimelineCtas);
    l.ctas.assign(stamps[slot].begin(), stamps[slot].begin() + static_cast<std::ptrdiff_t>(ctas));
  }
  std::stable_sort(launches.begin(), launches.end(), [](const GptqTimelineLaunch& a, const GptqTimelineLaunch& b) {
    if ((a.sequence < 0) != (b.sequence < 0)) return b.sequence < 0;  // unused slots last
    return a.sequence < b.sequence;
  });
  return launches;
}
#endif

}  // namespace ferrum::kernels
