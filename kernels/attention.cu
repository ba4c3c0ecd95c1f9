// flash_attention: softmax(q kᵀ · scale + causal mask) v with GQA, reading
// the head-major cache [num_kv_heads, capacity, head_dim] directly.
//
// One kernel body, attention_rows_kernel, handles a block of (query row,
// kv head, slice of the key range). Its 4 warps walk the slice 32 keys at a
// time: lane j scores key j against every q head of the GQA group (so each
// K row is read once for the whole group), the warp keeps an online softmax
// (running max and sum, base 2), and P·V broadcasts each key's probability
// across the warp while every lane accumulates its own head_dim/32 output
// columns. The four warps are merged through shared memory at the end.
//
// Decode (q_len == 1) splits the key range into fixed slices of
// kAttnSplitKeys (flash-decoding): one block per slice writes a partial
// output and its log-sum-exp, and attention_combine_kernel merges the
// slices in a fixed order. In device-state mode the grid covers the whole
// capacity and slices past the decode state's kv_len exit at once, so one
// captured launch serves every step. Prefill uses one slice per query row.
//
// Everything here runs on CUDA cores in fp32. Prefill goes to the
// tensor-core kernel (kernels/attention_prefill.cu) whenever it applies.
#include <cfloat>

#include "kernels/attention.hpp"
#include "kernels/attention_prefill.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroupPerBlock = 8;  // q heads of one GQA group per block
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The keys query row `i` of sequence `b` may see: [0, limit). A decode
// whose kv_len comes from the device (kv_lens or the decode state) and lies
// outside [1, kv_stride] sees nothing (zeros are written) and is reported.
__device__ __forceinline__ long long key_limit(const AttentionArgs& a, int b, int i, bool report) {
  if (a.kv_lens != nullptr || a.state != nullptr) {
    const long long kv_len = a.kv_lens != nullptr ? a.kv_lens[b] : a.state->kv_len;
    if (kv_len < 1 || kv_len > a.kv_stride) {
      if (report) report_device_error(a.error_flag, kErrAttnKvLenOutOfRange);
      return 0;
    }
    return kv_len;  // the one query is the newest position: it sees every key
  }
  long long limit = a.kv_len;
  const long long pos = a.pos_offset + i;
  if (a.causal && pos + 1 < limit) limit = pos + 1;
  return limit < 0 ? 0 : limit;
}

