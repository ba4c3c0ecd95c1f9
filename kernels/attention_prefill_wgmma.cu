// flash_attention prefill (q_len > 1) on Hopper warpgroup MMA (wgmma,
// sm_90a): the FlashAttention-2 schedule of attention_prefill.cu with its
// two matrix products moved from mma.sync to wgmma.mma_async.
//
// A block is one or two warpgroups (4 warps, 128 threads each) owning 64
// query rows each of one (sequence, q head); two share every K / V tile
// (the shape is picked from the grid size, two from one wave of 128-row
// blocks -- see launch_wgmma_typed; the bits are the same). Warp w of a
// warpgroup holds its rows 16 w .. 16 w + 15 of every accumulator (wgmma's
// m64 layout is the mma.sync C layout per warp and n8 tile, so the masking
// and the online softmax are attention_prefill.cu's).
// Per key tile of kBc = 64 keys:
//
//   S = Q Kᵀ    wgmma m64n64k16, Q and K both from shared memory (K-major,
//               128-byte swizzle), HD / 16 steps, fp32 accumulators
//   softmax     online, fp32, base 2 (online_softmax_step of mma.cuh, shared
//               with the mma.sync kernels)
//   O += P V    wgmma m64nHDk16 with P from registers (the S accumulators
//               re-packed, as in the mma.sync kernel) and V from shared
//               memory as an MN-major operand (imm-trans-b): V is stored
//               exactly like K, no transpose anywhere
//
// Q, K and V tiles come in by TMA (cp.async.bulk.tensor, one elected
// thread): 3-d tensor maps [batch x heads][rows][head_dim] with 64 x 64 boxes
// and the 128-byte swizzle write exactly the layout wgmma reads, and rows
// past q_len / kv_len (the tensor extents) arrive as zeros, so whatever lies
// there in memory never reaches an accumulator. K and V stream through a
// ring of kStages slots, kStages - 1 tiles ahead, each slot completing on
// its own mbarrier; the block barrier at the top of every tile tells the
// issuing thread that every wgmma reading the slot it refills (the previous
// tile's) was waited for. Two blocks per SM at head_dim 128 overlap one
// block's softmax with the other's matrix products.
//
// An experiment (PrefillTuning::wgmma_producer_warp, WS below): a producer
// warp issues the copies and each slot has a full and an empty mbarrier, so
// the warpgroups are never held together by a block barrier; one block per
// SM with a 5-slot ring (hd 128).
//
// Causal: the block reads keys up to its last query's position; tiles that
// reach past a warp's first row's position are masked per element (all four
// warps run every wgmma of the block, so a warp's fully masked tile is an
// exact no-op for its rows, as in the mma.sync kernel). Heavy (late) query
// tiles are scheduled first. Deterministic: no atomics, a fixed order.
// (A masked key below kv_len still enters P V with p = 0 in some warps, so V
// must be finite there -- as for any cache a model wrote; rows at or past
// kv_len are never read.)
// Not bitwise equal to the mma.sync kernel (wgmma sums its k16 steps in its
// own order); both are checked against the fp64 CPU reference.
#include <cuda.h>

#include <climits>
#include <cstdint>

#include "kernels/attention_prefill.hpp"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/tensor_map.hpp"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_ops.cuh"

