// Skinny dense GEMM for decode: out[m, n] = a[m, k] · b[n, k]ᵀ with m <= 16.
//
// At these sizes the op is a stream of the weight b through the SMs (a is a
// few KB to a few hundred KB and stays in L1/L2), so both kernels below are
// built to keep HBM busy, and share one plan:
// - A block owns a few consecutive rows of b and the whole of k. Its W warps
//   split k into fixed chunks; chunk c belongs to warp c % W, so the block
//   reads its rows front to back in W-chunk strides.
// - Each thread issues 16 loads of 16 bytes of b before it uses any of them
//   (8 KB in flight per warp; 8 loads, 4 KB, at m > 8). They skip L1 (read once) and are evict-first
//   in L2, so a decode step's weights do not push the activations and KV
//   cache out.
// - a is read with 16-byte L1-cached loads; every block reads all of a once,
//   so it is served from L1/L2.
// - The warp partials are summed in warp order from shared memory and each
//   output is rounded once. The summation order depends only on (m, n, k,
//   num_sms): repeated calls are bitwise identical.
// - Tails: rows past n and vectors past k load a clamped, valid address;
//   past-n rows are not stored and past-k vectors are zeroed, so no branch
//   surrounds the loads.
//
// Two kernels, picked by m:
// - m <= kSimtMaxM (1, 2): gemm_skinny_simt_kernel. Every lane does fp32
//   FMAs: 8 m per weight element plus the conversions, cheap for m <= 2
//   (measured ~84 % of copy bandwidth on an H200, ahead of cuBLAS).
// - m > kSimtMaxM (3..16): gemm_skinny_mma_kernel. At m = 8 the SIMT FMAs
//   alone need about half the GPU's FP32 issue rate at HBM speed, and with
//   the conversions and the a loads the SIMT kernel measured only 2.4-2.8
//   TB/s. Here mma.sync m16n8k16 (fp32 accumulators) takes 16 rows of b as
//   its A operand and 8 rows of a (padded; two groups of 8 at m > 8) as its B operand, so the
//   lanes only issue loads and one mma per 512 bytes of b; see the kernel.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common/activation.cuh"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/gemm_skinny.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kVecElems = 8;  // elements of one 16-byte load (f16 and bf16 are 2 bytes)
constexpr int kMaxWarps = 8;  // warps per block when the grid is small
constexpr int kMinWarps = 4;  // warps per block when there are >= 2 blocks per SM
constexpr int kSimtMaxM = 2;  // m above this takes the tensor-core kernel

// Warps per block: at >= 2 blocks per SM, 4 warps per block keep ~8-16 warps
// on every SM; a smaller grid (small n) spreads k over 8. Never more warps
// than chunks of k.
int warps_per_block(long long blocks, long long chunks, int num_sms) {
  const long long wanted = blocks >= 2LL * std::max(1, num_sms) ? kMinWarps : kMaxWarps;
  return static_cast<int>(std::max(1LL, std::min(wanted, chunks)));
}

constexpr int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// 16 bytes of the weight: read-only path, no L1 allocation, L2 evict-first.
// No .L2::256B prefetch hint: on the H200 it cost the llama3-8b f16 decode
// step 3 % and qwen3-0.6b's 1.6 % (session 75; level on the H100, session
// 55), as it cost the decode attention (session 14). Not volatile: the
// compiler may hoist and batch these loads (every address passed is valid,
// see "Tails" at the top).
// kPinned: volatile, so the load stays where it is written relative to other
// volatile asm, i.e. before pdl_begin()'s griddepcontrol.wait (a plain one
// was sunk past the wait: it reads no memory the wait's clobber covers).
template <bool kPinned = false>
__device__ __forceinline__ uint4 load_weight(const uint4* p, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 r;
  // One instruction and operand list for both forms; only `volatile` differs.
#define FERRUM_LOAD_WEIGHT_ASM                                                              \
  ("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" \
   : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)                                             \
   : "l"(p), "l"(policy))
  if constexpr (kPinned) {
    asm volatile FERRUM_LOAD_WEIGHT_ASM;
  } else {
    asm FERRUM_LOAD_WEIGHT_ASM;
  }
