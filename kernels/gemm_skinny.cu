// Skinny dense GEMM for decode: out[m, n] = a[m, k] · b[n, k]ᵀ with m <= 8.
//
// At these sizes the op is a stream of the weight b through the SMs (a is a
// few KB to a few hundred KB and stays in L1/L2), so the kernel is built to
// keep HBM busy:
// - A block owns kRows consecutive rows of b and the whole of k. Its W warps
//   split k into chunks of 256 elements (one 16-byte load per lane per row);
//   chunk c belongs to warp c % W, so the block reads each row front to back
//   in W * 512-byte strides.
// - Each thread issues kRows * kUnroll 16-byte loads of b before it uses
//   any of them. They skip L1 (read once) and are evict-first in L2, so a
//   decode step's weights do not push the activations and KV cache out.
// - a is read with 16-byte L1-cached loads; every block reads all of a, so
//   it is served from L1/L2. One a vector feeds kRows rows of b.
// - Every lane accumulates kRows x M fp32 sums. The warp reduces them with a
//   fixed shuffle tree, the W warp partials are summed in warp order from
//   shared memory, and each output is rounded once. The order depends only
//   on (m, n, k, num_sms): repeated calls are bitwise identical.
// - Tails: rows past n and vectors past k load a clamped, valid address;
//   past-n rows are not stored and past-k vectors are zeroed, so no branch
//   surrounds the loads.
#include <algorithm>
#include <cstdint>

#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/gemm_skinny.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kVecElems = 8;   // elements of one 16-byte load (f16 and bf16 are 2 bytes)
constexpr int kChunkVecs = 32;  // 16-byte vectors of one row per warp-wide load (256 elements)
constexpr int kMaxWarps = 8;    // warps per block when the grid is small
constexpr int kMinWarps = 4;    // warps per block when there are >= 2 blocks per SM

// Block shape per M. kRows * kUnroll 16-byte loads of b are in flight per
// thread; kRows is the reuse of each a vector (a traffic from L1 is M / kRows
// times the b traffic). Registers (sm_90, CUDA 13.0, -Xptxas -v, no spills):
// M=1: 80, M=2: 106, M=3/4: 80, M=5: 108, M=6/7: 128, M=8: 140, i.e. 3-6
// blocks of 4 warps per SM, 4 KB (M >= 3) or 8 KB (M <= 2) of b in flight
// per warp.
template <int M>
struct SkinnyConfig {
  static constexpr int kRows = M <= 2 ? 8 : 4;
  static constexpr int kUnroll = 2;
};

constexpr int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// L2 policy for the weight stream: evict first.
// (sm_80 and later; older targets fall back to a plain streaming load.)
__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// 16 bytes of the weight: read-only path, no L1 allocation, L2 evict-first,
// 256-byte L2 prefetch (a warp reads 512 contiguous bytes of a row anyway).
// Not volatile: the compiler may hoist and batch these loads (every address
// passed is valid, see "Tails" at the top).
__device__ __forceinline__ uint4 load_weight(const uint4* p, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(policy));
  return r;
#else
  (void)policy;
  return __ldcs(p);
#endif
}

__device__ __forceinline__ uint4 zero_unless(bool keep, uint4 v) {
  return keep ? v : make_uint4(0u, 0u, 0u, 0u);  // all-zero bits: +0.0 in f16 and bf16
}

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
  // bf16 is the upper half of an fp32: exact.
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
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

template <class T, int M, int R, int U>
__global__ void __launch_bounds__(kMaxWarps * 32) gemm_skinny_kernel(const T* __restrict__ a,  // [M, k]
                                                                     const T* __restrict__ b,  // [n, k]
                                                                     T* __restrict__ out,      // [M, n]
                                                                     int n, int k) {
  constexpr int kSums = R * M;                   // per lane: [R][M], flattened r * M + m
  constexpr int kSumsPow2 = next_pow2(kSums);    // padded with zeros for the reduction
  static_assert(kSumsPow2 <= 32, "one reduced value per lane at most");
  constexpr int kSpreadLanes = 32 / kSumsPow2;   // lanes left holding the same reduced value

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

  for (int c0 = warp; c0 < chunks; c0 += warps * U) {
    uint4 braw[U][R];
    int vi[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (c0 + u * warps) * kChunkVecs + lane;
      ok[u] = v < kvecs;
      vi[u] = ok[u] ? v : kvecs - 1;
#pragma unroll
      for (int r = 0; r < R; ++r) braw[u][r] = load_weight(brow[r] + vi[u], policy);
    }
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
  }

  // Warp: one reduced value per group of kSpreadLanes lanes.
  int index = 0;
  halve_values<kSumsPow2 / 2, 16>(acc, lane, index);
  __shared__ float partial[kMaxWarps][kSumsPow2];
  if (lane % kSpreadLanes == 0) partial[warp][index] = acc[0];
  __syncthreads();

  // Block: the warp partials in warp order, one rounding.
  if (static_cast<int>(threadIdx.x) < kSums) {
    const int t = threadIdx.x;
    float s = partial[0][t];
    for (int w = 1; w < warps; ++w) s += partial[w][t];
    const int r = t / M;
    const int m = t % M;
    const int row = row0 + r;
    if (row < n) out[static_cast<long long>(m) * n + row] = from_float<T>(s);
  }
}

template <class T, int M>
void launch_typed(const void* a, const void* b, void* out, long long n, long long k, int num_sms,
                  cudaStream_t stream) {
  using C = SkinnyConfig<M>;
  const long long blocks = (n + C::kRows - 1) / C::kRows;
  const long long chunks = (k / kVecElems + kChunkVecs - 1) / kChunkVecs;
  // Enough warps in flight: at >= 2 blocks per SM, 4 warps per block keep
  // ~8-16 warps on every SM; a smaller grid (small n) spreads k over 8.
  // Never more warps than chunks of k.
  const long long wanted = blocks >= 2LL * std::max(1, num_sms) ? kMinWarps : kMaxWarps;
  const int warps = static_cast<int>(std::max(1LL, std::min(wanted, chunks)));
  gemm_skinny_kernel<T, M, C::kRows, C::kUnroll><<<static_cast<unsigned>(blocks), warps * 32, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), static_cast<int>(n),
      static_cast<int>(k));
  check_launch("gemm_skinny");
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
  dispatch_half_dtype(dtype, "gemm_skinny", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<1, 2, 3, 4, 5, 6, 7, 8>(static_cast<int>(m), "gemm_skinny", "m (rows of a)", [&](auto m_c) {
      launch_typed<T, decltype(m_c)::value>(a, b, out, n, k, num_sms, stream);
    });
  });
  return true;
}

}  // namespace ferrum::kernels
