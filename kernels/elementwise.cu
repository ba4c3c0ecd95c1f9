// Elementwise ops. One flat map kernel serves gelu, add_inplace and add_bias
// (the op is a functor, the second operand either flat or broadcast along
// rows); silu·mul has its own indexing. 16-byte vectors when every pointer
// allows it, with scalar code for the unaligned case and the tail.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common/activation.cuh"
#include "kernels/common/check.hpp"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/elementwise.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 2;  // vectors per thread, loaded before any is used

struct GeluErf {
  __device__ float operator()(float x, float) const { return gelu_erf(x); }  // activation.cuh: not erff, for speed
};
struct GeluTanh {
  __device__ float operator()(float x, float) const {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out[e] = op(a[e], b[b_index(e)]), b_index(e) = period ? e % period : e.
// The 64-bit remainder stays: through IndexDivider (fast_divmod.cuh) add_bias
// [32768 x 4096] took 2.4 % longer in f16, 0.8 % in bf16 (H200, session 41).
// b may be null for unary ops. out may alias a. F16_FROM_WORD: f16 converted
// from the packed word (vec_t::f_from_word), which the launcher picks for
// small grids only (kSmallGridBlocks); false: vec_t::f (for bf16 also from
// the word).
template <class T, int VW, class Op, bool F16_FROM_WORD>
__global__ void flat_map_kernel(const T* a,             // [n]
                                const T* __restrict__ b,  // [n], [period] (broadcast) or null
                                T* out,                   // [n], may be a
                                long long n, long long period, Op op) {
  pdl_begin();
  using V = vec_t<T, VW>;
  const long long nvec = n / VW;
  const long long first = (static_cast<long long>(blockIdx.x) * blockDim.x * kItems) + threadIdx.x;
  V va[kItems], vb[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const long long vi = first + static_cast<long long>(it) * blockDim.x;
    if (vi < nvec) {
      const long long e = vi * VW;
      va[it].load(a + e);
      if (b != nullptr) vb[it].load(b + (period ? e % period : e));
    }
  }
  const auto as_f32 = [](const V& x, int j) {
    if constexpr (F16_FROM_WORD) {
      return x.f_from_word(j);
    } else {
      return x.f(j);
    }
  };
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const long long vi = first + static_cast<long long>(it) * blockDim.x;
    if (vi < nvec) {
      V o;
#pragma unroll
      for (int j = 0; j < VW; ++j) o.set(j, op(as_f32(va[it], j), b != nullptr ? as_f32(vb[it], j) : 0.0f));
      o.store(out + vi * VW);
    }
  }
  // Tail elements past the last whole vector (VW > 1 only).
  if constexpr (VW > 1) {
    const long long tail = n - nvec * VW;
    const long long gid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (gid < tail) {
      const long long e = nvec * VW + gid;
      const float bv = b != nullptr ? to_float(b[period ? e % period : e]) : 0.0f;
      out[e] = from_float<T>(op(to_float(a[e]), bv));
    }
  }
}

// f16 grids up to this many blocks convert from the packed word: under graph
// replay at [1..16 x 4096] (1-16 blocks) add_inplace took 1.32-1.56 us that
// way against 1.76-2.00 and gelu 2 % less, while at [32768 x 4096] (32768
// blocks) it cost add_inplace, add_bias and gelu 0.7-1.1 % (H200, session
// 40). Sizes in between were not measured; the cut is the H200's SM count
// (speed only: either instance is correct at any size).
constexpr long long kSmallGridBlocks = 132;

// a: [n]; b: [n], [period] (broadcast, period > 0) or null; out: [n].
template <class T, class Op>
void launch_flat_map(const char* name, const T* a, const T* b, T* out, long long n, long long period, Op op,
                     cudaStream_t stream) {
  constexpr int kWide = kVec16<T>;
  const bool wide = aligned16(a) && aligned16(out) && (b == nullptr || aligned16(b)) && (period % kWide == 0);
  const int vw = wide ? kWide : 1;
  const long long nvec = n / vw;
  long long blocks = (nvec + kThreads * kItems - 1) / (kThreads * kItems);
  if (blocks == 0) blocks = 1;  // the tail alone
  const dim3 grid(static_cast<unsigned>(blocks));
  if constexpr (std::is_same_v<T, __half>) {  // bf16's f already converts from the word
    if (wide && blocks <= kSmallGridBlocks) {
      launch_pdl(name, flat_map_kernel<T, kWide, Op, true>, grid, kThreads, 0, stream, a, b, out, n, period, op);
      return;
    }
  }
  if (wide) {
    launch_pdl(name, flat_map_kernel<T, kWide, Op, false>, grid, kThreads, 0, stream, a, b, out, n, period, op);
  } else {
    launch_pdl(name, flat_map_kernel<T, 1, Op, false>, grid, kThreads, 0, stream, a, b, out, n, period, op);
  }
}

// Where the gate and up of output e = t * im + j live: Split, row t of
// [tokens, 2 im] is [gate | up] (fused_silu_mul_split); Pairs, gate and up
// interleaved, [tokens * im, 2] (the unfused path of gemm_silu_mul and
// gemm_silu_mul_gptq).
enum class GateUp { Split, Pairs };

// The gate and up of VW consecutive outputs starting at vector vi, held as
// loaded (converted to fp32 only at use: converting at load took the f16
// split kernel from 34 to 48 registers and from 165 to 186 us at
// [8192 x 14336]).
template <class T, int VW, GateUp L>
struct GateUpVec;
template <class T, int VW>
struct GateUpVec<T, VW, GateUp::Split> {
  vec_t<T, VW> g, u;
  // The 64-bit division stays: through IndexDivider the f16 kernel took 3 %
  // longer at [8192 x 14336] and 18 % at [1..16 x 14336] (H200, session 41).
  __device__ __forceinline__ void load(const T* gate_up, long long vi, long long vec_per_row, long long im) {
    const long long t = vi / vec_per_row;
    const T* gate = gate_up + t * 2 * im + (vi - t * vec_per_row) * VW;
    g.load(gate);
    u.load(gate + im);
  }
  __device__ __forceinline__ float gate(int j) const { return g.f(j); }
  __device__ __forceinline__ float up(int j) const { return u.f(j); }
};
template <class T, int VW>
struct GateUpVec<T, VW, GateUp::Pairs> {
  vec_t<T, 2 * VW> gu;  // VW = 1: two 2-byte loads (any alignment)
  __device__ __forceinline__ void load(const T* gate_up, long long vi, long long, long long) {
    if constexpr (VW == 1) {
      gu.v[0] = gate_up[2 * vi];
      gu.v[1] = gate_up[2 * vi + 1];
    } else {
      gu.load(gate_up + vi * 2 * VW);
    }
  }
  __device__ __forceinline__ float gate(int j) const { return gu.f(2 * j); }
  __device__ __forceinline__ float up(int j) const { return gu.f(2 * j + 1); }
};

// out[t, j] = silu(gate) * up. VW outputs per access (im % VW == 0).
template <class T, int VW, GateUp L>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up,  // Split: [tokens, 2*im]; Pairs: [tokens*im, 2]
                                T* __restrict__ out,             // [tokens, im]
                                long long tokens, long long im, PdlTrigger trigger) {
  pdl_begin_with_trigger(trigger);  // the A/B switches of launch.cuh
  const long long vec_per_row = im / VW;
  const long long total = tokens * vec_per_row;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x * kItems + threadIdx.x;
  GateUpVec<T, VW, L> in[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const long long vi = first + static_cast<long long>(it) * blockDim.x;
    if (vi < total) in[it].load(gate_up, vi, vec_per_row, im);
  }
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const long long vi = first + static_cast<long long>(it) * blockDim.x;
    if (vi >= total) continue;
    vec_t<T, VW> o;
#pragma unroll
    for (int j = 0; j < VW; ++j) o.set(j, silu_mul(in[it].gate(j), in[it].up(j)));
    o.store(out + vi * VW);  // = t * im + j: rows of out are contiguous
  }
}