#undef FERRUM_LOAD_WEIGHT_ASM
  return r;
#else
  (void)policy;
  return __ldcs(p);
#endif
}

// The gemm_prefetch_before_wait switch (kernels/common/launch.cuh), called
// before pdl_begin(): asks L2 for the bytes [0, first_bytes) of the block's
// rows [row0, row0 + rows) of b, which is what its warps load in their first
// round. When the kernel before it triggered early, this runs while that
// kernel still does, and the first round hits L2 instead of paying the DRAM
// ramp. Callers skip the call (not inlined) when the switch is off.
// Not inlined: inlined, it raised the kernels' registers from 80 / 104 / 124
// to 102 / 128 / 126 (ptxas -v, sm_90, CUDA 13.0), i.e. fewer resident
// blocks for the whole weight stream, switch on or off. The b920e6f version
// was inlined; its 7 % engine loss in both PDL modes fits that.
template <class T>
__device__ __noinline__ void prefetch_first_round(const T* b, int row0, int rows, int n, int k, int first_bytes) {
  const int r = static_cast<int>(threadIdx.x);
  if (r < rows && row0 + r < n) {  // callers skip the call when first_bytes is 0
    // 64-bit: k * sizeof(T) passes INT_MAX from k = 2^30 (the kernel takes k < 2^31).
    const long long row_bytes = static_cast<long long>(k) * static_cast<long long>(sizeof(T));
    prefetch_l2_bulk(b + static_cast<long long>(row0 + r) * k,
                     static_cast<std::uint32_t>(min(row_bytes, static_cast<long long>(first_bytes))));
  }
}

__device__ __forceinline__ uint4 zero_unless(bool keep, uint4 v) {
  return keep ? v : make_uint4(0u, 0u, 0u, 0u);  // all-zero bits: +0.0 in f16 and bf16
}

// ── SIMT kernel (m <= kSimtMaxM) ─────────────────────────────────────────────

constexpr int kChunkVecs = 32;  // 16-byte vectors of one row per warp-wide load (256 elements)

// Block shape per M. kRows * kUnroll 16-byte loads of b are in flight per
// thread; kRows is the reuse of each a vector. Registers (sm_90, CUDA 13.0,
// -Xptxas -v, no spills): M=1: 80, M=2: 106.
template <int M>
struct SimtConfig {
  static constexpr int kRows = 8;
  static constexpr int kUnroll = 2;
};

// The two elements of a 32-bit word (the lower address in the low half) as fp32.
template <class T>
__device__ __forceinline__ float2 unpack2(std::uint32_t w);
template <>
__device__ __forceinline__ float2 unpack2<__half>(std::uint32_t w) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(std::uint32_t w) {
  return make_float2(bf16_in_word_as_float(w, false), bf16_in_word_as_float(w, true));
}

