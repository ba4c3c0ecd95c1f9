// qk_norm_rope: per (token, head) row, an optional RMSNorm over head_dim,
// then NeoX RoPE (element i pairs with i + head_dim/2), reading token-major
// and writing head-major.
//
// Fast path (head_dim/2 = 8·G with G a power of two <= 32, 16-byte aligned
// buffers): a group of G lanes per row, each lane owning 8 contiguous pairs,
// so every access is a 16-byte vector and a warp works on 32/G rows.
// General path: one warp per row; lane l owns pair indices l, l+32, ...
// (PAIRS per lane, head_dim/64 rounded up to 1, 2, 4 or 8).
#include <cstdint>

#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/fast_divmod.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/rope.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

// One row by one warp (general path): x = in[0, head_dim), optionally
// RMS-normalized with norm_w, rotated with the cos / sin rows, to out.
template <class T, int PAIRS, bool NORM>
__device__ __forceinline__ void rope_row_warp(const T* in, const T* norm_w, const float* c_row, const float* s_row,
                                              T* out, int lane, int head_dim, float eps) {
  const int half = head_dim / 2;
  float lo[PAIRS], hi[PAIRS];
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const int i = lane + 32 * p;
    lo[p] = i < half ? to_float(in[i]) : 0.0f;
    hi[p] = i < half ? to_float(in[i + half]) : 0.0f;
  }
  if constexpr (NORM) {
    float sq = 0.0f;
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) sq += lo[p] * lo[p] + hi[p] * hi[p];
    const float inv = rsqrtf(group_sum_in_warp(sq, 32) / static_cast<float>(head_dim) + eps);
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
      const int i = lane + 32 * p;
      if (i < half) {
        lo[p] = (lo[p] * inv) * to_float(norm_w[i]);
        hi[p] = (hi[p] * inv) * to_float(norm_w[i + half]);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      const float c = c_row[i];
      const float s = s_row[i];
      out[i] = from_float<T>(lo[p] * c - hi[p] * s);
      out[i + half] = from_float<T>(hi[p] * c + lo[p] * s);
    }
  }
}

template <class T, int PAIRS, bool NORM>
__global__ void qk_norm_rope_kernel(const T* __restrict__ input,    // [tokens, heads, head_dim]
                                    const T* __restrict__ norm_w,   // [head_dim]
                                    const float* __restrict__ cos,  // [max_pos, head_dim / 2]
                                    const float* __restrict__ sin,  // [max_pos, head_dim / 2]
                                    T* __restrict__ output,         // [heads, tokens, head_dim]
                                    int tokens, int heads, int head_dim, long long pos_offset,
                                    const DecodeState* state,       // [1] (device-state mode; else null)
                                    long long max_pos, float eps,
                                    DeviceErrorLog* error_log) {    // [1]
  pdl_begin();
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<long long>(tokens) * heads) return;  // whole warps exit together
  const int t = static_cast<int>(row / heads);
  const int h = static_cast<int>(row - static_cast<long long>(t) * heads);
  const int half = head_dim / 2;
  const long long pos = (state != nullptr ? state->pos : pos_offset) + t;
  if (pos < 0 || pos >= max_pos) {
    if (lane == 0) report_device_error(error_log, kErrRopePosition, pos, max_pos);
    return;
  }
  rope_row_warp<T, PAIRS, NORM>(input + row * head_dim, norm_w, cos + pos * half, sin + pos * half,
                                output + (static_cast<long long>(h) * tokens + t) * head_dim, lane, head_dim, eps);
}

