// flash_attention prefill (q_len > 1) on tensor cores, FlashAttention-2
// style.
//
// A block owns kBr = kWarps * 16 * kMT query rows of one (sequence, q head);
// each warp owns kMT m16 tiles (16 * kMT rows) for the whole key range, so
// softmax statistics never leave the warp. With kMT = 2 every K / V fragment
// a warp loads from shared memory feeds two mma.sync instead of one, which
// halves the ldmatrix traffic per mma (shared-memory bandwidth is what limits
// the one-tile shape). The block walks the keys kBc at a time:
//
//   S = Q Kᵀ        mma.sync m16n8k16 (f16/bf16 in, fp32 accumulate); Q and
//                   K fragments come from shared memory through ldmatrix
//                   (Q once into registers where the register budget allows)
//   online softmax  fp32 in registers, base 2: the running max m is kept in
//                   raw-score units, p = exp2(s * scale·log2e - m * scale·log2e)
//   O += P V        P re-packed from the S accumulators as the A operand
//                   (no shared-memory round trip), V through ldmatrix.trans
//
// K and V tiles stream through a ring of kStages shared-memory slots filled
// by cp.async (16-byte, L2-only), kStages - 1 tiles ahead, one commit group
// per tile: one barrier per tile both publishes tile t and frees the slot of
// tile t - 1 for refilling. Shared rows are XOR-swizzled in 16-byte chunks
// (chunk ^ (row & 7)), which keeps both the cp.async stores and the ldmatrix
// reads free of bank conflicts. Rows past q_len / kv_len are zero-filled
// (cp.async src-size 0), so whatever lies there in memory (the test poisons
// it with NaN) never reaches an accumulator.
//
// Causal: the block reads only keys up to its last query's position. Per
// warp, tiles past its own last valid query's position are skipped (no mma,
// no softmax), tiles entirely below its first query's position need no
// mask, the rest (the diagonal, and the partial last tile of kv_len) are
// masked per element. Heavy (late) query tiles are scheduled first. The
// output is normalized in fp32, rounded once to the dtype, and written
// through shared memory as 16-byte rows. No atomics: bitwise reproducible,
// and a row's result does not depend on kMT: every key tile with a key the
// row sees is walked, in the same order, in either shape; a tile fully
// masked for the row, walked by its warp in one shape and skipped in the
// other, is an exact no-op (online_softmax_step rescales by exactly 1
// and P = 0 adds exact zeros).
#include <atomic>
#include <climits>
#include <cstdint>

#include "kernels/attention_prefill.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {
namespace {

// Per (head_dim, m16 tiles per warp) shapes. kBc keys per tile, kStages ring
// slots (>= 2), kMinBlocks resident blocks per SM the register budget is
// sized for, kQInRegs: Q fragments held in registers for the whole key loop
// (else re-read from shared memory every tile).
//   hd 64,  kMT 1: smem (64  + 2*3*64) * 128 B =  56 KiB
//   hd 64,  kMT 2: smem (128 + 2*2*64) * 128 B =  48 KiB
//   hd 128, kMT 1: smem (64  + 2*2*64) * 256 B =  80 KiB  (2 blocks per SM)
//   hd 128, kMT 2: smem (128 + 2*2*64) * 256 B =  96 KiB  (2 blocks per SM;
//                  O 128 + S 64 fp32 registers per thread: Q stays in smem)
//   hd 256, kMT 1: smem (64  + 2*2*32) * 512 B =  96 KiB  (2 blocks per SM)
template <int HD, int MT>
struct PrefillTraits;
template <>
struct PrefillTraits<64, 1> {
  static constexpr int kWarps = 4, kBc = 64, kStages = 3, kMinBlocks = 3;
  static constexpr bool kQInRegs = true;
  static constexpr int kQKUnroll = 64 / 16;
};
template <>
struct PrefillTraits<64, 2> {
  static constexpr int kWarps = 4, kBc = 64, kStages = 2, kMinBlocks = 2;
  static constexpr bool kQInRegs = true;
  static constexpr int kQKUnroll = 64 / 16;
};
template <>
struct PrefillTraits<128, 1> {
  static constexpr int kWarps = 4, kBc = 64, kStages = 2, kMinBlocks = 2;
  static constexpr bool kQInRegs = true;
  static constexpr int kQKUnroll = 128 / 16;
};
template <>
struct PrefillTraits<128, 2> {
  static constexpr int kWarps = 4, kBc = 64, kStages = 2, kMinBlocks = 2;
  static constexpr bool kQInRegs = false;
  static constexpr int kQKUnroll = 1;  // unrolled further, ptxas hoists fragments and spills
};
template <>
struct PrefillTraits<256, 1> {
  static constexpr int kWarps = 4, kBc = 32, kStages = 2, kMinBlocks = 2;
  static constexpr bool kQInRegs = false;
  static constexpr int kQKUnroll = 256 / 16;
};

template <int HD, int MT>
struct PrefillShape : PrefillTraits<HD, MT> {
  using Base = PrefillTraits<HD, MT>;
  static constexpr int kMT = MT;
  static constexpr int kThreads = Base::kWarps * 32;
  static constexpr int kWarpRows = 16 * MT;
  static constexpr int kBr = Base::kWarps * kWarpRows;
  static constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  static constexpr int kSmemElems = (kBr + 2 * Base::kStages * Base::kBc) * HD;
  static constexpr int kSmemBytes = kSmemElems * 2;
  static_assert(Base::kStages >= 2, "the ring needs a slot to fill while another is read");
  static_assert(Base::kBc % 16 == 0 && HD % 16 == 0, "k16 steps");
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks of a row");
  static_assert(!Base::kQInRegs || Base::kQKUnroll == HD / 16, "Q fragments in registers are indexed by k16 step");
};

// ROWS x HD tile from global rows src[0..) (contiguous, HD apart) into
// swizzled shared memory; rows >= valid_rows are zero-filled.
template <class T, int HD, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int valid_rows, int tid) {
  constexpr int kChunks = HD / 8;
  constexpr int kTotal = ROWS * kChunks;
  static_assert(kTotal % THREADS == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kTotal / THREADS; ++i) {
    const int idx = tid + i * THREADS;
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    const T* from = valid ? src + row * HD + chunk * 8 : src;  // not read when invalid
    cp_async_16(smem_u32(dst + swz<HD>(row, chunk)), from, valid);
  }
}

