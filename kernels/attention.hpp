// Launcher for flash_attention. The caller (CudaBackend) has validated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include <cuda_runtime_api.h>

#include "ferrum/dtype.hpp"
#include "kernels/attention_split.hpp"
#include "kernels/common/int_list.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

// The head sizes the attention kernels are built for (prefill and decode:
// their dispatch and CudaBackend::supports_head_dim both read this list).
using AttentionHeadDims = IntList<64, 128, 256>;
constexpr bool attention_head_dim_supported(std::size_t head_dim) {
  return int_list_contains(AttentionHeadDims{}, head_dim);
}

// Heads (decode: kv heads; prefill: query heads and sequences) index a grid
// dimension y or z, which holds at most this many blocks.
constexpr std::size_t kAttentionMaxGridYZ = 65535;

// Arrival counters of the decode kernel's in-kernel merge, one per
// (sequence, kv head, head chunk) group of a launch: a launch of more
// groups merges in the combine kernel, whatever DecodeTuning allows.
constexpr int kDecodeArrivalSlots = 1 << 16;

// Slices per block for a decode launch of `groups` (sequence, kv head, head
// chunk) rows of `splits` slices of `slice_keys` keys on `sms` SMs with
// `slots` block slots, chosen by the launch's last wave
// (DecodeTuning::tail_free_slices, the default). A launch streams at full
// speed while about one block per SM is resident, so a power of two p
// dividing splits costs p * (1 - last / sms) for a last wave of `last` <
// sms blocks, else nothing. Among the tail-free p: the most slices whose
// block stays within max_block_keys keys, else the fewest; with none
// tail-free, the cheapest (the fewer slices on a tie). Only p dividing
// splits: else the last block of every row holds splits % p slices, the
// blocks are unequal and the wave model above does not hold (a capacity of
// 12288 positions is 12 slices: p = 1, 2 or 4).
//
// The bounds, from the H200 sweeps of session 32 (docs/design/
// decode_attention.md §4.9; tests/cpu/kernels/test_decode_plan.cpp pins them):
//   - slices of 512 keys and more (caches past 4096 positions), fewer
//     groups than slots: 4096 keys. Fitted on 33 points B = 3..32, L =
//     8k..128k, with session 31's 9: within 2.2 % of the fastest explicit
//     choice (0.4 % on the geometric mean), against the 90 %-of-slots rule
//     it replaced 8 % faster on the geometric mean of the 42; 8192 keys was
//     9 % off the fastest at B = 18 L = 8k. Run as the default on the 33
//     (call 2): 10 % faster than the 90 % rule on the geometric mean, up to
//     23 % (B = 18 L = 8k), at worst 1.1 % slower (B = 16 L = 128k).
//   - slices under 512 keys (caches up to 4096 positions), any batch: 2048
//     keys (16 slices of 128; the sweep ran no more). Fitted on 30 points
//     B = 2..64, L = 1k, 2k, 4k of 128-key slices (call 3): within 2.2 % of
//     the fastest (0.1 % on the geometric mean), never slower than the rule
//     it replaced; 1024 keys was 8 % off at B = 16 L = 4k. Run as the
//     default (call 4): up to 9 % faster (B = 24 L = 2k, B = 48 L = 1k),
//     within 2.7 % of the fastest. With 256-key slices at 4096 (session 35,
//     6 points B = 1..64): within 1.8 % of the fastest.
inline constexpr long long kTailFreeBlockKeys = 4096;
inline constexpr long long kTailFreeShortBlockKeys = 2048;
constexpr int tail_free_slices_per_block(long long groups, int splits, long long slice_keys, long long slots,
                                         long long sms, long long max_block_keys) {
  if (groups <= 0 || splits <= 0 || slots <= 0 || sms <= 0) return 1;
  int best_free_short = 0, best_free_any = 0, cheapest = 1;
  double cheapest_cost = -1.0;
  for (int p = 1; p <= splits && splits % p == 0; p *= 2) {
    const long long blocks = groups * (splits / p);
    const long long last = blocks - (blocks - 1) / slots * slots;  // blocks in the last wave, 1 .. slots
    const double cost = last >= sms ? 0.0 : p * (1.0 - static_cast<double>(last) / static_cast<double>(sms));
    if (cost == 0.0) {
      if (best_free_any == 0) best_free_any = p;
      if (p * slice_keys <= max_block_keys) best_free_short = p;
    }
    if (cheapest_cost < 0.0 || cost < cheapest_cost) {
      cheapest_cost = cost;
      cheapest = p;
    }
  }
  if (best_free_short > 0) return best_free_short;
  if (best_free_any > 0) return best_free_any;
  return cheapest;
}

