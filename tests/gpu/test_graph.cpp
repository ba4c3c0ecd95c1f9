// CUDA graph capture and replay on CudaBackend.
//
// Decode loop: ONE graph of embedding_lookup -> qk_norm_rope ->
// kv_cache_append_head_major -> rms_norm -> gemm is captured in device-state
// mode (small Llama-ish sizes), then replayed for 1000 steps with a changing
// token and position. Every step is also run eagerly on two more sets of
// buffers: in device-state mode, and with host arguments. All three must
// agree BITWISE on every output (embedding, rope, the kv rows written, the
// norm, the gemm), and at the end on the whole caches (rows never written
// still hold their poison).
//
// Capture errors: an op refused during capture (bad arguments, or a call not
// allowed while capturing: synchronize, alloc, host transfers, ...) throws,
// ends the capture, and leaves the backend usable. replay_last_graph() is
// false with no graph held.
//
// Memory a held graph points at: Buffers freed while a graph is held or
// captured stay allocated (retired) until the graph is dropped, so replays
// stay valid and no new allocation lands on them.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

constexpr std::size_t kDim = 512, kHeads = 8, kHd = 64, kVocab = 1000, kCapacity = 1024, kN = 768;
constexpr std::size_t kSteps = 1000;
constexpr float kEps = 1e-6f;

// Inputs every set of buffers shares (read-only).
struct Weights {
  Weights(Backend& be, Rng& rng, DType dt)
      : table(be, random_uniform(rng, dt, kVocab * kDim)),
        qk_norm_w(be, random_uniform(rng, dt, kHd, 0.5f, 1.5f)),
        norm_w(be, random_uniform(rng, dt, kDim, 0.5f, 1.5f)),
        w_out(be, random_uniform(rng, dt, kN * kDim, -0.1f, 0.1f)) {
    const RopeTables t = make_rope_tables(kCapacity, kHd, kRopeTheta10k);
    cos = DeviceTensor(be, t.cos);
    sin = DeviceTensor(be, t.sin);
  }
  DeviceTensor table, qk_norm_w, norm_w, w_out, cos, sin;
};

// One set of outputs for the decode chain, all poisoned and guarded.
struct DecodeBuffers {
  DecodeBuffers(Backend& be, DType dt)
      : ids(be, HostTensor{DType::I32, {0.0f}}),
        x(be, dt, kDim),
        q(be, dt, kHeads * kHd),
        cache_k(be, dt, kHeads * kCapacity * kHd),
        cache_v(be, dt, kHeads * kCapacity * kHd),
        normed(be, dt, kDim),
        logits(be, dt, kN) {}

  // The per-step outputs, in chain order.
  std::vector<GuardedOutput*> step_outputs() { return {&x, &q, &normed, &logits}; }

  DeviceTensor ids;
  GuardedOutput x, q, cache_k, cache_v, normed, logits;
};

// The decode chain. With `host` it passes the real token / position as host
// arguments (ids must hold the token); without, decoys that device-state mode
// must ignore (null ids, position 0).
void decode_chain(Backend& be, const Weights& w, DecodeBuffers& b, std::optional<DecodeStep> host) {
  const std::size_t pos = host ? host->step : 0;
  const Buffer null_ids;
  be.embedding_lookup(w.table.view(), host ? b.ids.view() : null_ids, b.x.view(), 1, kDim, kVocab);
  // x is [1, heads, hd] token-major; q comes out [heads, 1, hd] head-major.
  be.qk_norm_rope(b.x.view(), &w.qk_norm_w.view(), w.cos.view(), w.sin.view(), b.q.view(), 1, kHeads, kHd, pos, kCapacity,
                  kEps, RopeMode::NormAndRope);
  // K = the rotated q, V = the embedding ([1, 8*64] is [8, 1, 64] for one token).
  be.kv_cache_append_head_major(b.cache_k.view(), b.cache_v.view(), pos, kCapacity, b.q.view(), b.x.view(), 1,
                                kHeads, kHd);
  be.rms_norm(b.x.view(), w.norm_w.view(), kEps, b.normed.view(), 1, kDim);
  be.gemm(b.normed.view(), w.w_out.view(), b.logits.view(), 1, kN, kDim);
}