template <class T, int HD, int MT>
__global__ void __launch_bounds__(PrefillShape<HD, MT>::kThreads, PrefillShape<HD, MT>::kMinBlocks)
    attention_prefill_kernel(const AttentionArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Sh = PrefillShape<HD, MT>;
  constexpr int kMT = Sh::kMT;
  constexpr int kWarpRows = Sh::kWarpRows;
  constexpr int kBr = Sh::kBr;
  constexpr int kBc = Sh::kBc;
  constexpr int kStages = Sh::kStages;
  constexpr int kThreads = Sh::kThreads;
  constexpr int kChunks = Sh::kChunks;
  constexpr bool kQInRegs = Sh::kQInRegs;
  constexpr int kQKUnroll = Sh::kQKUnroll;
  constexpr int kKSteps = HD / 16;  // k16 steps of Q Kᵀ
  constexpr int kNT = kBc / 8;      // n8 tiles of S (keys)
  constexpr int kDT = HD / 8;       // n8 tiles of O (head dims)

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sQ = reinterpret_cast<T*>(smem_raw);  // [kBr][HD]
  T* const sK = sQ + kBr * HD;                   // [kStages][kBc][HD]
  T* const sV = sK + kStages * kBc * HD;         // [kStages][kBc][HD]

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

  // This warp's rows [w0, w0 + w_rows) of the block: keys [0, warp_keys)
  // reach one of its valid rows, keys below full_keys reach all of its rows.
  // A warp with no valid row (the block's last tile) computes nothing.
  const int w0 = warp * kWarpRows;
  const int w_rows = max(0, min(kWarpRows, q_rows - w0));
  long long w_end = w_rows > 0 ? kv_len : 0;
  long long w_full = kv_len;
  if (a.causal) {
    w_end = min(w_end, a.pos_offset + q0 + w0 + w_rows);
    w_full = min(w_full, a.pos_offset + q0 + w0 + 1);
  }
  const int warp_keys = static_cast<int>(max(w_end, 0LL));
  const int full_keys = static_cast<int>(max(w_full, 0LL));

  // Row i of the block sees keys [0, min(kv_len, pos_offset + q0 + i + 1))
  // (causal) or [0, kv_len). This thread's rows are w0 + g + 8j (j = 2mt +
  // r): key limit min(kv_len, limit0 + row_step * j). Rows past q_len are
  // computed but never stored.
  const long long row_end0 = a.causal ? a.pos_offset + q0 + w0 + g + 1 : static_cast<long long>(kv_len);
  const int limit0 = static_cast<int>(min(static_cast<long long>(kv_len), row_end0));
  const int row_step = a.causal ? 8 : 0;

  auto load_kv = [&](int tile) {
    const int j0 = tile * kBc;
    const int slot = tile % kStages;
    const long long off = static_cast<long long>(j0) * HD;
    load_tile<T, HD, kBc, kThreads>(sK + slot * kBc * HD, k + off, kv_len - j0, tid);
    load_tile<T, HD, kBc, kThreads>(sV + slot * kBc * HD, v + off, kv_len - j0, tid);
  };

  // Prologue: Q, then K/V of the first kStages - 1 tiles, one group each
  // (always commit, so the group count is the same whatever n_tiles is).
  load_tile<T, HD, kBr, kThreads>(sQ, q, q_rows, tid);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_kv(s);
    cp_async_commit();
  }
  cp_async_wait<kStages - 1>();  // Q has landed
  __syncthreads();

  // ldmatrix addresses. Each thread's lane address of fragment (row block,
  // k16 step kk) is its step-0 byte offset XOR (kk << 5): rows advance in
  // whole 16-row blocks (row & 7, hence the swizzle, unchanged) and step kk
  // is chunk 2kk + c with c in {0, 1}, so (2kk + c) ^ (row & 7) =
  // 2kk ^ (c ^ (row & 7)); kk << 5 < HD * 2 stays inside the chunk bits of
  // the offset. One LOP3 per address instead of a register per (kk, row
  // block) pair hoisted out of the key loop.
  //   Q (A operand, row-major): rows w0 + (lane & 15), chunk lane >> 4
  //   K (B operand, two n8 key tiles x one k16 step): rows (lane & 7) +
  //     8 * (lane >> 4), chunk (lane >> 3) & 1
  //   V (B operand through .trans, one k16 key step x two n8 dim tiles):
  //     rows lane & 15, chunk lane >> 4
  constexpr std::uint32_t kRowBytes = HD * 2;
  const std::uint32_t q_off = 2u * swz<HD>(w0 + (lane & 15), lane >> 4);
  const std::uint32_t k_off = 2u * swz<HD>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const std::uint32_t v_off = 2u * swz<HD>(lane & 15, lane >> 4);
  const std::uint32_t sQ_u32 = smem_u32(sQ);
  const std::uint32_t sK_u32 = smem_u32(sK);
  const std::uint32_t sV_u32 = smem_u32(sV);

  std::uint32_t qf[kQInRegs ? kMT : 1][kQInRegs ? kKSteps : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        ldmatrix_x4(qf[mt][kk], sQ_u32 + mt * 16 * kRowBytes + (q_off ^ (kk << 5)));
      }
    }
  }

  float o[kMT][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    }
  }
  float m_run[kMT][2];  // running max, raw score units
  float l_run[kMT][2];  // this thread's share of the row sum
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.0f;
  }
  const float scale_log2 = a.scale * kLog2e;

  for (int t = 0; t < n_tiles; ++t) {
    // Tile t has landed for every thread; every warp is done with tile
    // t - 1, so its slot can be refilled.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int next = t + kStages - 1;
      if (next < n_tiles) load_kv(next);
      cp_async_commit();
    }
    // Warp-uniform: no valid row of this warp sees a key of this tile.
    if (t * kBc >= warp_keys) continue;

    const std::uint32_t sKt = sK_u32 + (t % kStages) * kBc * kRowBytes;
    const std::uint32_t sVt = sV_u32 + (t % kStages) * kBc * kRowBytes;

    // S = Q Kᵀ for this warp's 16 * kMT rows x kBc keys.
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      }
    }