// One row by a group of `group` lanes (fast path): lane g owns the 8
// elements [8 g, 8 g + 8) of each half. Every lane of the warp must call it
// (the norm's group sum shuffles); lanes with active == false read and write
// nothing.
template <class T, bool NORM>
__device__ __forceinline__ void rope_row_vec(const T* in, const T* norm_w, const float* cos, const float* sin,
                                             long long pos, T* out, int g, int head_dim, int group, float eps,
                                             bool active) {
  using V = vec_t<T, 8>;
  const int half = head_dim / 2;
  V lo, hi, w_lo, w_hi;
  float4 c[2], s[2];
  if (active) {
    lo.load(in + g * 8);
    hi.load(in + half + g * 8);
    if constexpr (NORM) {
      w_lo.load(norm_w + g * 8);
      w_hi.load(norm_w + half + g * 8);
    }
    const float4* c_row = reinterpret_cast<const float4*>(cos + pos * half + g * 8);
    const float4* s_row = reinterpret_cast<const float4*>(sin + pos * half + g * 8);
    c[0] = c_row[0];
    c[1] = c_row[1];
    s[0] = s_row[0];
    s[1] = s_row[1];
  }
  // With the norm, bf16 through the element (f_from_element) measured faster
  // than from the word (vec_t's comment); the weights go the same way so the
  // PTX stays that of the build measured. Without the norm, f.
  const auto as_f32 = [](const V& x, int j) { return NORM ? x.f_from_element(j) : x.f(j); };
  float inv = 1.0f;
  if constexpr (NORM) {
    float sq = 0.0f;
    if (active) {
#pragma unroll
      for (int j = 0; j < 8; ++j) sq += as_f32(lo, j) * as_f32(lo, j) + as_f32(hi, j) * as_f32(hi, j);
    }
    inv = rsqrtf(group_sum_in_warp(sq, group) / static_cast<float>(head_dim) + eps);  // all lanes take part
  }
  if (!active) return;
  const float* cf = reinterpret_cast<const float*>(c);
  const float* sf = reinterpret_cast<const float*>(s);
  V o_lo, o_hi;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float x1 = as_f32(lo, j), x2 = as_f32(hi, j);
    if constexpr (NORM) {
      x1 = (x1 * inv) * as_f32(w_lo, j);
      x2 = (x2 * inv) * as_f32(w_hi, j);
    }
    o_lo.set(j, x1 * cf[j] - x2 * sf[j]);
    o_hi.set(j, x2 * cf[j] + x1 * sf[j]);
  }
  o_lo.store(out + g * 8);
  o_hi.store(out + half + g * 8);
}

// Index math in 32 bits, the division by heads through FastDivmod (the
// launcher has checked tokens x heads <= kFastDivmodMax): with 64-bit
// divisions the f16 instance ran 576 SASS instructions, with these 416, and
// [8192 x 32 x 128] took 44.4 us against 38.2 (H200, session 41).
template <class T, bool NORM>
__global__ void qk_norm_rope_vec_kernel(const T* __restrict__ input,   // [tokens, heads, head_dim]
                                        const T* __restrict__ norm_w,  // [head_dim]
                                        const float* __restrict__ cos,  // [max_pos, head_dim / 2]
                                        const float* __restrict__ sin,  // [max_pos, head_dim / 2]
                                        T* __restrict__ output,         // [heads, tokens, head_dim]
                                        int tokens, FastDivmod heads_div, int head_dim, int group,
                                        long long pos_offset, const DecodeState* state, long long max_pos, float eps,
                                        DeviceErrorLog* error_log) {
  pdl_begin();
  const auto [row, g] = group_row_lane(group);  // the launchers keep rows below 2^31
  const bool row_ok = row < static_cast<std::uint32_t>(tokens) * heads_div.divisor;
  std::uint32_t t = 0, h = 0;
  if (row_ok) heads_div.divmod(row, t, h);
  const long long pos = (state != nullptr ? state->pos : pos_offset) + t;
  const bool pos_ok = pos >= 0 && pos < max_pos;
  if (row_ok && !pos_ok && g == 0) report_device_error(error_log, kErrRopePosition, pos, max_pos);
  rope_row_vec<T, NORM>(input + static_cast<long long>(row) * head_dim, norm_w, cos, sin, pos,
                        output + (static_cast<long long>(h) * tokens + t) * head_dim, g, head_dim, group, eps,
                        row_ok && pos_ok);
}