// Bytes of row `step` of every kv head of a cache.
std::vector<std::uint8_t> cache_row(Backend& be, GuardedOutput& cache, std::size_t step) {
  const std::size_t es = size_of(cache.dtype()), row = kHd * es;
  std::vector<std::uint8_t> bytes(kHeads * row);
  for (std::size_t h = 0; h < kHeads; ++h) {
    be.read_bytes(cache.view(), bytes.data() + h * row, row, (h * kCapacity + step) * row);
  }
  return bytes;
}

class CudaGraphDecode : public CudaParamTest<DType> {};

TEST_P(CudaGraphDecode, ReplayMatchesEagerBitwiseFor1000Steps) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  Backend& be = cuda();
  const Weights w(be, rng, dt);
  DecodeBuffers graph(be, dt), eager_state(be, dt), eager_host(be, dt);

  be.reset_graph();
  EXPECT_FALSE(be.replay_last_graph()) << "no graph is held after reset_graph()";
  {
    DeviceStateScope scope(be, true);
    be.begin_graph_capture();
    EXPECT_TRUE(be.is_capturing());
    decode_chain(be, w, graph, std::nullopt);
    be.end_graph_capture();
  }
  EXPECT_FALSE(be.is_capturing());
  // Capturing records work; it must not have run any of it.
  for (GuardedOutput* out : graph.step_outputs()) {
    EXPECT_EQ(out->bytes(), std::vector<std::uint8_t>(out->need() * size_of(dt), kPoisonByte))
        << "capture executed work";
  }

  const std::size_t es = size_of(dt);
  std::size_t failed_steps = 0;
  for (std::size_t step = 0; step < kSteps && failed_steps < 3; ++step) {
    const DecodeStep s{rng.below(kVocab), static_cast<std::uint32_t>(step)};
    SCOPED_TRACE(cat("step ", step, " token ", s.token));
    be.set_decode_state(s.token, s.step);
    // Every step's outputs poisoned first: a step's bits are its own.
    for (DecodeBuffers* b : {&graph, &eager_state, &eager_host}) {
      for (GuardedOutput* out : b->step_outputs()) out->poison();
    }
    ASSERT_TRUE(be.replay_last_graph());
    {
      DeviceStateScope scope(be, true);
      decode_chain(be, w, eager_state, std::nullopt);
    }
    be.write(eager_host.ids.view(), std::vector<float>{static_cast<float>(s.token)});
    decode_chain(be, w, eager_host, s);
    be.synchronize();

    const auto graph_outs = graph.step_outputs(), state_outs = eager_state.step_outputs(),
               host_outs = eager_host.step_outputs();
    const char* names[] = {"embedding", "qk_norm_rope", "rms_norm", "gemm"};
    bool ok = true;
    for (std::size_t i = 0; i < graph_outs.size(); ++i) {
      SCOPED_TRACE(names[i]);
      const std::vector<std::uint8_t> g = graph_outs[i]->bytes();
      const auto a = bitwise_equal(g, state_outs[i]->bytes(), es);
      const auto b = bitwise_equal(g, host_outs[i]->bytes(), es);
      EXPECT_TRUE(a) << "graph replay vs eager device-state";
      EXPECT_TRUE(b) << "graph replay vs eager host arguments";
      ok = ok && a && b;
    }
    // Each step's guards, before the next step's poison refills them.
    for (DecodeBuffers* set : {&graph, &eager_state, &eager_host}) {
      for (std::size_t i = 0; i < graph_outs.size(); ++i) {
        const auto guard = set->step_outputs()[i]->check_guard(names[i], "out", cat("step ", step));
        EXPECT_TRUE(guard);
        ok = ok && guard;
      }
    }
    for (auto [name, member] : {std::pair{"cache_k", &DecodeBuffers::cache_k}, {"cache_v", &DecodeBuffers::cache_v}}) {
      SCOPED_TRACE(cat(name, " row ", step));
      const std::vector<std::uint8_t> g = cache_row(be, graph.*member, step);
      const auto a = bitwise_equal(g, cache_row(be, eager_state.*member, step), es);
      const auto b = bitwise_equal(g, cache_row(be, eager_host.*member, step), es);
      EXPECT_TRUE(a) << "graph replay vs eager device-state";
      EXPECT_TRUE(b) << "graph replay vs eager host arguments";
      ok = ok && a && b;
    }
    if (!ok) ++failed_steps;
  }
  ASSERT_EQ(failed_steps, 0u) << "stopped after the first failing steps";

  // Whole caches: identical across the three sets, and rows >= kSteps were
  // never written (still poison).
  for (auto member : {&DecodeBuffers::cache_k, &DecodeBuffers::cache_v}) {
    const std::vector<std::uint8_t> g = (graph.*member).bytes();
    EXPECT_TRUE(bitwise_equal(g, (eager_state.*member).bytes(), es));
    EXPECT_TRUE(bitwise_equal(g, (eager_host.*member).bytes(), es));
    for (std::size_t h = 0; h < kHeads; ++h) {
      const auto first = g.begin() + static_cast<std::ptrdiff_t>((h * kCapacity + kSteps) * kHd * es);
      const auto last = g.begin() + static_cast<std::ptrdiff_t>((h + 1) * kCapacity * kHd * es);
      EXPECT_TRUE(std::all_of(first, last, [](std::uint8_t v) { return v == kPoisonByte; }))
          << "kv head " << h << ": rows past the last step were written";
    }
  }
  for (DecodeBuffers* set : {&graph, &eager_state, &eager_host}) {
    for (GuardedOutput* out : set->step_outputs()) EXPECT_TRUE(out->check_guard());
    EXPECT_TRUE(set->cache_k.check_guard());
    EXPECT_TRUE(set->cache_v.check_guard());
  }
  be.reset_graph();
  EXPECT_FALSE(be.replay_last_graph());
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaGraphDecode, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Capture errors ───────────────────────────────────────────────────────────