#pragma unroll(kQKUnroll)
    for (int kk = 0; kk < kKSteps; ++kk) {
      std::uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][e] = qf[mt][kk][e];
        } else {
          ldmatrix_x4(qa[mt], sQ_u32 + mt * 16 * kRowBytes + (q_off ^ (kk << 5)));
        }
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, sKt + np * 16 * kRowBytes + (k_off ^ (kk << 5)));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // Mask the diagonal / kv_len edge tiles only (warp-uniform test).
    if ((t + 1) * kBc > full_keys) {
      // Limits relative to this thread's first key of the tile (column 0 of
      // its pair in n8 tile 0).
      const int rel = limit0 - (t * kBc + tig * 2);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int limit = min(kv_len - (t * kBc + tig * 2), rel + row_step * (2 * mt + r));
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              if (nt * 8 + c >= limit) s[mt][nt][2 * r + c] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax, per row: the quad (4 lanes) shares a row. A tile that
    // is fully masked for a row is an exact no-op for it (rescale by exactly
    // 1, P = 0 adds exact zeros), so which such tiles a warp walks -- it
    // depends on kMT -- never changes a bit.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) online_softmax_step(s[mt], m_run[mt], l_run[mt], o[mt], scale_log2);

    // O += P V. The S accumulators of n8 tiles 2kk and 2kk+1 are exactly the
    // A fragment of key step kk.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      std::uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, sVt + kk * 16 * kRowBytes + (v_off ^ (dp << 5)));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave none behind

  // Normalize (a row that saw no key writes zeros) and stage the warp's rows
  // in its own rows of sQ, which no other warp reads (and no cp.async
  // writes after the prologue).
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_run[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = w0 + mt * 16 + g + 8 * r;
        *reinterpret_cast<std::uint32_t*>(sQ + swz<HD>(row, dt) + tig * 2) =
            pack2<T>(o[mt][dt][2 * r] * inv[r], o[mt][dt][2 * r + 1] * inv[r]);
      }
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kWarpRows * kChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = w0 + idx / kChunks;
    const int chunk = idx % kChunks;
    if (row < q_rows) {
      *reinterpret_cast<uint4*>(out + static_cast<long long>(row) * HD + chunk * 8) =
          *reinterpret_cast<const uint4*>(sQ + swz<HD>(row, chunk));
    }
  }
