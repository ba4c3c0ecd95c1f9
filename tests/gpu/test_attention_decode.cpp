// Decode attention on CudaBackend beyond "matches the CPU":
//
// - Graph: ONE captured decode step (kv_cache_append_head_major, then
//   flash_attention, both in device-state mode) is replayed for 4096 steps
//   while kv_len grows 1..4096 and fresh K/V rows arrive each step. Every
//   step's attention output equals an eager device-state run on a second set
//   of caches, bit for bit, and the replayed cache equals the eager one.
// - Ragged graph: one captured flash_decode_ragged replayed while kv_lens
//   changes between replays (written outside the capture) equals eager.
// - Batch independence: each sequence of a ragged batch equals, bitwise, the
//   single-sequence flash_attention decode of the same data (the split size
//   is fixed, so nothing depends on the batch).
// - Determinism: a long decode (many slices) and a prefill, twice, bitwise.
// - Slice edges: kv_lens 1, around multiples of the slice size (128 keys up
//   to a 2k capacity, 256 at 4k, 512 at 5000), the capacity (not a multiple of the
//   slice), GQA groups that take two m-tiles and two head chunks: each
//   matches the CPU, two runs are bitwise equal, and each sequence equals
//   its own single decode. The fused merge's arrival counters must be back
//   at zero after every launch, else a later launch with another number of
//   valid slices merges too early or never (the 2nd run and the single
//   decodes would differ).
// - Device check: kv_lens outside [1, capacity] is reported as DeviceCheck
//   at synchronize(), zeros are written, and the backend keeps working.
// - Launch knobs (kernels::DecodeTuning, through the launcher): the L2
//   prefetch settings and who merges the slices change no bit of the
//   output, with NaN in the cache past kv_len; the default launch's output
//   within the tolerance table of CpuBackend's.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/attention_prefill.hpp"

#include "support/attention_args.hpp"
#include "support/device_bytes.hpp"
#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

class CudaDecodeGraph : public CudaParamTest<DType> {};

TEST_P(CudaDecodeGraph, ReplayEqualsEagerFor4096StepsAsKvLenGrows) {
  constexpr std::size_t kNh = 8, kNkv = 2, kHd = 128, kCap = 4096, kSteps = 4096;
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  Backend& be = cuda();
  const AttnConfig cfg = attn_config(kNh, kNkv, kHd, kCap);

  // Inputs rewritten before every step (outside any capture): q and the new
  // K/V row of every kv head.
  HostTensor q_host = random_normal(rng, dt, kNh * kHd);
  DeviceTensor q(be, q_host);
  DeviceTensor new_k(be, random_normal(rng, dt, kNkv * kHd)), new_v(be, random_normal(rng, dt, kNkv * kHd));
  struct Set {
    Set(Backend& be, DType dt)
        : cache_k(be, dt, kNkv * kCap * kHd), cache_v(be, dt, kNkv * kCap * kHd), out(be, dt, kNh * kHd) {}
    GuardedOutput cache_k, cache_v, out;
  };
  Set graph(be, dt), eager(be, dt);
  auto step = [&](Set& s) {
    be.kv_cache_append_head_major(s.cache_k.view(), s.cache_v.view(), 0, kCap, new_k.view(), new_v.view(), 1, kNkv,
                                  kHd);
    be.flash_attention(q.view(), s.cache_k.view(), s.cache_v.view(), s.out.view(), 1, 1, 1, 0, cfg);
  };
  be.reset_graph();
  {
    DeviceStateScope scope(be, true);
    be.begin_graph_capture();
    step(graph);
    be.end_graph_capture();
  }
  const std::size_t es = size_of(dt);
  std::size_t failed = 0;
  for (std::size_t i = 0; i < kSteps && failed < 3; ++i) {
    SCOPED_TRACE(cat("step ", i, " kv_len ", i + 1));
    // Fresh inputs every 16 steps keep the run short while K/V still vary.
    if (i % 16 == 0) {
      q_host = random_normal(rng, dt, kNh * kHd);
      be.write(q.view(), q_host.values);
      be.write(new_k.view(), random_normal(rng, dt, kNkv * kHd).values);
      be.write(new_v.view(), random_normal(rng, dt, kNkv * kHd).values);
    }
    be.set_decode_state(0, static_cast<std::int32_t>(i));
    ASSERT_TRUE(be.replay_last_graph());
    {
      DeviceStateScope scope(be, true);
      step(eager);
    }
    be.synchronize();
    const auto eq = bitwise_equal(graph.out.bytes(), eager.out.bytes(), es);
    EXPECT_TRUE(eq) << "graph replay vs eager device-state";
    if (!eq) ++failed;
  }
  ASSERT_EQ(failed, 0u);
  EXPECT_TRUE(bitwise_equal(graph.cache_k.bytes(), eager.cache_k.bytes(), es));
  EXPECT_TRUE(bitwise_equal(graph.cache_v.bytes(), eager.cache_v.bytes(), es));
  // The last step attended all 4096 keys: check it against the CPU oracle.
  FlashCase last{1, 1, kCap, kCap - 1, cfg, kCap, q_host, make_tensor(dt, graph.cache_k.values()),
                 make_tensor(dt, graph.cache_v.values())};
  const OpResult want = run(cpu(), last);
  EXPECT_TRUE(all_close(graph.out.values(), want.at("out").values, dt));
  EXPECT_TRUE(graph.out.check_guard());
  be.reset_graph();
}