namespace ferrum::kernels {
namespace {

// Per head_dim and warpgroups per block (WG: 1 or 2, 64 query rows each;
// the two of a 2-warpgroup block share every K / V tile, which halves the
// L2 -> shared traffic per FLOP): kStages ring slots of K and V tiles.
//   hd 64,  WG 1: (1 + 2 * 4) * 8 KiB  + 1 KiB = 73 KiB: 3 blocks per SM
//   hd 64,  WG 2: (2 + 2 * 4) * 8 KiB  + 1 KiB = 81 KiB: 2 blocks per SM
//   hd 128, WG 1: (1 + 2 * 3) * 16 KiB + 1 KiB = 113 KiB: 2 blocks per SM
//   hd 128, WG 2: (2 + 2 * 2) * 16 KiB + 1 KiB = 97 KiB: 2 blocks per SM
// (+ 1 KiB: the dynamic shared memory is aligned up to 1024 bytes in the
// kernel, the swizzle's period; the mbarriers take 8 bytes each of that
// slack, before or after the tiles. 2 x (113 KiB + 1 KiB reserved per
// block) is all of an sm_90 SM's 228 KiB: not a byte more.) Both shapes
// give the same bits: a row's products are the same wgmma over the same
// key tiles in the same order.
//
// WS (warp-specialized, an experiment behind PrefillTuning::wgmma_producer_warp):
// two or three consumer warpgroups plus one producer warp that issues every
// TMA; each slot has a "full" barrier (the copy landed) and an "empty" one
// (every consumer thread is done with it), so no block barrier couples the
// warpgroups. One block per SM (the producer warp's registers do not fit
// two; three warpgroups + the producer = 416 threads leave 157 registers
// each), hence a deep ring:
//   hd 64,  WG 2 / 3, WS: (2 / 3 + 2 * 8) * 8 KiB  + 1 KiB = 145 / 153 KiB
//   hd 128, WG 2 / 3, WS: (2 / 3 + 2 * 5) * 16 KiB + 1 KiB = 193 / 209 KiB
// The same bits again: every row's products are the same instructions.
template <int HD, int WG, bool WS = false>
struct WgmmaPrefillShape {
  static constexpr int kBr = 64 * WG;  // query rows: each warpgroup's m64
  static constexpr int kBc = 64;       // keys per tile
  static constexpr int kConsumerThreads = 128 * WG;
  static constexpr int kThreads = kConsumerThreads + (WS ? 32 : 0);
  static constexpr int kStages = WS ? (HD == 64 ? 8 : 5) : (HD == 64 ? 4 : (WG == 1 ? 3 : 2));
  static constexpr int kMinBlocks = WS ? 1 : (HD == 64 && WG == 1 ? 3 : 2);
  static constexpr int kTileBytes = 64 * HD * 2;  // 64 rows (a warpgroup's Q, or one K / V tile)
  static constexpr int kTilesBytes = kTileBytes * (WG + 2 * kStages);  // Q, the K ring, the V ring
  // Q's mbarrier, each slot's (full), and with WS each slot's empty one.
  static constexpr int kBarrierBytes = 8 * (1 + (WS ? 2 : 1) * kStages);
  static constexpr int kSmemBytes = kTilesBytes + 1024;
  // Dynamic shared memory starts 16-byte aligned at least, so aligning up
  // moves by d <= 1008 bytes: d bytes are free before the tiles and 1024 - d
  // after them, and one of the two holds the barriers.
  static_assert(kBarrierBytes <= 512, "the barriers fit in the alignment slack");
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024,
                "kMinBlocks blocks (+ 1 KiB reserved each) fit an sm_90 SM's 228 KiB of shared memory");
  static_assert(HD == 64 || HD == 128, "the wgmma prefill covers head_dim 64 and 128");
  static_assert(WS ? (WG == 2 || WG == 3) : (WG == 1 || WG == 2),
                "one or two consumer warpgroups, or two or three beside a producer warp");
  static_assert(kBc == 64, "the TMA boxes, wgmma_qk's n64 and wgmma_pv's 4 key steps are 64-key tiles");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kWgBlockBytes = 64 * 128;  // one 64-column block of a 64-row tile

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
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {  // 64 keys
    const std::uint64_t desc = wgmma_desc_sw128(sV + kk * 2048, kWgBlockBytes, 1024);
    if constexpr (HD == 64) {
      wgmma_rs_m64n64k16_tb<T>(o, pa[kk], desc, 1);
    } else {
      wgmma_rs_m64n128k16_tb<T>(o, pa[kk], desc, 1);
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class T, int HD, int WG, bool WS>
__global__ void __launch_bounds__(WgmmaPrefillShape<HD, WG, WS>::kThreads, WgmmaPrefillShape<HD, WG, WS>::kMinBlocks)
    attention_prefill_wgmma_kernel(const AttentionArgs a, const __grid_constant__ CUtensorMap q_map,
                                   const __grid_constant__ CUtensorMap k_map,
                                   const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Sh = WgmmaPrefillShape<HD, WG, WS>;
  constexpr int kBr = Sh::kBr;
  constexpr int kBc = Sh::kBc;
  constexpr int kStages = Sh::kStages;
  constexpr int kTileBytes = Sh::kTileBytes;
  constexpr int kNT = kBc / 8;  // n8 tiles of S
  constexpr int kDT = HD / 8;   // n8 tiles of O

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const std::uint32_t raw = smem_u32(smem_raw);
  const std::uint32_t sQ = (raw + 1023u) & ~1023u;     // [WG][64][HD], swizzled
  const std::uint32_t sK = sQ + WG * kTileBytes;       // [kStages][64][HD]
  const std::uint32_t sV = sK + kStages * kTileBytes;  // [kStages][64][HD]
  // Barriers: [0] Q, [1 + s] slot s (its K and V tiles landed), with WS
  // [1 + kStages + s] slot s (every consumer thread is done with it).
  const std::uint32_t tiles_end = sQ + Sh::kTilesBytes;
  const std::uint32_t bars_at = raw + Sh::kSmemBytes - tiles_end >= Sh::kBarrierBytes ? tiles_end : raw;
  std::uint64_t* const bars = reinterpret_cast<std::uint64_t*>(smem_raw + (bars_at - raw));

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;         // this thread's warpgroup: rows 64 wg .. 64 wg + 63
  const int warp = (tid % 128) / 32;  // warp in the warpgroup
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
  T* const out = static_cast<T*>(a.out) + q_row0 * HD;
  const int q_plane = b * a.num_heads + h;     // the tensor maps' outer coordinate
  const int kv_plane = b * a.num_kv_heads + kvh;

  // The block reads keys [0, n_end): up to its last valid query's position.
  long long n_end = kv_len;
  if (a.causal) n_end = min(n_end, a.pos_offset + q0 + q_rows);
  const int n_tiles = static_cast<int>((max(n_end, 0LL) + kBc - 1) / kBc);

  // This warpgroup's rows [64 wg, 64 wg + wg_rows) read tiles [0,
  // wg_tiles): a warpgroup skips the tiles past its last valid row's keys
  // (the block's other one reads them), and one without a valid row (a last,
  // partial block) computes nothing.
  const int wg_rows = max(0, min(64, q_rows - 64 * wg));
  long long wg_end = wg_rows > 0 ? kv_len : 0;
  if (a.causal) wg_end = min(wg_end, a.pos_offset + q0 + 64 * wg + wg_rows);
  const int wg_tiles = static_cast<int>((max(wg_end, 0LL) + kBc - 1) / kBc);
  const std::uint32_t sQw = sQ + wg * kTileBytes;

  // This warp's rows [w0, w0 + 16): keys below full_keys reach all of its
  // rows (tiles wholly below need no mask).
  const int w0 = 64 * wg + warp * 16;
  long long w_full = kv_len;
  if (a.causal) w_full = min(w_full, a.pos_offset + q0 + w0 + 1);
  const int full_keys = static_cast<int>(max(w_full, 0LL));
  // Row w0 + g + 8 r sees keys [0, min(kv_len, limit0 + row_step * r)).
  const long long row_end0 = a.causal ? a.pos_offset + q0 + w0 + g + 1 : static_cast<long long>(kv_len);
  const int limit0 = static_cast<int>(min(static_cast<long long>(kv_len), row_end0));
  const int row_step = a.causal ? 8 : 0;

  // One 64-row tile (HD / 64 boxes of 64 columns) of a tensor map into a
  // swizzled tile, completing on `bar`.
  auto tma_tile = [&](std::uint32_t dst, const CUtensorMap* map, int row0, int plane, std::uint64_t* bar) {
#pragma unroll
    for (int blk = 0; blk < HD / 64; ++blk) tma_load_3d(dst + blk * kWgBlockBytes, map, blk * 64, row0, plane, bar);
  };
  auto load_kv = [&](int tile) {  // one thread: 0, or (WS) the producer warp's lane 0
    const int slot = tile % kStages;
    std::uint64_t* const bar = &bars[1 + slot];
    mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
    tma_tile(sK + slot * kTileBytes, &k_map, tile * kBc, kv_plane, bar);
    tma_tile(sV + slot * kTileBytes, &v_map, tile * kBc, kv_plane, bar);
  };
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < 1 + kStages; ++i) mbarrier_init(&bars[i], 1);
    if constexpr (WS) {
#pragma unroll
      for (int i = 0; i < kStages; ++i) mbarrier_init(&bars[1 + kStages + i], Sh::kConsumerThreads);
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier of a WS block: the producer leaves below
  auto load_q = [&] {
    const int q_tiles = (q_rows + 63) / 64;
    mbarrier_arrive_expect_tx(&bars[0], q_tiles * kTileBytes);
    for (int w = 0; w < q_tiles; ++w) tma_tile(sQ + w * kTileBytes, &q_map, q0 + 64 * w, q_plane, &bars[0]);
  };
  if constexpr (WS) {
    if (tid >= Sh::kConsumerThreads) {  // the producer warp: one lane issues every copy
      if (tid == Sh::kConsumerThreads) {
        load_q();
        for (int t = 0; t < n_tiles; ++t) {
          // Slot t % kStages last held tile t - kStages: wait until every
          // consumer thread released it (that phase's parity).
          if (t >= kStages) {
            mbarrier_wait_parity(&bars[1 + kStages + t % kStages], static_cast<std::uint32_t>(t / kStages - 1) & 1u);
          }
          load_kv(t);
        }
      }
      return;
    }
  } else {
    // Prologue: Q of the warpgroups with a valid row, then K/V of the first
    // kStages - 1 tiles.
    if (tid == 0) {
      load_q();
      for (int st = 0; st < kStages - 1 && st < n_tiles; ++st) load_kv(st);
    }
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
    if constexpr (WS) {
      // A warpgroup past its last row's keys only releases the slot, once the
      // tile is there: its release of tile t + kStages must not count
      // toward the release of tile t, which the other warpgroup may still be
      // reading, and tile t + kStages lands only after that release.
      if (t >= wg_tiles) {
        mbarrier_wait_parity(&bars[1 + t % kStages], static_cast<std::uint32_t>(t / kStages) & 1u);
        mbarrier_arrive(&bars[1 + kStages + t % kStages]);
        continue;
      }
    } else {
      // Every wgmma of tile t - 1 was waited for by every thread, so its
      // slot can be refilled. (Every tile below n_tiles is read, and its
      // barrier phase waited for, by the warpgroup holding the block's last
      // valid row, before the barrier that lets thread 0 re-arm it.)
      __syncthreads();
      if (tid == 0 && t + kStages - 1 < n_tiles) load_kv(t + kStages - 1);
      if (WG > 1 && t >= wg_tiles) continue;  // warpgroup-uniform (one warpgroup: wg_tiles == n_tiles)
    }
    if (t == 0) mbarrier_wait_parity(&bars[0], 0);
    mbarrier_wait_parity(&bars[1 + t % kStages], static_cast<std::uint32_t>(t / kStages) & 1u);
    const std::uint32_t slot = static_cast<std::uint32_t>(t % kStages) * kTileBytes;

    wgmma_fence();
    wgmma_qk<T, HD>(s_flat, sQw, sK + slot);
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
    if constexpr (WS) mbarrier_arrive(&bars[1 + kStages + t % kStages]);  // this thread is done with the slot
  }
  if (wg_tiles == 0) mbarrier_wait_parity(&bars[0], 0);  // no copy outlives the block

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

template <class T, int HD, int WG, bool WS = false>
bool launch_wgmma_shape(const AttentionArgs& a, const CUtensorMap& q_map, const CUtensorMap& k_map,
                        const CUtensorMap& v_map, cudaStream_t stream) {
  using Sh = WgmmaPrefillShape<HD, WG, WS>;
  if (!prepare_kernel<attention_prefill_wgmma_kernel<T, HD, WG, WS>>("flash_attention", Sh::kSmemBytes)) return false;
  const long long tiles = (static_cast<long long>(a.q_len) + Sh::kBr - 1) / Sh::kBr;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.batch));
  attention_prefill_wgmma_kernel<T, HD, WG, WS><<<grid, Sh::kThreads, Sh::kSmemBytes, stream>>>(a, q_map, k_map,
                                                                                                v_map);
  check_launch("flash_attention");
  return true;
}

// Two warpgroups per block (128-row blocks sharing each K / V tile) once
// the grid of them fills the device at least once: on the H200 (f16, hd 128,
// 32 heads, random inputs) two beat one at every S measured: 1k +3.6 %,
// 2k +1.4 %, 4k +11.7 %, 16k +16.8 % (docs/PERFORMANCE.md, session 13);
// below one wave the 64-row
// blocks keep more SMs busy. PrefillTuning::wgmma_warpgroups overrides it.
// Both shapes give the same bits.
template <class T, int HD>
bool launch_wgmma_typed(const AttentionArgs& a, cudaStream_t stream) {
  // Q and out [batch * heads][q_len][HD]; K and V [batch * kv heads][kv_stride][HD],
  // of which rows < kv_len are mapped.
  CUtensorMap q_map, k_map, v_map;
  const long long q_planes = static_cast<long long>(a.batch) * a.num_heads;
  const long long kv_planes = static_cast<long long>(a.batch) * a.num_kv_heads;
  if (q_planes > INT_MAX) return false;  // the kernel's plane coordinate is an int (TMA coordinates are s32)
  if (!encode_rows_map(&q_map, a.dtype, a.q, HD, a.q_len, a.q_len, q_planes) ||
      !encode_rows_map(&k_map, a.dtype, a.k, HD, a.kv_len, a.kv_stride, kv_planes) ||
      !encode_rows_map(&v_map, a.dtype, a.v, HD, a.kv_len, a.kv_stride, kv_planes)) {
    return false;
  }
  int warpgroups = a.prefill_tuning.wgmma_warpgroups;
  if (a.prefill_tuning.wgmma_producer_warp) {
    if (warpgroups == 0 || warpgroups == 2) return launch_wgmma_shape<T, HD, 2, true>(a, q_map, k_map, v_map, stream);
    if (warpgroups == 3) return launch_wgmma_shape<T, HD, 3, true>(a, q_map, k_map, v_map, stream);
    throw_bad_dispatch("flash_attention", "PrefillTuning::wgmma_warpgroups (with the producer warp)", warpgroups);
  }
  if (warpgroups == 0) {
    const long long blocks2 = (static_cast<long long>(a.q_len) + 127) / 128 * a.num_heads * a.batch;
    warpgroups = blocks2 >= device_sm_count("flash_attention") ? 2 : 1;
  }
  if (warpgroups == 2) return launch_wgmma_shape<T, HD, 2>(a, q_map, k_map, v_map, stream);
  if (warpgroups == 1) return launch_wgmma_shape<T, HD, 1>(a, q_map, k_map, v_map, stream);
  throw_bad_dispatch("flash_attention", "PrefillTuning::wgmma_warpgroups", warpgroups);
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