class CudaGraphErrors : public CudaTest {
 protected:
  // Eager ops work and match the CPU; a new capture can be made and replayed.
  void expect_backend_usable(Rng& rng) {
    EXPECT_FALSE(cuda().is_capturing());
    EXPECT_NO_THROW(cuda().synchronize());
    expect_backend_works(cuda(), cpu(), rng);
    expect_capture_replays();
  }

  // Captures add_inplace(acc, one) and replays it 3 times: acc == 3.
  void expect_capture_replays() {
    Buffer acc = cuda().upload(std::vector<float>(100, 0.0f), DType::F16);
    Buffer one = cuda().upload(std::vector<float>(100, 1.0f), DType::F16);
    cuda().begin_graph_capture();
    cuda().add_inplace(acc, one, 100);
    cuda().end_graph_capture();
    EXPECT_EQ(cuda().download(acc), std::vector<float>(100, 0.0f)) << "capture ran the op";
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(cuda().replay_last_graph());
    EXPECT_EQ(cuda().download(acc), std::vector<float>(100, 3.0f));
    cuda().reset_graph();
  }

  // Begins a capture with one op recorded, then runs `refused`, which must
  // throw `code` naming `op` and end the capture.
  void expect_refused_during_capture(ErrorCode code, std::string_view op, const std::function<void()>& refused,
                                     std::source_location where = std::source_location::current()) {
    SCOPED_TRACE(cat("refused during capture: ", op));
    Buffer a = cuda().upload(std::vector<float>(64, 1.0f), DType::F16);
    Buffer b = cuda().upload(std::vector<float>(64, 2.0f), DType::F16);
    cuda().begin_graph_capture();
    cuda().add_inplace(a, b, 64);
    expect_error(code, op, refused, std::string_view{}, where);
    EXPECT_FALSE(cuda().is_capturing()) << "the capture must be ended by the error";
    EXPECT_FALSE(cuda().replay_last_graph()) << "a half-recorded graph must never be kept for replay";
    EXPECT_EQ(cuda().download(a), std::vector<float>(64, 1.0f)) << "the recorded op must not have run";
  }
};

TEST_F(CudaGraphErrors, ReplayIsFalseWithoutAGraph) {
  cuda().reset_graph();
  EXPECT_FALSE(cuda().replay_last_graph());
  EXPECT_NO_THROW(cuda().reset_graph());  // resetting nothing is fine
  expect_capture_replays();  // ends with reset_graph()
  EXPECT_FALSE(cuda().replay_last_graph());
}