#else
  __trap();  // built without sm_80+: the launcher never launches this
#endif
}

template <class T, int HD, int MT>
bool launch_shape(const AttentionArgs& a, cudaStream_t stream) {
  using Sh = PrefillShape<HD, MT>;
  const auto kernel = attention_prefill_kernel<T, HD, MT>;
  if (!prepare_kernel<attention_prefill_kernel<T, HD, MT>>("flash_attention", Sh::kSmemBytes)) return false;
  const long long tiles = (static_cast<long long>(a.q_len) + Sh::kBr - 1) / Sh::kBr;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.batch));
  kernel<<<grid, Sh::kThreads, Sh::kSmemBytes, stream>>>(a);
  check_launch("flash_attention");
  return true;
}

// Two m16 tiles per warp (128-row blocks) only when the grid still fills the
// device a few times over: with fewer, longer blocks the causal critical path
// (the heaviest block) and SMs left with one block cost more than the
// halved shared-memory traffic gains. Both shapes give the same bits.
template <class T, int HD>
bool launch_typed(const AttentionArgs& a, cudaStream_t stream) {
  if constexpr (HD <= 128) {
    // Same bits from both shapes: the same key tiles, in the same order.
    static_assert(PrefillShape<HD, 1>::kBc == PrefillShape<HD, 2>::kBc, "both shapes walk the same key tiles");
    constexpr int kBr2 = PrefillShape<HD, 2>::kBr;
    const long long blocks2 = (static_cast<long long>(a.q_len) + kBr2 - 1) / kBr2 * a.num_heads * a.batch;
    if (blocks2 >= 4LL * device_sm_count("flash_attention") && launch_shape<T, HD, 2>(a, stream)) return true;
  }
  return launch_shape<T, HD, 1>(a, stream);
}

}  // namespace

bool prefill_tc_applies(const AttentionArgs& a) {
  if (a.state != nullptr || a.kv_lens != nullptr || a.q_len < 2) return false;
  if (a.dtype != DType::F16 && a.dtype != DType::BF16) return false;
  if (!attention_head_dim_supported(static_cast<std::size_t>(a.head_dim))) return false;
  constexpr long long kMaxGrid = static_cast<long long>(kAttentionMaxGridYZ);
  if (a.batch < 1 || a.batch > kMaxGrid || a.num_heads < 1 || a.num_heads > kMaxGrid) return false;
  if (a.num_kv_heads < 1 || a.num_heads % a.num_kv_heads != 0) return false;
  if (a.kv_len < 0 || a.kv_stride < a.kv_len || a.pos_offset < 0 || !(a.scale > 0.0f)) return false;
  // Key indices (tile ends, row limits + 24) are int in the kernels.
  if (a.kv_len > INT_MAX - 256) return false;
  return all_aligned16(a.q, a.k, a.v, static_cast<const void*>(a.out));
}

bool launch_attention_prefill_tc(const AttentionArgs& a, cudaStream_t stream) {
  if (!prefill_tc_applies(a)) return false;
  bool launched = false;
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int(AttentionHeadDims{}, a.head_dim, "flash_attention", "head_dim", [&](auto hd_c) {
      constexpr int HD = decltype(hd_c)::value;
      launched = launch_typed<T, HD>(a, stream);
    });
  });
  return launched;
}

}  // namespace ferrum::kernels