// VW = kWide when `wide` (the caller checked alignment and im % kWide),
// else 1. gate_up: [tokens, 2 im] laid out as L says; out: [tokens, im].
template <class T, GateUp L, int kWide>
void launch_silu_mul(const char* op, bool wide, const void* gate_up, void* out, long long tokens, long long im,
                     cudaStream_t stream) {
  const int vw = wide ? kWide : 1;
  const long long blocks = std::max(1LL, (tokens * (im / vw) + kThreads * kItems - 1) / (kThreads * kItems));
  const dim3 grid(static_cast<unsigned>(blocks));
  const auto* in = static_cast<const T*>(gate_up);
  auto* o = static_cast<T*>(out);
  if (wide) {
    launch_pdl(op, silu_mul_kernel<T, kWide, L>, grid, kThreads, 0, stream, in, o, tokens, im, small_op_trigger());
  } else {
    launch_pdl(op, silu_mul_kernel<T, 1, L>, grid, kThreads, 0, stream, in, o, tokens, im, small_op_trigger());
  }
  check_launch(op);
}

}  // namespace

void launch_gelu(DType dtype, const void* x, void* out, long long n, bool approx_tanh, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (approx_tanh) {
      launch_flat_map("gelu", static_cast<const T*>(x), static_cast<const T*>(nullptr), static_cast<T*>(out), n, 0,
                      GeluTanh{}, stream);
    } else {
      launch_flat_map("gelu", static_cast<const T*>(x), static_cast<const T*>(nullptr), static_cast<T*>(out), n, 0,
                      GeluErf{}, stream);
    }
  });
  check_launch("gelu");
}

void launch_add_inplace(DType dtype, void* residual, const void* x, long long n, cudaStream_t stream) {
  dispatch_half_dtype(dtype, "add_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_flat_map("add_inplace", static_cast<const T*>(residual), static_cast<const T*>(x),
                    static_cast<T*>(residual), n, 0, Add{}, stream);
  });
  check_launch("add_inplace");
}

void launch_add_bias(DType dtype, void* data, const void* bias, long long rows, long long cols,
                     cudaStream_t stream) {
  dispatch_half_dtype(dtype, "add_bias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_flat_map("add_bias", static_cast<const T*>(data), static_cast<const T*>(bias), static_cast<T*>(data),
                    rows * cols, cols, Add{}, stream);
  });
  check_launch("add_bias");
}

void launch_silu_mul_split(DType dtype, const void* gate_up, void* out, long long tokens, long long im,
                           cudaStream_t stream) {
  dispatch_half_dtype(dtype, "fused_silu_mul_split", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = kVec16<T>;
    const bool wide = im % kWide == 0 && aligned16(gate_up) && aligned16(out);
    launch_silu_mul<T, GateUp::Split, kWide>("fused_silu_mul_split", wide, gate_up, out, tokens, im, stream);
  });
}

void launch_silu_mul_pairs(const char* op, DType dtype, const void* gate_up, void* out, long long n,
                           cudaStream_t stream) {
  dispatch_half_dtype(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = kVec16<T> / 2;  // outputs per 16-byte input vector
    const bool wide =
        n % kWide == 0 && aligned16(gate_up) && (reinterpret_cast<std::uintptr_t>(out) % (sizeof(T) * kWide)) == 0;
    launch_silu_mul<T, GateUp::Pairs, kWide>(op, wide, gate_up, out, 1, n, stream);
  });
}

}  // namespace ferrum::kernels
