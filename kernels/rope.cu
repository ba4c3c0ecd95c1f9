// qk_norm_rope: per (token, head) row, an optional RMSNorm over head_dim,
// then NeoX RoPE (element i pairs with i + head_dim/2), reading token-major
// and writing head-major.
//
// Fast path (head_dim/2 = 8·G with G a power of two <= 32, 16-byte aligned
// buffers): a group of G lanes per row, each lane owning 8 contiguous pairs,
// so every access is a 16-byte vector and a warp works on 32/G rows.
// General path: one warp per row; lane l owns pair indices l, l+32, ...
// (PAIRS per lane, head_dim/64 rounded up to 1, 2, 4 or 8).
#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/rope.hpp"

namespace ferrum::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

template <class T, int PAIRS, bool NORM>
__global__ void qk_norm_rope_kernel(const T* __restrict__ input, const T* __restrict__ norm_w,
                                    const float* __restrict__ cos, const float* __restrict__ sin,
                                    T* __restrict__ output, int tokens, int heads, int head_dim,
                                    long long pos_offset, const DecodeState* state, long long max_pos, float eps,
                                    std::uint32_t* error_flag) {
  pdl_begin();
  const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<long long>(tokens) * heads) return;  // whole warps exit together
  const int t = static_cast<int>(row / heads);
  const int h = static_cast<int>(row - static_cast<long long>(t) * heads);
  const int half = head_dim / 2;
  const long long pos = (state != nullptr ? state->pos : pos_offset) + t;
  if (pos < 0 || pos >= max_pos) {
    if (lane == 0) report_device_error(error_flag, kErrRopePositionOutOfRange);
    return;
  }

  const T* in = input + row * head_dim;
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
  T* out = output + (static_cast<long long>(h) * tokens + t) * head_dim;
  const float* c_row = cos + pos * half;
  const float* s_row = sin + pos * half;
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

template <class T, bool NORM>
__global__ void qk_norm_rope_vec_kernel(const T* __restrict__ input, const T* __restrict__ norm_w,
                                        const float* __restrict__ cos, const float* __restrict__ sin,
                                        T* __restrict__ output, int tokens, int heads, int head_dim, int group,
                                        long long pos_offset, const DecodeState* state, long long max_pos, float eps,
                                        std::uint32_t* error_flag) {
  pdl_begin();
  using V = vec_t<T, 8>;
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / group;
  const int g = threadIdx.x % group;
  const bool row_ok = row < static_cast<long long>(tokens) * heads;
  const int t = row_ok ? static_cast<int>(row / heads) : 0;
  const int h = row_ok ? static_cast<int>(row - static_cast<long long>(t) * heads) : 0;
  const int half = head_dim / 2;
  const long long pos = (state != nullptr ? state->pos : pos_offset) + t;
  const bool pos_ok = pos >= 0 && pos < max_pos;
  const bool active = row_ok && pos_ok;
  if (row_ok && !pos_ok && g == 0) report_device_error(error_flag, kErrRopePositionOutOfRange);

  V lo, hi, w_lo, w_hi;
  float4 c[2], s[2];
  if (active) {
    const T* in = input + row * head_dim + g * 8;
    lo.load(in);
    hi.load(in + half);
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
  float inv = 1.0f;
  if constexpr (NORM) {
    float sq = 0.0f;
    if (active) {
#pragma unroll
      for (int j = 0; j < 8; ++j) sq += lo.f(j) * lo.f(j) + hi.f(j) * hi.f(j);
    }
    inv = rsqrtf(group_sum_in_warp(sq, group) / static_cast<float>(head_dim) + eps);  // all lanes take part
  }
  if (!active) return;
  const float* cf = reinterpret_cast<const float*>(c);
  const float* sf = reinterpret_cast<const float*>(s);
  V o_lo, o_hi;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float x1 = lo.f(j), x2 = hi.f(j);
    if constexpr (NORM) {
      x1 = (x1 * inv) * w_lo.f(j);
      x2 = (x2 * inv) * w_hi.f(j);
    }
    o_lo.set(j, x1 * cf[j] - x2 * sf[j]);
    o_hi.set(j, x2 * cf[j] + x1 * sf[j]);
  }
  T* out = output + (static_cast<long long>(h) * tokens + t) * head_dim + g * 8;
  o_lo.store(out);
  o_hi.store(out + half);
}

}  // namespace

void launch_qk_norm_rope(const RopeArgs& a, cudaStream_t stream) {
  const int half = a.head_dim / 2;
  const int group = half / 8;
  const bool vec_ok = half % 8 == 0 && group <= 32 && (group & (group - 1)) == 0 &&
                      all_aligned16(a.input, a.output, a.cos, a.sin) &&
                      (a.norm_w == nullptr || aligned16(a.norm_w));
  if (vec_ok) {
    constexpr int kThreads = 128;
    const long long rows = static_cast<long long>(a.tokens) * a.heads;
    const auto blocks = static_cast<unsigned>((rows * group + kThreads - 1) / kThreads);
    dispatch_half_dtype(a.dtype, "qk_norm_rope", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto* in = static_cast<const T*>(a.input);
      auto* w = static_cast<const T*>(a.norm_w);
      auto* out = static_cast<T*>(a.output);
      auto* kernel = a.norm_w != nullptr ? qk_norm_rope_vec_kernel<T, true> : qk_norm_rope_vec_kernel<T, false>;
      launch_pdl("qk_norm_rope", kernel, dim3(blocks), kThreads, 0, stream, in, w, a.cos, a.sin, out, a.tokens, a.heads,
                 a.head_dim, group, a.pos_offset, a.state, a.max_pos, a.eps, a.error_flag);
    });
    check_launch("qk_norm_rope");
    return;
  }
  const int pairs_per_lane = (a.head_dim / 2 + 31) / 32;
  const int pairs = pairs_per_lane <= 1 ? 1 : pairs_per_lane <= 2 ? 2 : pairs_per_lane <= 4 ? 4 : 8;
  const long long rows = static_cast<long long>(a.tokens) * a.heads;
  const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch_half_dtype(a.dtype, "qk_norm_rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<1, 2, 4, 8>(pairs, "qk_norm_rope", "pairs per lane", [&](auto pairs_c) {
      constexpr int P = decltype(pairs_c)::value;
      auto* in = static_cast<const T*>(a.input);
      auto* w = static_cast<const T*>(a.norm_w);
      auto* out = static_cast<T*>(a.output);
      auto* kernel = a.norm_w != nullptr ? qk_norm_rope_kernel<T, P, true> : qk_norm_rope_kernel<T, P, false>;
      launch_pdl("qk_norm_rope", kernel, dim3(blocks), 32 * kWarpsPerBlock, 0, stream, in, w, a.cos, a.sin, out,
                 a.tokens, a.heads, a.head_dim, a.pos_offset, a.state, a.max_pos, a.eps, a.error_flag);
    });
  });
  check_launch("qk_norm_rope");
}

}  // namespace ferrum::kernels
