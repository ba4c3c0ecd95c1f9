// flash_attention: softmax(q kᵀ · scale + causal mask) v with GQA, reading
// the head-major cache [num_kv_heads, capacity, head_dim] directly.
//
// Decode (q_len == 1) is flash-decoding on tensor cores,
// attention_decode_kernel. The key range is cut into slices whose size
// depends on the cache capacity alone (attention_decode_slice_keys: at
// most 16 slices, of 128 keys or more), so a result never depends
// on kv_len, the batch or the launch size; one block owns a run of
// consecutive slices of one (sequence, kv head) (DecodeTuning::
// slices_per_block: one at batch 1, several for large batches), each run
// exactly as alone, and every q head of the GQA group: the group is the M dimension of mma.sync m16n8k16 (padded to
// 16 rows per m-tile; groups above 16 take a second set of 4 warps, above
// 32 a further block per 32 heads). The slice streams through shared memory
// 64 keys at a time; each of the 4 key warps owns 16 keys of every 64:
//
//   S = Q Kᵀ        Q fragments in registers (hd <= 128; hd 256 re-reads
//                   them from shared memory), K through ldmatrix
//   online softmax  fp32, base 2, per warp for the whole slice
//   O += P V        P re-packed from the S accumulators as the A operand,
//                   V through ldmatrix.trans
//
// A warp's 16-key sub-tiles arrive through its own ring of kStages slots
// filled by cp.async (16-byte, L2-only; rows past the valid keys are
// zero-filled, never read), so the key warps run decoupled: the only
// barriers in the loop are per warp (or per pair of warps sharing keys when
// the group has two m-tiles). At the end of the slice the warps' (m, l, O)
// merge through shared memory in a fixed order into a partial output and
// its base-2 log-sum-exp. The block that finishes a (sequence, kv head)
// last -- an arrival counter, which that block returns to zero -- merges
// the slices' partials in slice order (merge_slice_partials), so there is
// no second kernel; a row with one valid slice is written directly, a block
// that holds every valid slice of its row merges them itself (folding each
// into the output as it ends, where a thread owns one output item). Every
// merge runs the same steps in slice order (SliceWeights). Large
// launches of several blocks per row (DecodeTuning::fused_max_groups_per_sm)
// merge in a second kernel instead, attention_combine_kernel: the same
// arithmetic.
// Bitwise deterministic: which block merges never changes the arithmetic.
// In device-state / ragged mode the grid covers the whole capacity and
// slices past kv_len exit at once (they do not arrive: the count to wait
// for is the number of valid slices), so one captured launch serves every
// step.
//
// attention_rows_kernel (CUDA cores, fp32) is the prefill fallback for
// calls the tensor-core prefill (kernels/attention_prefill.cu) declines,
// and runs decode only on a device without sm_80 tensor-core support.
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <optional>

#include "kernels/attention.hpp"
#include "kernels/attention_prefill.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/device_error.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/fast_divmod.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/per_device.hpp"
#include "kernels/common/vec.cuh"

namespace ferrum::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroupPerBlock = 8;  // q heads of one GQA group per block

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
      if (report) report_device_error(a.error_log, kErrAttnKvLen, kv_len, a.kv_stride);
      return 0;
    }
    return kv_len;  // the one query is the newest position: it sees every key
  }
  long long limit = a.kv_len;
  const long long pos = a.pos_offset + i;
  if (a.causal && pos + 1 < limit) limit = pos + 1;
  return limit < 0 ? 0 : limit;
}

// The slices of `slice_keys` keys (a power of two: attention_decode_slice_keys)
// that hold one of `limit` valid keys, at most `splits`: a shift, not a
// 64-bit division on every decode block's path.
__device__ __forceinline__ int used_slices(long long limit, int splits, int slice_keys) {
  const int shift = 31 - __clz(slice_keys);
  return static_cast<int>(min(static_cast<long long>(splits), (limit + slice_keys - 1) >> shift));
}

// FERRUM_DECODE_TIMELINE (a CMake option, diagnostics only): thread 0 of
// every block stores clock64() at each DecodeTimelinePoint of
// attention_decode_kernel; decode_timeline_read returns them
// (ferrum_attention_tuning timeline). Without the option the marks are
// empty. (Session 15 found the B = 1 merges' cost this way.)
#if defined(FERRUM_DECODE_TIMELINE)
__device__ DecodeTimelineBlock g_decode_timeline[kDecodeTimelineBlocks];
#endif
__device__ __forceinline__ void timeline_mark(DecodeTimelinePoint point) {
#if defined(FERRUM_DECODE_TIMELINE)
  const unsigned block = blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0 && block < static_cast<unsigned>(kDecodeTimelineBlocks)) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    g_decode_timeline[block].points[static_cast<int>(point)] =
        DecodeTimelineStamp{static_cast<unsigned long long>(clock64()), ns};
    if (point == DecodeTimelinePoint::Entry) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_decode_timeline[block].sm = sm;
    }
  }
#else
  (void)point;
#endif
}

// Where a row's slice partials lie: the split-K workspace (written by other
// blocks, read through L2), or, under DecodeTuning::cluster_merge, the
// shared memory of the cluster's blocks (block rank s holds slice s).
template <int HD>
struct WorkspacePartials {
  const float* out;  // [rows][splits][HD], row = sequence * num_heads + head
  const float* lse;  // [rows][splits]
  long long row0;    // the row of head 0
  int splits;
  bool discard;      // DecodeTuning::partials_in_l2: drop the merged partials' L2 lines
  // The workspace partials of `a` from row row0 on (discard: the launch's
  // partials_in_l2 verdict, which the launcher puts in a).
  __device__ static WorkspacePartials of(const AttentionArgs& a, long long row0, int splits) {
    return {a.partial_out, a.partial_lse, row0, splits, a.decode_tuning.partials_in_l2};
  }
  __device__ float lse_at(int h, int s) const { return __ldcg(lse + (row0 + h) * splits + s); }
  __device__ float4 quad_at(int h, int s, int d) const {
    return __ldcg(reinterpret_cast<const float4*>(out + ((row0 + h) * splits + s) * HD + d));
  }
  // After the merge (every thread of the block): heads h_begin .. h_end - 1
  // are merged, and nothing reads their partials again.
  __device__ void release(int h_begin, int h_end) const {
    if (!discard) return;
    __syncthreads();  // every thread's reads of them are done
    discard_l2_lines(out + (row0 + h_begin) * splits * HD, out + (row0 + h_end) * splits * HD,
                     static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
  }
};

template <int HD>
struct ClusterPartials {
  float* out;  // [kMaxHeads][HD] at the same offset in every block's shared memory
  float* lse;  // [kMaxHeads]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __device__ float lse_at(int h, int s) const {
    return *static_cast<const float*>(__cluster_map_shared_rank(lse + h, static_cast<unsigned>(s)));
  }
  __device__ float4 quad_at(int h, int s, int d) const {
    return *static_cast<const float4*>(__cluster_map_shared_rank(out + h * HD + d, static_cast<unsigned>(s)));
  }
#else
  __device__ float lse_at(int, int) const { __trap(); return 0.0f; }      // never launched below sm_90
  __device__ float4 quad_at(int, int, int) const { __trap(); return {}; }
#endif
  __device__ void release(int, int) const {}  // shared memory: nothing to drop
};

// The merge of a row's slice partials, one slice at a time in slice order:
// after slices 0 .. s, with M_s the largest of their base-2 log-sum-exps,
//   l = sum 2^(lse - M_s),   acc = sum 2^(lse - M_s) O   (O normalized per slice),
// and the output is acc / l. Step s rescales the running sums by
// alpha_s = 2^(M_{s-1} - M_s) (0 at the first: M_{-1} = -inf) and adds the
// slice with weight beta_s = 2^(lse_s - M_s), through explicit roundings (no
// contraction left to the compiler). The weights depend on the lse alone,
// so a merge may compute them apart from the columns (merge_slice_partials:
// a warp per head); every merge of the decode runs these steps in slice
// order on the same values (a block holding its whole row as each slice
// ends, the row's last block, the cluster, the combine kernel), so every
// path gives the same bits. A valid slice's lse is finite (its row sum is
// > 0).
struct SliceWeights {
  float alpha, beta;
  // Slice weights with the running max m_prev before it and m after.
  __device__ __forceinline__ static SliceWeights of(float m_prev, float m, float lse) {
    return {exp2f(m_prev - m), exp2f(lse - m)};
  }
  __device__ __forceinline__ float fold_sum(float l) const { return __fmaf_rn(l, alpha, beta); }
  __device__ __forceinline__ void fold_quad(float (&acc)[4], const float4& o) const {
    acc[0] = __fmaf_rn(acc[0], alpha, __fmul_rn(beta, o.x));
    acc[1] = __fmaf_rn(acc[1], alpha, __fmul_rn(beta, o.y));
    acc[2] = __fmaf_rn(acc[2], alpha, __fmul_rn(beta, o.z));
    acc[3] = __fmaf_rn(acc[3], alpha, __fmul_rn(beta, o.w));
  }
};