// The default slices per block of a decode launch (DecodeTuning::
// slices_per_block = 0) of `groups` rows of `splits` slices of `slice_keys`
// keys, `slots` block slots on `sms` SMs; kernels/attention.cu's plan calls
// it, tests/cpu/kernels/test_decode_plan.cpp checks it. tail_free: the rules of
// session 32 (DecodeTuning::tail_free_slices), else those before.
//   - slices under 512 keys (caches up to 4096 positions), any batch: tail-free
//     within kTailFreeShortBlockKeys when the slices are a power of two (8
//     and 16: what the sweeps measured); a count like 9 or 12 would leave the
//     tail-free rule few or no divisors (9: only one slice per block, which
//     lost 16-26 % at B = 32 and 64 in the sweep), so it keeps the older
//     rule, not measured at such counts. Older rule:
//     doubled while a block stays within 1024 keys and the launch keeps at
//     least half a block per slot (H200, session 14: B=64 L=1k 106 -> 86
//     us, B=16 L=1k 36 -> 27 us).
//   - longer slices, fewer groups than slots: tail-free within
//     kTailFreeBlockKeys (any slice count: long rows run well at one slice
//     per block); older rule: doubled while the launch keeps 90 % of a block
//     per slot.
//   - longer slices, at least a block per slot at one slice per block: one
//     (many waves, so no tail to fill; B = 64 at 8k and 32k lost 1-2 % at 2
//     to 8 in session 14's sweep, B = 40..64 at 8k 0.6-1.3 % at 4 in
//     session 32's).
constexpr int default_slices_per_block(long long groups, int splits, long long slice_keys, long long slots,
                                       long long sms, bool tail_free) {
  if (groups <= 0 || splits <= 1 || slots <= 0) return 1;
  auto blocks_at = [&](long long per) { return groups * ((splits + per - 1) / per); };
  int per_block = 1;
  if (slice_keys < 512) {
    if (tail_free && (splits & (splits - 1)) == 0) {
      return tail_free_slices_per_block(groups, splits, slice_keys, slots, sms, kTailFreeShortBlockKeys);
    }
    while (per_block * 2 <= splits && per_block * 2 * slice_keys <= 1024 && 2 * blocks_at(per_block * 2) >= slots) {
      per_block *= 2;
    }
  } else if (groups < slots) {
    if (tail_free) return tail_free_slices_per_block(groups, splits, slice_keys, slots, sms, kTailFreeBlockKeys);
    while (per_block * 2 <= splits && 10 * blocks_at(per_block * 2) >= 9 * slots) per_block *= 2;
  }
  return per_block;
}