// held_graph(): 0 without a graph, a new id for every capture, the same id
// seen through another CudaBackend object on the device (the slot is the
// device's), 0 again after reset_graph().
TEST_F(CudaGraphErrors, HeldGraphIdsTellCapturesApart) {
  cuda().reset_graph();
  EXPECT_EQ(cuda().held_graph(), 0u);
  Buffer acc = cuda().upload(std::vector<float>(16, 0.0f), DType::F16);
  Buffer one = cuda().upload(std::vector<float>(16, 1.0f), DType::F16);
  auto capture = [&] {
    cuda().begin_graph_capture();
    cuda().add_inplace(acc, one, 16);
    cuda().end_graph_capture();
    return cuda().held_graph();
  };
  const std::uint64_t first = capture();
  EXPECT_NE(first, 0u);
  CudaBackend other;
  EXPECT_EQ(other.held_graph(), first);
  const std::uint64_t second = capture();
  EXPECT_NE(second, 0u);
  EXPECT_NE(second, first);
  EXPECT_EQ(other.held_graph(), second);
  other.reset_graph();
  EXPECT_EQ(cuda().held_graph(), 0u);
  EXPECT_FALSE(cuda().replay_last_graph());
}

TEST_F(CudaGraphErrors, BadArgumentsDuringCapture) {
  FERRUM_SEEDED_RNG(rng);
  cuda().reset_graph();
  Buffer x = cuda().upload(std::vector<float>(64, 1.0f), DType::F16);
  Buffer w = cuda().upload(std::vector<float>(64, 1.0f), DType::F16);
  Buffer out = cuda().alloc(DType::F16, 64);
  Buffer wrong = cuda().alloc(DType::F32, 64);
  expect_refused_during_capture(ErrorCode::InvalidArgument, "rms_norm",
                                [&] { cuda().rms_norm(x, w, 1e-6f, out, 0, 64); });
  expect_refused_during_capture(ErrorCode::ShapeMismatch, "rms_norm",
                                [&] { cuda().rms_norm(x, w, 1e-6f, out, 2, 64); });
  expect_refused_during_capture(ErrorCode::DTypeMismatch, "gemm", [&] { cuda().gemm(x, wrong, out, 1, 1, 64); });
  expect_refused_during_capture(ErrorCode::NullBuffer, "add_inplace", [&] {
    Buffer null;
    cuda().add_inplace(null, x, 64);
  });
  expect_refused_during_capture(ErrorCode::CapacityExceeded, "kv_cache_append_head_major", [&] {
    cuda().kv_cache_append_head_major(out, out, 1, 1, x, x, 1, 1, 64);  // cache_len 1 + 1 > capacity 1
  });
  expect_backend_usable(rng);
}