template <class T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[kVecElems]) {
  const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = unpack2<T>(words[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// Transposing warp reduction of N values per lane (N a power of two <= 32).
// Step with offset O: a lane keeps one half of its values (the upper half
// when lane & O), sends the other half to lane ^ O and adds what it gets, so
// the values halve while the lanes covering them double. When one value is
// left, the remaining offsets are a plain butterfly. N - 1 + (5 - log2 N)
// shuffles instead of 5 N. `index` accumulates which of the N values the
// lane ends up holding. Fixed tree: deterministic.
template <int H, int O, int N>
__device__ __forceinline__ void halve_values(float (&v)[N], int lane, int& index) {
  if constexpr (H >= 1) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float send = upper ? v[i] : v[i + H];
      const float keep = upper ? v[i + H] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    if (upper) index += H;
    halve_values<H / 2, O / 2>(v, lane, index);
  } else {
#pragma unroll
    for (int o = O; o > 0; o /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  }
}

// Warp w handles chunks w, w + W, ... of 256 elements (one 16-byte load per
// lane per row); every lane accumulates R x M fp32 sums, reduced over the
// warp with a fixed shuffle tree.
//
// kSiluPairs (gemm_silu_mul): rows 2j, 2j + 1 of b are gate_j and up_j, and
// the block writes out[m, j] = silu(gate) * up of its rounded pairs instead
// of the two outputs ([M, n / 2]; n even, R even, so pairs never straddle
// blocks). The sums are the plain kernel's, in the same order: the bits are
// those of gemm + silu_mul_pairs.
template <class T, int M, int R, int U, bool kSiluPairs, bool kWeightsBeforeWait>
__global__ void __launch_bounds__(kMaxWarps * 32) gemm_skinny_simt_kernel(const T* __restrict__ a,  // [M, k]
                                                                          const T* __restrict__ b,  // [n, k]
                                                                          T* __restrict__ out,  // [M, n] ([M, n/2] pairs)
                                                                          int n, int k, int prefetch_bytes) {
  static_assert(!kSiluPairs || R % 2 == 0, "a block must own whole (gate, up) pairs");
  if (prefetch_bytes > 0) prefetch_first_round(b, static_cast<int>(blockIdx.x) * R, R, n, k, prefetch_bytes);
  constexpr int kSums = R * M;                 // per lane: [R][M], flattened r * M + m
  constexpr int kSumsPow2 = next_pow2(kSums);  // padded with zeros for the reduction
  static_assert(kSumsPow2 <= 32, "one reduced value per lane at most");
  constexpr int kSpreadLanes = 32 / kSumsPow2;  // lanes left holding the same reduced value

  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * R;
  const int kvecs = k / kVecElems;
  const int chunks = (kvecs + kChunkVecs - 1) / kChunkVecs;
  const std::uint64_t policy = evict_first_policy();

  const uint4* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = min(row0 + r, n - 1);  // rows past n re-read the last row; never stored
    brow[r] = reinterpret_cast<const uint4*>(b + static_cast<long long>(row) * k);
  }
  const uint4* a4 = reinterpret_cast<const uint4*>(a);

  float acc[kSumsPow2];
#pragma unroll
  for (int i = 0; i < kSumsPow2; ++i) acc[i] = 0.0f;

  // One round: the U chunks c0, c0 + W, ... of every row this block owns.
  uint4 braw[U][R];
  int vi[U];
  bool ok[U];
  auto load_round = [&](int c0, auto pinned) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (c0 + u * warps) * kChunkVecs + lane;
      ok[u] = v < kvecs;
      vi[u] = ok[u] ? v : kvecs - 1;
#pragma unroll
      for (int r = 0; r < R; ++r) braw[u][r] = load_weight<decltype(pinned)::value>(brow[r] + vi[u], policy);
    }
  };
  auto consume_round = [&] {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float bf[R][kVecElems];
#pragma unroll
      for (int r = 0; r < R; ++r) unpack8<T>(zero_unless(ok[u], braw[u][r]), bf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float af[kVecElems];
        unpack8<T>(zero_unless(ok[u], __ldg(a4 + static_cast<long long>(m) * kvecs + vi[u])), af);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int j = 0; j < kVecElems; ++j) acc[r * M + m] = fmaf(af[j], bf[r][j], acc[r * M + m]);
        }
      }
    }
  };
  // kWeightsBeforeWait (CudaBackendConfig::gemm_weights_before_wait): the
  // first round of b is loaded before the wait on the previous kernel, so
  // its DRAM latency overlaps that kernel's tail. The caller promises that
  // no kernel in flight writes b (model weights); a is read, and out written,
  // only after the wait.
  int c0 = warp;
  if constexpr (kWeightsBeforeWait) {
    load_round(c0, std::true_type{});
    pdl_begin();
    consume_round();
    c0 += warps * U;
  } else {
    pdl_begin();
  }
  for (; c0 < chunks; c0 += warps * U) {
    load_round(c0, std::false_type{});
    consume_round();
  }

  // Warp: one reduced value per group of kSpreadLanes lanes.
  int index = 0;
  halve_values<kSumsPow2 / 2, 16>(acc, lane, index);
  __shared__ float partial[kMaxWarps][kSumsPow2];
  if (lane % kSpreadLanes == 0) partial[warp][index] = acc[0];
  __syncthreads();

  // Block: the warp partials in warp order, one rounding.
  auto block_sum = [&](int t) {
    float s = partial[0][t];
    for (int w = 1; w < warps; ++w) s += partial[w][t];
    return s;
  };
  if constexpr (!kSiluPairs) {
    if (static_cast<int>(threadIdx.x) < kSums) {
      const int t = threadIdx.x;
      const int r = t / M;
      const int m = t % M;
      const int row = row0 + r;
      if (row < n) out[static_cast<long long>(m) * n + row] = from_float<T>(block_sum(t));
    }
  } else {
    // Round every sum first, then pair them after a barrier. Computing both
    // block sums of a pair in one thread kept two reduction loops live and
    // took the kernel from 80 to 104 registers (ptxas -v, sm_90, m = 1),
    // i.e. 4 resident blocks per SM instead of 6 on the whole weight stream.
    __shared__ float rounded[kSums];
    if (static_cast<int>(threadIdx.x) < kSums) {
      rounded[threadIdx.x] = to_float(from_float<T>(block_sum(static_cast<int>(threadIdx.x))));
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < kSums / 2) {
      const int t = threadIdx.x;
      const int pair = t / M;
      const int m = t % M;
      const int row = row0 + 2 * pair;  // gate; row + 1 is up
      if (row + 1 < n) {
        const float gate = rounded[2 * pair * M + m];
        const float up = rounded[(2 * pair + 1) * M + m];
        out[static_cast<long long>(m) * (n / 2) + row / 2] = from_float<T>(silu_mul(gate, up));
      }
    }
  }
}