// 4 columns of the merged output: acc / l (zeros where no slice was folded).
template <class T>
__device__ __forceinline__ void store_folded_quad(T* dst, const float (&acc)[4], float l) {
  vec_t<T, 4> o;
#pragma unroll
  for (int c = 0; c < 4; ++c) o.set(c, l > 0.0f ? __fdiv_rn(acc[c], l) : 0.0f);
  o.store(dst);
}

// A slice's partial: its 4 accumulated columns normalized by its row sum.
__device__ __forceinline__ float4 slice_partial_quad(const float (&acc)[4], float sum) {
  return make_float4(__fdiv_rn(acc[0], sum), __fdiv_rn(acc[1], sum), __fdiv_rn(acc[2], sum), __fdiv_rn(acc[3], sum));
}

// One (head, 4 columns) item's running fold (a block holding its whole row).
struct SliceFold {
  float m = -INFINITY;
  float l = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  __device__ __forceinline__ void add(float lse, const float4& o) {
    const float mx = fmaxf(m, lse);
    const SliceWeights w = SliceWeights::of(m, mx, lse);
    l = w.fold_sum(l);
    w.fold_quad(acc, o);
    m = mx;
  }
};

// Merges the decode slice partials of heads h_begin .. h_end - 1 of one
// sequence (slices 0 .. used - 1 hold a valid key) into out ([heads][HD]
// from head 0) by the steps of SliceWeights, in slice order; used == 0
// writes zeros. Every thread of the block calls it (it holds
// __syncthreads); blockDim.x is a multiple of 32; smem: (h_end - h_begin) *
// 2 * kAttnDecodeMaxSplits floats, 8-byte aligned. It ends with src.release: workspace partials
// are dropped from L2 unwritten where their discard is set
// (DecodeTuning::partials_in_l2), so nothing may read them after it.
//
// It is latency, not bandwidth: at B = 1 one block per (sequence, kv head)
// runs it alone after the decode. So every partial a thread reads is
// requested at once (up to kAttnDecodeMaxSplits float4 in registers), its
// first item's before the weights exist (one round trip covers those and
// the lse), and each head's weights come from one warp (the running max as
// a shuffle scan, lane s computing slice s's) instead of a serial loop.
// (Session 15, B = 1 L = 4k: the serial weights and batches of 8 slices
// took 3.3 us after the last arrival.)
template <class T, int HD, class Partials>
__device__ void merge_slice_partials(const Partials& src, T* out, int h_begin, int h_end, int used, float* smem) {
  static_assert(HD % 4 == 0, "4 columns per thread");
  static_assert(kAttnDecodeMaxSplits <= 32, "one slice per lane in the weight step");
  constexpr int kQuads = HD / 4;
  constexpr int kMaxUsed = kAttnDecodeMaxSplits;
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int lane = tid % 32;
  const int heads = h_end - h_begin;
  const int items = heads * kQuads;                 // (head, 4 columns)
  // [heads][kMaxUsed]: (lse, -), then (alpha, beta), written for every
  // step (past `used`: (1, 0)), so each fold step loads 8 bytes at a fixed
  // offset
  float2* const ab_s = reinterpret_cast<float2*>(smem);
  // Item idx's partials of slices 0 .. used - 1.
  auto load_item = [&](int idx, float4 (&x)[kMaxUsed]) {
    const int h = h_begin + idx / kQuads;
    const int d = (idx % kQuads) * 4;
#pragma unroll
    for (int s = 0; s < kMaxUsed; ++s) x[s] = s < used ? src.quad_at(h, s, d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  // Every thread folds its head's l beside its columns (one more fma per
  // step, off the columns' chains), so no lane folds l alone before the
  // block may start. The steps are branch-free (each loads its weights and
  // computes; one past `used` keeps the old values): a ten-instruction step
  // under an `if` stays a branch in SASS with its load behind it, so each
  // step waited a shared-load latency (session 64, v4: B = 1 L = 4k 0.37 us
  // slower than the flat sum, whose 5-wide steps ptxas predicates, loads
  // hoisted).
  auto finish_item = [&](int idx, const float4 (&x)[kMaxUsed]) {
    const int hl = idx / kQuads;
    const int d = (idx % kQuads) * 4;
    const float2* const ab = ab_s + hl * kMaxUsed;
    float l = 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kMaxUsed; ++s) {
      const SliceWeights w{ab[s].x, ab[s].y};
      float l_next = w.fold_sum(l);
      float acc_next[4] = {acc[0], acc[1], acc[2], acc[3]};
      w.fold_quad(acc_next, x[s]);
      const bool on = s < used;
      l = on ? l_next : l;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] = on ? acc_next[c] : acc[c];
    }
    store_folded_quad(out + static_cast<long long>(h_begin + hl) * HD + d, acc, l);
  };
  // The thread's first item, in flight across the weight step.
  float4 first[kMaxUsed];
  if (tid < items) load_item(tid, first);
  for (int i = tid; i < heads * used; i += nthreads) {
    const int hl = i / used;
    const int s = i % used;
    ab_s[hl * kMaxUsed + s].x = src.lse_at(h_begin + hl, s);
  }
  __syncthreads();
  // The weights of slice s of a head in lane s: M_s, the running max, by a
  // shuffle scan (max is exact, so any order gives SliceFold's M_s), M_{s-1}
  // from the lane below.
  for (int hl = tid / 32; hl < heads; hl += nthreads / 32) {
    const float lse = lane < used ? ab_s[hl * kMaxUsed + lane].x : -INFINITY;
    float m = lse;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float below = __shfl_up_sync(0xffffffffu, m, off);
      if (lane >= off) m = fmaxf(m, below);
    }
    float m_prev = __shfl_up_sync(0xffffffffu, m, 1);
    if (lane == 0) m_prev = -INFINITY;
    const SliceWeights w = SliceWeights::of(m_prev, m, lse);
    if (lane < kMaxUsed) ab_s[hl * kMaxUsed + lane] = lane < used ? make_float2(w.alpha, w.beta) : make_float2(1.0f, 0.0f);
  }
  __syncthreads();
  if (tid < items) finish_item(tid, first);
  for (int idx = tid + nthreads; idx < items; idx += nthreads) {  // more than one item per thread
    float4 x[kMaxUsed];
    load_item(idx, x);
    finish_item(idx, x);
  }
  src.release(h_begin, h_end);
}

// Arrival counters of the fused decode merge, one per (sequence, kv head,
// head chunk) of a launch. Zero at module load, and every launch leaves
// them zero (each group's last block wraps its counter back), so every
// launch and graph replay starts from zero. Per device: decode launches of
// one device must not run concurrently (the backend queues every op of a
// device on one stream), as for the split-K workspace. A launch with more
// groups (or past DecodeTuning's fused size) merges in
// attention_combine_kernel instead (the same bits). kDecodeArrivalSlots:
// kernels/attention.hpp.
__device__ unsigned int g_decode_arrivals[kDecodeArrivalSlots];

// The merge of one slice's key warps for one q head, shared by both forms
// of the merge at a slice's end (DecodeTuning::slot_merge), so both give
// the same bits. Weights f_w = 2^(m_w - max) over the warps' maxima in
// base-2 units (0 for a warp that saw no key: its O is exactly 0) and the
// slice's row sum; returns the max (the slice's lse is max + log2(sum)).
template <int kKeyWarps>
__device__ __forceinline__ float slice_warp_weights(const float (&m)[kKeyWarps], const float (&l)[kKeyWarps],
                                                    float (&f)[kKeyWarps], float& sum) {
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kKeyWarps; ++w) mx = fmaxf(mx, m[w]);
  sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kKeyWarps; ++w) {
    f[w] = m[w] == -INFINITY ? 0.0f : exp2f(m[w] - mx);
    sum += l[w] * f[w];
  }
  return mx;
}
// acc += f * x, 4 columns of one key warp's O (warps in order 0, 1, 2, ...).
__device__ __forceinline__ void slice_warp_accumulate(float (&acc)[4], float f, const float4& x) {
  acc[0] += x.x * f;
  acc[1] += x.y * f;
  acc[2] += x.z * f;
  acc[3] += x.w * f;
}

