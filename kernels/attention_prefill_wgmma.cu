// flash_attention prefill (q_len > 1) on Hopper warpgroup MMA (wgmma,
// sm_90a): the FlashAttention-2 schedule of attention_prefill.cu with its
// two matrix products moved from mma.sync to wgmma.mma_async.
//
// A block is one warpgroup (4 warps, 128 threads) owning kBr = 64 query rows
// of one (sequence, q head); warp w holds rows 16 w .. 16 w + 15 of every
// accumulator (wgmma's m64 layout is the mma.sync C layout per warp and n8
// tile, so the masking and the online softmax are attention_prefill.cu's).
// Per key tile of kBc = 64 keys:
//
//   S = Q Kᵀ    wgmma m64n64k16, Q and K both from shared memory (K-major,
//               128-byte swizzle), HD / 16 steps, fp32 accumulators
//   softmax     online, fp32, base 2 (online_softmax_step, shared with the
//               mma.sync kernel)
//   O += P V    wgmma m64nHDk16 with P from registers (the S accumulators
//               re-packed, as in the mma.sync kernel) and V from shared
//               memory as an MN-major operand (imm-trans-b): V is stored
//               exactly like K, no transpose anywhere
//
// K and V stream through a ring of kStages slots filled by cp.async (16
// bytes per thread per copy, rows past kv_len zero-filled), kStages - 1
// tiles ahead; the copies are made visible to wgmma (the async proxy) by
// fence.proxy.async before the block barrier that publishes a tile. The
// barrier also frees the slot of the previous tile: every wgmma reading it
// was waited for. Two blocks per SM at head_dim 128 overlap one block's
// softmax with the other's matrix products.
//
// Causal: the block reads keys up to its last query's position; tiles that
// reach past a warp's first row's position are masked per element (all four
// warps run every wgmma of the block, so a warp's fully masked tile is an
// exact no-op for its rows, as in the mma.sync kernel). Heavy (late) query
// tiles are scheduled first. Deterministic: no atomics, a fixed order.
// Not bitwise equal to the mma.sync kernel (wgmma sums its k16 steps in its
// own order); both are checked against the fp64 CPU reference.
#include <climits>
#include <cstdint>

#include "kernels/attention_prefill.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_ops.cuh"

namespace ferrum::kernels {
namespace {

// Per head_dim: kStages ring slots of K and V tiles.
//   hd 64:  (1 + 2 * 4) * 8 KiB  + 1 KiB = 73 KiB: 3 blocks per SM
//   hd 128: (1 + 2 * 3) * 16 KiB + 1 KiB = 113 KiB: 2 blocks per SM
// (+ 1 KiB: the dynamic shared memory is aligned up to 1024 bytes in the
// kernel, the swizzle's period).
template <int HD>
struct WgmmaPrefillShape {
  static constexpr int kBr = 64;  // query rows: one warpgroup's m64
  static constexpr int kBc = 64;  // keys per tile
  static constexpr int kThreads = 128;
  static constexpr int kStages = HD == 64 ? 4 : 3;
  static constexpr int kMinBlocks = HD == 64 ? 3 : 2;
  static constexpr int kTileBytes = 64 * HD * 2;  // 64 rows (Q, or one K / V tile)
  static constexpr int kSmemBytes = kTileBytes * (1 + 2 * kStages) + 1024;
  static_assert(HD == 64 || HD == 128, "the wgmma prefill covers head_dim 64 and 128");
  static_assert(kBr == kBc, "Q and K / V tiles share one tile shape (64 rows)");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kWgBlockBytes = 64 * 128;  // one 64-column block of a 64-row tile

// 64 x HD tile from global rows src[0..) (contiguous, HD apart) into the
// 128-byte-swizzled tile at shared address dst; rows >= valid_rows are
// zero-filled.
template <class T, int HD>
__device__ __forceinline__ void load_tile64(std::uint32_t dst, const T* src, int valid_rows, int tid) {
  constexpr int kChunks = HD / 8;
  constexpr int kPerThread = 64 * kChunks / 128;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = tid + i * 128;
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    const T* from = valid ? src + row * HD + chunk * 8 : src;  // not read when invalid
    cp_async_16(dst + swz128_offset(row, chunk, 64), from, valid);
  }
}

// S (+)= Q Kᵀ over head dims, for the 64 x 64 tile at sK: A = Q, B = K, both
// K-major; k16 step kk is 32 bytes into its 64-column block.
template <class T, int HD>
__device__ __forceinline__ void wgmma_qk(float (&s)[32], std::uint32_t sQ, std::uint32_t sK) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const std::uint32_t off = (kk / 4) * kWgBlockBytes + (kk % 4) * 32;
    wgmma_ss_m64n64k16<T>(s, wgmma_desc_sw128(sQ + off, 16, 1024), wgmma_desc_sw128(sK + off, 16, 1024),
                          kk > 0 ? 1 : 0);
  }
}