TEST_F(CudaGraphErrors, CallsNotAllowedDuringCapture) {
  FERRUM_SEEDED_RNG(rng);
  cuda().reset_graph();
  Buffer buf = cuda().alloc(DType::F16, 64);
  std::vector<std::uint8_t> host(128);
  expect_refused_during_capture(ErrorCode::GraphCapture, "synchronize", [&] { cuda().synchronize(); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "alloc", [&] { (void)cuda().alloc(DType::F16, 8); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "alloc_host",
                                [&] { (void)cuda().alloc_host(DType::I32, 8); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "write",
                                [&] { cuda().write(buf, std::vector<float>(4, 1.0f)); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "write_bytes",
                                [&] { cuda().write_bytes(buf, host.data(), 8); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "download", [&] { (void)cuda().download(buf); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "read_bytes",
                                [&] { cuda().read_bytes(buf, host.data(), 8); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "set_decode_state", [&] { cuda().set_decode_state(1, 1); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "begin_graph_capture", [&] { cuda().begin_graph_capture(); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "replay_last_graph", [&] { (void)cuda().replay_last_graph(); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "reset_graph", [&] { cuda().reset_graph(); });
  expect_refused_during_capture(ErrorCode::GraphCapture, "load_gptq", [&] { (void)cuda().load_gptq({}); });
  expect_backend_usable(rng);
}

// A capture the caller opens on stream() directly (interop): is_capturing()
// says so, ops record into it, the setup ops refuse as during the slot's
// own capture (before, write_bytes recorded a pageable copy, then
// synchronized a capturing stream), end_graph_capture refuses to take it,
// and it stays the caller's to end.
TEST_F(CudaGraphErrors, CallersOwnCaptureOnTheStream) {
  FERRUM_SEEDED_RNG(rng);
  cuda().reset_graph();
  auto& be = dynamic_cast<CudaBackend&>(cuda());
  Buffer a = be.upload(std::vector<float>(64, 1.0f), DType::F16);
  Buffer b = be.upload(std::vector<float>(64, 2.0f), DType::F16);
  std::vector<std::uint8_t> host(128);
  ASSERT_EQ(cudaStreamBeginCapture(be.stream(), cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_TRUE(be.is_capturing());
  be.add_inplace(a, b, 64);
  expect_error(ErrorCode::GraphCapture, "write_bytes", [&] { be.write_bytes(a, host.data(), 8); });
  expect_error(ErrorCode::GraphCapture, "download", [&] { (void)be.download(a); });
  expect_error(ErrorCode::GraphCapture, "begin_graph_capture", [&] { be.begin_graph_capture(); });
  expect_error(ErrorCode::GraphCapture, "synchronize", [&] { be.synchronize(); });
  expect_error(ErrorCode::GraphCapture, "end_graph_capture", [&] { be.end_graph_capture(); }, "cudaStreamEndCapture");
  EXPECT_TRUE(be.is_capturing()) << "the caller's capture stays open";
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(be.stream(), &graph), cudaSuccess);
  EXPECT_FALSE(be.is_capturing());
  EXPECT_EQ(be.held_graph(), 0u) << "the caller's graph is not the slot's";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, be.stream()), cudaSuccess);
  be.synchronize();
  EXPECT_EQ(be.download(a), std::vector<float>(64, 3.0f)) << "the recorded op ran once, at the launch";
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  expect_backend_usable(rng);
}

TEST_F(CudaGraphErrors, FailedCaptureKeepsNoStaleGraph) {
  // A graph held from an earlier capture, then a capture that fails: replay
  // must not run the half-recorded one. (Whether the earlier graph survives
  // is the backend's choice; either way the stream stays usable.)
  FERRUM_SEEDED_RNG(rng);
  Buffer acc = cuda().upload(std::vector<float>(16, 0.0f), DType::F16);
  Buffer one = cuda().upload(std::vector<float>(16, 1.0f), DType::F16);
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, one, 16);
  cuda().end_graph_capture();
  Buffer other_acc = cuda().upload(std::vector<float>(16, 0.0f), DType::F16);
  cuda().begin_graph_capture();
  cuda().add_inplace(other_acc, one, 16);
  expect_error(ErrorCode::InvalidArgument, "add_inplace", [&] { cuda().add_inplace(other_acc, one, 0); });
  EXPECT_FALSE(cuda().is_capturing());
  if (cuda().replay_last_graph()) {
    cuda().synchronize();
    EXPECT_EQ(cuda().download(acc), std::vector<float>(16, 1.0f)) << "the replayed graph must be the earlier one";
  }
  EXPECT_EQ(cuda().download(other_acc), std::vector<float>(16, 0.0f)) << "the abandoned capture must never run";
  cuda().reset_graph();
  expect_backend_usable(rng);
}

// Programmatic dependent launch is decided per device by the first
// CudaBackend (cuda() made it, with the default); a second one asking the
// opposite is refused by name, and one that agrees works.
TEST_F(CudaGraphErrors, PdlSettingMustAgreeWithTheDevice) {
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "no programmatic dependent launch before sm_90: nothing to disagree on";
  CudaBackendConfig other;
  other.programmatic_dependent_launch = false;
  expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(other); },
               "programmatic_dependent_launch");
  CudaBackendConfig same;
  EXPECT_NO_THROW(CudaBackend be(same));
}

// The same for the per-device launch switches: each one asked the other way
// from the device's first backend is refused, naming its field.
TEST_F(CudaGraphErrors, LaunchSwitchesMustAgreeWithTheDevice) {
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "no programmatic dependent launch before sm_90: the PDL switches are all off";
  const CudaBackendConfig first;  // what cuda() was made with
  struct Case {
    const char* field;
    void (*flip)(CudaBackendConfig&);
  };
  const Case cases[] = {
      {"pdl_early_trigger", [](CudaBackendConfig& c) { c.pdl_early_trigger = !c.pdl_early_trigger; }},
      {"pdl_chain_release", [](CudaBackendConfig& c) { c.pdl_chain_release = !c.pdl_chain_release; }},
      {"gemm_prefetch_before_wait",
       [](CudaBackendConfig& c) { c.gemm_prefetch_before_wait = !c.gemm_prefetch_before_wait; }},
      {"gemm_weights_before_wait", [](CudaBackendConfig& c) { c.gemm_weights_before_wait = !c.gemm_weights_before_wait; }},
      {"attention_kv_before_wait", [](CudaBackendConfig& c) { c.attention_kv_before_wait = !c.attention_kv_before_wait; }},
      {"gptq_weights_evict_first", [](CudaBackendConfig& c) { c.gptq_weights_evict_first = !c.gptq_weights_evict_first; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    CudaBackendConfig other = first;
    c.flip(other);
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(other); }, c.field);
  }
}

// ── Memory a held graph points at ──────────────────────────────────────────
//
// A graph's nodes hold the raw pointers its capture saw. Library memory freed
// while a graph may point at it is retired (kept) until the graph is dropped:
// a replay gives the eager result, and no new allocation lands on the retired
// memory meanwhile (if one did, the replay would read or write it).

class CudaGraphMemory : public CudaTest {
 protected:
  static constexpr std::size_t kLen = 4096;

  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    cuda().reset_graph();
    ASSERT_EQ(retained(), 0u);
  }

  std::size_t retained() { return dynamic_cast<CudaBackend&>(cuda()).graph_retained_allocations(); }

  Buffer filled(float value) { return cuda().upload(std::vector<float>(kLen, value), DType::F16); }

  // Allocations of the same size as a retired one, none of which may reuse
  // its address (the retired memory is not free).
  void expect_not_reused(const void* retired) {
    std::vector<Buffer> decoys;
    for (int i = 0; i < 8; ++i) {
      decoys.push_back(filled(100.0f));
      EXPECT_NE(decoys.back().data(), retired) << "a new allocation reused memory a held graph points at";
    }
  }
};

TEST_F(CudaGraphMemory, BufferFreedWhileAGraphIsHeldStaysValidForItsReplays) {
  Buffer acc = filled(0.0f);
  std::optional<Buffer> one = filled(1.0f);
  const void* const one_memory = one->data();
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, *one, kLen);
  cuda().end_graph_capture();
  one.reset();
  EXPECT_EQ(retained(), 1u);
  expect_not_reused(one_memory);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  EXPECT_EQ(cuda().download(acc), std::vector<float>(kLen, 3.0f));
  cuda().reset_graph();
  EXPECT_EQ(retained(), 0u) << "dropping the graph frees what it kept";
}

TEST_F(CudaGraphMemory, BufferFreedDuringTheCaptureStaysValidForReplay) {
  Buffer acc = filled(0.0f);
  std::optional<Buffer> two = filled(2.0f);
  const void* const two_memory = two->data();
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, *two, kLen);
  two.reset();  // recorded, then freed before the capture ends
  EXPECT_EQ(retained(), 1u);
  cuda().end_graph_capture();
  EXPECT_EQ(retained(), 1u);
  expect_not_reused(two_memory);
  ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  EXPECT_EQ(cuda().download(acc), std::vector<float>(kLen, 2.0f));
  cuda().reset_graph();
  EXPECT_EQ(retained(), 0u);
}

// alloc_host's page-locked memory in a graph: a captured copy from it reads
// what the host wrote before each replay (the per-step inputs an engine
// writes between replays); freed while the graph is held, it is retired
// like device memory and freed (cudaFreeHost) when the graph goes.
TEST_F(CudaGraphMemory, CapturedCopyFromHostMemoryReadsItAtEachReplay) {
  constexpr std::size_t kIds = 37;
  std::optional<Buffer> host = cuda().alloc_host(DType::I32, kIds);
  Buffer device = cuda().upload(std::vector<float>(kIds, -1.0f), DType::I32);
  auto* ids = static_cast<std::int32_t*>(host->data());
  for (std::size_t i = 0; i < kIds; ++i) ids[i] = 1000;
  cuda().begin_graph_capture();
  cuda().copy_slice(*host, 0, device, 0, kIds);
  cuda().end_graph_capture();
  EXPECT_EQ(cuda().download(device), std::vector<float>(kIds, -1.0f)) << "capture ran the copy";
  for (std::int32_t step = 0; step < 5; ++step) {
    std::vector<float> want(kIds);
    for (std::size_t i = 0; i < kIds; ++i) {
      ids[i] = step * 100 + static_cast<std::int32_t>(i);  // the stream is idle: download synchronized
      want[i] = static_cast<float>(ids[i]);
    }
    ASSERT_TRUE(cuda().replay_last_graph());
    EXPECT_EQ(cuda().download(device), want) << "step " << step;
  }
  const void* const host_memory = host->data();
  host.reset();
  EXPECT_EQ(retained(), 1u) << "the graph's copy still points at the host memory";
  for (int i = 0; i < 4; ++i) {
    Buffer decoy = cuda().alloc_host(DType::I32, kIds);
    EXPECT_NE(decoy.data(), host_memory) << "a new host allocation reused memory a held graph points at";
  }
  ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  cuda().reset_graph();
  EXPECT_EQ(retained(), 0u) << "dropping the graph frees what it kept";
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, host_memory), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered) << "the page-locked memory was not freed (cudaFreeHost)";
  EXPECT_NO_THROW(cuda().synchronize());
}

// Views keep no memory of their own: only the allocation is retired, once.
TEST_F(CudaGraphMemory, AViewOfAFreedAllocationIsRetiredWithIt) {
  Buffer acc = filled(0.0f);
  std::optional<Buffer> ones = cuda().upload(std::vector<float>(2 * kLen, 1.0f), DType::F16);
  Buffer upper = ones->view(kLen, kLen);
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, upper, kLen);
  cuda().end_graph_capture();
  upper = Buffer();
  EXPECT_EQ(retained(), 0u) << "a view frees nothing";
  ones.reset();
  EXPECT_EQ(retained(), 1u);
  ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  EXPECT_EQ(cuda().download(acc), std::vector<float>(kLen, 1.0f));
  cuda().reset_graph();
  EXPECT_EQ(retained(), 0u);
}