template <class T, int HD>
__global__ void __launch_bounds__(kWarps * 32) attention_rows_kernel(const AttentionArgs a, int splits,
                                                                      int slice_keys, int heads_per_block) {
  constexpr int kCols = HD / 32;  // output columns per lane
  __shared__ float q_s[kMaxGroupPerBlock][HD];
  __shared__ float m_s[kWarps][kMaxGroupPerBlock];
  __shared__ float l_s[kWarps][kMaxGroupPerBlock];
  __shared__ float o_s[kWarps][kMaxGroupPerBlock][HD];

  // grid.x enumerates (batch * q_len) x splits (x is the only dimension
  // without a 65535 limit), grid.y kv heads x head chunks.
  // 32-bit unsigned index math (grid.x < 2^31): a 64-bit division is a long SASS routine.
  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
  const unsigned query_row = blockIdx.x / static_cast<unsigned>(splits);  // b * q_len + i
  const int group = a.num_heads / a.num_kv_heads;
  const int chunks = (group + heads_per_block - 1) / heads_per_block;
  const int kvh = blockIdx.y / chunks;
  const int head0 = kvh * group + (blockIdx.y % chunks) * heads_per_block;
  const int heads = min(heads_per_block, kvh * group + group - head0);
  const int b = static_cast<int>(query_row / static_cast<unsigned>(a.q_len));
  const int i = static_cast<int>(query_row % static_cast<unsigned>(a.q_len));
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  const long long limit = key_limit(a, b, i, split == 0 && threadIdx.x == 0);
  const long long slice = splits > 1 ? slice_keys : limit;
  const long long begin = static_cast<long long>(split) * slice;
  const long long end = min(limit, begin + slice);
  const long long row_base = (static_cast<long long>(b) * a.num_heads + head0) * a.q_len + i;  // head0's row

  if (begin >= end) {  // a slice past the valid keys (or an empty row)
    if (splits == 1) {  // else the merge reads only the slices that hold a valid key
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
      if (d == 0) a.partial_lse[row * splits + split] = __fadd_rn(mx, log2f(sum));
    } else {
      static_cast<T*>(a.out)[row * HD + d] = from_float<T>(acc / sum);
    }
  }
}

// ── Decode on tensor cores ───────────────────────────────────────────────────

// Ring slots per key warp (>= 2). Shared memory per block is
// kStages * 4 warps * (K + V) * 16 keys * head_dim * 2 B, plus Q of 32 heads:
//   hd 64:  4 * 4 * 2 * 16 * 128 B = 64 KiB + 4 KiB   (3 blocks per SM)
//   hd 128: 3 * 4 * 2 * 16 * 256 B = 96 KiB + 8 KiB   (2 blocks per SM)
//   hd 256: 3 * 4 * 2 * 16 * 512 B = 192 KiB + 16 KiB (1 block per SM)
template <int HD>
struct DecodeTraits;
template <>
struct DecodeTraits<64> {
  static constexpr int kStages = 4;
};
template <>
struct DecodeTraits<128> {
  static constexpr int kStages = 3;
};
template <>
struct DecodeTraits<256> {
  static constexpr int kStages = 3;
};

// DecodeTuning::l2_ahead (sub-tiles per key warp requested into L2 ahead
// of the cp.async ring in large launches; see prefetch_sub) defaults to 0:
// with 2, the H200 run of 8d425d1 had B=16 L=8k at 159 us against 143 us
// for the kernel before it, which had no such prefetch and the same 512-key
// slices. bench/attention_tuning.cpp decides it.

// DecodeTuning::cluster_merge: at most the portable cluster size.
constexpr int kDecodeMaxClusterSlices = 8;

template <int HD>
struct DecodeShape {
  static constexpr int kKeyWarps = 4;    // warps splitting the keys of a tile
  static constexpr int kSub = 16;        // keys per warp per tile (one k16 step of P·V)
  static constexpr int kTileKeys = kKeyWarps * kSub;
  static constexpr int kMaxMTiles = 2;   // m16 tiles of q heads per block
  static constexpr int kMaxHeads = 16 * kMaxMTiles;
  static constexpr int kMaxWarps = kKeyWarps * kMaxMTiles;
  static constexpr int kMaxThreads = kMaxWarps * 32;
  static constexpr int kStages = DecodeTraits<HD>::kStages;
  static constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  static constexpr bool kQInRegs = HD <= 128;
  static constexpr int kSubElems = kSub * HD;  // one K or V sub-tile
  static constexpr int kRingElems = kStages * kKeyWarps * 2 * kSubElems;
  static constexpr int kQElems = kMaxHeads * HD;
  static constexpr int kSmemBytes = (kRingElems + kQElems) * 2;
  // End-of-slice merge, reusing the ring: O [warps][16][kOStride] f32 (rows
  // padded against bank conflicts), then m and l [warps][16].
  static constexpr int kOStride = HD + 8;
  static constexpr int kMergeFloats = kMaxWarps * 16 * (kOStride + 2);
  static_assert(kStages >= 2, "the ring needs a slot to fill while another is read");
  static_assert(kMergeFloats * 4 <= kRingElems * 2, "the merge fits in the drained ring");
  // DecodeTuning::cluster_merge: a slice's (O, lse) at the end of the ring,
  // beside the largest merge scratch (which starts at the ring's start).
  static constexpr int kClusterFloats = kMaxHeads * (HD + 1);
  static_assert((kMergeFloats + kClusterFloats) * 4 <= kRingElems * 2, "the cluster partials fit beside the scratch");
  static_assert(kMaxHeads * 2 * kAttnDecodeMaxSplits * 4 <= kQElems * 2, "the cluster merge's weights fit in Q");
  static_assert(kAttnDecodeMinSliceKeys % kTileKeys == 0, "whole tiles per slice (powers of two from 128)");
  static_assert(kMaxHeads * 2 * kAttnDecodeMaxSplits * 4 <= kRingElems * 2, "the slice merge fits in the ring");
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks of a row");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of sm_90");
};

// One 16-key sub-tile of K and of V into swizzled shared memory, PT threads
// (the warps sharing these keys); rows >= valid_rows are zero-filled.
//
// Plain cp.async.cg: the .L2::256B fetch hint (used until session 14) made
// the H200 decode 3-8 % slower at every large shape (B=1 L=128k: 145.4 against
// 131.7 us; B=16 L=128k: 2050 against 1888).
template <class T, int HD, int PT>
__device__ __forceinline__ void load_sub_tile(T* dk, T* dv, const T* gk, const T* gv, int valid_rows, int ptid) {
  constexpr int kChunks = HD / 8;
  constexpr int kTotal = 16 * kChunks;
  static_assert(kTotal % PT == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kTotal / PT; ++i) {
    const int idx = ptid + i * PT;
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    const int off = swz<HD>(row, chunk);
    const int goff = valid ? row * HD + chunk * 8 : 0;  // not read when invalid
    cp_async_16(smem_u32(dk + off), gk + goff, valid);
    cp_async_16(smem_u32(dv + off), gv + goff, valid);
  }
}

// Orders a ring slot among the warps that share key warp kw's sub-tiles:
// after it, the slot's cp.async data has landed for all of them (each lane
// waited for its own groups) and all are done reading the slot refilled
// next. One m-tile: the warp alone, __syncwarp (it orders memory among the
// warp's lanes). Two: the warp pair, a named barrier (ids 1..4, a literal
// per case so ptxas reserves only those).
__device__ __forceinline__ void ring_barrier(int kw, int mtiles) {
  if (mtiles == 1) {
    __syncwarp();
    return;
  }
  switch (kw) {
    case 0:
      named_barrier<1>(64);
      break;
    case 1:
      named_barrier<2>(64);
      break;
    case 2:
      named_barrier<3>(64);
      break;
    default:
      named_barrier<4>(64);
      break;
  }
}

// How a decode block finds its (sequence, run of slices, head chunk) from
// blockIdx.x, with the divisors fixed at launch: at B = 1 the block's set-up
// is its latency, and four division routines ahead of its first K / V load
// cost more than the multiply-highs.
struct DecodeBlockMap {
  FastDivmod head_chunks;  // DecodeLaunchPlan::head_chunks
  FastDivmod row_blocks;   // DecodeLaunchPlan::row_blocks
  int group = 1;           // q heads per kv head
};

