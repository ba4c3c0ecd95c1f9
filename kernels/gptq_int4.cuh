// INT4 building blocks shared by the GPTQ kernels (kernels/gptq_gemm.cu:
// fused and streaming; kernels/gptq_gemm_wgmma.cu: warpgroup MMA): the
// magic-number dequantization of a repacked word (src/quant/gptq_repack.hpp),
// the unpacking of a lane's 8 permuted scales and zeros, the fixed-order
// split-K reduction through the workspace, and the weight-stream load.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/cluster.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/row_sq.cuh"
#include "kernels/gptq_gemm.hpp"

namespace ferrum::kernels::gptq {

// ── PTX helpers ─────────────────────────────────────────────────────────────

// (a & b) | c in one instruction.
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  std::uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The low / high 16 bits of x in both halves (one prmt each).
__device__ __forceinline__ std::uint32_t dup16(std::uint32_t x) { return __byte_perm(x, 0u, 0x1010u); }
__device__ __forceinline__ std::uint32_t dup16_hi(std::uint32_t x) { return __byte_perm(x, 0u, 0x3232u); }

// ── Element types: dequantization and mma ───────────────────────────────────

template <class T>
struct Int4Math;

template <>
struct Int4Math<__half> {
  // Per n tile: the negated biases -(1024 + z) (low nibble) and -(64 + z)
  // (second nibble, after the 1/16 scaling), as duplicated half2 patterns.
  static __device__ __forceinline__ void biases(int z, std::uint32_t& lo, std::uint32_t& hi) {
    lo = dup16(0xE400u | static_cast<std::uint32_t>(z));
    hi = dup16(0xD400u + (static_cast<std::uint32_t>(z) << 4));
  }
  static __device__ __forceinline__ std::uint32_t add(std::uint32_t a, std::uint32_t b) {
    std::uint32_t d;
    asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  static __device__ __forceinline__ std::uint32_t mul(std::uint32_t a, std::uint32_t b) {
    std::uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  static __device__ __forceinline__ std::uint32_t fma(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    std::uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  // One word -> the 4 B registers of n tiles 2j (b[0], b[1]) and 2j+1
  // (b[2], b[3]) as the exact integers q - z (no scale).
  static __device__ __forceinline__ void dequant_unscaled(std::uint32_t w, std::uint32_t lo0, std::uint32_t hi0,
                                                          std::uint32_t lo1, std::uint32_t hi1,
                                                          std::uint32_t (&b)[4]) {
    constexpr std::uint32_t kMagic = 0x64006400u;   // half2 (1024, 1024)
    constexpr std::uint32_t kSixteenth = 0x2C002C00u;  // half2 (1/16, 1/16)
    const std::uint32_t w8 = w >> 8;
    b[0] = add(and_or(w, 0x000F000Fu, kMagic), lo0);
    b[1] = fma(and_or(w, 0x00F000F0u, kMagic), kSixteenth, hi0);
    b[2] = add(and_or(w8, 0x000F000Fu, kMagic), lo1);
    b[3] = fma(and_or(w8, 0x00F000F0u, kMagic), kSixteenth, hi1);
  }
};

template <>
struct Int4Math<__nv_bfloat16> {
  // -(128 + z) as duplicated bf16x2 (the second pattern is unused).
  static __device__ __forceinline__ void biases(int z, std::uint32_t& lo, std::uint32_t& hi) {
    lo = dup16(0xC300u + static_cast<std::uint32_t>(z));
    hi = lo;
  }
  // add / mul.rn.bf16x2 are sm_90 instructions; below it the same roundings
  // as fma.rn.bf16x2 (sm_80): a * 1 + b, and a * b + (-0), which keeps the
  // sign of a zero product.
  static __device__ __forceinline__ std::uint32_t add(std::uint32_t a, std::uint32_t b) {
    std::uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(b));
#else
    asm("add.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
  }
  static __device__ __forceinline__ std::uint32_t mul(std::uint32_t a, std::uint32_t b) {
    std::uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#else
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
  }
  static __device__ __forceinline__ void dequant_unscaled(std::uint32_t w, std::uint32_t lo0, std::uint32_t /*hi0*/,
                                                          std::uint32_t lo1, std::uint32_t /*hi1*/,
                                                          std::uint32_t (&b)[4]) {
    constexpr std::uint32_t kMagic = 0x43004300u;  // bf16x2 (128, 128)
    b[0] = add(and_or(w, 0x000F000Fu, kMagic), lo0);
    b[1] = add(and_or(w >> 4, 0x000F000Fu, kMagic), lo0);
    b[2] = add(and_or(w >> 8, 0x000F000Fu, kMagic), lo1);
    b[3] = add(and_or(w >> 12, 0x000F000Fu, kMagic), lo1);
  }
};

// One word -> the 4 B registers of n tiles 2j (b[0], b[1]) and 2j+1 (b[2],
// b[3]), scaled: (q - z) is exact, so the one multiply rounds once, exactly
// as rounding the f32 weight to the activation dtype (the fused kernel).
template <class T>
__device__ __forceinline__ void dequant_scaled(std::uint32_t w, std::uint32_t s0, std::uint32_t lo0, std::uint32_t hi0,
                                               std::uint32_t s1, std::uint32_t lo1, std::uint32_t hi1,
                                               std::uint32_t (&b)[4]) {
  using M = Int4Math<T>;
  M::dequant_unscaled(w, lo0, hi0, lo1, hi1, b);
  b[0] = M::mul(b[0], s0);
  b[1] = M::mul(b[1], s0);
  b[2] = M::mul(b[2], s1);
  b[3] = M::mul(b[3], s1);
}

// ── Scale / zero rows (shared by every INT4 kernel) ────────────────────────

// Lane gid's 8 permuted scales (one 16-byte slice of a scale row: n tile t,
// column gid, i.e. feature 8t + gid of the column block) as duplicated pairs.
__device__ __forceinline__ void unpack_scales(const uint4 raw, std::uint32_t (&sc)[8]) {
  const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int t = 0; t < 8; ++t) sc[t] = t % 2 == 0 ? dup16(words[t / 2]) : dup16_hi(words[t / 2]);
}
// The negated biases of the same 8 features from their 8 zero bytes.
template <class T>
__device__ __forceinline__ void unpack_zeros(const uint2 zr, std::uint32_t (&lo)[8], std::uint32_t (&hi)[8]) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const std::uint32_t zw = t < 4 ? zr.x : zr.y;
    Int4Math<T>::biases(static_cast<int>((zw >> (8 * (t % 4))) & 0xFFu), lo[t], hi[t]);
  }
}

// ── Split-K over CTAs ───────────────────────────────────────────────────────
//
// One quad (4 f32 columns) of a split-K sum: sum += v, and the finished
// quad stored as 4 T at out[row, col .. col + 3] (row stride n), the two
// reductions below (workspace and cluster) sharing both.
__device__ __forceinline__ void add_quad(float4& sum, const float4& v) {
  sum.x += v.x;
  sum.y += v.y;
  sum.z += v.z;
  sum.w += v.w;
}
template <class T>
__device__ __forceinline__ void store_quad(T* out /* [rows, n] */, int n, int row, int col, const float4& sum) {
  *reinterpret_cast<uint2*>(out + static_cast<std::size_t>(row) * n + col) =
      make_uint2(pack2<T>(sum.x, sum.y), pack2<T>(sum.z, sum.w));
}

// The final store of one quad: out = T(sum) as store_quad; or, with
// GptqResidualOut's epilogue where res.residual is set (grid-uniform),
// residual = T(residual + T(sum)) and the new residual's squares summed per
// 16 columns into res.row_sq (kernels/common/row_sq.cuh), out left alone
// (Backend::gemm_gptq_add_residual's out is a workspace). Every lane of the
// warp calls it, in the same iteration (the squares meet by shuffles among
// the 4 lanes of a 16-column group, whose quads sit in lanes 4i .. 4i + 3);
// `stored` says whether this lane's quad is in the output (else it stores
// nothing and adds 0). col is a multiple of 4, of 16 in lane 4i.
template <class T>
__device__ __forceinline__ void store_quad_out(T* out /* [rows, n] */, int n, int row, int col, const float4& sum,
                                               bool stored, const GptqResidualOut& res) {
  if (res.residual == nullptr) {
    if (stored) store_quad(out, n, row, col, sum);
    return;
  }
  float sq = 0.0f;
  if (stored) {
    const float4 rounded = make_float4(to_float(from_float<T>(sum.x)), to_float(from_float<T>(sum.y)),
                                       to_float(from_float<T>(sum.z)), to_float(from_float<T>(sum.w)));
    T* const r = static_cast<T*>(res.residual) + static_cast<std::size_t>(row) * n + col;
    const float4 h = residual_add_quad<T>(load_quad_f32(r), rounded);
    store_quad_f32(r, h);
    sq = row_sq_quad(h);
  }
  const float group = row_sq_group(sq);
  if (stored && col % kRowSqCols == 0) {
    res.row_sq[static_cast<std::size_t>(row) * ((n + kRowSqCols - 1) / kRowSqCols) + col / kRowSqCols] = group;
  }
}

// splitk_finish_last's stores: the sums of this thread's quads c = tid +
// (i0 + j) * kThreadsN, j < kCount, to out (row stride n). n is a multiple
// of 8, so a quad is all in or all out. Every lane of the warp calls it
// (store_quad_out's residual epilogue shuffles).
template <int kThreadsN, class T, int kCount>
__device__ __forceinline__ void store_quad_sums(T* out, int n, int tid, int i0, int quads, int quads_per_row,
                                                int col0, const float4 (&sum)[kCount], const GptqResidualOut& res) {
#pragma unroll
  for (int j = 0; j < kCount; ++j) {
    const int c = tid + (i0 + j) * kThreadsN;
    const int row = c / quads_per_row, col = col0 + (c % quads_per_row) * 4;
    store_quad_out(out, n, row, col, sum[j], c < quads && col < n, res);
  }
}

// The last arriver (every INT4 kernel): every CTA of output tile `tile` has
// stored its f32 partial, rows x cols row-major, at partials + (split *
// tiles + tile) * rows * cols. The CTA
// that arrives last at counters[tile] sums the `splits` partials in split
// order 0, 1, ..., S-1 (fixed: bitwise reproducible), stores
// out[r, col0 + c] (row stride n) for col0 + c < n, and resets the counter
// for the next launch on the stream. Every thread of the CTA calls it.
// Quads of 4 columns, kPer per thread. Below 8 quads per thread the loads
// of 8 / kPer splits go out together, then are added in split order: the
// last arriver waits ceil(splits / (8 / kPer)) L2 round trips, not one per
// split (the streaming kernel's tiles are one or two quads per thread, the
// fused kernel's m <= 32 configurations two or four; only the streaming
// kernel's were timed, session 48). kChunked (from 8 quads per thread; the
// fused kernel's m <= 64 configuration takes it): the quads go in chunks of
// 4, each with 4 splits' loads in flight and stored before the next chunk,
// ceil(splits / 4) round trips per chunk. Session 50: the fused kernel at
// m = 33 / 64 0.63-0.90 of the per-split loop's time, and the wgmma
// kernel's workspace path 0.58-0.85; but in the wgmma kernel, one instance
// for both reductions, it slowed the cluster path Auto runs by 2-7 %, so
// the wgmma kernel keeps the per-split loop.
// res: store_quad_out's residual epilogue (cols a multiple of 16).
template <class T, int kThreadsN, int kPer, bool kChunked = false>
__device__ __forceinline__ void splitk_finish_last(const float* partials,  // [splits][tiles][rows][cols] f32
                                                   int* counters,          // [tiles], zero between launches
                                                   int tile, int tiles, int splits, int rows, int cols, int col0,
                                                   int n, T* out /* [rows, n] */,
                                                   const GptqResidualOut& res = GptqResidualOut{}) {
  __shared__ int s_is_last;
  const int tid = static_cast<int>(threadIdx.x);
  __threadfence();  // release: this CTA's partial is visible device-wide before it arrives
  __syncthreads();
  if (tid == 0) s_is_last = atomicAdd(counters + tile, 1) == splits - 1 ? 1 : 0;
  __syncthreads();
  if (s_is_last == 0) return;
  __threadfence();  // acquire: the other partials are read through L2 below
  const int quads_per_row = cols / 4;
  const int quads = rows * quads_per_row;
  const std::size_t tile_floats = static_cast<std::size_t>(rows) * cols;
  const float* tile0 = partials + static_cast<std::size_t>(tile) * tile_floats;
  const std::size_t split_stride = static_cast<std::size_t>(tiles) * tile_floats;
  static_assert(kThreadsN % 32 == 0, "whole warps: a 16-column group's quads in 4 lanes of one warp");
  // Quad c is row c / quads_per_row, columns (c % quads_per_row) * 4 ..
  // Columns >= n are skipped (a column block past n has no partial).
  const auto live = [&](int i) {
    const int c = tid + i * kThreadsN;
    return c < quads && col0 + (c % quads_per_row) * 4 < n;
  };
  if constexpr (kChunked || kPer < 8) {
    // Below 8 quads per thread one chunk of all kPer, 8 / kPer splits a batch.
    constexpr int kChunk = kPer < 8 ? kPer : 4, kSplitBatch = kPer < 8 ? 8 / kPer : 4;
    static_assert(kPer % kChunk == 0 && (kPer >= 8 || 8 % kPer == 0), "whole chunks, whole splits per batch");
#pragma unroll
    for (int i0 = 0; i0 < kPer; i0 += kChunk) {
      float4 sum[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) sum[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int s0 = 0; s0 < splits; s0 += kSplitBatch) {
        float4 v[kSplitBatch][kChunk];
#pragma unroll
        for (int b = 0; b < kSplitBatch; ++b) {
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            if (s0 + b < splits && live(i0 + j)) {
              const float* part = tile0 + static_cast<std::size_t>(s0 + b) * split_stride;
              v[b][j] = __ldcg(reinterpret_cast<const float4*>(part) + tid + (i0 + j) * kThreadsN);
            }
          }
        }
        // Added in split order, and only the splits that exist.
#pragma unroll
        for (int b = 0; b < kSplitBatch; ++b) {
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            if (s0 + b < splits && live(i0 + j)) add_quad(sum[j], v[b][j]);
          }
        }
      }
      store_quad_sums<kThreadsN>(out, n, tid, i0, quads, quads_per_row, col0, sum, res);
    }
  } else {
    float4 sum[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) sum[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // Enough loads in flight per split (the wgmma kernel's 256-column
    // tiles); the condition stays inside the split loop, where ptxas keeps
    // the wgmma N = 64 instances under 255 registers.
    for (int s = 0; s < splits; ++s) {
      const float* part = tile0 + static_cast<std::size_t>(s) * split_stride;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = tid + i * kThreadsN;
        if (c < quads && col0 + (c % quads_per_row) * 4 < n) {
          add_quad(sum[i], __ldcg(reinterpret_cast<const float4*>(part) + c));
        }
      }
    }
    store_quad_sums<kThreadsN>(out, n, tid, 0, quads, quads_per_row, col0, sum, res);
  }
  if (tid == 0) counters[tile] = 0;
}


