// flash_attention prefill (q_len > 1) on tensor cores, FlashAttention-2
// style.
//
// A block owns kBr = 16 * kWarps query rows of one (sequence, q head); each
// warp owns 16 of them for the whole key range, so softmax statistics never
// leave the warp. The block walks the keys kBc at a time:
//
//   S = Q Kᵀ        mma.sync m16n8k16 (f16/bf16 in, fp32 accumulate); Q and
//                   K fragments come from shared memory through ldmatrix
//                   (Q once into registers for head_dim <= 128)
//   online softmax  fp32 in registers, base 2: the running max m is kept in
//                   raw-score units, p = exp2(s * scale·log2e - m * scale·log2e)
//   O += P V        P re-packed from the S accumulators as the A operand
//                   (no shared-memory round trip), V through ldmatrix.trans
//
// K and V tiles stream through a ring of kStages shared-memory slots filled
// by cp.async (16-byte, L2-only); K and V of a tile are separate commit
// groups, so S = Q Kᵀ starts as soon as K has landed while V is still in
// flight. Shared rows are XOR-swizzled in 16-byte chunks (chunk ^ (row & 7)),
// which keeps both the cp.async stores and the ldmatrix reads free of bank
// conflicts. Rows past q_len / kv_len are zero-filled (cp.async src-size 0),
// so whatever lies there in memory (the test poisons it with NaN) never
// reaches an accumulator.
//
// Causal: the block reads only keys up to its last query's position; tiles
// entirely below its first query's position need no mask, the rest (the
// diagonal, and the partial last tile of kv_len) are masked per element.
// Heavy (late) query tiles are scheduled first. The output is normalized
// in fp32, rounded once to the dtype, and written through shared memory as
// 16-byte rows. No atomics: bitwise reproducible.
#include <climits>
#include <cstdint>

#include "kernels/attention_prefill.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {
namespace {

// Per head_dim tile shapes. kBc keys per tile, kStages ring slots (>= 2),
// kMinBlocks resident blocks per SM the register budget is sized for.
//   hd 64:  smem (64 + 2*3*64) * 128 B = 56 KiB
//   hd 128: smem (64 + 2*2*64) * 256 B = 80 KiB  (2 blocks per SM)
//   hd 256: smem (64 + 2*2*32) * 512 B = 96 KiB  (2 blocks per SM)
template <int HD>
struct PrefillTraits;
template <>
struct PrefillTraits<64> {
  static constexpr int kWarps = 4, kBc = 64, kStages = 3, kMinBlocks = 3;
};
template <>
struct PrefillTraits<128> {
  static constexpr int kWarps = 4, kBc = 64, kStages = 2, kMinBlocks = 2;
};
template <>
struct PrefillTraits<256> {
  static constexpr int kWarps = 4, kBc = 32, kStages = 2, kMinBlocks = 2;
};

template <int HD>
struct PrefillShape : PrefillTraits<HD> {
  using Base = PrefillTraits<HD>;
  static constexpr int kThreads = Base::kWarps * 32;
  static constexpr int kBr = Base::kWarps * 16;
  static constexpr int kChunks = HD / 8;     // 16-byte chunks per row
  static constexpr bool kQInRegs = HD <= 128;  // hd 256 re-reads Q fragments per tile
  static constexpr int kSmemElems = (kBr + 2 * Base::kStages * Base::kBc) * HD;
  static constexpr int kSmemBytes = kSmemElems * 2;
  static_assert(Base::kStages >= 2, "the ring needs a slot to fill while another is read");
  static_assert(Base::kBc % 16 == 0 && HD % 16 == 0, "k16 steps");
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks of a row");
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

template <class T, int HD>
__global__ void __launch_bounds__(PrefillShape<HD>::kThreads, PrefillShape<HD>::kMinBlocks)
    attention_prefill_kernel(const AttentionArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Sh = PrefillShape<HD>;
  constexpr int kBr = Sh::kBr;
  constexpr int kBc = Sh::kBc;
  constexpr int kStages = Sh::kStages;
  constexpr int kThreads = Sh::kThreads;
  constexpr int kChunks = Sh::kChunks;
  constexpr bool kQInRegs = Sh::kQInRegs;
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
  const int g = lane / 4;  // fragment row (and row + 8)
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

  // Keys [0, n_end) are read; keys below n_full are visible to every row.
  long long n_end = kv_len;
  long long n_full = kv_len;
  if (a.causal) {
    n_end = min(n_end, a.pos_offset + q0 + q_rows);
    n_full = min(n_full, a.pos_offset + q0 + 1);
  }
  const int n_tiles = static_cast<int>((max(n_end, 0LL) + kBc - 1) / kBc);
  const int full_keys = static_cast<int>(max(n_full, 0LL));

  // Key limits of this thread's two rows (rows past q_len are computed but
  // never stored).
  int limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const long long pos = a.pos_offset + q0 + warp * 16 + g + 8 * r;
    limit[r] = a.causal ? static_cast<int>(max(0LL, min(static_cast<long long>(kv_len), pos + 1))) : kv_len;
  }

  auto load_kv = [&](int tile, bool is_v) {
    const int j0 = tile * kBc;
    T* dst = (is_v ? sV : sK) + (tile % kStages) * kBc * HD;
    load_tile<T, HD, kBc, kThreads>(dst, (is_v ? v : k) + static_cast<long long>(j0) * HD, kv_len - j0, tid);
  };

