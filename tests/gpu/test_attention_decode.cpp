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
//   to a 4k capacity, 512 at 5000), the capacity (not a multiple of the
//   slice), GQA groups that take two m-tiles and two head chunks: each
//   matches the CPU, two runs are bitwise equal, and each sequence equals
//   its own single decode. The fused merge's arrival counters must be back
//   at zero after every launch, else a later launch with another number of
//   valid slices merges too early or never (the 2nd run and the single
//   decodes would differ).
// - Device check: kv_lens outside [1, capacity] is reported as DeviceCheck
//   at synchronize(), zeros are written, and the backend keeps working.
// - Launch knobs (kernels::DecodeTuning, through the launcher on raw device
//   memory: the backend always passes the default): under every slice
//   geometry (long_splits, min_slice_keys), the L2 prefetch settings and who
//   merges the slices change no bit of the output. The geometry knobs change
//   the slices, so each of them is checked like the default: against the
//   CPU, two runs bitwise, each sequence of a ragged batch equal to its own
//   decode with a host kv_len and with the decode state, the fused merge
//   equal to the combine kernel, and the slice merge across several rounds
//   of loads (GQA 32 heads per block). Values outside the lists throw.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible, except the knob
// check, which throws before any device work.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/decode_state.hpp"

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
    ASSERT_TRUE(be.replay_last_graph());
    be.flash_decode_ragged(q.view(), k.view(), v.view(), out_eager.view(), lens_eager.view(), kBatch, cfg);
    be.synchronize();
    ASSERT_TRUE(bitwise_equal(out_graph.bytes(), out_eager.bytes(), size_of(dt)));
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
  EXPECT_TRUE(bitwise_equal(d1.at("out").bytes, d2.at("out").bytes, size_of(dt)));
  cfg.kv_seq_stride = 0;
  const FlashCase prefill = make_flash_case(rng, dt, 1, 300, 1000, 700, cfg);
  const OpResult p1 = run(be, prefill), p2 = run(be, prefill);
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
  // (two m-tiles), GQA 48 (two chunks, hd 64), hd 256 with GQA 1.
  for (const Shape& sh : {Shape{32, 8, 128, 1000}, Shape{32, 8, 128, 5000}, Shape{64, 2, 128, 700},
                          Shape{48, 1, 64, 3000}, Shape{4, 4, 256, 300}}) {
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

// A ragged decode case in raw device memory, run straight through
// kernels::launch_attention with any DecodeTuning (the backend always
// passes the default). The workspace is attention_workspace_floats, sized
// for every allowed tuning.
class RawDecode {
 public:
  enum class KvLen { Host, PerSequence, DecodeState };

  explicit RawDecode(const RaggedDecodeCase& c)
      : c_(c), q_row_(c.cfg.num_heads * c.cfg.head_dim), kv_seq_(c.cfg.num_kv_heads * c.cfg.kv_seq_stride * c.cfg.head_dim),
        es_(size_of(c.q.dtype)) {
    upload(&q_, encode_bytes(c.q));
    upload(&k_, encode_bytes(c.k));
    upload(&v_, encode_bytes(c.v));
    upload(&lens_, encode_bytes(c.kv_lens));
    ws_floats_ = kernels::attention_workspace_floats(static_cast<int>(c.batch), static_cast<int>(c.cfg.num_heads), 1,
                                                     static_cast<int>(c.cfg.head_dim),
                                                     static_cast<long long>(c.cfg.kv_seq_stride));
    EXPECT_EQ(cudaMalloc(&ws_, std::max<std::size_t>(ws_floats_, 1) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out_, c.batch * q_row_ * es_), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&state_, sizeof(kernels::DecodeState)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&flag_, sizeof(std::uint32_t)), cudaSuccess);
    EXPECT_EQ(cudaMemset(flag_, 0, sizeof(std::uint32_t)), cudaSuccess);
  }
  ~RawDecode() {
    for (void* p : {q_, k_, v_, lens_, ws_, out_, state_, flag_}) EXPECT_EQ(cudaFree(p), cudaSuccess);
  }
  RawDecode(const RawDecode&) = delete;
  RawDecode& operator=(const RawDecode&) = delete;

  // Sequences [b0, b0 + n) into a poisoned output; their kv_len from the
  // host (`kv_len`, all of them), from the case's kv_lens, or from the
  // decode state (`kv_len`). Returns the output bytes.
  std::vector<std::uint8_t> run(const kernels::DecodeTuning& tuning, KvLen source, std::size_t b0, std::size_t n,
                                int kv_len = 0) {
    EXPECT_EQ(cudaMemset(out_, kPoisonByte, n * q_row_ * es_), cudaSuccess);
    kernels::AttentionArgs a;
    a.dtype = c_.q.dtype;
    a.q = static_cast<const std::uint8_t*>(q_) + b0 * q_row_ * es_;
    a.k = static_cast<const std::uint8_t*>(k_) + b0 * kv_seq_ * es_;
    a.v = static_cast<const std::uint8_t*>(v_) + b0 * kv_seq_ * es_;
    a.out = out_;
    a.batch = static_cast<int>(n);
    a.num_heads = static_cast<int>(c_.cfg.num_heads);
    a.num_kv_heads = static_cast<int>(c_.cfg.num_kv_heads);
    a.q_len = 1;
    a.head_dim = static_cast<int>(c_.cfg.head_dim);
    a.kv_stride = static_cast<long long>(c_.cfg.kv_seq_stride);
    a.error_flag = static_cast<std::uint32_t*>(flag_);
    a.scale = 1.0f / std::sqrt(static_cast<float>(c_.cfg.head_dim));
    switch (source) {
      case KvLen::Host:
        a.kv_len = kv_len;
        a.pos_offset = kv_len - 1;
        break;
      case KvLen::PerSequence:
        a.kv_lens = static_cast<const int*>(lens_) + b0;
        break;
      case KvLen::DecodeState: {
        const kernels::DecodeState st{0, kv_len - 1, kv_len};
        EXPECT_EQ(cudaMemcpy(state_, &st, sizeof st, cudaMemcpyHostToDevice), cudaSuccess);
        a.state = static_cast<const kernels::DecodeState*>(state_);
        break;
      }
    }
    kernels::set_decode_workspace(a, static_cast<float*>(ws_), ws_floats_);
    a.decode_tuning = tuning;
    kernels::launch_attention(a, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint8_t> out(n * q_row_ * es_);
    EXPECT_EQ(cudaMemcpy(out.data(), out_, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // Sequence b's rows of a whole-batch output.
  std::vector<std::uint8_t> rows_of(const std::vector<std::uint8_t>& all, std::size_t b) const {
    const auto row = static_cast<std::ptrdiff_t>(q_row_ * es_);
    return {all.begin() + static_cast<std::ptrdiff_t>(b) * row, all.begin() + static_cast<std::ptrdiff_t>(b + 1) * row};
  }
  std::vector<float> values(const std::vector<std::uint8_t>& bytes) const {
    std::vector<float> out(bytes.size() / es_);
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::uint16_t h;
      std::memcpy(&h, bytes.data() + i * es_, 2);
      out[i] = c_.q.dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    return out;
  }
  std::uint32_t error_flag() const {
    std::uint32_t flag = 1;
    EXPECT_EQ(cudaMemcpy(&flag, flag_, sizeof flag, cudaMemcpyDeviceToHost), cudaSuccess);
    return flag;
  }

 private:
  static void upload(void** dst, const std::vector<std::uint8_t>& bytes) {
    EXPECT_EQ(cudaMalloc(dst, std::max<std::size_t>(bytes.size(), 16)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(*dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }

  const RaggedDecodeCase& c_;
  std::size_t q_row_, kv_seq_, es_;
  std::size_t ws_floats_ = 0;
  void *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *lens_ = nullptr, *ws_ = nullptr, *out_ = nullptr,
       *state_ = nullptr, *flag_ = nullptr;
};

// The slice geometries: the default and every allowed knob value.
std::vector<kernels::DecodeTuning> geometries() {
  std::vector<kernels::DecodeTuning> g(4);
  g[1].long_splits = 32;
  g[2].min_slice_keys = 64;
  g[3].long_splits = 32;
  g[3].min_slice_keys = 64;
  return g;
}
std::string describe_geometry(const kernels::DecodeTuning& t, std::size_t capacity) {
  return cat("long_splits ", t.long_splits, " min_slice_keys ", t.min_slice_keys, ": ",
             kernels::attention_decode_splits(static_cast<long long>(capacity), t), " slices of ",
             kernels::attention_decode_slice_keys(static_cast<long long>(capacity), t));
}

// Every DecodeTuning variant that keeps the slices gives the bytes of its
// geometry's default. Cases: a small launch (the whole-slice L2 prefetch
// applies when a variant turns it on), one past a 36 MiB footprint
// (prefetch-ahead applies), several valid slices to merge in both; each
// under every geometry (at capacity 1000 min_slice_keys 64 gives 16 slices
// for 8; at 5000 and 20000 long_splits 32 gives 20 for 10).
TEST_P(CudaDecodeBatch, DecodeTuningKnobsChangeNoBit) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  cuda();  // device 0 current, its runtime made
  struct Case {
    std::size_t batch;
    int kv_len;
    std::size_t capacity;
  };
  for (const Case& c : {Case{1, 700, 1000}, Case{3, 4999, 5000}, Case{2, 9000, 20000}}) {
    const RaggedDecodeCase rc = make_ragged_decode_case(rng, dt, attn_config(8, 2, 128, c.capacity),
                                                        std::vector<std::size_t>(c.batch, c.kv_len));
    RawDecode raw(rc);
    for (const kernels::DecodeTuning& geometry : geometries()) {
      SCOPED_TRACE(cat("batch ", c.batch, " kv_len ", c.kv_len, " capacity ", c.capacity, ", ",
                       describe_geometry(geometry, c.capacity)));
      const std::vector<std::uint8_t> reference = raw.run(geometry, RawDecode::KvLen::Host, 0, c.batch, c.kv_len);
      std::vector<kernels::DecodeTuning> variants(5, geometry);
      variants[0].l2_ahead = 2;
      variants[1].l2_ahead = 5;
      variants[2].l2_prefetch_bytes = 36.0 * 1024 * 1024;
      variants[3].l2_prefetch_bytes = 1e12;
      variants[4].fused_merge = false;
      for (std::size_t i = 0; i < variants.size(); ++i) {
        EXPECT_TRUE(reference == raw.run(variants[i], RawDecode::KvLen::Host, 0, c.batch, c.kv_len))
            << "variant " << i << " changed the output";
      }
    }
    EXPECT_EQ(raw.error_flag(), 0u);
  }
}

// The geometry knobs' slices, checked like the default's: slice edges at
// 64-key and 256-key slices, 32 slices (the most), GQA 32 in one block (hd
// 128 and 64: the slice merge takes several rounds of loads), two head
// chunks, hd 256 in both regimes. Rows past kv_lens hold NaN.
TEST_P(CudaDecodeBatch, GeometryKnobsMatchCpuAndRepeatBitwise) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  cuda();
  struct Shape {
    std::size_t nh, nkv, hd, cap;
    std::vector<std::size_t> lens;
  };
  const Shape shapes[] = {
      {32, 8, 128, 1000, {1, 63, 64, 65, 129, 700, 999, 1000}},  // min 64: 16 slices
      {8, 2, 128, 2048, {1, 64, 65, 2047, 2048}},                 // min 64: 32 slices
      {8, 2, 128, 5000, {1, 255, 256, 257, 4999, 5000}},          // long 32: 256-key slices, 20
      {64, 2, 128, 700, {1, 64, 65, 699, 700}},                   // GQA 32: two m-tiles
      {48, 1, 64, 2000, {1, 64, 129, 1999, 2000}},                // GQA 48: two chunks (32 + 16 heads)
      {4, 4, 256, 300, {1, 64, 65, 299, 300}},                    // hd 256, min 64: 5 slices
      {16, 2, 256, 4500, {1, 2300, 4500}},                        // hd 256, long 32: 18 slices
  };
  for (const Shape& sh : shapes) {
    const RaggedDecodeCase c = make_ragged_decode_case(rng, dt, attn_config(sh.nh, sh.nkv, sh.hd, sh.cap), sh.lens);
    const OpResult want = run(cpu(), c);
    RawDecode raw(c);
    for (const kernels::DecodeTuning& geometry : geometries()) {
      SCOPED_TRACE(cat(describe(c), ", ", describe_geometry(geometry, sh.cap)));
      const std::vector<std::uint8_t> first = raw.run(geometry, RawDecode::KvLen::PerSequence, 0, c.batch);
      EXPECT_TRUE(all_close(raw.values(first), want.at("out").values, dt));
      EXPECT_TRUE(bitwise_equal(raw.run(geometry, RawDecode::KvLen::PerSequence, 0, c.batch), first, size_of(dt)))
          << "second run";
      kernels::DecodeTuning unfused = geometry;
      unfused.fused_merge = false;
      EXPECT_TRUE(bitwise_equal(raw.run(unfused, RawDecode::KvLen::PerSequence, 0, c.batch), first, size_of(dt)))
          << "combine kernel vs fused merge";
      for (std::size_t b = 0; b < c.batch; ++b) {
        const int len = static_cast<int>(sh.lens[b]);
        SCOPED_TRACE(cat("sequence ", b, " kv_len ", len));
        EXPECT_TRUE(bitwise_equal(raw.run(geometry, RawDecode::KvLen::Host, b, 1, len), raw.rows_of(first, b),
                                  size_of(dt)))
            << "host kv_len, batch 1";
        EXPECT_TRUE(bitwise_equal(raw.run(geometry, RawDecode::KvLen::DecodeState, b, 1, len),
                                  raw.rows_of(first, b), size_of(dt)))
            << "decode state, batch 1";
      }
    }
    EXPECT_EQ(raw.error_flag(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaDecodeBatch, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

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
    expect_error(ErrorCode::DeviceCheck, "flash_decode_ragged", [&] { be.synchronize(); });
    // The bad sequence gets zeros; the good one is computed.
    const std::vector<float> got = out.values();
    const std::size_t row = cfg.num_heads * cfg.head_dim;
    for (std::size_t i = row; i < 2 * row; ++i) ASSERT_EQ(got[i], 0.0f) << "element " << i;
    for (std::size_t i = 0; i < row; ++i) ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    EXPECT_TRUE(out.check_guard());
  }
  // Still usable.
  const RaggedDecodeCase ok = make_ragged_decode_case(rng, DType::F16, cfg, {5, 9});
  EXPECT_TRUE(run(be, ok).guards_ok());
}

// Host-side: a geometry knob outside its list throws before any device
// work (so this runs without a GPU too).
TEST(DecodeTuningCheck, GeometryKnobsOutsideTheirListsThrow) {
  for (int bad : {0, 8, 24, 64}) {
    kernels::AttentionArgs a;
    a.q_len = 1;
    a.decode_tuning.long_splits = bad;
    expect_error(ErrorCode::Internal, "flash_attention", [&] { kernels::launch_attention(a, nullptr); },
                 "decode_tuning.long_splits");
  }
  for (int bad : {0, 32, 96, 256}) {
    kernels::AttentionArgs a;
    a.q_len = 1;
    a.decode_tuning.min_slice_keys = bad;
    expect_error(ErrorCode::Internal, "flash_attention", [&] { kernels::launch_attention(a, nullptr); },
                 "decode_tuning.min_slice_keys");
  }
}

}  // namespace
}  // namespace ferrum::test