// The cluster form of the same sum (sm_90): the S CTAs of a thread-block
// cluster of dims 1 x S (rank = split) each hold their split's f32 partial,
// rows x cols with a row pitch of `pitch` floats (16-byte aligned), at
// `tile` in their own shared memory. After a cluster barrier CTA rank r sums
// its share of the quads over the S tiles in split order 0, 1, ..., S-1 from
// 0.0f, exactly as splitk_finish_last sums the workspace partials (so both
// give the same bits), and stores out[row, col0 + c] (row stride n) for
// col0 + c < n; a second barrier keeps every tile alive until the last read.
// No workspace, counter, fence or atomic. Every thread of every CTA calls it.
// kBatch: quads per thread whose loads are in flight together, each with
// every split's load issued before the first add (one distributed shared
// memory round trip per kBatch quads, not one per split: the streaming
// kernel's one quad per thread waited out S round trips in a row).
// Ranks take whole 16-column groups (4 quads; cols a multiple of 16), so
// that store_quad_out's residual epilogue (res) finds a group in one warp.
template <class T, int kThreadsN, int kBatch>
__device__ __forceinline__ void cluster_sum_store(const float* tile, int pitch, int splits, int rows, int cols,
                                                  int col0, int n, T* out /* [rows, n] */,
                                                  const GptqResidualOut& res = GptqResidualOut{}) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  (void)tile, (void)pitch, (void)splits, (void)rows, (void)cols, (void)col0, (void)n, (void)out, (void)res;
  __trap();  // never launched: clusters run on sm_90+ only