  // Prologue: Q, then K/V of the first kStages - 1 tiles (always commit, so
  // the group count is the same whatever n_tiles is).
  load_tile<T, HD, kBr, kThreads>(sQ, q, q_rows, tid);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_kv(s, false);
    cp_async_commit();
    if (s < n_tiles) load_kv(s, true);
    cp_async_commit();
  }
  cp_async_wait<2 * (kStages - 1)>();  // Q has landed
  __syncthreads();

  // Q fragments (A operand, 16 rows x 16 dims per step) for this warp's rows.
  const int a_row = warp * 16 + (lane & 15);
  const int a_chunk = lane >> 4;
  std::uint32_t qf[kQInRegs ? kKSteps : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(qf[kk], smem_u32(sQ + swz<HD>(a_row, kk * 2 + a_chunk)));
  }
  // K fragment rows: two n8 tiles (16 keys) by one k16 step per ldmatrix.x4.
  const int k_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_chunk = (lane >> 3) & 1;
  // V fragment rows (transposed): one k16 step (16 keys) by two n8 dim tiles.
  const int v_row = lane & 15;
  const int v_chunk = lane >> 4;

  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  }
  float m_run[2] = {-INFINITY, -INFINITY};  // running max, raw score units
  float l_run[2] = {0.0f, 0.0f};           // this thread's share of the row sum
  const float scale_log2 = a.scale * kLog2e;

  for (int t = 0; t < n_tiles; ++t) {
    // K(t) has landed for every thread; every warp is done with tile t - 1,
    // so its slot can be refilled.
    cp_async_wait<2 * kStages - 3>();
    __syncthreads();
    {
      const int next = t + kStages - 1;
      if (next < n_tiles) load_kv(next, false);
      cp_async_commit();
      if (next < n_tiles) load_kv(next, true);
      cp_async_commit();
    }
    const T* const sKt = sK + (t % kStages) * kBc * HD;
    const T* const sVt = sV + (t % kStages) * kBc * HD;

    // S = Q Kᵀ for this warp's 16 rows x kBc keys.
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      std::uint32_t qa[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qa[e] = qf[kk][e];
      } else {
        ldmatrix_x4(qa, smem_u32(sQ + swz<HD>(a_row, kk * 2 + a_chunk)));
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, smem_u32(sKt + swz<HD>(np * 16 + k_row, kk * 2 + k_chunk)));
        mma_16816<T>(s[2 * np], qa, kb[0], kb[1]);
        mma_16816<T>(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    // Mask the diagonal / kv_len edge tiles only.
    if ((t + 1) * kBc > full_keys) {
      const int j0 = t * kBc + tig * 2;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (j0 + nt * 8 + (e & 1) >= limit[e >> 1]) s[nt][e] = -INFINITY;
        }
      }
    }

    // Online softmax, per row: the quad (4 lanes) shares a row.
    online_softmax_step(s, m_run, l_run, o, scale_log2);

    // V(t) has landed for every thread.
    cp_async_wait<2 * (kStages - 1)>();
    __syncthreads();

    // O += P V. The S accumulators of n8 tiles 2kk and 2kk+1 are exactly the
    // A fragment of key step kk.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const std::uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                   pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, smem_u32(sVt + swz<HD>(kk * 16 + v_row, dp * 2 + v_chunk)));
        mma_16816<T>(o[2 * dp], pa, vb[0], vb[1]);
        mma_16816<T>(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave none behind

  // Normalize (a row that saw no key writes zeros) and stage the warp's 16
  // rows in its own rows of sQ, which no other warp reads.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
  }
  __syncwarp();
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r;
      *reinterpret_cast<std::uint32_t*>(sQ + swz<HD>(row, dt) + tig * 2) =
          pack2<T>(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = warp * 16 + idx / kChunks;
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

template <class T, int HD>
bool launch_typed(const AttentionArgs& a, cudaStream_t stream) {
  using Sh = PrefillShape<HD>;
  const auto kernel = attention_prefill_kernel<T, HD>;
  if (!prepare_kernel<attention_prefill_kernel<T, HD>>(Sh::kSmemBytes)) return false;
  const dim3 grid(static_cast<unsigned>((a.q_len + Sh::kBr - 1) / Sh::kBr), static_cast<unsigned>(a.num_heads),
                  static_cast<unsigned>(a.batch));
  kernel<<<grid, Sh::kThreads, Sh::kSmemBytes, stream>>>(a);
  check_launch("flash_attention");
  return true;
}

}  // namespace

bool launch_attention_prefill_tc(const AttentionArgs& a, cudaStream_t stream) {
  if (a.state != nullptr || a.kv_lens != nullptr || a.q_len < 2) return false;
  if (a.dtype != DType::F16 && a.dtype != DType::BF16) return false;
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) return false;
  if (a.batch < 1 || a.batch > 65535 || a.num_heads < 1 || a.num_heads > 65535) return false;
  if (a.num_kv_heads < 1 || a.num_heads % a.num_kv_heads != 0) return false;
  if (a.kv_len < 0 || a.kv_stride < a.kv_len || a.pos_offset < 0 || !(a.scale > 0.0f)) return false;
  if (!all_aligned16(a.q, a.k, a.v, static_cast<const void*>(a.out))) return false;
  bool launched = false;
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<64, 128, 256>(a.head_dim, "flash_attention", "head_dim", [&](auto hd_c) {
      constexpr int HD = decltype(hd_c)::value;
      launched = launch_typed<T, HD>(a, stream);
    });
  });
  return launched;
}

}  // namespace ferrum::kernels