// Launch knobs of the tensor-core decode. The defaults are the library's
// choice and every caller leaves them; bench/attention_tuning.cpp sweeps
// them (the A/B runs of docs/design/decode_attention.md). None changes a
// result: slices, their order and the merge order stay the same.
struct DecodeTuning {
  // Sub-tiles per key warp asked into L2 beyond the cp.async ring, in
  // launches too large for the whole-slice prefetch. 0: none.
  int l2_ahead = 0;
  // Launch footprint (K + V bytes over batch x kv heads x capacity) up to
  // which every block prefetches its whole slice into L2 (H200: 50 MiB L2).
  // 0: never. Measured on the H200 (ferrum_attention_tuning, 2026-11-30):
  // at 36 MiB, B=1 L=4k took 13.8 µs against 12.4 without, L=8k 17.8
  // against 15.4; no shape gained. Kept as a knob for other GPUs.
  double l2_prefetch_bytes = 0.0;
  // The last block of a row merges its slices (else a second kernel does)
  // in launches of at most fused_max_groups_per_sm (sequence, kv head,
  // chunk) groups per SM. On the H200 (f16, 8 kv heads, hd 128; session 13)
  // the fused merge won at B = 1 (2-4 µs) and B = 16 (1-3 %, 1 group per
  // SM), the combine kernel at B = 64 (0.5-7 %, 3.9 groups per SM); 2 is
  // between the two, not measured closer. A block that holds a whole row
  // (slices_per_block) merges it itself at any launch size, unless
  // fused_merge = false: then the second kernel always merges.
  bool fused_merge = true;
  double fused_max_groups_per_sm = 2.0;
  // Consecutive slices of one (sequence, kv head, chunk) per block, run one
  // after another (each exactly as alone: the bits never change). 0: a
  // power of two by the launch, default_slices_per_block (slots = blocks
  // per SM x SMs). A block holding every valid slice of its row merges them
  // itself.
  int slices_per_block = 0;
  // With slices_per_block 0: default_slices_per_block's tail-free rules
  // (session 32); false: the rules before them.
  bool tail_free_slices = true;
  // At a slice's end each key warp publishes its (m, l, O) into its own
  // slot of the ring stage of its last sub-tile (which only it read), so
  // the block merges with two barriers instead of four, every thread
  // computing its head's warp weights itself: with one m-tile (up to 16 q
  // heads per block) where overlap_boundary's scratch fits (up to 14 heads
  // at hd 128). false: the four-barrier merge. The same bits.
  bool slot_merge = true;
  // A block running several slices requests the next slice's first
  // sub-tiles before it merges its warps (the merge scratch then sits in the
  // ring stage of the slice's last sub-tile, the one those do not fill,
  // where it fits: up to 14 heads per block at hd 128); false: after the
  // merge, with those sub-tiles asked into L2 meanwhile. The same bits.
  bool overlap_boundary = true;
  // With overlap_boundary: the next slice's first sub-tiles are requested
  // by the current slice's last iterations, in place of their empty ring
  // refills, so the ring never drains at a slice boundary; false: after
  // the ring drained (the rule before session 33). At hd 64 it needs
  // slices of 256 keys or more (kStages 4). The same bits. H200
  // (session 33, 22 points): up to 5 % faster where a launch is about one
  // wave of short slices (B = 24 L = 2k, B = 12 L = 4k, B = 8 L = 1k),
  // within +-1.3 % elsewhere; geometric mean 0.995 (docs/design/
  // decode_attention.md §4.10).
  bool stream_across_slices = true;
  // The slices of a row as one thread-block cluster, on sm_90 where a row
  // has 2..8 slices (caches of 129..1024 positions), one head chunk covers
  // the GQA group (up to 32 q heads per kv head) and a block runs one slice
  // (slices_per_block 0 then means one; fused_merge = false turns this
  // off): each block keeps its slice's (O, lse) in shared memory, and after
  // a cluster barrier the row's blocks merge a share of its heads each
  // through distributed shared memory -- no partial stores, fences, arrival
  // counter or second kernel, at any launch size. The same arithmetic as
  // the other merges (merge_slice_partials), so the same bits. Off: on the
  // H200 (session 16) it did not beat the arrival-counter merge at B = 1
  // L = 1k under graph replay (8.81-9.01 against 8.70 µs), and it loses
  // wherever a launch has more than one wave (docs/design/
  // decode_attention.md §4.6).
  bool cluster_merge = false;
  // The slices' partial outputs in the workspace are stored with an L2
  // evict-last hint, and the block that merges a row's partials drops their
  // L2 lines once read (discard.global.L2), so they are neither evicted by
  // the K / V stream before the merge (and read back from DRAM) nor written
  // back to DRAM after it: up to 2 x heads / slice_keys of the launch's DRAM
  // bytes (~6 % at 128-key slices and 4 q heads per kv head, ~1.6 % at
  // 512). The log-sum-exps stay plain (4 bytes per slice); at hd 256 the
  // partials are stored plainly too (the hint's registers spill there) but
  // still discarded once merged. The same bits.
  // Session 37 on the H200: 2-6 % faster at B = 16 / 64 (L = 1k, 8k), 1-2 %
  // slower at B = 1 L = 1k / 4k (docs/design/decode_attention.md §4.15),
  // where the K / V stream never evicts the partials: hence the footprint
  // rule below.
  bool partials_in_l2 = true;
  // partials_in_l2 applies only to launches whose footprint (K + V bytes over
  // batch x kv heads x capacity, as for l2_prefetch_bytes) exceeds this; a
  // negative value stands for the device's L2 size (50 MiB on the H200).
  // 0: every launch (the tests use it to reach the hint at small shapes).
  double partials_in_l2_min_bytes = -1.0;
  // A launch of no more blocks than SMs gives each block more than half an
  // SM's shared memory, so no two blocks of such launches share an SM.
  // Under PDL's early trigger the next launch's blocks are placed while
  // this one's still run: a second decode of one wave (a graph of decode
  // calls) otherwise lands two blocks on some SMs, which then stream at
  // half the rate and hold the launch up. Not for launches that run as
  // clusters (cluster_merge taken). The same bits. Session 38 on the H200
  // (decode-exp, chains of decodes under the early trigger): B = 1 L = 4k
  // 11.2 -> 10.9 us, 1-2 % at B = 1 / 2 up to 8k, level elsewhere
  // (docs/design/decode_attention.md §4.16).
  bool sole_block_per_sm = true;
};