TEST_P(CudaDecodeGraph, RaggedReplayFollowsKvLens) {
  constexpr std::size_t kBatch = 3, kSteps = 64;
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  Backend& be = cuda();
  const AttnConfig cfg = attn_config(16, 4, 128, 3000);
  const RaggedDecodeCase c = make_ragged_decode_case(rng, dt, cfg, {3000, 3000, 3000});  // no NaN rows
  DeviceTensor q(be, c.q), k(be, c.k), v(be, c.v);
  DeviceTensor lens_graph(be, c.kv_lens), lens_eager(be, c.kv_lens);
  GuardedOutput out_graph(be, dt, c.q.size()), out_eager(be, dt, c.q.size());
  be.reset_graph();
  be.begin_graph_capture();
  be.flash_decode_ragged(q.view(), k.view(), v.view(), out_graph.view(), lens_graph.view(), kBatch, cfg);
  be.end_graph_capture();
  for (std::size_t i = 0; i < kSteps; ++i) {
    std::vector<float> lens(kBatch);
    for (float& l : lens) l = static_cast<float>(1 + rng.below(3000));
    SCOPED_TRACE(cat("step ", i, " kv_lens ", lens[0], ",", lens[1], ",", lens[2]));
    be.write(lens_graph.view(), lens);
    be.write(lens_eager.view(), lens);
    out_graph.poison();  // each step's bits are its own
    out_eager.poison();
    ASSERT_TRUE(be.replay_last_graph());
    be.flash_decode_ragged(q.view(), k.view(), v.view(), out_eager.view(), lens_eager.view(), kBatch, cfg);
    be.synchronize();
    ASSERT_TRUE(bitwise_equal(out_graph.bytes(), out_eager.bytes(), size_of(dt)));
    ASSERT_TRUE(out_graph.check_guard("flash_decode_ragged (replay)", "out", cat("step ", i)));
    ASSERT_TRUE(out_eager.check_guard("flash_decode_ragged", "out", cat("step ", i)));
  }
  be.reset_graph();
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaDecodeGraph, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

class CudaDecodeBatch : public CudaParamTest<DType> {};

// Sequence b of a ragged batch == a batch-1 flash_attention decode of it.
TEST_P(CudaDecodeBatch, RaggedSequenceEqualsItsOwnDecodeBitwise) {
  FERRUM_SEEDED_RNG(rng);
  const RaggedDecodeCase c = make_ragged_decode_case(rng, GetParam(), attn_config(32, 8, 128, 2600),
                                                     {2600, 1, 513, 1024, 77});
  SCOPED_TRACE(describe(c));
  EXPECT_TRUE(ragged_equals_single_decodes(cuda(), c));
}

TEST_P(CudaDecodeBatch, TwoRunsAreBitwiseEqual) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  Backend& be = cuda();
  AttnConfig cfg = attn_config(32, 8, 128, 40000);
  // Decode over 10 slices of 4096 keys, then a causal prefill chunk.
  const FlashCase decode = make_flash_case(rng, dt, 2, 1, 40000, 39999, cfg);
  const OpResult d1 = run(be, decode), d2 = run(be, decode);
  EXPECT_TRUE(d1.guards_ok());
  EXPECT_TRUE(d2.guards_ok());
  EXPECT_TRUE(bitwise_equal(d1.at("out").bytes, d2.at("out").bytes, size_of(dt)));
  cfg.kv_seq_stride = 0;
  const FlashCase prefill = make_flash_case(rng, dt, 1, 300, 1000, 700, cfg);
  const OpResult p1 = run(be, prefill), p2 = run(be, prefill);
  EXPECT_TRUE(p1.guards_ok());
  EXPECT_TRUE(p2.guards_ok());
  EXPECT_TRUE(bitwise_equal(p1.at("out").bytes, p2.at("out").bytes, size_of(dt)));
}

TEST_P(CudaDecodeBatch, SliceEdgesMatchCpuAndRepeatBitwise) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  Backend& be = cuda();
  struct Shape {
    std::size_t nh, nkv, hd, cap;
  };
  // Slice 128 (8 slices, the last partial), slice 512 (10 slices), GQA 32
  // (two m-tiles), GQA 48 (two chunks, hd 64; 12 slices of 256), GQA 40
  // (two chunks, 32 + 8 heads, hd 128), hd 256 with GQA 1.
  for (const Shape& sh : {Shape{32, 8, 128, 1000}, Shape{32, 8, 128, 5000}, Shape{64, 2, 128, 700},
                          Shape{48, 1, 64, 3000}, Shape{80, 2, 128, 1500}, Shape{4, 4, 256, 300}}) {
    std::vector<std::size_t> lens;
    for (std::size_t len : {std::size_t{1}, std::size_t{127}, std::size_t{128}, std::size_t{129}, std::size_t{255},
                            std::size_t{257}, std::size_t{511}, std::size_t{512}, std::size_t{513}, sh.cap - 1,
                            sh.cap}) {
      if (len <= sh.cap) lens.push_back(len);
    }
    const RaggedDecodeCase c = make_ragged_decode_case(rng, dt, attn_config(sh.nh, sh.nkv, sh.hd, sh.cap), lens);
    SCOPED_TRACE(describe(c));
    const OpResult first = run(be, c);
    expect_same_outputs(first, run(cpu(), c), Match::Close);
    const OpResult second = run(be, c);
    EXPECT_TRUE(bitwise_equal(first.at("out").bytes, second.at("out").bytes, size_of(dt)));
    EXPECT_TRUE(ragged_equals_single_decodes(be, c));
  }
}

// A batch whose default plan finishes its rows in the combine kernel: more
// (sequence, kv head) groups than the in-kernel merge takes (40 x 8 at a
// capacity of 1024: 8 slices of 128 keys over several blocks per row, 320
// groups past fused_max_groups_per_sm x 132 SMs). Ragged lengths (1 and the
// whole cache among them) against the CPU, and a graph replay bitwise its
// eager run.
TEST_P(CudaDecodeBatch, CombineKernelPlanMatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  Backend& be = cuda();
  constexpr std::size_t kBatch = 40, kCap = 1024;
  const AttnConfig cfg = attn_config(32, 8, 128, kCap);
  const kernels::AttentionArgs a =
      attention_args(dt, nullptr, nullptr, nullptr, nullptr,
                     {.batch = kBatch, .heads = 32, .kv_heads = 8, .q_len = 1, .head_dim = 128, .kv_stride = kCap});
  const std::optional<kernels::DecodeLaunchPlan> plan = kernels::decode_launch_plan(a);
  ASSERT_TRUE(plan.has_value());
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  if (sms == 132) {
    EXPECT_FALSE(plan->fused) << "the combine kernel on 132 SMs (" << plan->row_blocks << " blocks per row)";
  }
  std::vector<std::size_t> lens(kBatch);
  for (std::size_t& len : lens) len = 1 + rng.below(kCap);
  lens[0] = 1;
  lens[1] = kCap;
  const RaggedDecodeCase c = make_ragged_decode_case(rng, dt, cfg, lens);
  SCOPED_TRACE(describe(c));
  const OpResult eager = run(be, c);
  expect_same_outputs(eager, run(cpu(), c), Match::Close);
  RunOptions graph;
  graph.graph = true;
  expect_same_outputs(run(be, c, graph), eager, Match::Exact);
}