// grid.x = (batch * row_blocks) * chunks, row_blocks = ceil(splits /
// slices_per_block) (chunk fastest, so the blocks of one run of slices that
// split a large group run together and share K/V through L2),
// grid.y = kv heads; blockDim = 128 * m-tiles.
template <class T, int HD>
__global__ void __launch_bounds__(DecodeShape<HD>::kMaxThreads)
    attention_decode_kernel(const AttentionArgs a, const DecodeBlockMap map, int splits, int slice_keys,
                            int slices_per_block, bool prefetch_l2, bool fused, bool cluster, bool trigger) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  timeline_mark(DecodeTimelinePoint::Entry);
  // Launched with launch_pdl: nothing global is touched before the wait,
  // but for the first sub-tiles below the newest row under a.kv_before_wait
  // (below).
  if (!a.kv_before_wait) {
    pdl_begin();
    if (trigger) pdl_trigger_dependents();  // the A/B switch of launch.cuh
  }
  using Sh = DecodeShape<HD>;
  constexpr int kStages = Sh::kStages;
  constexpr int kChunks = Sh::kChunks;
  constexpr int kKSteps = HD / 16;  // k16 steps of Q Kᵀ
  constexpr int kDT = HD / 8;       // n8 tiles of O (head dims)

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const ring = reinterpret_cast<T*>(smem_raw);  // [kStages][4 key warps][K, V][16][HD]
  T* const sQ = ring + Sh::kRingElems;              // [32][HD]

  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int mtiles = nthreads / (32 * Sh::kKeyWarps);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int kw = warp % Sh::kKeyWarps;  // which 16 keys of each tile
  const int mt = warp / Sh::kKeyWarps;  // which 16 q heads
  const int g = lane / 4;
  // DecodeTuning::cluster_merge (launched only on sm_90, one slice per
  // block, the row's slices one cluster along grid.x: block rank = slice).
  float* const cluster_out = reinterpret_cast<float*>(smem_raw + Sh::kRingElems * 2) - Sh::kClusterFloats;  // [32][HD]
  float* const cluster_lse = cluster_out + Sh::kMaxHeads * HD;                                              // [32]
  auto cluster_merge_barriers = [] {
#if __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
    cooperative_groups::this_cluster().sync();
#else
    __trap();
#endif
  };
  const int tig = lane % 4;

  // blockIdx.x = (b, run of slices_per_block slices, chunk), chunk fastest.
  const int chunks = static_cast<int>(map.head_chunks.divisor);
  unsigned seq_block = 0, chunk_u = 0, b_u = 0, run = 0;
  map.head_chunks.divmod(blockIdx.x, seq_block, chunk_u);
  map.row_blocks.divmod(seq_block, b_u, run);
  const int chunk = static_cast<int>(chunk_u);
  const int split0 = static_cast<int>(run) * slices_per_block;
  const int b = static_cast<int>(b_u);
  const int kvh = static_cast<int>(blockIdx.y);
  const int group = map.group;
  const int head0 = kvh * group + chunk * 16 * mtiles;
  const int heads = min(16 * mtiles, kvh * group + group - head0);
  const long long row0 = static_cast<long long>(b) * a.num_heads + head0;  // q / out row of head0

  const int ptid = mt * 32 + lane;  // index among the warps sharing this warp's keys
  const long long plane_row0 = (static_cast<long long>(b) * a.num_kv_heads + kvh) * a.kv_stride;
  // a.kv_before_wait (the caller's promise: nothing still running writes
  // kv_len or the rows below the newest): this warp's sub-tile 0 of the
  // block's first slice, where its 16 keys all lie below the newest row
  // (kv_len - 1, which the kernel before may be appending), requested into
  // ring stage 0 before the wait. The prologue commits it as the group it
  // would have loaded; after the wait kv_len reads the same, so it is the
  // same data. kv_len is read without a report (a write): a bad one
  // requests nothing here and is reported after the wait.
  // 16 key rows of K and V (from gk / gv, rows >= valid zero-filled) into
  // this key warp's slot of ring stage `stage`, by the warps sharing it.
  auto load_rows = [&](int stage, const T* gk, const T* gv, int valid) {
    T* const dk = ring + (stage * Sh::kKeyWarps + kw) * 2 * Sh::kSubElems;
    if (mtiles == 1) {
      load_sub_tile<T, HD, 32>(dk, dk + Sh::kSubElems, gk, gv, valid, ptid);
    } else {
      load_sub_tile<T, HD, 64>(dk, dk + Sh::kSubElems, gk, gv, valid, ptid);
    }
  };
  bool sub0_requested = false;
  if (a.kv_before_wait) {
    const long long early_limit = key_limit(a, b, 0, false);
    const long long key0 = static_cast<long long>(split0) * slice_keys + kw * Sh::kSub;
    sub0_requested = key0 + Sh::kSub <= early_limit - 1;
    if (sub0_requested) {  // what the prologue's load_sub(cur, 0, 0) would load
      load_rows(0, static_cast<const T*>(a.k) + (plane_row0 + key0) * HD,
                static_cast<const T*>(a.v) + (plane_row0 + key0) * HD, Sh::kSub);
    }
    pdl_begin();
    if (trigger) pdl_trigger_dependents();
  }

  const long long limit = key_limit(a, b, 0, split0 == 0 && chunk == 0 && tid == 0);
  if (static_cast<long long>(split0) * slice_keys >= limit) {
    // Slices past the valid keys take no part (the block does not arrive;
    // in a cluster it passes the cluster's two barriers). With no valid key
    // at all (a reported bad kv_len), slice 0 writes zeros.
    if (sub0_requested) {  // a broken promise (kv_len changed): nothing lands after the exit
      cp_async_commit();
      cp_async_wait<0>();
    }
    if (split0 == 0) {
      T* const out = static_cast<T*>(a.out) + row0 * HD;
      for (int idx = tid; idx < heads * HD; idx += nthreads) out[idx] = from_float<T>(0.0f);
    }
    if (cluster && limit > slice_keys) cluster_merge_barriers();
    return;
  }
  timeline_mark(DecodeTimelinePoint::KvLenKnown);
  const int l2_ahead = a.decode_tuning.l2_ahead;
  const bool prefetch_ahead = !prefetch_l2 && l2_ahead > 0 && mt == 0 && lane == 0;
  const float scale_log2 = a.scale * kLog2e;

  // The block's slices one after another, each exactly as a block of its own
  // would run it (the same sub-tiles per key warp, the same merges), so the
  // bits never depend on slices_per_block. The next slice's first
  // sub-tiles are requested by this slice's last iterations, in place of
  // their empty ring refills (DecodeTuning::stream_across_slices), or else
  // after the ring drained and before this one's warps merge (where the
  // merge scratch fits beside them, DecodeTuning::overlap_boundary), else
  // asked into L2 while the slice drains.
  struct SliceView {
    const T* k;  // [n_keys, HD] of this (sequence, kv head)
    const T* v;  // [n_keys, HD]
    int n_keys;
    int n_sub;  // this key warp's sub-tiles: keys [t * 64 + kw * 16, + 16)
  };
  auto view_of = [&](int split) {
    SliceView sv;
    const long long begin = static_cast<long long>(split) * slice_keys;
    sv.n_keys = static_cast<int>(min(static_cast<long long>(slice_keys), limit - begin));
    sv.n_sub = sv.n_keys > kw * Sh::kSub ? (sv.n_keys - kw * Sh::kSub + Sh::kTileKeys - 1) / Sh::kTileKeys : 0;
    sv.k = static_cast<const T*>(a.k) + (plane_row0 + begin) * HD;
    sv.v = static_cast<const T*>(a.v) + (plane_row0 + begin) * HD;
    return sv;
  };
  // Sub-tile t of a slice into ring stage `stage`: the block's sub-tiles
  // take consecutive stages (mod kStages) across its slices.
  auto load_sub = [&](const SliceView& sv, int t, int stage) {
    const int key0 = t * Sh::kTileKeys + kw * Sh::kSub;
    const long long goff = static_cast<long long>(key0) * HD;
    load_rows(stage, sv.k + goff, sv.v + goff, sv.n_keys - key0);
  };
  // Each warp may ask L2 for its sub-tiles l2_ahead beyond the ring (lane 0
  // of m-tile 0): more bytes in flight per SM without more shared memory. At
  // most 8 warps x 132 SMs x l2_ahead x 8 KiB (hd 128) wait in L2, used
  // within a few microseconds: never evicted unread.
  auto prefetch_sub = [&](const SliceView& sv, int t) {
    const int key0 = t * Sh::kTileKeys + kw * Sh::kSub;
    const auto bytes = static_cast<std::uint32_t>(min(Sh::kSub, sv.n_keys - key0)) * HD * 2u;
    prefetch_l2_bulk(sv.k + static_cast<long long>(key0) * HD, bytes);
    prefetch_l2_bulk(sv.v + static_cast<long long>(key0) * HD, bytes);
  };
  // Q (rows past the block's heads zero), its own cp.async group.
  auto load_q = [&] {
    const T* const q = static_cast<const T*>(a.q) + row0 * HD;
    for (int idx = tid; idx < 16 * mtiles * kChunks; idx += nthreads) {
      const int row = idx / kChunks;
      const int c = idx % kChunks;
      const bool valid = row < heads;
      cp_async_16(smem_u32(sQ + swz<HD>(row, c)), q + (valid ? row * HD + c * 8 : 0), valid);
    }
    cp_async_commit();
  };
  // A slice's prologue: its first kStages - 1 sub-tiles of this warp (one
  // commit group each, always committed so the group count is fixed), in
  // ring stages first_stage, first_stage + 1, ... (mod kStages). The
  // block's first slice also loads Q, as the second group: the stream from
  // DRAM starts before anything else of the set-up (at B = 1 the set-up is
  // hundreds of instructions per warp at one warp per scheduler).
  // sub0_in_flight: sub-tile 0 was requested before the wait
  // (sub0_requested), so the first group only commits it.
  auto prologue = [&](const SliceView& sv, bool with_q, int first_stage, bool sub0_in_flight) {
    if (prefetch_l2 && chunk == 0 && tid == 0) {
      // A small grid (about one block per SM): request the whole slice from
      // DRAM at once, so the cp.async stream is served from L2.
      const auto bytes = static_cast<std::uint32_t>(sv.n_keys) * HD * 2u;
      prefetch_l2_bulk(sv.k, bytes);
      prefetch_l2_bulk(sv.v, bytes);
    }
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < sv.n_sub && !(t == 0 && sub0_in_flight)) load_sub(sv, t, (first_stage + t) % kStages);
      cp_async_commit();
      if (t == 0 && with_q) load_q();
    }
    if (prefetch_ahead) {
      for (int t = kStages - 1; t < kStages - 1 + l2_ahead; ++t) {
        if (t < sv.n_sub) prefetch_sub(sv, t);
      }
    }
  };
  SliceView cur = view_of(split0);
  prologue(cur, true, 0, sub0_requested);
  // The ring stages carry across the block's slices: a slice's sub-tile 0
  // takes the stage after its predecessor's last one.
  int stage = 0;                   // of sub-tile t
  int refill_stage = kStages - 1;  // of sub-tile t - 1, refilled at t

  // The slices that hold a valid key, this block's run of them, and the
  // blocks that hold one (the blocks that arrive).
  const int used = used_slices(limit, splits, slice_keys);
  const int split_end = min(split0 + slices_per_block, used);
  const int arrivals = (used + slices_per_block - 1) / slices_per_block;
  const bool direct = fused && used == 1;  // the row's only valid slice is its output

  // The merge scratch: (m, l, O) of each warp's valid rows, [warps][hrows]
  // (one m-tile: only the block's heads; two: all 16 rows per warp). Where
  // it fits in one ring stage (overlap): in the stage of the slice's last
  // sub-tile, the one stage that the next slice's first kStages - 1
  // sub-tiles (in the next ring stages) do not fill, so those can be in
  // flight across the merge; else over the drained ring.
  const int hrows = mtiles == 1 ? heads : 16;
  const int scratch_floats = Sh::kMaxWarps / Sh::kMaxMTiles * mtiles * hrows * (Sh::kOStride + 2);
  constexpr int kSlotFloats = Sh::kKeyWarps * 2 * Sh::kSubElems / 2;
  const bool overlap = !cluster && a.decode_tuning.overlap_boundary && scratch_floats <= kSlotFloats;
  // DecodeTuning::slot_merge: with one m-tile, where the scratch fits a ring
  // stage, each key warp's rows fit its own slot of that stage (the same
  // bound), which only that warp read: it publishes there without waiting
  // for the block.
  const bool slot_merge = overlap && mtiles == 1 && a.decode_tuning.slot_merge;
  // A block that holds every valid slice of its row and merges it (fused),
  // under the slot merge with at most one (head, 4 columns) item per
  // thread, folds each slice into its row's output as the slice ends
  // (SliceFold in registers) and stores only the output: no partial stores,
  // no read back and no merge after its last slice. The same steps on the
  // same values as merge_slice_partials, so the same bits.
  // (Not at hd 256: its kernel is at ptxas's 255 registers, and the fold's 6
  // spill there.)
  const bool fold_in_block =
      HD <= 128 && fused && !cluster && !direct && arrivals == 1 && slot_merge && heads * (HD / 4) <= nthreads;
  SliceFold row_fold;
  // Head h's columns d .. d + 3 of a slice, normalized by its row sum: the
  // row's output where this is its only valid slice (direct), else the
  // slice's partial (in the cluster's shared memory, or the workspace).
  auto store_slice_quad = [&](int h, int d, int split, const float (&acc)[4], float sum) {
    if (direct) {
      vec_t<T, 4> out;
#pragma unroll
      for (int c = 0; c < 4; ++c) out.set(c, acc[c] / sum);
      out.store(static_cast<T*>(a.out) + (row0 + h) * HD + d);
    } else {
      const float4 quad = slice_partial_quad(acc, sum);
      if (cluster) {
        *reinterpret_cast<float4*>(cluster_out + h * HD + d) = quad;
      } else {
        float* const partial = a.partial_out + ((row0 + h) * splits + split) * HD + d;
        if (HD <= 128 && a.decode_tuning.partials_in_l2) {  // at hd 256 the hint costs a spill
          store_f4_l2_keep(partial, quad);
        } else {
          *reinterpret_cast<float4*>(partial) = quad;
        }
      }
    }
  };
  // Head h's log-sum-exp of a slice (base 2), beside its partial (none where
  // the slice is the row's only valid one).
  auto store_slice_lse = [&](int h, int split, float lse) {
    if (cluster) {
      cluster_lse[h] = lse;
    } else if (!direct) {
      a.partial_lse[(row0 + h) * splits + split] = lse;
    }
  };

  // ldmatrix row addresses. Chunk 2 * (4j + i) + c of a swizzled row lies
  // at offset[i] + j * 128 bytes (the swizzle only permutes the low 3 bits
  // of the chunk), so 4 offsets per operand cover every k16 step.
  //   A (Q, this warp's 16 heads): rows lane & 15, chunk c = lane >> 4
  //   K: keys (lane & 7) + 8 (lane >> 4), c = (lane >> 3) & 1: both n8 key
  //      tiles of one k16 step per ldmatrix.x4
  //   V (transposed): keys lane & 15, c = lane >> 4: two n8 dim tiles
  std::uint32_t q_off[4], k_off[4], v_off[4];
  {
    const int a_row = mt * 16 + (lane & 15);
    const int k_row = (lane & 7) + ((lane >> 4) << 3);
    const int v_row = lane & 15;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q_off[i] = smem_u32(sQ + swz<HD>(a_row, 2 * i + (lane >> 4)));
      k_off[i] = static_cast<std::uint32_t>(swz<HD>(k_row, 2 * i + ((lane >> 3) & 1)) * 2);
      v_off[i] = static_cast<std::uint32_t>(swz<HD>(v_row, 2 * i + (lane >> 4)) * 2);
    }
  }
  std::uint32_t qf[Sh::kQInRegs ? kKSteps : 1][4];

  for (int split = split0; split < split_end; ++split) {
    const bool has_next = split + 1 < split_end;
    if (split == split0) {
      cp_async_wait<kStages - 2>();  // sub-tile 0 and Q have landed
      __syncthreads();
      timeline_mark(DecodeTimelinePoint::FirstTileLanded);
      if constexpr (Sh::kQInRegs) {
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(qf[kk], q_off[kk % 4] + (kk / 4) * 128);
      }
    }

    float o[kDT][4];
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
    }
    float m_run[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8, raw score units
    float l_run[2] = {0.0f, 0.0f};           // this thread's share of the row sums

    // Every warp of the block runs the same number of iterations (key warp 0
    // has the most sub-tiles), so all warps pass the same sequence of
    // barriers; a warp whose keys ran out only keeps the ring's group count.
    // (compute-sanitizer racecheck pairs barriers by count across the block:
    // with unequal counts it reported the merge below as racing.)
    const int n_iter = (cur.n_keys + Sh::kTileKeys - 1) / Sh::kTileKeys;
    // DecodeTuning::stream_across_slices: the iterations whose ring refill
    // would lie past this slice load the next slice's first kStages - 1
    // sub-tiles instead (in the next ring stages), so the stream from
    // DRAM does not drain at the boundary; they stay in flight across the
    // merge (the scratch is the one stage they do not fill). Needs a slice
    // of at least kStages - 1 tiles of 64 keys: every slice with a next one
    // at hd 128 and 256 (kStages 3); at hd 64 (kStages 4) slices of 256 keys
    // and more, so not the 128-key slices of caches up to 2048 positions.
    const bool flow = overlap && has_next && a.decode_tuning.stream_across_slices && n_iter >= kStages - 1;
    // Without the early prologue: the iteration after which the ring has
    // nothing left to load asks L2 for the next slice's first sub-tiles.
    const int next_prefetch_t = has_next && !overlap ? max(0, n_iter - (kStages - 1)) : -1;
    for (int t = 0; t < n_iter; ++t) {
      // Sub-tile t has landed for every thread sharing it, and all of them are
      // done with sub-tile t - 1, whose slot is refilled next.
      cp_async_wait<kStages - 2>();
      ring_barrier(kw, mtiles);
      const int refill = t + kStages - 1;  // the sub-tile the freed stage takes, counted from this slice's first
      if (refill < cur.n_sub) {
        load_sub(cur, refill, refill_stage);
      } else if (flow && refill >= n_iter) {
        // The next slice's view is rebuilt where it is used (a few integer
        // ops): held across the loop it costs hd 256 a spill (ptxas, 255
        // registers).
        const SliceView next = view_of(split + 1);
        if (refill - n_iter < next.n_sub) load_sub(next, refill - n_iter, refill_stage);
      }
      cp_async_commit();
      const int t_stage = stage;
      refill_stage = stage;
      stage = stage == kStages - 1 ? 0 : stage + 1;
      if (t == next_prefetch_t && mt == 0 && lane == 0) {
        const SliceView next = view_of(split + 1);
        for (int u = 0; u < kStages - 1 && u < next.n_sub; ++u) prefetch_sub(next, u);
      }
      if (prefetch_ahead && t + kStages - 1 + l2_ahead < cur.n_sub) prefetch_sub(cur, t + kStages - 1 + l2_ahead);
      if (t >= cur.n_sub) continue;  // warp-uniform: this key warp's sub-tiles are done
      const std::uint32_t sK = smem_u32(ring + (t_stage * Sh::kKeyWarps + kw) * 2 * Sh::kSubElems);
      const std::uint32_t sV = sK + Sh::kSubElems * 2;

      // S = Q Kᵀ: 16 heads x 16 keys.
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        std::uint32_t qa[4];
        if constexpr (Sh::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[e] = qf[kk][e];
        } else {
          ldmatrix_x4(qa, q_off[kk % 4] + (kk / 4) * 128);
        }
        std::uint32_t kb[4];
        ldmatrix_x4(kb, sK + k_off[kk % 4] + (kk / 4) * 128);
        mma_16816<T>(s[0], qa, kb[0], kb[1]);
        mma_16816<T>(s[1], qa, kb[2], kb[3]);
      }

      // Keys past the slice's valid range (the last sub-tile only).
      const int key0 = t * Sh::kTileKeys + kw * Sh::kSub;
      if (key0 + Sh::kSub > cur.n_keys) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (key0 + nt * 8 + tig * 2 + (e & 1) >= cur.n_keys) s[nt][e] = -INFINITY;
          }
        }
      }

      // Online softmax per row; the quad (4 lanes) shares a row.
      online_softmax_step(s, m_run, l_run, o, scale_log2);

      // O += P V: the two n8 accumulators of S are the A fragment of P.
      const std::uint32_t pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]),
                                   pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][2], s[1][3])};
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, sV + v_off[dp % 4] + (dp / 4) * 128);
        mma_16816<T>(o[2 * dp], pa, vb[0], vb[1]);
        mma_16816<T>(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    // Publishes this warp's (m in base-2 units, l, O) of each of its valid
    // rows (below hrows: the block's heads with one m-tile) into a merge
    // scratch: row r's O at o_rows + r * kOStride, its m at m_rows[r], its l
    // at l_rows[r]. Both merges at a slice's end publish through it.
    auto publish_warp_rows = [&](float* o_rows, float* m_rows, float* l_rows) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = g + 8 * r;
        if (row >= hrows) continue;
        if (tig == 0) {
          m_rows[row] = m_run[r] == -INFINITY ? -INFINITY : m_run[r] * scale_log2;
          l_rows[row] = l;
        }
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          *reinterpret_cast<float2*>(o_rows + row * Sh::kOStride + dt * 8 + tig * 2) =
              make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
        }
      }
    };
    const SliceView next = has_next ? view_of(split + 1) : cur;
    if (slot_merge) {
      // Two block barriers per boundary, not four: each key warp publishes
      // its (m, l, O) into its own slot of the stage of its last sub-tile
      // (refill_stage), then every thread merges a head's 4 columns,
      // computing that head's warp weights itself (no step of one thread per
      // head between two barriers); the second barrier keeps the slots until
      // the next slice's first refill takes that stage.
      if (!flow) cp_async_wait<0>();
      __syncwarp();  // the warp's lanes are done reading its slot
      timeline_mark(DecodeTimelinePoint::SliceComputed);
      if (has_next && !flow) prologue(next, false, stage, false);  // fills the other stages
      auto warp_slot = [&](int w) {  // [heads][kOStride] O, then [heads] m, [heads] l
        return reinterpret_cast<float*>(ring + (refill_stage * Sh::kKeyWarps + w) * 2 * Sh::kSubElems);
      };
      {
        float* const so = warp_slot(kw);  // one m-tile: hrows == heads
        publish_warp_rows(so, so + heads * Sh::kOStride, so + heads * Sh::kOStride + heads);
      }
      __syncthreads();  // every warp's rows are published
      timeline_mark(DecodeTimelinePoint::WarpsPublished);
      constexpr int kQuads = HD / 4;
      for (int idx = tid; idx < heads * kQuads; idx += nthreads) {
        const int h = idx / kQuads;
        const int d = (idx % kQuads) * 4;
        float mw[Sh::kKeyWarps], lw[Sh::kKeyWarps], f[Sh::kKeyWarps];
#pragma unroll
        for (int w = 0; w < Sh::kKeyWarps; ++w) {
          const float* const sm = warp_slot(w) + heads * Sh::kOStride;
          mw[w] = sm[h];
          lw[w] = sm[heads + h];
        }
        float sum;  // > 0: key 0 of the slice is valid and belongs to key warp 0
        const float mx = slice_warp_weights(mw, lw, f, sum);
        if (d == 0 && !fold_in_block) store_slice_lse(h, split, __fadd_rn(mx, log2f(sum)));
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < Sh::kKeyWarps; ++w) {
          slice_warp_accumulate(acc, f[w], *reinterpret_cast<const float4*>(warp_slot(w) + h * Sh::kOStride + d));
        }
        if (fold_in_block) {  // the lse and partial store_slice_lse / store_slice_quad would store
          row_fold.add(__fadd_rn(mx, log2f(sum)), slice_partial_quad(acc, sum));
        } else {
          store_slice_quad(h, d, split, acc, sum);
        }
      }
      __syncthreads();  // every thread is done with the slots: the next slice's first refill takes that stage
      timeline_mark(DecodeTimelinePoint::SliceStored);
      cur = next;
      continue;
    }
    // Without flow only empty groups can remain: leave none behind. With it
    // the next slice's first sub-tiles stay in flight.
    if (!flow) cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring: the scratch and the next prologue may overwrite it
    timeline_mark(DecodeTimelinePoint::SliceComputed);
    // Fills the next kStages - 1 ring stages (from `stage`, that of sub-tile
    // n_iter), not the scratch's: refill_stage, that of the last sub-tile.
    if (overlap && has_next && !flow) prologue(next, false, stage, false);
    float* const mo = overlap ? reinterpret_cast<float*>(ring + refill_stage * Sh::kKeyWarps * 2 * Sh::kSubElems)
                              : reinterpret_cast<float*>(smem_raw);  // [warps][hrows][kOStride]
    float* const mm = mo + Sh::kMaxWarps / Sh::kMaxMTiles * mtiles * hrows * Sh::kOStride;  // [warps][hrows]
    float* const ml = mm + Sh::kMaxWarps / Sh::kMaxMTiles * mtiles * hrows;                  // [warps][hrows]

    publish_warp_rows(mo + warp * hrows * Sh::kOStride, mm + warp * hrows, ml + warp * hrows);
    __syncthreads();
    timeline_mark(DecodeTimelinePoint::WarpsPublished);

    // Merge the key warps of each head in a fixed order; normalize per slice.
    // The row's only valid slice (fused) is its final output. First one
    // thread per head: the key warps' factors 2^(m_w - max) (0 for a warp
    // that saw no key: its O is exactly 0) over their m, the row sum in
    // their l slot of key warp 0, the slice's lse. Then 4 columns per thread.
    // (Computing the factors per column made this the longest serial step of
    // a short decode: 1.4 us at B = 1, session 15.)
    for (int h = tid; h < heads; h += nthreads) {
      const int wrow = (h / 16) * Sh::kKeyWarps * hrows + h % 16;  // row of key warp 0 of h's m-tile
      float mw[Sh::kKeyWarps], lw[Sh::kKeyWarps], f[Sh::kKeyWarps];
#pragma unroll
      for (int w = 0; w < Sh::kKeyWarps; ++w) {
        mw[w] = mm[wrow + w * hrows];
        lw[w] = ml[wrow + w * hrows];
      }
      float sum;
      const float mx = slice_warp_weights(mw, lw, f, sum);
#pragma unroll
      for (int w = 0; w < Sh::kKeyWarps; ++w) mm[wrow + w * hrows] = f[w];
      ml[wrow] = sum;  // key 0 of the slice is valid and belongs to key warp 0: sum > 0
      store_slice_lse(h, split, __fadd_rn(mx, log2f(sum)));
    }
    __syncthreads();
    constexpr int kQuads = HD / 4;
    for (int idx = tid; idx < heads * kQuads; idx += nthreads) {
      const int h = idx / kQuads;
      const int d = (idx % kQuads) * 4;
      const int wrow = (h / 16) * Sh::kKeyWarps * hrows + h % 16;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int w = 0; w < Sh::kKeyWarps; ++w) {
        slice_warp_accumulate(acc, mm[wrow + w * hrows],
                              *reinterpret_cast<const float4*>(mo + (wrow + w * hrows) * Sh::kOStride + d));
      }
      store_slice_quad(h, d, split, acc, ml[wrow]);
    }
    __syncthreads();  // every thread is done with the scratch: the ring refills over it
    timeline_mark(DecodeTimelinePoint::SliceStored);
    if (!overlap && has_next) prologue(next, false, stage, false);
    cur = next;
  }  // slices
  if (fold_in_block) {
    if (tid < heads * (HD / 4)) {
      store_folded_quad(static_cast<T*>(a.out) + row0 * HD + tid * 4, row_fold.acc, row_fold.l);
    }
    return;
  }
  if (cluster && used > 1) {
    // The row's slices are this cluster's blocks (block rank = slice): after
    // the barrier every block's (O, lse) is readable through distributed
    // shared memory; blocks 0 .. used - 1 merge a share of the heads each;
    // the second barrier keeps every block's partials alive until the last
    // read. (With one valid slice the block wrote the output directly.)
#if __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
    timeline_mark(DecodeTimelinePoint::Arrived);
    if (split0 < used) {
      const int h_begin = split0 * heads / used;
      const int h_end = (split0 + 1) * heads / used;
      if (h_begin < h_end) {
        merge_slice_partials<T, HD>(ClusterPartials<HD>{cluster_out, cluster_lse}, static_cast<T*>(a.out) + row0 * HD,
                                    h_begin, h_end, used, reinterpret_cast<float*>(sQ));
      }
    }
    cooperative_groups::this_cluster().sync();
    timeline_mark(DecodeTimelinePoint::RowMerged);
#else
    __trap();
#endif
    return;
  }
  if (direct || !fused) return;  // done, or attention_combine_kernel merges
  if (arrivals == 1) {
    // The block holds every valid slice of the row: its own partials,
    // visible to it after the barrier above, merge here.
    merge_slice_partials<T, HD>(WorkspacePartials<HD>::of(a, row0, splits),
                                static_cast<T*>(a.out) + row0 * HD, 0, heads, used,
                                reinterpret_cast<float*>(smem_raw));
    return;
  }

  // Arrive. The last of the `arrivals` blocks of this (sequence, kv head,
  // chunk) merges their partials. Every writer fences before the arrival
  // (release: its partials are visible device-wide first); the last block
  // fences after it (acquire) and reads the partials through L2. (One
  // thread's fence after the barrier, as in a cooperative-groups grid sync,
  // measured 0.3-1 us slower at B = 1 in session 14.)
  unsigned int* const s_last = reinterpret_cast<unsigned int*>(sQ);  // Q is no longer read
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    unsigned int* const counter =
        g_decode_arrivals + (static_cast<long long>(b) * a.num_kv_heads + kvh) * chunks + chunk;
    // atomicInc wraps to 0 after arrivals - 1: the last arrival leaves it zero.
    const unsigned int last = static_cast<unsigned int>(arrivals - 1);
    *s_last = atomicInc(counter, last) == last ? 1u : 0u;
  }
  __syncthreads();
  timeline_mark(DecodeTimelinePoint::Arrived);
  if (*s_last == 0) return;
  __threadfence();
  merge_slice_partials<T, HD>(WorkspacePartials<HD>::of(a, row0, splits),
                              static_cast<T*>(a.out) + row0 * HD, 0, heads, used,
                              reinterpret_cast<float*>(smem_raw));
  __syncthreads();
  timeline_mark(DecodeTimelinePoint::RowMerged);