// Launch knobs of the wgmma prefill (kernels/attention_prefill_wgmma.cu);
// like DecodeTuning, the defaults are the library's choice and
// bench/attention_tuning.cpp sweeps them. None changes a bit of the result.
struct PrefillTuning {
  // Consumer warpgroups per block (64 query rows each; they share every K /
  // V tile): 1 or 2; 0: two where a grid of 128-row blocks fills the device
  // at least once, else one. With wgmma_producer_warp: 2 or 3 (0: 2).
  int wgmma_warpgroups = 0;
  // An experiment (kernels/attention_prefill_wgmma.cu, WS): the consumer
  // warpgroups and a producer warp issuing the copies, slots handed over by
  // full / empty mbarriers instead of a block barrier per tile, one block per
  // SM with a deeper ring. The same bits.
  bool wgmma_producer_warp = false;
};

struct AttentionArgs {
  DType dtype = DType::F16;
  const void* q = nullptr;  // [batch, num_heads, q_len, head_dim]
  const void* k = nullptr;  // [batch, num_kv_heads, kv_stride, head_dim]
  const void* v = nullptr;  // [batch, num_kv_heads, kv_stride, head_dim]
  void* out = nullptr;      // [batch, num_heads, q_len, head_dim]; 16-byte aligned like q, k, v
  int batch = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int q_len = 0;
  int head_dim = 0;          // 64, 128 or 256
  long long kv_stride = 0;   // positions per kv head in k / v
  int kv_len = 0;            // valid keys (ignored when state is set)
  long long pos_offset = 0;  // position of query 0 (state: kv_len - 1)
  const DecodeState* state = nullptr;  // [1] DecodeState in device memory (q_len == 1): kv_len read from it
  const int* kv_lens = nullptr;        // [batch] i32 (q_len == 1): per-sequence kv_len; wins over state
  DeviceErrorLog* error_log = nullptr; // [1] DeviceErrorLog (host-mapped), null: none; gets
                                       // kErrAttnKvLen when a device-side kv_len (state or kv_lens)
                                       // is outside [1, kv_stride] (that sequence's out: zeros)
  bool causal = true;
  float scale = 0.0f;  // softmax scale (already resolved: > 0)
  // Split-K scratch for decode (q_len == 1): [batch * num_heads][splits][head_dim]
  // partial outputs and [batch * num_heads][splits] log-sum-exps (base 2),
  // f32, splits = attention_decode_splits(kv_stride). Only slices holding a
  // valid key are written and read.
  float* partial_out = nullptr;  // [batch * num_heads][splits][head_dim] f32
  float* partial_lse = nullptr;  // [batch * num_heads][splits] f32, base 2
  DecodeTuning decode_tuning;  // q_len == 1, tensor-core kernel only
  // q_len == 1, tensor-core kernel: CudaBackendConfig::attention_kv_before_wait,
  // the caller's promise that no kernel still running writes a sequence's
  // kv_len (state or kv_lens) or its K / V rows below the newest (kv_len - 1).
  // Each warp then requests its first sub-tile, where it lies wholly below
  // the newest row, before the PDL wait; Q, the newest row and every write
  // after it. The same bits either way.
  bool kv_before_wait = false;
  // q_len > 1: the wgmma kernel (kernels/attention_prefill_wgmma.cu) where
  // it applies, else the mma.sync kernel (CudaBackendConfig::prefill_kernel).
  bool prefill_wgmma = true;
  PrefillTuning prefill_tuning;  // q_len > 1, wgmma kernel only
};