// ── qkv_rope_append ─────────────────────────────────────────────────────────
//
// Rows of one launch: first tokens x (heads + kv_heads) rope rows (token t,
// head h < heads: q to q_out; h >= heads: k head h - heads to the K cache at
// pos), then tokens x kv_heads v rows (copied to the V cache at pos). A row
// reads qkv[t, h, :] with h counted over q | k | v.

// Where row r goes; false past the last row.
struct FusedRow {
  int t = 0;
  int h = 0;       // head within q | k | v of the qkv row
  bool rope = false;
  bool valid = false;
};

// The divisors of fused_row, built by the launcher (which has checked
// tokens x (heads + 2 kv_heads) <= kFastDivmodMax).
struct FusedRowDivisors {
  FastDivmod rope_heads;  // heads + kv_heads
  FastDivmod kv_heads;
};

__device__ __forceinline__ FusedRow fused_row(std::uint32_t r, int tokens, const FusedRowDivisors& d) {
  FusedRow f;
  const std::uint32_t rope_rows = static_cast<std::uint32_t>(tokens) * d.rope_heads.divisor;
  const std::uint32_t all_rows = rope_rows + static_cast<std::uint32_t>(tokens) * d.kv_heads.divisor;
  if (r >= all_rows) return f;
  f.valid = true;
  f.rope = r < rope_rows;
  std::uint32_t t = 0, h = 0;
  if (f.rope) {
    d.rope_heads.divmod(r, t, h);
  } else {
    d.kv_heads.divmod(r - rope_rows, t, h);
    h += d.rope_heads.divisor;
  }
  f.t = static_cast<int>(t);
  f.h = static_cast<int>(h);
  return f;
}

// The destination of row f at position pos: q_out, the K cache or the V cache
// (with positions: of sequence f.t, and q_out batch-major).
template <class T>
__device__ __forceinline__ T* fused_destination(const QkvRopeAppendArgs& a, const FusedRow& f, long long pos) {
  const bool ragged = a.positions != nullptr;
  if (f.h < a.heads) {
    const long long q_row = ragged ? static_cast<long long>(f.t) * a.heads + f.h
                                   : static_cast<long long>(f.h) * a.tokens + f.t;
    return static_cast<T*>(a.q_out) + q_row * a.head_dim;
  }
  const bool is_k = f.h < a.heads + a.kv_heads;
  const int kvh = is_k ? f.h - a.heads : f.h - a.heads - a.kv_heads;
  const long long seq = ragged ? f.t : 0;
  T* const cache = static_cast<T*>(is_k ? a.k_cache : a.v_cache);
  return cache + ((seq * a.kv_heads + kvh) * a.capacity + pos) * a.head_dim;
}

// Checks positions [first, first + count) against the rope table and the
// caches, reporting through lane_leader a position outside (first when it
// is negative, else the run's last); false if any is outside.
__device__ __forceinline__ bool fused_run_fits(const QkvRopeAppendArgs& a, long long first, long long count,
                                               bool lane_leader) {
  bool ok = true;
  const long long last = first + count - 1;
  if (first < 0 || first > a.max_pos - count) {
    if (lane_leader) report_device_error(a.error_log, kErrRopePosition, first < 0 ? first : last, a.max_pos);
    ok = false;
  }
  if (first < 0 || first > a.capacity - count) {
    if (lane_leader) report_device_error(a.error_log, kErrKvAppendPosition, first < 0 ? first : last, a.capacity);
    ok = false;
  }
  return ok;
}