template <class T, int HD>
__global__ void __launch_bounds__(kWarps * 32) attention_rows_kernel(const AttentionArgs a, int splits,
                                                                      int heads_per_block) {
  constexpr int kCols = HD / 32;  // output columns per lane
  __shared__ float q_s[kMaxGroupPerBlock][HD];
  __shared__ float m_s[kWarps][kMaxGroupPerBlock];
  __shared__ float l_s[kWarps][kMaxGroupPerBlock];
  __shared__ float o_s[kWarps][kMaxGroupPerBlock][HD];

  // grid.x enumerates (batch * q_len) x splits (x is the only dimension
  // without a 65535 limit), grid.y kv heads x head chunks.
  const int split = static_cast<int>(blockIdx.x % splits);
  const long long query_row = blockIdx.x / splits;  // b * q_len + i
  const int group = a.num_heads / a.num_kv_heads;
  const int chunks = (group + heads_per_block - 1) / heads_per_block;
  const int kvh = blockIdx.y / chunks;
  const int head0 = kvh * group + (blockIdx.y % chunks) * heads_per_block;
  const int heads = min(heads_per_block, kvh * group + group - head0);
  const int b = static_cast<int>(query_row / a.q_len);
  const int i = static_cast<int>(query_row % a.q_len);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  const long long limit = key_limit(a, b, i, split == 0 && threadIdx.x == 0);
  const long long slice = splits > 1 ? kAttnSplitKeys : limit;
  const long long begin = static_cast<long long>(split) * slice;
  const long long end = min(limit, begin + slice);
  const long long row_base = (static_cast<long long>(b) * a.num_heads + head0) * a.q_len + i;  // head0's row

  if (begin >= end) {  // a slice past the valid keys (or an empty row)
    if (splits > 1) {
      for (int h = threadIdx.x; h < heads; h += blockDim.x) {
        a.partial_lse[(row_base + static_cast<long long>(h) * a.q_len) * splits + split] = -INFINITY;
      }
    } else {
      T* out = static_cast<T*>(a.out);
      for (int idx = threadIdx.x; idx < heads * HD; idx += blockDim.x) {
        out[(row_base + static_cast<long long>(idx / HD) * a.q_len) * HD + idx % HD] = from_float<T>(0.0f);
      }
    }
    return;
  }

  // q of every head of the block, pre-scaled so scores come out in base 2.
  const T* q = static_cast<const T*>(a.q);
  const float q_scale = a.scale * kLog2e;
  for (int idx = threadIdx.x; idx < heads * HD; idx += blockDim.x) {
    const int h = idx / HD;
    q_s[h][idx % HD] = to_float(q[(row_base + static_cast<long long>(h) * a.q_len) * HD + idx % HD]) * q_scale;
  }
  __syncthreads();

  const long long kv_head_base = (static_cast<long long>(b) * a.num_kv_heads + kvh) * a.kv_stride;
  const T* k = static_cast<const T*>(a.k) + kv_head_base * HD;
  const T* v = static_cast<const T*>(a.v) + kv_head_base * HD;

  float m[kMaxGroupPerBlock], l[kMaxGroupPerBlock], o[kMaxGroupPerBlock][kCols];
#pragma unroll
  for (int h = 0; h < kMaxGroupPerBlock; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) o[h][c] = 0.0f;
  }

  for (long long tile = begin + warp * 32; tile < end; tile += kWarps * 32) {
    const long long key = tile + lane;
    const bool valid = key < end;
    // Scores of this lane's key against every head.
    float s[kMaxGroupPerBlock];
#pragma unroll
    for (int h = 0; h < kMaxGroupPerBlock; ++h) s[h] = 0.0f;
    if (valid) {
      const T* k_row = k + key * HD;
#pragma unroll 4
      for (int d0 = 0; d0 < HD; d0 += 8) {
        vec_t<T, 8> kv;
        kv.load(k_row + d0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float kf = kv.f(j);
#pragma unroll
          for (int h = 0; h < kMaxGroupPerBlock; ++h) {
            if (h < heads) s[h] += q_s[h][d0 + j] * kf;
          }
        }
      }
    }
    // Online softmax over the tile, per head.
    float p[kMaxGroupPerBlock];
#pragma unroll
    for (int h = 0; h < kMaxGroupPerBlock; ++h) {
      if (h >= heads) {
        p[h] = 0.0f;
        continue;
      }
      const float tile_max = warp_max(valid ? s[h] : -INFINITY);
      const float m_new = fmaxf(m[h], tile_max);  // finite: the tile has a valid key
      const float alpha = exp2f(m[h] - m_new);    // m[h] = -inf gives 0
      p[h] = valid ? exp2f(s[h] - m_new) : 0.0f;
      l[h] = l[h] * alpha + warp_sum(p[h]);
      m[h] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) o[h][c] *= alpha;
    }
    // P·V: key j's probability goes to every lane; lane owns kCols columns.
    const int keys_here = static_cast<int>(min(static_cast<long long>(32), end - tile));
    for (int j = 0; j < keys_here; ++j) {
      const T* v_row = v + (tile + j) * HD + lane * kCols;
      float vf[kCols];
      if constexpr (kCols == 8) {
        vec_t<T, 8> vv;
        vv.load(v_row);
#pragma unroll
        for (int c = 0; c < 8; ++c) vf[c] = vv.f(c);
      } else if constexpr (kCols == 4) {
        vec_t<T, 4> vv;
        vv.load(v_row);
#pragma unroll
        for (int c = 0; c < 4; ++c) vf[c] = vv.f(c);
      } else {
        vec_t<T, 2> vv;
        vv.load(v_row);
#pragma unroll
        for (int c = 0; c < 2; ++c) vf[c] = vv.f(c);
      }
#pragma unroll
      for (int h = 0; h < kMaxGroupPerBlock; ++h) {
        const float pj = __shfl_sync(0xffffffffu, p[h], j);
#pragma unroll
        for (int c = 0; c < kCols; ++c) o[h][c] += pj * vf[c];
      }
    }
  }

  // Merge the warps: each publishes its (m, l, o) per head.