// Floats of split-K scratch a call needs: 0 for prefill (q_len > 1), else
// attention_decode_workspace_floats, saturated at size_t's largest value.
std::size_t attention_workspace_floats(int batch, int num_heads, int q_len, int head_dim, long long kv_stride);

// Points a.partial_out and a.partial_lse into `workspace` (f32, `floats` of
// them, at least attention_workspace_floats): the outputs first, then the
// log-sum-exps. a.head_dim must be set.
inline void set_decode_workspace(AttentionArgs& a, float* workspace /*[floats] f32*/, std::size_t floats) {
  const std::size_t rows = floats / static_cast<std::size_t>(a.head_dim + 1);  // (sequence, head, slice) rows
  a.partial_out = workspace;
  a.partial_lse = workspace + rows * static_cast<std::size_t>(a.head_dim);
}

void launch_attention(const AttentionArgs& args, cudaStream_t stream);

// How launch_attention runs a decode (q_len == 1) on the tensor-core
// kernel on the current device: for tests (which path a knob took) and the
// tuning tool. nullopt where that kernel does not apply (the CUDA-core
// fallback runs).
struct DecodeLaunchPlan {
  int splits = 0;            // slices per row (attention_decode_splits)
  int slice_keys = 0;
  int slices_per_block = 0;  // consecutive slices per block
  int head_chunks = 0;       // blocks across one kv head's GQA group
  int row_blocks = 0;        // blocks per (sequence, kv head, head chunk): ceil(splits / slices_per_block)
  long long grid_x = 0;      // batch * ceil(splits / slices_per_block) * head_chunks
  int grid_y = 0;            // kv heads
  int threads = 0;           // 128 per m-tile of 16 q heads
  bool prefetch_l2 = false;  // whole slices asked into L2 first
  bool fused = false;        // the kernel merges the slices (no combine kernel)
  bool cluster = false;      // DecodeTuning::cluster_merge taken
  // DecodeTuning::partials_in_l2 on and the footprint past its floor: the
  // kernels receive it (it acts only where slices store workspace partials:
  // not with one slice per row nor under the cluster merge).
  bool partials_in_l2 = false;
  int smem_bytes = 0;  // the launch's dynamic shared memory (sole_block_per_sm raises it)
};
std::optional<DecodeLaunchPlan> decode_launch_plan(const AttentionArgs& args);

// FERRUM_DECODE_TIMELINE (CMake option, diagnostics only): per block of the
// last decode launches (block = blockIdx.y * gridDim.x + blockIdx.x, the
// first kDecodeTimelineBlocks), thread 0's clock64() and %globaltimer at
// each point, and the block's SM; zeros where a block did not pass a point
// (e.g. RowMerged in non-merging blocks). clock64 counts one SM's cycles
// (phases within a block); the global timer is one clock for the device
// (when blocks start and end against each other: the launch's waves).
// A later launch overwrites what it reaches, so reset before the launch read.
enum class DecodeTimelinePoint : int {
  Entry = 0,            // before the PDL wait
  KvLenKnown = 1,       // the block's slices hold a valid key
  FirstTileLanded = 2,  // Q and the first sub-tile in shared memory
  SliceComputed = 3,    // the (last) slice's sub-tiles computed
  WarpsPublished = 4,   // the key warps' (m, l, O) in shared memory
  SliceStored = 5,      // the slice's merged (O, lse) stored
  Arrived = 6,          // past the arrival counter or the first cluster barrier
  RowMerged = 7,        // the merging block: the row's output stored
};
inline constexpr int kDecodeTimelinePoints = 8;
inline constexpr int kDecodeTimelineBlocks = 8192;
}  // namespace ferrum::kernels

#if defined(FERRUM_DECODE_TIMELINE)
#include <array>
#include <vector>

namespace ferrum::kernels {
struct DecodeTimelineStamp {
  unsigned long long clock;  // clock64() of the block's SM
  unsigned long long ns;     // %globaltimer
};
struct DecodeTimelineBlock {
  std::array<DecodeTimelineStamp, kDecodeTimelinePoints> points;
  unsigned sm;  // %smid at Entry
};
void decode_timeline_reset();
std::vector<DecodeTimelineBlock> decode_timeline_read();
}  // namespace ferrum::kernels
#endif