// Ragged: whether every positions[t] lies inside the tables and the caches.
// Each block checks them once (a strided share per thread, ORed by a
// barrier), so the cost does not grow with batch x rows; block 0's threads
// report the positions they found outside. Every thread of the block must
// call it, before any may exit.
__device__ __forceinline__ bool ragged_positions_fit(const QkvRopeAppendArgs& a) {
  bool bad = false;
  for (int t = static_cast<int>(threadIdx.x); t < a.tokens; t += static_cast<int>(blockDim.x)) {
    const long long p = a.positions[t];
    const bool rope_bad = p < 0 || p >= a.max_pos;
    const bool cache_bad = p < 0 || p >= a.capacity;
    if (blockIdx.x == 0 && rope_bad) report_device_error(a.error_log, kErrRopePosition, p, a.max_pos);
    if (blockIdx.x == 0 && cache_bad) report_device_error(a.error_log, kErrKvAppendPosition, p, a.capacity);
    bad = bad || rope_bad || cache_bad;
  }
  return __syncthreads_or(bad) == 0;
}

// The position of row f, and whether the op may write at all: one run
// base .. base + tokens - 1 (checked here, reported once per row through
// lane_leader), or with positions each sequence's own (ragged_ok: the
// block's ragged_positions_fit). Any position outside stops every row (q,
// k and v; every token, not only the bad ones), so a bad step leaves q_out
// and the caches as they were, as CpuBackend refuses the whole op.
__device__ __forceinline__ bool fused_row_position(const QkvRopeAppendArgs& a, const FusedRow& f, bool lane_leader,
                                                   bool ragged_ok, long long& pos) {
  if (a.positions == nullptr) {
    const long long base = a.state != nullptr ? a.state->pos : a.pos_offset;
    pos = base + f.t;
    return fused_run_fits(a, base, a.tokens, lane_leader);
  }
  pos = a.positions[f.t];
  return ragged_ok;
}

template <class T, bool NORM>
__global__ void qkv_rope_append_vec_kernel(const QkvRopeAppendArgs a, FusedRowDivisors divisors, int group) {
  pdl_begin();
  if (a.release_next) pdl_trigger_dependents();
  const bool ragged_ok = a.positions == nullptr || ragged_positions_fit(a);  // grid-uniform branch
  const auto [r, g] = group_row_lane(group);
  const FusedRow f = fused_row(r, a.tokens, divisors);
  long long pos = 0;
  const bool writes = f.valid && fused_row_position(a, f, g == 0, ragged_ok, pos);
  const long long row_len = static_cast<long long>(a.heads + 2 * a.kv_heads) * a.head_dim;
  const T* in = static_cast<const T*>(a.qkv) + f.t * row_len + static_cast<long long>(f.h) * a.head_dim;
  T* const out = writes ? fused_destination<T>(a, f, pos) : nullptr;
  const T* w = static_cast<const T*>(f.h < a.heads ? a.q_norm : a.k_norm);
  // Rope rows (and, for the norm's shuffles, every lane of the warp).
  rope_row_vec<T, NORM>(in, w, a.cos, a.sin, pos, out, g, a.head_dim, group, a.eps, writes && f.rope);
  if (writes && !f.rope) {  // v: copied as it is
    using V = vec_t<T, 8>;
    const int half = a.head_dim / 2;
    V lo, hi;
    lo.load(in + g * 8);
    hi.load(in + half + g * 8);
    lo.store(out + g * 8);
    hi.store(out + half + g * 8);
  }
}