#else
  __trap();  // built without sm_80+: the launcher never launches this
#endif
}

// The merge as a kernel of its own, one block per (sequence, head): after
// attention_rows_kernel, and after the tensor-core kernel when the launch is
// not fused (more (sequence, kv head, chunk) groups than
// DecodeTuning::fused_max_groups_per_sm per SM or than arrival counters, or
// fused_merge off). The same arithmetic as the fused merge, so the same bits.
constexpr int kCombineThreads = 64;

template <class T, int HD>
__global__ void __launch_bounds__(kCombineThreads)
    attention_combine_kernel(const AttentionArgs a, int splits, int slice_keys) {
  __shared__ __align__(8) float smem[2 * kAttnDecodeMaxSplits];
  const long long row = blockIdx.x;  // b * num_heads + head (q_len == 1)
  const long long limit = key_limit(a, static_cast<int>(blockIdx.x / static_cast<unsigned>(a.num_heads)), 0, false);
  const int used = used_slices(limit, splits, slice_keys);
  merge_slice_partials<T, HD>(WorkspacePartials<HD>::of(a, row, splits),
                              static_cast<T*>(a.out) + row * HD, 0, 1, used, smem);
}

// Blocks of Kernel resident per SM at `threads` threads (128 or 256) and
// kSmemBytes of dynamic shared memory, asked once per device and block size
// (the kernel and its shared memory are template arguments: each pair keeps
// answers of its own).
template <auto Kernel, int kSmemBytes>
int resident_blocks(int threads) {
  static PerDeviceAnswers<int, 2> known;
  const int device = current_device_index("flash_attention");
  return *known.get(device, threads > 128 ? 1 : 0, [&]() -> std::optional<int> {
    int blocks = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, threads, kSmemBytes);
    if (err != cudaSuccess) throw_cuda_error("flash_attention", "cudaOccupancyMaxActiveBlocksPerMultiprocessor", err);
    return std::max(blocks, 1);
  });
}