// O += P V for the 64-key tile at sV: P from registers (pa[kk]: keys 16 kk ..
// 16 kk + 15), V MN-major: 8-key groups 1024 bytes apart, 64-dim blocks one
// block (kWgBlockBytes) apart, key step kk = 16 rows = 2048 bytes.
template <class T, int HD>
__device__ __forceinline__ void wgmma_pv(float (&o)[HD / 2], const std::uint32_t (&pa)[4][4], std::uint32_t sV) {
  using Sh = WgmmaPrefillShape<HD>;
#pragma unroll
  for (int kk = 0; kk < Sh::kBc / 16; ++kk) {
    const std::uint64_t desc = wgmma_desc_sw128(sV + kk * 2048, kWgBlockBytes, 1024);
    if constexpr (HD == 64) {
      wgmma_rs_m64n64k16_tb<T>(o, pa[kk], desc, 1);
    } else {
      wgmma_rs_m64n128k16_tb<T>(o, pa[kk], desc, 1);
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class T, int HD>
__global__ void __launch_bounds__(WgmmaPrefillShape<HD>::kThreads, WgmmaPrefillShape<HD>::kMinBlocks)
    attention_prefill_wgmma_kernel(const AttentionArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Sh = WgmmaPrefillShape<HD>;
  constexpr int kBr = Sh::kBr;
  constexpr int kBc = Sh::kBc;
  constexpr int kStages = Sh::kStages;
  constexpr int kTileBytes = Sh::kTileBytes;
  constexpr int kNT = kBc / 8;  // n8 tiles of S
  constexpr int kDT = HD / 8;   // n8 tiles of O

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const std::uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u;  // [64][HD], swizzled
  const std::uint32_t sK = sQ + kTileBytes;                         // [kStages][64][HD]
  const std::uint32_t sV = sK + kStages * kTileBytes;               // [kStages][64][HD]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;    // fragment row (and row + 8)
  const int tig = lane % 4;  // fragment column pair

  // Causal: the last query tiles see the most keys; run them first.
  const int q_tile = a.causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int q0 = q_tile * kBr;
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int kvh = h / (a.num_heads / a.num_kv_heads);
  const int kv_len = a.kv_len;
  const int q_rows = min(kBr, a.q_len - q0);  // valid query rows of the block

  const long long q_row0 = (static_cast<long long>(b) * a.num_heads + h) * a.q_len + q0;
  const T* const q = static_cast<const T*>(a.q) + q_row0 * HD;
  T* const out = static_cast<T*>(a.out) + q_row0 * HD;
  const long long kv_row0 = (static_cast<long long>(b) * a.num_kv_heads + kvh) * a.kv_stride;
  const T* const k = static_cast<const T*>(a.k) + kv_row0 * HD;
  const T* const v = static_cast<const T*>(a.v) + kv_row0 * HD;

  // The block reads keys [0, n_end): up to its last valid query's position.
  long long n_end = kv_len;
  if (a.causal) n_end = min(n_end, a.pos_offset + q0 + q_rows);
  const int n_tiles = static_cast<int>((max(n_end, 0LL) + kBc - 1) / kBc);

  // This warp's rows [w0, w0 + 16): keys below full_keys reach all of its
  // rows (tiles wholly below need no mask).
  const int w0 = warp * 16;
  long long w_full = kv_len;
  if (a.causal) w_full = min(w_full, a.pos_offset + q0 + w0 + 1);
  const int full_keys = static_cast<int>(max(w_full, 0LL));
  // Row w0 + g + 8 r sees keys [0, min(kv_len, limit0 + row_step * r)).
  const long long row_end0 = a.causal ? a.pos_offset + q0 + w0 + g + 1 : static_cast<long long>(kv_len);
  const int limit0 = static_cast<int>(min(static_cast<long long>(kv_len), row_end0));
  const int row_step = a.causal ? 8 : 0;

  auto load_kv = [&](int tile) {
    const int j0 = tile * kBc;
    const std::uint32_t slot = static_cast<std::uint32_t>(tile % kStages) * kTileBytes;
    const long long off = static_cast<long long>(j0) * HD;
    load_tile64<T, HD>(sK + slot, k + off, kv_len - j0, tid);
    load_tile64<T, HD>(sV + slot, v + off, kv_len - j0, tid);
  };

  // Prologue: Q, then K/V of the first kStages - 1 tiles, one group each
  // (always committed, so the group count does not depend on n_tiles).
  load_tile64<T, HD>(sQ, q, q_rows, tid);
  cp_async_commit();
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) load_kv(st);
    cp_async_commit();
  }

  float o[kDT][4];
  float s[kNT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
  }
  auto& s_flat = reinterpret_cast<float(&)[kNT * 4]>(s);
  auto& o_flat = reinterpret_cast<float(&)[kDT * 4]>(o);
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, raw score units
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the row sum
  const float scale_log2 = a.scale * kLog2e;

  for (int t = 0; t < n_tiles; ++t) {
    // Tile t (and Q) landed for this thread; the proxy fence hands its
    // copies to wgmma, the barrier everyone's. Every wgmma of tile t - 1 was
    // waited for, so its slot can be refilled.
    cp_async_wait<kStages - 2>();
    fence_proxy_async_shared();
    __syncthreads();
    {
      const int next = t + kStages - 1;
      if (next < n_tiles) load_kv(next);
      cp_async_commit();
    }
    const std::uint32_t slot = static_cast<std::uint32_t>(t % kStages) * kTileBytes;

    wgmma_fence();
    wgmma_qk<T, HD>(s_flat, sQ, sK + slot);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s_flat);

    // Mask the diagonal / kv_len edge tiles only (warp-uniform test).
    if ((t + 1) * kBc > full_keys) {
      const int rel = limit0 - (t * kBc + tig * 2);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int limit = min(kv_len - (t * kBc + tig * 2), rel + row_step * r);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            if (nt * 8 + c >= limit) s[nt][2 * r + c] = -INFINITY;
          }
        }
      }
    }

    online_softmax_step(s, m_run, l_run, o, scale_log2);

    // P as the A operand: the S accumulators of n8 tiles 2 kk and 2 kk + 1
    // are the A fragment of key step kk.
    std::uint32_t pa[kBc / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    wgmma_fence_operands(o_flat);
    wgmma_fence();
    wgmma_pv<T, HD>(o_flat, pa, sV + slot);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o_flat);
  }
  cp_async_wait<0>();  // only empty groups can remain; leave none behind

  // Normalize (a row that saw no key writes zeros) and store: each quad
  // writes 16 contiguous bytes of a row per n8 tile.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int row = w0 + g + 8 * r;
    if (row < q_rows) {
      T* const dst = out + static_cast<long long>(row) * HD + tig * 2;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        *reinterpret_cast<std::uint32_t*>(dst + dt * 8) = pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      }
    }
  }