template <class T, int PAIRS, bool NORM>
__global__ void qkv_rope_append_kernel(const QkvRopeAppendArgs a, FusedRowDivisors divisors) {
  pdl_begin();
  if (a.release_next) pdl_trigger_dependents();
  const bool ragged_ok = a.positions == nullptr || ragged_positions_fit(a);  // grid-uniform branch, before any exit
  const std::uint32_t r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const FusedRow f = fused_row(r, a.tokens, divisors);
  if (!f.valid) return;  // whole warps exit together
  long long pos = 0;
  if (!fused_row_position(a, f, lane == 0, ragged_ok, pos)) return;
  const long long row_len = static_cast<long long>(a.heads + 2 * a.kv_heads) * a.head_dim;
  const T* in = static_cast<const T*>(a.qkv) + f.t * row_len + static_cast<long long>(f.h) * a.head_dim;
  T* const out = fused_destination<T>(a, f, pos);
  if (f.rope) {
    const int half = a.head_dim / 2;
    const T* w = static_cast<const T*>(f.h < a.heads ? a.q_norm : a.k_norm);
    rope_row_warp<T, PAIRS, NORM>(in, w, a.cos + pos * half, a.sin + pos * half, out, lane, a.head_dim, a.eps);
  } else {
    for (int i = lane; i < a.head_dim; i += 32) out[i] = in[i];
  }
}

// How a launch covers a rope row of head_dim elements: the 16-byte vector
// path (`group` threads per row, 8 pairs each) when the halves split into a
// power of two of at most 32 vectors and the caller's pointers are aligned,
// else the warp path with `pairs` (1, 2, 4 or 8) pairs per lane.
struct RopeLaunchPlan {
  bool vec = false;
  int group = 0;
  int pairs = 0;
};

// The warp path's widest instance (8 pairs per lane, 32 lanes) bounds the head
// size the backend accepts (rope_head_dim_supported).
static_assert(kRopeMaxHeadDim == 2 * 32 * 8, "kRopeMaxHeadDim is what the warp path's largest dispatch covers");

RopeLaunchPlan rope_launch_plan(const char* op, int head_dim, bool pointers_aligned) {
  if (head_dim > kRopeMaxHeadDim) throw_size_limit(op, "head_dim", head_dim, kRopeMaxHeadDim);  // pairs per lane <= 8
  const int half = head_dim / 2;
  RopeLaunchPlan p;
  p.group = half / 8;
  p.vec = half % 8 == 0 && p.group <= 32 && (p.group & (p.group - 1)) == 0 && pointers_aligned;
  const int pairs_per_lane = (half + 31) / 32;
  p.pairs = pairs_per_lane <= 1 ? 1 : pairs_per_lane <= 2 ? 2 : pairs_per_lane <= 4 ? 4 : 8;
  return p;
}

// A launch's blocks along grid.x for `rows` head rows (tokens x heads),
// `threads_per_row` threads each in blocks of `threads`: past 2^31 - 1
// blocks (rows near 2^33) a named Unsupported, not a count truncated to 32
// bits.
unsigned grid_blocks(const char* op, long long rows, int threads_per_row, int threads) {
  const long long max_rows = kMaxGridX * threads / threads_per_row;  // checked before rows * threads_per_row
  if (rows > max_rows) throw_size_limit(op, "rows (tokens x heads)", rows, max_rows);
  return static_cast<unsigned>((rows * threads_per_row + threads - 1) / threads);
}

}  // namespace