// a: [M, k]; b: [n, k]; out: [M, n], or with kSiluPairs [M, n / 2] (b's
// rows 2j, 2j + 1 are gate_j and up_j).
template <class T, int M, bool kSiluPairs = false>
void launch_simt(const char* op, const void* a, const void* b, void* out, long long n, long long k, int num_sms,
                 cudaStream_t stream) {
  using C = SimtConfig<M>;
  const long long blocks = (n + C::kRows - 1) / C::kRows;
  const long long chunks = (k / kVecElems + kChunkVecs - 1) / kChunkVecs;
  const int warps = warps_per_block(blocks, chunks, num_sms);
  // First round of a block: every warp's U chunks of kChunkVecs vectors.
  const LaunchSwitches switches = launch_switches();
  const int prefetch_bytes = switches.gemm_prefetch_before_wait ? warps * C::kUnroll * kChunkVecs * 16 : 0;
  auto* kernel = switches.gemm_weights_before_wait
                     ? gemm_skinny_simt_kernel<T, M, C::kRows, C::kUnroll, kSiluPairs, true>
                     : gemm_skinny_simt_kernel<T, M, C::kRows, C::kUnroll, kSiluPairs, false>;
  launch_pdl(op, kernel, dim3(static_cast<unsigned>(blocks)), warps * 32, 0, stream, static_cast<const T*>(a),
             static_cast<const T*>(b), static_cast<T*>(out), static_cast<int>(n), static_cast<int>(k), prefetch_bytes);
  check_launch(op);
}

// launch_simt with the dtype and m (1 or 2) made compile-time constants;
// `op` names the public op in errors. a: [m, k]; b: [n, k]; out: as
// launch_simt's.
template <bool kSiluPairs>
void launch_simt_for(const char* op, DType dtype, const void* a, const void* b, void* out, long long m, long long n,
                     long long k, int num_sms, cudaStream_t stream) {
  static_assert(kSimtMaxM == 2, "the SIMT kernel is instantiated for m = 1, 2");
  dispatch_half_dtype(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<1, 2>(static_cast<int>(m), op, "m (rows of a)", [&](auto m_c) {
      launch_simt<T, decltype(m_c)::value, kSiluPairs>(op, a, b, out, n, k, num_sms, stream);
    });
  });
}