// The arguments the decode and combine kernels receive: DecodeTuning::
// partials_in_l2 replaced by whether the launch takes it (the plan's
// footprint rule; never for the CUDA-core fallback, whose partials are
// stored plainly).
AttentionArgs with_partials_in_l2(const AttentionArgs& a, bool taken) {
  AttentionArgs k = a;
  k.decode_tuning.partials_in_l2 = taken;
  return k;
}

template <class T, int HD>
void launch_combine(const AttentionArgs& a, int splits, int slice_keys, cudaStream_t stream) {
  attention_combine_kernel<T, HD>
      <<<static_cast<unsigned>(a.batch * a.num_heads), kCombineThreads, 0, stream>>>(a, splits, slice_keys);
  check_launch("flash_attention (combine)");
}

// Whether clusters of `slices` blocks of the decode kernel (`threads`
// threads, its shared-memory opt-in done) can be resident at all
// (cudaOccupancyMaxActiveClusters > 0) on the current device, which must be
// sm_90+ and run a build holding the kernel's sm_90 code. Where not, the
// launch merges as without DecodeTuning::cluster_merge: the same bits.
// Asked once per device, cluster size and block size; a failed query (the
// current device's included: this never throws) is no answer, not cached,
// and the launch takes the other merge.
template <class T, int HD>
bool decode_cluster_fits(int slices, unsigned threads) {
  if (slices < 2 || slices > kDecodeMaxClusterSlices) return false;
  static PerDeviceAnswers<bool, (kDecodeMaxClusterSlices + 1) * 2> known;
  const int dev = try_current_device_index();
  if (dev < 0) return false;
  return known
      .get(dev, slices * 2 + (threads > 128 ? 1 : 0),
           [&]() -> std::optional<bool> {
             if (!device_is_sm90_or_later() || !has_sm90_code<attention_decode_kernel<T, HD>>()) return false;
             int clusters = 0;
             if (max_active_clusters(&clusters, attention_decode_kernel<T, HD>,
                                     dim3(static_cast<unsigned>(slices), 1, 1), dim3(threads),
                                     DecodeShape<HD>::kSmemBytes) != cudaSuccess) {
               return std::nullopt;  // no answer: not remembered
             }
             return clusters > 0;
           })
      .value_or(false);
}