void launch_qk_norm_rope(const RopeArgs& a, cudaStream_t stream) {
  const RopeLaunchPlan plan =
      rope_launch_plan("qk_norm_rope", a.head_dim, all_aligned16(a.input, a.output, a.cos, a.sin) &&
                                       (a.norm_w == nullptr || aligned16(a.norm_w)));
  const int group = plan.group;
  if (plan.vec) {
    constexpr int kThreads = 128;
    const long long rows = static_cast<long long>(a.tokens) * a.heads;
    if (rows > kFastDivmodMax) throw_size_limit("qk_norm_rope", "rows (tokens x heads)", rows, kFastDivmodMax);
    const auto blocks = grid_blocks("qk_norm_rope", rows, group, kThreads);
    const FastDivmod heads_div(static_cast<std::uint32_t>(a.heads));
    dispatch_half_dtype(a.dtype, "qk_norm_rope", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto* in = static_cast<const T*>(a.input);
      auto* w = static_cast<const T*>(a.norm_w);
      auto* out = static_cast<T*>(a.output);
      auto* kernel = a.norm_w != nullptr ? qk_norm_rope_vec_kernel<T, true> : qk_norm_rope_vec_kernel<T, false>;
      launch_pdl("qk_norm_rope", kernel, dim3(blocks), kThreads, 0, stream, in, w, a.cos, a.sin, out, a.tokens, heads_div,
                 a.head_dim, group, a.pos_offset, a.state, a.max_pos, a.eps, a.error_log);
    });
    check_launch("qk_norm_rope");
    return;
  }
  const int pairs = plan.pairs;
  const long long rows = static_cast<long long>(a.tokens) * a.heads;
  const auto blocks = grid_blocks("qk_norm_rope", rows, 32, 32 * kWarpsPerBlock);
  dispatch_half_dtype(a.dtype, "qk_norm_rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<1, 2, 4, 8>(pairs, "qk_norm_rope", "pairs per lane", [&](auto pairs_c) {
      constexpr int P = decltype(pairs_c)::value;
      auto* in = static_cast<const T*>(a.input);
      auto* w = static_cast<const T*>(a.norm_w);
      auto* out = static_cast<T*>(a.output);
      auto* kernel = a.norm_w != nullptr ? qk_norm_rope_kernel<T, P, true> : qk_norm_rope_kernel<T, P, false>;
      launch_pdl("qk_norm_rope", kernel, dim3(blocks), 32 * kWarpsPerBlock, 0, stream, in, w, a.cos, a.sin, out,
                 a.tokens, a.heads, a.head_dim, a.pos_offset, a.state, a.max_pos, a.eps, a.error_log);
    });
  });
  check_launch("qk_norm_rope");
}

void launch_qkv_rope_append(const QkvRopeAppendArgs& a, cudaStream_t stream) {
  const char* const op = a.positions != nullptr ? "qkv_rope_append_ragged" : "qkv_rope_append";  // as errors name it
  const bool norm = a.q_norm != nullptr;
  const RopeLaunchPlan plan =
      rope_launch_plan(op, a.head_dim, all_aligned16(a.qkv, a.q_out, a.k_cache, a.v_cache, a.cos, a.sin) &&
                                       (!norm || all_aligned16(a.q_norm, a.k_norm)));
  const int group = plan.group;
  const long long rows = static_cast<long long>(a.tokens) * (a.heads + 2 * a.kv_heads);
  if (rows > kFastDivmodMax) {
    throw_size_limit(op, "rows (tokens x (heads + 2 kv_heads))", rows, kFastDivmodMax);
  }
  const FusedRowDivisors divisors{FastDivmod(static_cast<std::uint32_t>(a.heads + a.kv_heads)),
                                  FastDivmod(static_cast<std::uint32_t>(a.kv_heads))};
  if (plan.vec) {
    constexpr int kThreads = 128;
    const auto blocks = grid_blocks(op, rows, group, kThreads);
    dispatch_half_dtype(a.dtype, op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto* kernel = norm ? qkv_rope_append_vec_kernel<T, true> : qkv_rope_append_vec_kernel<T, false>;
      launch_pdl(op, kernel, dim3(blocks), kThreads, 0, stream, a, divisors, group);
    });
    check_launch(op);
    return;
  }
  const int pairs = plan.pairs;
  const auto blocks = grid_blocks(op, rows, 32, 32 * kWarpsPerBlock);
  dispatch_half_dtype(a.dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<1, 2, 4, 8>(pairs, op, "pairs per lane", [&](auto pairs_c) {
      constexpr int P = decltype(pairs_c)::value;
      auto* kernel = norm ? qkv_rope_append_kernel<T, P, true> : qkv_rope_append_kernel<T, P, false>;
      launch_pdl(op, kernel, dim3(blocks), 32 * kWarpsPerBlock, 0, stream, a, divisors);
    });
  });
  check_launch(op);
}

}  // namespace ferrum::kernels