// ── Tensor-core kernel (kSimtMaxM < m <= kSkinnyMaxM) ────────────────────────
//
// mma.sync.m16n8k16.row.col, fp32 accumulate: D[16 x 8] += A[16 x 16] ·
// B[16 x 8]. A = 16 rows of b (one "row tile"), B[kk][j] = a[8 q + j][kk]
// for group q of 8 rows of a (kGroups groups: m <= 8 kGroups); D[r][j] is
// then out[8 q + j][row0 + r]. Lane = 4 g + t (g = groupID 0..7, t = 0..3).
// Per the PTX fragment layouts, lane (g, t) supplies A rows g and g + 8, B
// column g, and receives D rows g, g + 8 x columns 2t, 2t + 1.
//
// A dot product does not care in which order its k terms are visited, as
// long as A and B visit them in the same order, so the mma's 16 logical k
// columns are mapped onto memory to suit 16-byte loads: lane (g, t) loads
// the 8 elements [8 t, 8 t + 8) of a 32-element k step from rows g and g + 8
// of the tile (two loads of b) and from row 8 q + g of a (one load per
// group). Word w of a load holds elements 2w, 2w + 1. Two mmas per group
// consume the step: mma s (0, 1) takes words 2s (as logical columns 2t,
// 2t + 1) and 2s + 1 (as logical columns 2t + 8, 2t + 9), for A and B alike:
//   A regs {row g word 2s, row g+8 word 2s, row g word 2s+1, row g+8 word 2s+1}
//   B regs {a row 8q+g word 2s, a row 8q+g word 2s+1}
// Every element of the 32-element step is used exactly once. The 4 lanes of
// a group read 64 contiguous bytes of a row per load (two full sectors).
//
// Lanes whose row 8 q + g >= m read row m - 1 of a (a valid address): D
// columns never mix, so those columns hold finite garbage that is never
// stored.
//
// A warp iteration is 16 / kGroups loads of b per lane: kTiles row tiles x
// 2 rows x kSteps 32-element k steps. kTiles = 2 halves the a traffic per
// byte of b (a is 8 kGroups / (16 kTiles) of b, read from L1/L2) but needs
// n >= 32 per block. The second group's a fragments and accumulators take
// the registers of half the b loads (under the 2-blocks-per-SM bound of 128
// registers), so m > 8 keeps half as many bytes in flight per warp.
constexpr int kMmaLoads = 16;  // 16-byte loads of b per lane per warp iteration (one group)

__device__ __forceinline__ std::uint32_t word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
}

template <int kTiles, int kGroups>
struct MmaShape {
  static constexpr int kLoads = kMmaLoads / kGroups;     // 16-byte loads of b per lane per warp iteration
  static constexpr int kSteps = kLoads / (2 * kTiles);   // 32-element k steps per warp iteration
  static constexpr int kIterVecs = 4 * kSteps;           // 16-byte vectors of a row per warp iteration
  static constexpr int kIterElems = kVecElems * kIterVecs;
  static constexpr int kRows = 16 * kTiles;              // rows of b per block
  // Independent accumulator sets per (tile, group): one per mma of a k step
  // with one group (halves the chain of dependent mmas); with two groups the
  // groups already give two chains.
  static constexpr int kAccSets = kGroups == 1 ? 2 : 1;
  static_assert(kSteps >= 1, "at least one k step per iteration");
};

template <class T, int kTiles, int kGroups>
__global__ void __launch_bounds__(kMaxWarps * 32, 2) gemm_skinny_mma_kernel(const T* __restrict__ a,  // [m, k]
                                                                            const T* __restrict__ b,  // [n, k]
                                                                            T* __restrict__ out,      // [m, n]
                                                                            int m, int n, int k, int prefetch_bytes) {
  using S = MmaShape<kTiles, kGroups>;
  constexpr int kSteps = S::kSteps;
  constexpr int kIterVecs = S::kIterVecs;
  constexpr int kRows = S::kRows;
  constexpr int kAccSets = S::kAccSets;
  if (prefetch_bytes > 0) prefetch_first_round(b, static_cast<int>(blockIdx.x) * kRows, kRows, n, k, prefetch_bytes);
  pdl_begin();

  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int row0 = blockIdx.x * kRows;
  const int kvecs = k / kVecElems;
  const int iters = (kvecs + kIterVecs - 1) / kIterVecs;
  const std::uint64_t policy = evict_first_policy();

  const uint4* brow[kTiles][2];  // rows row0 + 16 tile + g + 8 h
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + 16 * tile + 8 * h + g, n - 1);  // rows past n re-read the last row; never stored
      brow[tile][h] = reinterpret_cast<const uint4*>(b + static_cast<long long>(row) * k);
    }
  }
  const uint4* arow[kGroups];  // rows 8 q + g of a
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    arow[q] = reinterpret_cast<const uint4*>(a + static_cast<long long>(min(8 * q + g, m - 1)) * k);
  }

  float4 acc[kAccSets][kTiles][kGroups];