// A new graph replaces the old one: what only the old one could point at is
// freed then; what the new capture saw freed is kept for the new graph.
TEST_F(CudaGraphMemory, ReplacingTheGraphFreesWhatOnlyTheOldOneKept) {
  Buffer acc = filled(0.0f);
  Buffer one = filled(1.0f);
  std::optional<Buffer> old_operand = filled(5.0f);
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, *old_operand, kLen);
  cuda().end_graph_capture();
  old_operand.reset();
  EXPECT_EQ(retained(), 1u);
  std::optional<Buffer> new_operand = filled(1.0f);
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, *new_operand, kLen);
  new_operand.reset();
  EXPECT_EQ(retained(), 2u) << "the old graph still exists during the capture";
  cuda().end_graph_capture();
  EXPECT_EQ(retained(), 1u) << "only the new graph's operand is still needed";
  ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  EXPECT_EQ(cuda().download(acc), std::vector<float>(kLen, 1.0f));
  cuda().reset_graph();
  EXPECT_EQ(retained(), 0u);
}

// A capture that fails: with no graph held, what it saw freed is freed at
// once; with one held, it waits for that graph (which may point at it).
TEST_F(CudaGraphMemory, AFailedCaptureKeepsOnlyWhatTheHeldGraphMayNeed) {
  Buffer acc = filled(0.0f);
  auto failed_capture_freeing_one = [&] {
    std::optional<Buffer> operand = filled(1.0f);
    cuda().begin_graph_capture();
    cuda().add_inplace(acc, *operand, kLen);
    operand.reset();
    expect_error(ErrorCode::InvalidArgument, "add_inplace", [&] { cuda().add_inplace(acc, acc, 0); });
    EXPECT_FALSE(cuda().is_capturing());
  };
  failed_capture_freeing_one();
  EXPECT_EQ(retained(), 0u) << "no graph can point at it";

  std::optional<Buffer> held_operand = filled(1.0f);
  cuda().begin_graph_capture();
  cuda().add_inplace(acc, *held_operand, kLen);
  cuda().end_graph_capture();
  failed_capture_freeing_one();
  EXPECT_EQ(retained(), 1u);
  held_operand.reset();
  EXPECT_EQ(retained(), 2u);
  ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  EXPECT_EQ(cuda().download(acc), std::vector<float>(kLen, 1.0f));
  cuda().reset_graph();
  EXPECT_EQ(retained(), 0u);
  // Without a graph, freeing is immediate again.
  { Buffer gone = filled(0.0f); }
  EXPECT_EQ(retained(), 0u);
}

}  // namespace
}  // namespace ferrum::test