#else
  static_assert(kThreadsN % 32 == 0, "whole warps: a 16-column group's quads in 4 lanes of one warp");
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  // Publishes every split's tile (release / acquire); a block's shared
  // memory may also be read only once the block is known to run.
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int quads_per_row = cols / 4;
  const int groups = rows * quads_per_row / 4;
  const int q_begin = 4 * (rank * groups / splits), q_end = 4 * ((rank + 1) * groups / splits);
  // 4 kBatch x kGptqClusterMaxSplits registers of loads in flight. The loop
  // is the same for every thread of the CTA (store_quad_out's shuffles).
  for (int base = q_begin; base < q_end; base += kBatch * kThreadsN) {
    const int q0 = base + static_cast<int>(threadIdx.x);
    float4 part[kBatch][kGptqClusterMaxSplits];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = q0 + b * kThreadsN;
      const float4* at =
          reinterpret_cast<const float4*>(tile + (q / quads_per_row) * pitch + (q % quads_per_row) * 4);
      // Only quads that are stored are read (see the second barrier).
      const bool stored = q < q_end && col0 + (q % quads_per_row) * 4 < n;
#pragma unroll
      for (int s = 0; s < kGptqClusterMaxSplits; ++s) {
        if (stored && s < splits) part[b][s] = *cluster.map_shared_rank(at, s);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int q = q0 + b * kThreadsN;
      const int row = q / quads_per_row, c4 = (q % quads_per_row) * 4;
      const bool stored = q < q_end && col0 + c4 < n;
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kGptqClusterMaxSplits; ++s) {
        if (stored && s < splits) add_quad(sum, part[b][s]);
      }
      store_quad_out(out, n, row, col0 + c4, sum, stored, res);
    }
  }
  // No block exits while another may still read its tile; the reads above
  // are all complete (each value feeds a store issued before the barrier).
  cluster_sync_after_reads();
#endif
}

// 16 bytes of the weight stream: read once, so not kept in L1.
__device__ __forceinline__ uint4 load_stream_16(const std::uint32_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace ferrum::kernels::gptq