#pragma unroll
  for (int set = 0; set < kAccSets; ++set) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
      for (int q = 0; q < kGroups; ++q) acc[set][tile][q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  for (int it = warp; it < iters; it += warps) {
    const int v0 = it * kIterVecs + t;
    const bool full = (it + 1) * kIterVecs <= kvecs;  // warp-uniform; false only in the last chunk of a row
    uint4 braw[kSteps][kTiles][2];
    uint4 araw[kSteps][kGroups];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int v = full ? v0 + 4 * s : min(v0 + 4 * s, kvecs - 1);
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
        for (int h = 0; h < 2; ++h) braw[s][tile][h] = load_weight(brow[tile][h] + v, policy);
      }
#pragma unroll
      for (int q = 0; q < kGroups; ++q) araw[s][q] = __ldg(arow[q] + v);
    }
    if (!full) {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const bool ok = v0 + 4 * s < kvecs;
#pragma unroll
        for (int q = 0; q < kGroups; ++q) araw[s][q] = zero_unless(ok, araw[s][q]);
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
          for (int h = 0; h < 2; ++h) braw[s][tile][h] = zero_unless(ok, braw[s][tile][h]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile) {
          const uint4& lo = braw[s][tile][0];  // row g
          const uint4& hi = braw[s][tile][1];  // row g + 8
          const std::uint32_t a_frag[4] = {word(lo, 2 * half), word(hi, 2 * half), word(lo, 2 * half + 1),
                                           word(hi, 2 * half + 1)};
#pragma unroll
          for (int q = 0; q < kGroups; ++q) {
            const std::uint32_t b0 = word(araw[s][q], 2 * half);
            const std::uint32_t b1 = word(araw[s][q], 2 * half + 1);
            mma_16816_at<T>(&acc[kAccSets == 2 ? half : 0][tile][q].x, a_frag, b0, b1);
          }
        }
      }
    }
  }

  // Warp partials: D fragments as they are, [warp][tile][group][lane] x 4.
  __shared__ float4 partial[kMaxWarps][kTiles][kGroups][32];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      float4 x = acc[0][tile][q];
      if constexpr (kAccSets == 2) {
        const float4 y = acc[1][tile][q];
        x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      }
      partial[warp][tile][q][lane] = x;
    }
  }
  __syncthreads();

  // Block: output (j, r) with r fastest (coalesced stores), the warp
  // partials in warp order, one rounding. D[r][jj] of a tile and group sits
  // in lane 4 (r % 8) + jj / 2, component 2 (r / 8) + jj % 2 (jj = j % 8).
  const float* flat = reinterpret_cast<const float*>(&partial[0][0][0][0]);
  constexpr int kWarpStride = kTiles * kGroups * 32 * 4;
  for (int idx = threadIdx.x; idx < m * kRows; idx += blockDim.x) {
    const int j = idx / kRows;
    const int r = idx % kRows;
    const int row = row0 + r;
    if (row >= n) continue;
    const int tile = r / 16;
    const int rt = r % 16;
    const int q = kGroups == 1 ? 0 : j / 8;  // j < 8 with one group
    const int jj = kGroups == 1 ? j : j % 8;
    const int src = ((tile * kGroups + q) * 32 + 4 * (rt % 8) + jj / 2) * 4 + 2 * (rt / 8) + jj % 2;
    float s = flat[src];
    for (int w = 1; w < warps; ++w) s += flat[w * kWarpStride + src];
    out[static_cast<long long>(j) * n + row] = from_float<T>(s);
  }
}