// How launch_decode_typed runs a decode (DecodeLaunchPlan); false where the
// device cannot run the kernel (no sm_80+ image or shared-memory opt-in).
template <class T, int HD>
bool plan_decode_typed(const AttentionArgs& a, DecodeLaunchPlan& plan) {
  using Sh = DecodeShape<HD>;
  // One shared-memory opt-in per device, at the larger of the kernel's own
  // size and the sole-block size (DecodeTuning::sole_block_per_sm): set at
  // two sizes, racing threads could leave it below a launch's.
  const int sole = device_sole_block_smem("flash_attention");
  if (!prepare_kernel<attention_decode_kernel<T, HD>>("flash_attention", std::max(Sh::kSmemBytes, sole))) return false;
  const int splits = attention_decode_splits(a.kv_stride);
  const int slice_keys = static_cast<int>(attention_decode_slice_keys(a.kv_stride));
  const int group = a.num_heads / a.num_kv_heads;
  const int mtiles = group > 16 ? Sh::kMaxMTiles : 1;
  const int chunks = (group + 16 * mtiles - 1) / (16 * mtiles);
  const long long groups = static_cast<long long>(a.batch) * a.num_kv_heads * chunks;
  const int smem = Sh::kSmemBytes;
  const unsigned threads = static_cast<unsigned>(Sh::kKeyWarps * 32 * mtiles);
  // Slices per block (DecodeTuning::slices_per_block).
  int per_block = a.decode_tuning.slices_per_block;
  // DecodeTuning::cluster_merge wants one slice per block.
  const bool cluster_shape = a.decode_tuning.cluster_merge && a.decode_tuning.fused_merge && chunks == 1 &&
                             splits >= 2 && splits <= kDecodeMaxClusterSlices;
  if (per_block <= 0 && cluster_shape) per_block = 1;
  const long long sms = device_sm_count("flash_attention");
  if (per_block <= 0) {
    const int resident = resident_blocks<attention_decode_kernel<T, HD>, Sh::kSmemBytes>(static_cast<int>(threads));
    const long long slots = static_cast<long long>(resident) * sms;
    per_block = default_slices_per_block(groups, splits, slice_keys, slots, sms, a.decode_tuning.tail_free_slices);
  }
  per_block = std::min(per_block, splits);
  const int row_blocks = (splits + per_block - 1) / per_block;
  // L2 prefetch of whole slices only while everything the launch may read
  // fits well inside L2 (else prefetched lines would be evicted unread).
  const double footprint = static_cast<double>(a.batch) * a.num_kv_heads * static_cast<double>(a.kv_stride) * HD * 4.0;
  // The row's slices as one cluster (DecodeTuning::cluster_merge): one
  // slice per block, one head chunk (so a row's blocks are adjacent in
  // grid.x), 2 .. 8 slices; it merges in the kernel at any launch size.
  const bool cluster = cluster_shape && per_block == 1 && decode_cluster_fits<T, HD>(splits, threads);
  // Otherwise the kernel finishes every row itself (no second launch) where
  // one block holds the whole row, and in launches of few (sequence, kv
  // head, chunk) groups (DecodeTuning), never past the arrival counters.
  const bool fused =
      splits == 1 || cluster ||
      (a.decode_tuning.fused_merge &&
       (row_blocks == 1 || (groups <= kDecodeArrivalSlots &&
                            static_cast<double>(groups) <=
                                a.decode_tuning.fused_max_groups_per_sm * static_cast<double>(sms))));
  plan.splits = splits;
  plan.slice_keys = slice_keys;
  plan.slices_per_block = per_block;
  plan.head_chunks = chunks;
  plan.row_blocks = row_blocks;
  plan.grid_x = static_cast<long long>(a.batch) * row_blocks * chunks;
  plan.grid_y = a.num_kv_heads;
  plan.threads = static_cast<int>(threads);
  plan.prefetch_l2 = footprint <= a.decode_tuning.l2_prefetch_bytes;
  plan.fused = fused;
  plan.cluster = cluster;
  // The partials kept in L2 pay only where the K / V stream would evict them
  // before their merge (else the hint and the discard are pure cost: 1-2 %
  // at B = 1 L = 1k / 4k).
  const double l2_keep_floor = a.decode_tuning.partials_in_l2_min_bytes < 0.0
                                   ? static_cast<double>(device_l2_bytes("flash_attention"))
                                   : a.decode_tuning.partials_in_l2_min_bytes;
  plan.partials_in_l2 = a.decode_tuning.partials_in_l2 && footprint > l2_keep_floor;
  // A one-wave launch (not a cluster launch) at the sole-block size, where
  // that is more than the kernel's own: a later launch's early-placed blocks
  // of that size then never share an SM with one of this launch's.
  const bool sole_launch = a.decode_tuning.sole_block_per_sm && !cluster && plan.grid_x * plan.grid_y <= sms;
  plan.smem_bytes = sole_launch && sole > smem ? sole : smem;
  return true;
}