#pragma unroll
  for (int h = 0; h < kMaxGroupPerBlock; ++h) {
    if (h < heads) {
      if (lane == 0) {
        m_s[warp][h] = m[h];
        l_s[warp][h] = l[h];
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) o_s[warp][h][lane * kCols + c] = o[h][c];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < heads * HD; idx += blockDim.x) {
    const int h = idx / HD;
    const int d = idx % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][h]);
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (m_s[w][h] == -INFINITY) continue;  // a warp that saw no key
      const float f = exp2f(m_s[w][h] - mx);
      sum += l_s[w][h] * f;
      acc += o_s[w][h][d] * f;
    }
    const long long row = row_base + static_cast<long long>(h) * a.q_len;
    if (splits > 1) {
      a.partial_out[(row * splits + split) * HD + d] = acc / sum;
      if (d == 0) a.partial_lse[row * splits + split] = mx + log2f(sum);
    } else {
      static_cast<T*>(a.out)[row * HD + d] = from_float<T>(acc / sum);
    }
  }
}

// Merges the decode slices of each (sequence, head) in slice order.
template <class T, int HD>
__global__ void attention_combine_kernel(const AttentionArgs a, int splits) {
  const long long row = blockIdx.x;  // b * num_heads + head (q_len == 1)
  const long long limit = key_limit(a, static_cast<int>(row / a.num_heads), 0, false);
  const int used = static_cast<int>(min(static_cast<long long>(splits), (limit + kAttnSplitKeys - 1) / kAttnSplitKeys));
  const float* lse = a.partial_lse + row * splits;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float mx = -INFINITY;
    for (int s = 0; s < used; ++s) mx = fmaxf(mx, lse[s]);
    float sum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
      for (int s = 0; s < used; ++s) {
        const float f = exp2f(lse[s] - mx);
        sum += f;
        acc += f * a.partial_out[(row * splits + s) * HD + d];
      }
    }
    static_cast<T*>(a.out)[row * HD + d] = from_float<T>(sum > 0.0f ? acc / sum : 0.0f);
  }
}

int decode_splits(long long kv_stride) {
  return static_cast<int>((kv_stride + kAttnSplitKeys - 1) / kAttnSplitKeys);
}

}  // namespace

std::size_t attention_workspace_floats(int batch, int num_heads, int q_len, int head_dim, long long kv_stride) {
  if (q_len != 1) return 0;
  const auto rows = static_cast<std::size_t>(batch) * static_cast<std::size_t>(num_heads);
  return rows * static_cast<std::size_t>(decode_splits(kv_stride)) * static_cast<std::size_t>(head_dim + 1);
}

void launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  // Prefill (q_len > 1) runs on tensor cores wherever that kernel applies;
  // this CUDA-core kernel stays the fallback and the decode path.
  if (launch_attention_prefill_tc(a, stream)) return;
  const int splits = a.q_len == 1 ? decode_splits(a.kv_stride) : 1;
  const int group = a.num_heads / a.num_kv_heads;
  const int heads_per_block = group < kMaxGroupPerBlock ? group : kMaxGroupPerBlock;
  const int chunks = (group + heads_per_block - 1) / heads_per_block;
  const dim3 grid(static_cast<unsigned>(static_cast<long long>(a.batch) * a.q_len * splits),
                  static_cast<unsigned>(a.num_kv_heads * chunks));
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int<64, 128, 256>(a.head_dim, "flash_attention", "head_dim", [&](auto hd_c) {
      constexpr int HD = decltype(hd_c)::value;
      attention_rows_kernel<T, HD><<<grid, kWarps * 32, 0, stream>>>(a, splits, heads_per_block);
      if (splits > 1) {
        attention_combine_kernel<T, HD>
            <<<static_cast<unsigned>(a.batch * a.num_heads), HD, 0, stream>>>(a, splits);
      }
    });
  });
  check_launch("flash_attention");
}

}  // namespace ferrum::kernels