// a: [m, k]; b: [n, k]; out: [m, n] (so in launch_mma_groups and launch_mma).
template <class T, int kTiles, int kGroups>
void launch_mma_tiles(const void* a, const void* b, void* out, long long m, long long n, long long k, int num_sms,
                      cudaStream_t stream) {
  using S = MmaShape<kTiles, kGroups>;
  const long long blocks = (n + S::kRows - 1) / S::kRows;
  const long long chunks = (k + S::kIterElems - 1) / S::kIterElems;
  const int warps = warps_per_block(blocks, chunks, num_sms);
  // First round of a block: one iteration (kIterElems elements) per warp.
  const int prefetch_bytes =
      launch_switches().gemm_prefetch_before_wait ? warps * S::kIterElems * static_cast<int>(sizeof(T)) : 0;
  launch_pdl("gemm_skinny", gemm_skinny_mma_kernel<T, kTiles, kGroups>, dim3(static_cast<unsigned>(blocks)),
             warps * 32, 0, stream, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out),
             static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), prefetch_bytes);
  check_launch("gemm_skinny");
}

template <class T, int kGroups>
void launch_mma_groups(const void* a, const void* b, void* out, long long m, long long n, long long k, int num_sms,
                       cudaStream_t stream) {
  // Two row tiles (32 rows) per block when that still gives every SM a
  // block; otherwise one (16 rows), so that e.g. n = 4096 runs 256 blocks on
  // 132 SMs rather than 128.
  if ((n + 31) / 32 >= std::max(1, num_sms)) {
    launch_mma_tiles<T, 2, kGroups>(a, b, out, m, n, k, num_sms, stream);
  } else {
    launch_mma_tiles<T, 1, kGroups>(a, b, out, m, n, k, num_sms, stream);
  }
}

template <class T>
void launch_mma(const void* a, const void* b, void* out, long long m, long long n, long long k, int num_sms,
                cudaStream_t stream) {
  static_assert(kSkinnyMaxM == 16, "the tensor-core kernel takes one or two groups of 8 rows of a");
  if (m <= 8) {
    launch_mma_groups<T, 1>(a, b, out, m, n, k, num_sms, stream);
  } else {
    launch_mma_groups<T, 2>(a, b, out, m, n, k, num_sms, stream);
  }
}

}  // namespace

bool gemm_skinny_applicable(DType dtype, const void* a, const void* b, long long m, long long n, long long k) {
  if (dtype != DType::F16 && dtype != DType::BF16) return false;
  if (m < 1 || m > kSkinnyMaxM || n < 1 || k < 1) return false;
  if (n > 0x7fffffffLL || k > 0x7fffffffLL) return false;  // int indexing in the kernel
  if (k % kVecElems != 0) return false;
  return aligned16(a) && aligned16(b);
}

bool launch_gemm_skinny(DType dtype, const void* a, const void* b, void* out, long long m, long long n, long long k,
                        int num_sms, cudaStream_t stream) {
  if (!gemm_skinny_applicable(dtype, a, b, m, n, k)) return false;
  if (m <= kSimtMaxM) {
    launch_simt_for<false>("gemm_skinny", dtype, a, b, out, m, n, k, num_sms, stream);
    return true;
  }
  dispatch_half_dtype(dtype, "gemm_skinny", [&](auto tag) {
    launch_mma<typename decltype(tag)::type>(a, b, out, m, n, k, num_sms, stream);
  });
  return true;
}

bool launch_gemm_skinny_silu_mul(DType dtype, const void* a, const void* b, void* act, long long m, long long im,
                                 long long k, int num_sms, cudaStream_t stream) {
  if (m > kSimtMaxM || !gemm_skinny_applicable(dtype, a, b, m, 2 * im, k)) return false;
  launch_simt_for<true>("gemm_silu_mul", dtype, a, b, act, m, 2 * im, k, num_sms, stream);
  return true;
}

}  // namespace ferrum::kernels