template <class T, int HD>
bool launch_decode_typed(const AttentionArgs& a, cudaStream_t stream) {
  DecodeLaunchPlan p;
  if (!plan_decode_typed<T, HD>(a, p)) return false;
  const AttentionArgs ka = with_partials_in_l2(a, p.partials_in_l2);
  const dim3 grid(static_cast<unsigned>(p.grid_x), static_cast<unsigned>(p.grid_y));
  DecodeBlockMap map;
  map.head_chunks = FastDivmod(static_cast<std::uint32_t>(p.head_chunks));
  map.row_blocks = FastDivmod(static_cast<std::uint32_t>(p.row_blocks));
  map.group = a.num_heads / a.num_kv_heads;
  launch_pdl_clustered("flash_attention", dim3(p.cluster ? static_cast<unsigned>(p.splits) : 1u, 1, 1),
                       attention_decode_kernel<T, HD>, grid, static_cast<unsigned>(p.threads),
                       static_cast<std::size_t>(p.smem_bytes), stream, ka, map, p.splits, p.slice_keys,
                       p.slices_per_block, p.prefetch_l2, p.fused, p.cluster, launch_switches().pdl_early_trigger);
  if (!p.fused) launch_combine<T, HD>(ka, p.splits, p.slice_keys, stream);
  check_launch("flash_attention");
  return true;
}

// Decode (q_len == 1) on tensor cores; false (nothing launched) where it
// does not apply, so the caller falls back to the CUDA-core kernel.
bool decode_tc_applies(const AttentionArgs& a) {
  if (a.q_len != 1 || a.kv_stride < 1) return false;
  if (a.dtype != DType::F16 && a.dtype != DType::BF16) return false;
  if (!attention_head_dim_supported(static_cast<std::size_t>(a.head_dim))) return false;
  if (a.num_kv_heads < 1 || a.num_kv_heads > static_cast<long long>(kAttentionMaxGridYZ) ||
      a.num_heads % a.num_kv_heads != 0) {
    return false;
  }
  // out too: the kernel stores 4 elements at once (8 bytes). A misaligned q
  // falls back to the CUDA-core kernel, which reads q one element at a time;
  // so does a misaligned out, which that kernel writes one element at a
  // time where a row has one slice (its combine stores 4 at once).
  return all_aligned16(a.q, a.k, a.v, a.out);
}

bool launch_attention_decode_tc(const AttentionArgs& a, cudaStream_t stream) {
  if (!decode_tc_applies(a)) return false;
  bool launched = false;
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int(AttentionHeadDims{}, a.head_dim, "flash_attention", "head_dim", [&](auto hd_c) {
      launched = launch_decode_typed<T, decltype(hd_c)::value>(a, stream);
    });
  });
  return launched;
}

}  // namespace

std::optional<DecodeLaunchPlan> decode_launch_plan(const AttentionArgs& a) {
  if (!decode_tc_applies(a)) return std::nullopt;
  DecodeLaunchPlan plan;
  bool planned = false;
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int(AttentionHeadDims{}, a.head_dim, "flash_attention", "head_dim", [&](auto hd_c) {
      planned = plan_decode_typed<T, decltype(hd_c)::value>(a, plan);
    });
  });
  if (!planned) return std::nullopt;
  return plan;
}

#if defined(FERRUM_DECODE_TIMELINE)
void decode_timeline_reset() { zero_device_symbol("decode_timeline", g_decode_timeline); }

std::vector<DecodeTimelineBlock> decode_timeline_read() {
  std::vector<DecodeTimelineBlock> rows(kDecodeTimelineBlocks);
  const cudaError_t err = cudaMemcpyFromSymbol(rows.data(), g_decode_timeline, sizeof(g_decode_timeline));
  if (err != cudaSuccess) throw_cuda_error("decode_timeline", "cudaMemcpyFromSymbol", err);
  return rows;
}
#endif

std::size_t attention_workspace_floats(int batch, int num_heads, int q_len, int head_dim, long long kv_stride) {
  if (q_len != 1) return 0;
  // Past size_t: the most there is, which no workspace holds (the caller's
  // capacity check then names it).
  return attention_decode_workspace_floats(static_cast<std::size_t>(batch), static_cast<std::size_t>(num_heads),
                                           static_cast<std::size_t>(head_dim), kv_stride)
      .value_or(static_cast<std::size_t>(-1));
}

void launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  // Decode runs on tensor cores wherever the device allows (sm_80+),
  // prefill on the wgmma kernel (sm_90a) or else the mma.sync kernel
  // wherever those apply; the CUDA-core kernel below is the fallback for
  // both.
  if (a.q_len == 1) {
    if (launch_attention_decode_tc(a, stream)) return;
  } else {
    if (a.prefill_wgmma && launch_attention_prefill_wgmma(a, stream)) return;
    if (launch_attention_prefill_tc(a, stream)) return;
  }
  // The CUDA-core kernel: what its grid and loads need, which the validating
  // layer guarantees (every tensor-core kernel declined, so something here
  // is unusual: name it rather than fault).
  if (a.num_kv_heads < 1 || a.num_heads < 1 || a.num_heads % a.num_kv_heads != 0) {
    throw_bad_dispatch("flash_attention", "num_heads / num_kv_heads (fallback kernel)", a.num_kv_heads);
  }
  if (a.q_len == 1 && a.kv_stride < 1) throw_bad_dispatch("flash_attention", "kv_stride (fallback kernel)", a.kv_stride);
  if (!all_aligned16(a.k, a.v)) {
    throw_bad_dispatch("flash_attention", "k / v 16-byte alignment (fallback kernel's vector loads)",
                       static_cast<long long>(reinterpret_cast<std::uintptr_t>(all_aligned16(a.k) ? a.v : a.k) % 16));
  }
  const int splits = a.q_len == 1 ? attention_decode_splits(a.kv_stride) : 1;
  if (splits > 1 && reinterpret_cast<std::uintptr_t>(a.out) % 8 != 0) {
    throw_bad_dispatch("flash_attention", "out 8-byte alignment (the fallback's split combine stores 4 elements)",
                       static_cast<long long>(reinterpret_cast<std::uintptr_t>(a.out) % 8));
  }
  const int slice_keys = static_cast<int>(attention_decode_slice_keys(a.kv_stride));
  const int group = a.num_heads / a.num_kv_heads;
  const int heads_per_block = group < kMaxGroupPerBlock ? group : kMaxGroupPerBlock;
  const int chunks = (group + heads_per_block - 1) / heads_per_block;
  const dim3 grid(static_cast<unsigned>(static_cast<long long>(a.batch) * a.q_len * splits),
                  static_cast<unsigned>(a.num_kv_heads * chunks));
  dispatch_half_dtype(a.dtype, "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_int(AttentionHeadDims{}, a.head_dim, "flash_attention", "head_dim", [&](auto hd_c) {
      constexpr int HD = decltype(hd_c)::value;
      attention_rows_kernel<T, HD><<<grid, kWarps * 32, 0, stream>>>(a, splits, slice_keys, heads_per_block);
      check_launch("flash_attention");  // before the combine is queued behind a failed launch
      if (splits > 1) launch_combine<T, HD>(with_partials_in_l2(a, false), splits, slice_keys, stream);
    });
  });
  check_launch("flash_attention");
}

}  // namespace ferrum::kernels