#else
  __trap();  // built without sm_90a: the launcher never launches this
#endif
}

template <class T, int HD>
bool launch_wgmma_typed(const AttentionArgs& a, cudaStream_t stream) {
  using Sh = WgmmaPrefillShape<HD>;
  if (!prepare_kernel<attention_prefill_wgmma_kernel<T, HD>>(Sh::kSmemBytes)) return false;
  const long long tiles = (static_cast<long long>(a.q_len) + Sh::kBr - 1) / Sh::kBr;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.batch));
  attention_prefill_wgmma_kernel<T, HD><<<grid, Sh::kThreads, Sh::kSmemBytes, stream>>>(a);
  check_launch("flash_attention");
  return true;
}

}  // namespace

bool attention_prefill_wgmma_built() {
#if defined(FERRUM_HAVE_SM90A)
  return true;
#else
  return false;
#endif
}

bool launch_attention_prefill_wgmma(const AttentionArgs& a, cudaStream_t stream) {
  if (!attention_prefill_wgmma_built() || !device_is_sm90a()) return false;
  if (!prefill_tc_applies(a) || (a.head_dim != 64 && a.head_dim != 128)) return false;
  bool launched = false;
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launched = a.head_dim == 64 ? launch_wgmma_typed<T, 64>(a, stream) : launch_wgmma_typed<T, 128>(a, stream);
  });
  return launched;
}

}  // namespace ferrum::kernels