// The in-kernel merge counts each (sequence, kv head, head chunk) group's
// arrivals in one of kDecodeArrivalSlots counters, so a launch of more
// groups merges in the combine kernel even where DecodeTuning lets the
// kernel merge any number per SM. Plans only (nothing is launched or
// allocated): one slice per block over a 256-key cache (two blocks per row,
// so the row is merged across blocks), 8 kv heads, batches of exactly the
// counters' groups and of one sequence more.
TEST_P(CudaDecodeBatch, ArrivalCountersBoundTheInKernelMerge) {
  constexpr int kKvHeads = 8, kCap = 256;
  static_assert(kernels::kDecodeArrivalSlots % kKvHeads == 0);
  constexpr int kFullBatch = kernels::kDecodeArrivalSlots / kKvHeads;
  for (const int batch : {kFullBatch, kFullBatch + 1}) {
    SCOPED_TRACE(cat("batch=", batch));
    kernels::AttentionArgs a = attention_args(
        GetParam(), nullptr, nullptr, nullptr, nullptr,
        {.batch = batch, .heads = 32, .kv_heads = kKvHeads, .q_len = 1, .head_dim = 128, .kv_stride = kCap});
    a.decode_tuning.slices_per_block = 1;
    a.decode_tuning.fused_max_groups_per_sm = 1e9;
    const std::optional<kernels::DecodeLaunchPlan> plan = kernels::decode_launch_plan(a);
    ASSERT_TRUE(plan.has_value());
    ASSERT_EQ(plan->splits, 2);
    ASSERT_EQ(plan->row_blocks, 2);
    ASSERT_EQ(plan->head_chunks, 1);
    ASSERT_FALSE(plan->cluster);
    EXPECT_EQ(plan->fused, batch == kFullBatch) << batch * kKvHeads << " groups against "
                                                 << kernels::kDecodeArrivalSlots << " arrival counters";
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaDecodeBatch, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// Straight through the launcher, on raw device memory: every DecodeTuning
// variant gives the default's bytes. Cases: a small launch (the whole-slice
// L2 prefetch applies when a variant turns it on), one past a 36 MiB
// footprint (prefetch-ahead applies), several valid slices to merge in both,
// slices ending inside a 64-key tile and inside a warp's 16 keys; head_dim
// 64 and 256; a GQA group of 20 (two m-tiles); a batch large enough that
// the size rule picks the combine kernel (where a block runs one slice,
// as the default now does there; the variants of two slices per block hold
// whole rows and merge them themselves); ragged
// batches (kv_lens) whose default runs several slices per block; kv_len
// from a device decode state (also with two m-tiles at hd 256, in one head
// chunk and in two); two slices of one row (the smallest cluster); B = 1 at
// 4k and 2k caches (16 slices of 256 and of 128 keys); 128 rows of 512-key
// slices (several slices per block by default). Cache rows
// at and past each sequence's kv_len hold NaN, so a path that lets one
// into P V shows.
struct DecodeKnobCase {
  int batch;
  int kv_len;
  long long capacity;
  int heads;
  int kv_heads;
  int head_dim;
  bool ragged = false;  // kv_lens: sequence b holds kv_len, kv_len / 2 + 1 or 1 keys (b % 3)
  bool state = false;   // kv_len from a device DecodeState (one captured launch's mode)
};
constexpr DecodeKnobCase kDecodeKnobCases[] = {
    {1, 700, 1000, 8, 2, 128},       {3, 4999, 5000, 8, 2, 128},
    {2, 9000, 20000, 8, 2, 128},     {2, 333, 4096, 40, 2, 128},
    {1, 4100, 9000, 4, 1, 64},       {2, 1234, 1500, 16, 2, 256},
    {48, 200, 256, 16, 8, 128},      {6, 3000, 4096, 32, 8, 128, true},
    {5, 1000, 1024, 16, 1, 64, true}, {16, 2500, 4096, 32, 8, 128, false, true},
    {2, 900, 1024, 40, 1, 256, false, true}, {2, 900, 1024, 32, 1, 256, false, true},
    {1, 200, 256, 4, 1, 128},        {1, 3999, 4096, 8, 2, 128},
    {1, 1500, 2048, 32, 8, 128, false, true},
    {16, 1500, 8192, 8, 8, 64},
    // The largest head counts whose warps' merge rows fit a ring slot (13 at
    // hd 64, 14 at 128, 15 at 256: DecodeTuning::slot_merge's bound).
    {1, 3000, 4096, 13, 1, 64},      {2, 900, 1024, 28, 2, 128},
    {2, 1000, 1024, 15, 1, 256},
    // One slice per row (capacity 128): every row merged in its own block,
    // whatever fused_merge says, and kv_before_wait's early request on a
    // row stored directly; one with GQA 20, ragged.
    {2, 100, 128, 8, 2, 64},         {3, 120, 128, 20, 1, 128, true}};

// One test per (dtype, case), so that a sanitizer run shards them (the two
// tests of 15 cases each did not finish under racecheck in 230 s).
class CudaDecodeKnobs : public CudaParamTest<std::tuple<DType, int>> {};

TEST_P(CudaDecodeKnobs, DecodeTuningKnobsChangeNoBit) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = std::get<0>(GetParam());
  const DecodeKnobCase& c = kDecodeKnobCases[std::get<1>(GetParam())];
  cuda();  // device 0 current, its runtime made
  SCOPED_TRACE(cat("batch ", c.batch, " kv_len ", c.kv_len, " capacity ", c.capacity, " heads ", c.heads, "/",
                   c.kv_heads, " hd ", c.head_dim, c.ragged ? " ragged" : "", c.state ? " state" : ""));
  auto seq_len = [&](int b) {
    if (!c.ragged) return c.kv_len;
    return b % 3 == 0 ? c.kv_len : b % 3 == 1 ? c.kv_len / 2 + 1 : 1;
  };
  const std::size_t q_elems = static_cast<std::size_t>(c.batch) * c.heads * c.head_dim;
  const std::size_t kv_elems = static_cast<std::size_t>(c.batch) * c.kv_heads * c.capacity * c.head_dim;
  const HostTensor q_host = random_uniform(rng, dt, q_elems), k_host = random_uniform(rng, dt, kv_elems),
                   v_host = random_uniform(rng, dt, kv_elems);
  const std::vector<std::uint8_t> q = encode_bytes(q_host);
  std::vector<std::uint8_t> k = encode_bytes(k_host);
  std::vector<std::uint8_t> v = encode_bytes(v_host);
  // Rows past the sequence's kv_len .. capacity - 1 of every (sequence,
  // kv head): NaN (0xffff in f16 and bf16).
  const std::size_t row_bytes = static_cast<std::size_t>(c.head_dim) * 2;
  std::vector<std::int32_t> lens(static_cast<std::size_t>(c.batch));
  for (int b = 0; b < c.batch; ++b) lens[static_cast<std::size_t>(b)] = seq_len(b);
  for (std::size_t plane = 0; plane < static_cast<std::size_t>(c.batch) * c.kv_heads; ++plane) {
    const std::size_t len = static_cast<std::size_t>(lens[plane / static_cast<std::size_t>(c.kv_heads)]);
    const std::size_t from = (plane * c.capacity + len) * row_bytes;
    const std::size_t to = (plane + 1) * c.capacity * row_bytes;
    std::memset(k.data() + from, 0xff, to - from);
    std::memset(v.data() + from, 0xff, to - from);
  }
  const std::size_t ws = kernels::attention_workspace_floats(c.batch, c.heads, 1, c.head_dim, c.capacity);
  // The workspace between two guards, 144 bytes into its allocation (16-byte
  // aligned, not on a 128-byte L2 line): partials_in_l2 drops the merged
  // partials' lines from L2 unwritten, and must never take a line that
  // holds a byte outside the workspace.
  constexpr std::size_t kGuardBytes = 144;
  const std::size_t ws_bytes = std::max<std::size_t>(ws, 1) * sizeof(float);
  const DeviceBytes dq_mem(q), dk_mem(k), dv_mem(v), dws_mem(ws_bytes + 2 * kGuardBytes);
  DeviceBytes dout_mem(q.size()), dflag_mem(sizeof(kernels::DeviceErrorLog));
  dflag_mem.fill(0);
  std::vector<std::uint8_t> lens_bytes(lens.size() * sizeof(std::int32_t));
  std::memcpy(lens_bytes.data(), lens.data(), lens_bytes.size());
  const DeviceBytes dlens_mem(lens_bytes);
  const kernels::DecodeState host_state{0, c.kv_len - 1, c.kv_len};
  std::vector<std::uint8_t> state_bytes(sizeof host_state);
  std::memcpy(state_bytes.data(), &host_state, sizeof host_state);
  const DeviceBytes dstate_mem(state_bytes);
  void *const dq = dq_mem.get(), *const dk = dk_mem.get(), *const dv = dv_mem.get(), *const dout = dout_mem.get();
  auto* const guard_before = static_cast<std::uint8_t*>(dws_mem.get());
  auto* const guard_after = guard_before + kGuardBytes + ws_bytes;
  void *const dws = guard_before + kGuardBytes, *const dflag = dflag_mem.get();

  auto args_for = [&](const kernels::DecodeTuning& tuning, bool kv_before_wait = false) {
    kernels::AttentionArgs a = attention_args(dt, dq, dk, dv, dout,
                                              {.batch = c.batch,
                                               .heads = c.heads,
                                               .kv_heads = c.kv_heads,
                                               .q_len = 1,
                                               .head_dim = c.head_dim,
                                               .kv_stride = c.capacity,
                                               .kv_len = c.kv_len,
                                               .pos_offset = c.kv_len - 1});
    if (c.ragged) a.kv_lens = static_cast<const int*>(dlens_mem.get());
    if (c.state) a.state = static_cast<const kernels::DecodeState*>(dstate_mem.get());
    a.error_log = static_cast<kernels::DeviceErrorLog*>(dflag);
    kernels::set_decode_workspace(a, static_cast<float*>(dws), ws);
    a.decode_tuning = tuning;
    a.kv_before_wait = kv_before_wait;
    return a;
  };
  // Before each run the workspace holds NaN in DRAM (poisoned, then pushed
  // out of L2 by writing twice L2's size elsewhere), so a partial or lse
  // dropped from L2 before its merge read it (partials_in_l2's discard), or
  // never written, reads back as NaN; and the guards take a new value each
  // run, so a guard line dropped from L2 reads back the last run's.
  int l2_bytes = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  const std::size_t flush_bytes = 2 * static_cast<std::size_t>(std::max(l2_bytes, 1 << 20));
  DeviceBytes flush_mem(flush_bytes);
  int run_index = 0;
  auto run_with = [&](const kernels::DecodeTuning& tuning, bool kv_before_wait = false) {
    const auto guard_byte = static_cast<std::uint8_t>(0x40 + run_index++ % 64);
    EXPECT_EQ(cudaMemset(dout, kPoisonByte, q.size()), cudaSuccess);
    EXPECT_EQ(cudaMemset(dws, 0xff, ws_bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(flush_mem.get(), 0, flush_bytes), cudaSuccess);
    // Written just before the launch, so that their lines are likely still
    // dirty in L2 when it runs.
    EXPECT_EQ(cudaMemset(guard_before, guard_byte, kGuardBytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(guard_after, guard_byte, kGuardBytes), cudaSuccess);
    kernels::launch_attention(args_for(tuning, kv_before_wait), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint8_t> out(q.size()), guards(2 * kGuardBytes);
    EXPECT_EQ(cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(guards.data(), guard_before, kGuardBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(guards.data() + kGuardBytes, guard_after, kGuardBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    const auto changed = std::count_if(guards.begin(), guards.end(), [&](std::uint8_t g) { return g != guard_byte; });
    EXPECT_EQ(changed, 0) << "guard bytes changed around the workspace (2 x " << kGuardBytes << ")";
    return out;
  };
  const std::vector<std::uint8_t> reference = run_with({});
  // The default launch against CpuBackend (the variants below against it
  // bitwise): the same batch as flash_decode_ragged, each sequence at its
  // kv_len (the decode state's for every sequence in the state cases). The
  // CPU's k / v rows past kv_len are never read, so its copies need no NaN.
  {
    std::vector<float> ref_lens(static_cast<std::size_t>(c.batch));
    for (int b = 0; b < c.batch; ++b) {
      ref_lens[static_cast<std::size_t>(b)] = static_cast<float>(c.state ? c.kv_len : seq_len(b));
    }
    const RaggedDecodeCase on_cpu{static_cast<std::size_t>(c.batch),
                                  attn_config(static_cast<std::size_t>(c.heads), static_cast<std::size_t>(c.kv_heads),
                                              static_cast<std::size_t>(c.head_dim),
                                              static_cast<std::size_t>(c.capacity)),
                                  q_host, k_host, v_host, make_tensor(DType::I32, ref_lens)};
    ASSERT_TRUE(all_close(decode_bytes(dt, reference), run(cpu(), on_cpu).at("out").values, dt))
        << "the default launch against CpuBackend";
  }
  std::vector<kernels::DecodeTuning> variants(6);
  variants[0].l2_ahead = 2;
  variants[1].l2_ahead = 5;
  variants[2].l2_prefetch_bytes = 36.0 * 1024 * 1024;
  variants[3].l2_prefetch_bytes = 1e12;
  variants[4].fused_merge = false;
  // The size rule: 0 takes the combine kernel wherever a row has several
  // blocks (one slice each here); a huge bound the fused merge everywhere,
  // also where the default rule does not (48 x 8 groups pass 2 per SM on
  // devices of up to 191 SMs, the H200's 132).
  variants[5].fused_max_groups_per_sm = 0.0;
  variants[5].slices_per_block = 1;
  variants.push_back({});
  variants.back().fused_max_groups_per_sm = 1e9;
  // Slices per block (a block running several slices, merging a whole row
  // itself at 8 and 16), also with the combine kernel; the next slice's
  // prologue after the merge.
  for (int per_block : {1, 2, 3, 8, 16}) {
    variants.push_back({});
    variants.back().slices_per_block = per_block;
  }
  variants.push_back({});
  variants.back().tail_free_slices = false;  // the slices-per-block rules before session 32
  variants.push_back({});
  variants.back().slices_per_block = 2;
  variants.back().fused_merge = false;
  variants.push_back({});
  variants.back().overlap_boundary = false;
  variants.back().slices_per_block = 3;
  // The next slice's first sub-tiles requested only after the ring drained
  // (the rule before stream_across_slices), at 2 and 16 slices per block.
  for (int per_block : {2, 16}) {
    variants.push_back({});
    variants.back().stream_across_slices = false;
    variants.back().slices_per_block = per_block;
  }
  // The four-barrier merge at a slice's end (the rule before slot_merge),
  // at 1, 2 and 16 slices per block.
  for (int per_block : {1, 2, 16}) {
    variants.push_back({});
    variants.back().slot_merge = false;
    variants.back().slices_per_block = per_block;
  }
  // The row's slices as one cluster, merged through distributed shared
  // memory (where a row has 2..8 slices and one head chunk; elsewhere the
  // launch merges as without it): by default, and with a block per slice.
  variants.push_back({});
  variants.back().cluster_merge = true;
  variants.push_back({});
  variants.back().cluster_merge = true;
  variants.back().slices_per_block = 1;
  // The partials kept in L2 and dropped once merged (partials_in_l2, on by
  // default but only past the device's L2 in footprint, which no case here
  // reaches: its floor at 0 takes it at every size): merged by the last
  // block, by the combine kernel, and by a block holding the whole row
  // (through the workspace where a thread has more than one output item,
  // else folded in registers with no partial stored); and the knob off.
  for (const int merge : {0, 1, 2}) {
    variants.push_back({});
    variants.back().partials_in_l2_min_bytes = 0.0;
    if (merge == 1) variants.back().fused_merge = false;
    if (merge == 2) variants.back().slices_per_block = 16;
  }
  variants.push_back({});
  variants.back().partials_in_l2 = false;
  // Blocks sharing SMs in one-wave launches (sole_block_per_sm off).
  variants.push_back({});
  variants.back().sole_block_per_sm = false;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    EXPECT_TRUE(reference == run_with(variants[i])) << "variant " << i << " changed the output";
  }
  // AttentionArgs::kv_before_wait (CudaBackendConfig::attention_kv_before_wait):
  // each warp's first sub-tile below the newest row requested before the
  // PDL wait. By default, and with several slices per block (2, 16: the
  // first slice's prologue is the one it changes), the combine kernel, the
  // cluster merge with a block per slice, the L2 prefetches ahead, and the
  // whole-slice L2 prefetch in the same prologue (with one and 16 slices per
  // block).
  EXPECT_TRUE(reference == run_with({}, true)) << "kv_before_wait changed the output";
  {
    std::vector<kernels::DecodeTuning> early(7);
    early[0].slices_per_block = 2;
    early[1].slices_per_block = 16;
    early[2].fused_merge = false;
    early[2].slices_per_block = 1;
    early[3].cluster_merge = true;
    early[3].slices_per_block = 1;
    early[4].l2_ahead = 5;
    early[5].l2_prefetch_bytes = 1e12;
    early[5].slices_per_block = 1;
    early[6].l2_prefetch_bytes = 1e12;
    early[6].slices_per_block = 16;
    for (std::size_t i = 0; i < early.size(); ++i) {
      EXPECT_TRUE(reference == run_with(early[i], true)) << "kv_before_wait variant " << i << " changed the output";
    }
  }
  // The cluster merge ran where it applies (an sm_90 device: 2..8 slices,
  // one head chunk), so the comparison above covered it.
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const int splits = kernels::attention_decode_splits(c.capacity);
  const bool one_chunk = c.heads / c.kv_heads <= 32;  // two m-tiles of 16 q heads per block at most
  kernels::DecodeTuning cluster_tuning;
  cluster_tuning.cluster_merge = true;
  const std::optional<kernels::DecodeLaunchPlan> plan = kernels::decode_launch_plan(args_for(cluster_tuning));
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->cluster, major >= 9 && splits >= 2 && splits <= 8 && one_chunk) << "splits " << splits;
  // The grid the kernel's DecodeBlockMap decomposes: (sequence, run of slices, head chunk).
  EXPECT_EQ(plan->row_blocks, (plan->splits + plan->slices_per_block - 1) / plan->slices_per_block);
  EXPECT_EQ(plan->grid_x, static_cast<long long>(c.batch) * plan->row_blocks * plan->head_chunks);
  if (plan->cluster) {
    EXPECT_EQ(plan->slices_per_block, 1);
    EXPECT_TRUE(plan->fused);
    // A cluster launch keeps the kernel's own shared memory (sole_block_per_sm does not apply).
    kernels::DecodeTuning cluster_shared = cluster_tuning;
    cluster_shared.sole_block_per_sm = false;
    EXPECT_EQ(plan->smem_bytes, kernels::decode_launch_plan(args_for(cluster_shared))->smem_bytes);
  }
  // The footprint rule of partials_in_l2: taken at every size with a floor
  // of 0; by default past the device's L2 (K + V over batch x kv heads x
  // capacity).
  kernels::DecodeTuning keep_tuning;
  keep_tuning.partials_in_l2_min_bytes = 0.0;
  const std::optional<kernels::DecodeLaunchPlan> keep_plan = kernels::decode_launch_plan(args_for(keep_tuning));
  const std::optional<kernels::DecodeLaunchPlan> default_plan = kernels::decode_launch_plan(args_for({}));
  ASSERT_TRUE(keep_plan.has_value() && default_plan.has_value());
  EXPECT_TRUE(keep_plan->partials_in_l2);
  const double footprint = 4.0 * c.batch * c.kv_heads * static_cast<double>(c.capacity) * c.head_dim;
  EXPECT_EQ(default_plan->partials_in_l2, footprint > l2_bytes) << "footprint " << footprint << " L2 " << l2_bytes;
  // The floor's edge: taken just past it, not at it; never with the knob off.
  keep_tuning.partials_in_l2_min_bytes = footprint - 1.0;
  EXPECT_TRUE(kernels::decode_launch_plan(args_for(keep_tuning))->partials_in_l2);
  keep_tuning.partials_in_l2_min_bytes = footprint;
  EXPECT_FALSE(kernels::decode_launch_plan(args_for(keep_tuning))->partials_in_l2);
  keep_tuning.partials_in_l2_min_bytes = 0.0;
  keep_tuning.partials_in_l2 = false;
  EXPECT_FALSE(kernels::decode_launch_plan(args_for(keep_tuning))->partials_in_l2);
  // sole_block_per_sm: a launch of at most one block per SM asks for more
  // than half an SM's shared memory (where the kernel's own is less), so no
  // second block fits beside one; otherwise, or with the knob off, the
  // kernel's own.
  kernels::DecodeTuning shared_tuning;
  shared_tuning.sole_block_per_sm = false;
  const std::optional<kernels::DecodeLaunchPlan> shared_plan = kernels::decode_launch_plan(args_for(shared_tuning));
  ASSERT_TRUE(shared_plan.has_value());
  int sms = 0, smem_per_sm = 0, reserved = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0), cudaSuccess);
  const long long blocks = default_plan->grid_x * default_plan->grid_y;
  if (blocks <= sms && !default_plan->cluster) {
    EXPECT_GT(2 * (default_plan->smem_bytes + reserved), smem_per_sm) << "blocks " << blocks;
    // Raised where the kernel's own size lets two blocks share an SM, else kept.
    if (2 * (shared_plan->smem_bytes + reserved) <= smem_per_sm) {
      EXPECT_GT(default_plan->smem_bytes, shared_plan->smem_bytes);
    } else {
      EXPECT_EQ(default_plan->smem_bytes, shared_plan->smem_bytes);
    }
  } else {
    EXPECT_EQ(default_plan->smem_bytes, shared_plan->smem_bytes) << "blocks " << blocks;
  }
  kernels::DeviceErrorLog log{};
  EXPECT_EQ(cudaMemcpy(&log, dflag, sizeof log, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::uint64_t slot : log.slots) EXPECT_EQ(slot, 0u);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecodeKnobs,
                         ::testing::Combine(::testing::ValuesIn(kHalfDTypes),
                                            ::testing::Range(0, static_cast<int>(std::size(kDecodeKnobCases)))),
                         [](const ::testing::TestParamInfo<std::tuple<DType, int>>& info) {
                           return cat(dtype_param_name({std::get<0>(info.param), info.index}), "_case",
                                      std::get<1>(info.param));
                         });

class CudaDecodeCheck : public CudaTest {};

TEST_F(CudaDecodeCheck, KvLensOutOfRangeIsADeviceCheck) {
  FERRUM_SEEDED_RNG(rng);
  Backend& be = cuda();
  const AttnConfig cfg = attn_config(8, 2, 64, 700);
  for (std::int32_t bad : {0, -3, 701}) {
    SCOPED_TRACE(cat("kv_lens[1] = ", bad));
    RaggedDecodeCase c = make_ragged_decode_case(rng, DType::F16, cfg, {700, 700});
    c.kv_lens.values[1] = static_cast<float>(bad);
    DeviceTensor q(be, c.q), k(be, c.k), v(be, c.v), lens(be, c.kv_lens);
    GuardedOutput out(be, DType::F16, c.q.size());
    be.flash_decode_ragged(q.view(), k.view(), v.view(), out.view(), lens.view(), 2, cfg);
    expect_error(ErrorCode::DeviceCheck, "flash_decode_ragged", [&] { be.synchronize(); },
                 cat("device-side kv_len ", bad, " (decode state or kv_lens) outside [1, kv_seq_stride = 700]"));
    // The bad sequence gets zeros; the good one is computed, as CpuBackend
    // computes it (the same batch with the bad kv_len made good: sequence 0
    // does not depend on sequence 1).
    const std::vector<float> got = out.values();
    const std::size_t row = cfg.num_heads * cfg.head_dim;
    for (std::size_t i = row; i < 2 * row; ++i) ASSERT_EQ(got[i], 0.0f) << "element " << i;
    RaggedDecodeCase good = c;
    good.kv_lens.values[1] = 700.0f;
    const std::vector<float> want = run(cpu(), good).at("out").values;
    EXPECT_TRUE(all_close(std::span<const float>(got).first(row), std::span<const float>(want).first(row),
                          DType::F16))
        << "the good sequence beside the bad one";
    EXPECT_TRUE(out.check_guard());
  }
  // Still usable.
  const RaggedDecodeCase ok = make_ragged_decode_case(rng, DType::F16, cfg, {5, 9});
  EXPECT_TRUE(run(be, ok).guards_ok());
}

// The same check where kv_len comes from the decode state: a step past the
// cache (set_decode_state(0, 700) on a capacity of 700: kv_len 701) is a
// named DeviceCheck at the next synchronize and its output zeros, at head
// dims 64 and 128 and capacities 100 (one slice) and 700 (six); the backend
// works after.
TEST_F(CudaDecodeCheck, DecodeStateKvLenPastTheCapacityIsADeviceCheck) {
  FERRUM_SEEDED_RNG(rng);
  Backend& be = cuda();
  for (std::size_t hd : {64, 128}) {
    for (std::size_t capacity : {100, 700}) {
      SCOPED_TRACE(cat("head_dim ", hd, ", capacity ", capacity));
      const AttnConfig cfg = attn_config(8, 2, hd, capacity);
      // Host kv_len 1 / pos_offset 0 are decoys (device-state mode reads the state).
      const FlashCase c = make_flash_case(rng, DType::F16, 1, 1, 1, 0, cfg, capacity);
      DeviceTensor q(be, c.q), k(be, c.k), v(be, c.v);
      GuardedOutput out(be, DType::F16, c.q.size());
      be.set_decode_state(0, static_cast<std::uint32_t>(capacity));
      {
        DeviceStateScope scope(be, true);
        be.flash_attention(q.view(), k.view(), v.view(), out.view(), 1, 1, 1, 0, cfg);
      }
      expect_error(ErrorCode::DeviceCheck, "flash_attention", [&] { be.synchronize(); },
                   cat("device-side kv_len ", capacity + 1, " (decode state or kv_lens) outside [1, kv_seq_stride = ",
                       capacity, "]"));
      for (float x : out.values()) ASSERT_EQ(x, 0.0f);
      EXPECT_TRUE(out.check_guard());
    }
  }
  be.set_decode_state(0, 0);
  const RaggedDecodeCase ok = make_ragged_decode_case(rng, DType::F16, attn_config(8, 2, 128, 700), {5, 9});
  EXPECT_TRUE(run(be, ok).guards_ok());
}

// Straight through the launcher with AttentionArgs::kv_before_wait (kv_len
// read before the PDL wait, without a report): a bad device-side kv_len is
// still reported (after the wait), its sequence gets zeros, and every byte
// equals the launch without it; a good sequence long enough for the early
// requests is computed alike.
TEST_F(CudaDecodeCheck, KvBeforeWaitStillReportsABadKvLen) {
  FERRUM_SEEDED_RNG(rng);
  cuda();  // device 0 current, its runtime made
  constexpr int kBatch = 2, kHeads = 8, kKvHeads = 2, kHd = 128, kCap = 700;
  const std::size_t q_elems = std::size_t{kBatch} * kHeads * kHd;
  const std::size_t kv_elems = std::size_t{kBatch} * kKvHeads * kCap * kHd;
  const DeviceBytes dq(encode_bytes(random_uniform(rng, DType::F16, q_elems)));
  const DeviceBytes dk(encode_bytes(random_uniform(rng, DType::F16, kv_elems)));
  const DeviceBytes dv(encode_bytes(random_uniform(rng, DType::F16, kv_elems)));
  const std::size_t ws = kernels::attention_workspace_floats(kBatch, kHeads, 1, kHd, kCap);
  DeviceBytes dout(q_elems * 2), dlog(sizeof(kernels::DeviceErrorLog)), dws(ws * sizeof(float));
  for (std::int32_t bad : {0, -3, kCap + 1}) {
    SCOPED_TRACE(cat("kv_lens[1] = ", bad));
    const std::int32_t lens[kBatch] = {kCap, bad};
    std::vector<std::uint8_t> lens_bytes(sizeof lens);
    std::memcpy(lens_bytes.data(), lens, sizeof lens);
    const DeviceBytes dlens(lens_bytes);
    auto run_with = [&](bool kv_before_wait) {
      dout.fill(kPoisonByte);
      dlog.fill(0);
      kernels::AttentionArgs a = attention_args(DType::F16, dq.get(), dk.get(), dv.get(), dout.get(),
                                                {.batch = kBatch, .heads = kHeads, .kv_heads = kKvHeads, .q_len = 1,
                                                 .head_dim = kHd, .kv_stride = kCap, .kv_len = 0, .pos_offset = 0});
      a.kv_lens = static_cast<const int*>(dlens.get());
      a.error_log = static_cast<kernels::DeviceErrorLog*>(dlog.get());
      kernels::set_decode_workspace(a, static_cast<float*>(dws.get()), ws);
      a.kv_before_wait = kv_before_wait;
      kernels::launch_attention(a, nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      kernels::DeviceErrorLog log{};
      EXPECT_EQ(cudaMemcpy(&log, dlog.get(), sizeof log, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_NE(log.slots[kernels::kErrAttnKvLen], 0u) << "the bad kv_len was not reported";
      return dout.read();
    };
    const std::vector<std::uint8_t> early = run_with(true);
    const std::size_t row_bytes = std::size_t{kHeads} * kHd * 2;
    for (std::size_t i = row_bytes; i < 2 * row_bytes; ++i) ASSERT_EQ(early[i], 0) << "byte " << i;
    EXPECT_TRUE(early == run_with(false));
  }
}

// The CUDA-core kernel (attention_rows_kernel, and its combine over split
// slices): the fallback where no tensor-core kernel applies (a device before
// sm_80, or operands their 16-byte loads cannot take). Reached here through
// the launcher with q 2 bytes past a 16-byte boundary (this kernel reads q
// one element at a time), against CpuBackend, f16 and bf16, every head_dim,
// GQA 10 (blocks of 8 heads: two per kv head): a batch of three decodes
// over 8 slices (the combine), a decode query before the newest key, and
// prefill chunks, causal at pos_offset > 0 and not; then out 2 bytes in
// (q aligned): a decode of one slice per row runs there too (this kernel
// writes out one element at a time), one of several slices is a named
// error (the combine stores 4 elements at once). out is poisoned, with a
// guard past its end.
TEST_F(CudaDecodeCheck, CudaCoreFallbackMatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  cuda();  // device 0 current, its runtime made
  constexpr std::size_t kHeads = 20, kKvHeads = 2, kGuardBytes = 64;
  struct Shape {
    std::size_t batch, q_len, kv_len, pos_offset, capacity;
    bool causal;
    std::size_t q_offset = 2, out_offset = 0;  // bytes past a 16-byte boundary
  };
  const Shape shapes[] = {{3, 1, 1000, 999, 1000, true},
                          {2, 1, 1000, 300, 1300, true},
                          {1, 70, 200, 130, 200, true},
                          {2, 70, 200, 0, 260, false},
                          {2, 1, 100, 99, 100, true, 0, 2},
                          {1, 1, 1000, 999, 1000, true, 0, 2}};
  for (DType dt : kHalfDTypes) {
    for (std::size_t hd : {64, 128, 256}) {
      for (const Shape& sh : shapes) {
        AttnConfig cfg = attn_config(kHeads, kKvHeads, hd, sh.capacity);
        cfg.causal = sh.causal;
        const FlashCase c = make_flash_case(rng, dt, sh.batch, sh.q_len, sh.kv_len, sh.pos_offset, cfg);
        SCOPED_TRACE(cat(describe(c), ", q ", sh.q_offset, " and out ", sh.out_offset, " bytes in"));
        std::vector<std::uint8_t> q_bytes(sh.q_offset, 0);
        const std::vector<std::uint8_t> q_encoded = encode_bytes(c.q);
        q_bytes.insert(q_bytes.end(), q_encoded.begin(), q_encoded.end());
        const DeviceBytes dq(q_bytes), dk(encode_bytes(c.k)), dv(encode_bytes(c.v));
        const std::size_t out_bytes = c.q.values.size() * size_of(dt);
        DeviceBytes dout(sh.out_offset + out_bytes + kGuardBytes);
        dout.fill(kPoisonByte);
        const std::size_t ws = kernels::attention_workspace_floats(
            static_cast<int>(sh.batch), static_cast<int>(kHeads), static_cast<int>(sh.q_len), static_cast<int>(hd),
            static_cast<long long>(sh.capacity));
        DeviceBytes dws(std::max<std::size_t>(ws, 1) * sizeof(float));
        kernels::AttentionArgs a = attention_args(
            dt, static_cast<const std::uint8_t*>(dq.get()) + sh.q_offset, dk.get(), dv.get(),
            static_cast<std::uint8_t*>(dout.get()) + sh.out_offset,
            {.batch = static_cast<int>(sh.batch), .heads = static_cast<int>(kHeads),
             .kv_heads = static_cast<int>(kKvHeads), .q_len = static_cast<int>(sh.q_len), .head_dim = static_cast<int>(hd),
             .kv_stride = static_cast<long long>(sh.capacity), .kv_len = static_cast<int>(sh.kv_len),
             .pos_offset = static_cast<long long>(sh.pos_offset), .causal = sh.causal});
        if (ws > 0) kernels::set_decode_workspace(a, static_cast<float*>(dws.get()), ws);
        if (sh.q_len == 1) {
          ASSERT_FALSE(kernels::decode_launch_plan(a).has_value()) << "the tensor-core decode took a misaligned operand";
        } else {
          ASSERT_FALSE(kernels::prefill_tc_applies(a)) << "a tensor-core prefill took a misaligned operand";
        }
        if (sh.out_offset != 0 && kernels::attention_decode_splits(a.kv_stride) > 1) {
          expect_error(ErrorCode::Internal, "flash_attention", [&] { kernels::launch_attention(a, nullptr); },
                       "out 8-byte alignment");
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<std::uint8_t> untouched = dout.read();
          EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](std::uint8_t b) { return b == kPoisonByte; }))
              << "nothing may be launched";
          continue;
        }
        kernels::launch_attention(a, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<std::uint8_t> got_bytes = dout.read();
        for (std::size_t i = 0; i < got_bytes.size(); ++i) {
          if (i >= sh.out_offset && i < sh.out_offset + out_bytes) continue;
          ASSERT_EQ(got_bytes[i], kPoisonByte) << "guard byte " << i << " around out";
        }
        const std::vector<std::uint8_t> out_only(got_bytes.begin() + static_cast<std::ptrdiff_t>(sh.out_offset),
                                                 got_bytes.begin() + static_cast<std::ptrdiff_t>(sh.out_offset + out_bytes));
        const std::vector<float> got = decode_bytes(dt, out_only);
        EXPECT_TRUE(all_close(got, run(cpu(), c).at("out").values, dt));
      }
    }
  }
}

// Past the kernels' grid limits (65535 heads; 65535 sequences at prefill):
// a named Unsupported, not a failed launch.
TEST_F(CudaDecodeCheck, GridLimitsAreNamedErrors) {
  Backend& be = cuda();
  constexpr std::size_t kPast = 65536, kHd = 64;
  {
    AttnConfig cfg = attn_config(kPast, kPast, kHd, 1);
    Buffer q = be.alloc(DType::F16, kPast * kHd), k = be.alloc(DType::F16, kPast * kHd);
    Buffer v = be.alloc(DType::F16, kPast * kHd), out = be.alloc(DType::F16, kPast * kHd);
    expect_error(ErrorCode::Unsupported, "flash_attention", [&] { be.flash_attention(q, k, v, out, 1, 1, 1, 0, cfg); },
                 "cfg.num_heads = 65536");
  }
  {
    AttnConfig cfg = attn_config(1, 1, kHd, 2);
    Buffer q = be.alloc(DType::F16, kPast * 2 * kHd), k = be.alloc(DType::F16, kPast * 2 * kHd);
    Buffer v = be.alloc(DType::F16, kPast * 2 * kHd), out = be.alloc(DType::F16, kPast * 2 * kHd);
    expect_error(ErrorCode::Unsupported, "flash_attention",
                 [&] { be.flash_attention(q, k, v, out, kPast, 2, 2, 0, cfg); }, "batch = 65536");
  }
  be.synchronize();  // nothing was launched: the backend is fine
}

// A decode call whose split-K scratch outgrows the preallocated workspace
// (CudaBackendConfig::attention_workspace_bytes, 256 MiB by default) is a
// named CapacityExceeded, in flash_attention and flash_decode_ragged, eagerly
// and during a capture (which it ends, keeping no graph); the backend works
// afterwards. Many heads make the scratch large with small buffers: 2
// sequences x 16384 heads x 16 slices x (256 + 1) floats is 539 MB, with one
// kv head of a 8192-position cache.
TEST_F(CudaDecodeCheck, SplitScratchPastTheWorkspaceIsCapacityExceeded) {
  Backend& be = cuda();
  constexpr std::size_t kBatch = 2, kHeads = 16384, kHd = 256, kStride = 8192;
  const std::size_t need_bytes = kBatch * kHeads * kernels::attention_decode_splits(kStride) * (kHd + 1) * 4;
  ASSERT_GT(need_bytes, CudaBackendConfig{}.attention_workspace_bytes) << "the test must outgrow the default";
  const AttnConfig cfg = attn_config(kHeads, 1, kHd, kStride);
  Buffer q = be.alloc(DType::F16, kBatch * kHeads * kHd), out = be.alloc(DType::F16, kBatch * kHeads * kHd);
  Buffer k = be.alloc(DType::F16, kBatch * kStride * kHd), v = be.alloc(DType::F16, kBatch * kStride * kHd);
  const Buffer kv_lens = be.upload(std::vector<float>{1.0f, static_cast<float>(kStride)}, DType::I32);
  const std::string named = cat("decode split-K scratch needs ", need_bytes,
                                " bytes, more than CudaBackendConfig::attention_workspace_bytes");
  for (const bool capture : {false, true}) {
    SCOPED_TRACE(capture ? "during a capture" : "eager");
    auto refused = [&](const char* op, const std::function<void()>& call) {
      if (capture) be.begin_graph_capture();
      expect_error(ErrorCode::CapacityExceeded, op, call, named);
      EXPECT_FALSE(be.is_capturing()) << op << ": the refusal must end the capture";
      EXPECT_FALSE(be.replay_last_graph()) << op << ": no graph may be kept";
    };
    refused("flash_attention", [&] { be.flash_attention(q, k, v, out, kBatch, 1, kStride, kStride - 1, cfg); });
    refused("flash_decode_ragged", [&] { be.flash_decode_ragged(q, k, v, out, kv_lens, kBatch, cfg); });
  }
  be.synchronize();  // nothing was launched
  FERRUM_SEEDED_RNG(rng);
  EXPECT_TRUE(run(be, make_ragged_decode_case(rng, DType::F16, attn_config(8, 2, 128, 700), {5, 700})).guards_ok());
}

// The attention kernels read device memory (cp.async, bulk and tensor-map
// copies): host memory (alloc_host, or wrapped page-locked memory) in any
// operand, kv_lens included, is a named InvalidArgument, eagerly and during
// a capture (which it ends); nothing is launched.
TEST_F(CudaDecodeCheck, HostMemoryOperandsAreRefusedByName) {
  Backend& be = cuda();
  constexpr std::size_t kHeads = 8, kKvHeads = 2, kHd = 64, kStride = 16;
  const AttnConfig cfg = attn_config(kHeads, kKvHeads, kHd, kStride);
  const std::size_t q_n = 2 * kHeads * kHd, kv_n = 2 * kKvHeads * kStride * kHd;
  Buffer q = be.alloc(DType::F16, q_n), out = be.alloc(DType::F16, q_n);
  Buffer k = be.alloc(DType::F16, kv_n), v = be.alloc(DType::F16, kv_n);
  const Buffer kv_lens = be.upload(std::vector<float>{3.0f, 16.0f}, DType::I32);
  Buffer host_q = be.alloc_host(DType::F16, q_n), host_v = be.alloc_host(DType::F16, kv_n);
  Buffer host_out = be.alloc_host(DType::F16, q_n), host_lens = be.alloc_host(DType::I32, 2);
  static_cast<std::int32_t*>(host_lens.data())[0] = 3;
  static_cast<std::int32_t*>(host_lens.data())[1] = 16;
  ASSERT_TRUE(host_q.host_memory());
  ASSERT_FALSE(q.host_memory());
  // Page-locked memory the engine allocated itself, wrapped.
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, kv_n * 2, cudaHostAllocPortable), cudaSuccess);
  {
    Buffer wrapped_k = Buffer::wrap(be, pinned, DType::F16, kv_n);
    EXPECT_TRUE(wrapped_k.host_memory());
    EXPECT_FALSE(Buffer::wrap(be, k.data(), DType::F16, kv_n).host_memory());
    for (const bool capture : {false, true}) {
      SCOPED_TRACE(capture ? "during a capture" : "eager");
      auto refused = [&](const char* op, const char* arg, const std::function<void()>& call) {
        SCOPED_TRACE(arg);
        if (capture) be.begin_graph_capture();
        expect_error(ErrorCode::InvalidArgument, op, call, cat("argument '", arg, "'"));
        EXPECT_FALSE(be.is_capturing()) << op << ": the refusal must end the capture";
        EXPECT_FALSE(be.replay_last_graph()) << op << ": no graph may be kept";
      };
      // Decode (q_len 1) and prefill (q_len 2: wgmma's tensor maps on sm_90a).
      refused("flash_attention", "q", [&] { be.flash_attention(host_q, k, v, out, 2, 1, 16, 15, cfg); });
      refused("flash_attention", "k", [&] { be.flash_attention(q, wrapped_k, v, out, 2, 1, 16, 15, cfg); });
      refused("flash_attention", "v", [&] { be.flash_attention(q, k, host_v, out, 1, 2, 16, 14, cfg); });
      refused("flash_attention", "out", [&] { be.flash_attention(q, k, v, host_out, 1, 2, 16, 14, cfg); });
      refused("flash_decode_ragged", "q", [&] { be.flash_decode_ragged(host_q, k, v, out, kv_lens, 2, cfg); });
      refused("flash_decode_ragged", "kv_lens", [&] { be.flash_decode_ragged(q, k, v, out, host_lens, 2, cfg); });
    }
  }
  be.synchronize();  // nothing was launched
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  FERRUM_SEEDED_RNG(rng);
  EXPECT_TRUE(run(be, make_ragged_decode_case(rng, DType::F16, attn_config(8, 2, 128, 700), {5, 700})).guards_ok());
}

}  // namespace
}  // namespace ferrum::test
