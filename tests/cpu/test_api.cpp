// The public API surface: Buffer (views, bounds, wrap, null, ownership),
// ferrum::Error (codes, messages naming op / argument / value), supports()
// agreeing with behaviour for every Op, world-size-1 collectives, and
// upload / download / write / read round trips for every dtype. Suites
// parameterized by backend run on CpuBackend always and CudaBackend when a
// GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include "support/op_registry.hpp"
#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

constexpr DType kAllDTypes[] = {DType::F16, DType::BF16, DType::F32, DType::I32, DType::U8};

// ── Buffer ───────────────────────────────────────────────────────────────────

TEST(BufferApi, NullBuffer) {
  Buffer b;
  EXPECT_TRUE(b.is_null());
  EXPECT_EQ(b.numel(), 0u);
  EXPECT_EQ(b.nbytes(), 0u);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.backend(), nullptr);
  EXPECT_FALSE(b.owns_memory());
  expect_error(ErrorCode::NullBuffer, "Buffer::view", [&] { (void)b.view(0, 0); });
}

TEST(BufferApi, AllocatedBuffer) {
  CpuBackend cpu;
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(to_string(dt));
    Buffer b = cpu.alloc(dt, 13);
    EXPECT_FALSE(b.is_null());
    EXPECT_TRUE(b.owns_memory());
    EXPECT_EQ(b.backend(), &cpu);
    EXPECT_EQ(b.dtype(), dt);
    EXPECT_EQ(b.numel(), 13u);
    EXPECT_EQ(b.nbytes(), 13u * size_of(dt));
  }
}

TEST(BufferApi, ViewBounds) {
  CpuBackend cpu;
  Buffer b = cpu.alloc(DType::F16, 10);
  const auto* base = static_cast<const std::uint8_t*>(b.data());

  Buffer whole = b.view(0, 10);
  EXPECT_EQ(whole.data(), b.data());
  EXPECT_FALSE(whole.owns_memory());
  EXPECT_EQ(whole.backend(), &cpu);
  EXPECT_EQ(whole.dtype(), DType::F16);

  Buffer mid = b.view(3, 4);
  EXPECT_EQ(mid.data(), base + 3 * 2);
  EXPECT_EQ(mid.numel(), 4u);
  EXPECT_NO_THROW((void)b.view(10, 0));  // empty window at the end
  EXPECT_NO_THROW((void)b.view(0, 0));

  expect_error(ErrorCode::ShapeMismatch, "Buffer::view", [&] { (void)b.view(9, 2); });
  expect_error(ErrorCode::ShapeMismatch, "Buffer::view", [&] { (void)b.view(11, 0); });
  expect_error(ErrorCode::ShapeMismatch, "Buffer::view", [&] { (void)b.view(0, 11); });
  // No wrap-around in offset + count, in the check or in the message.
  expect_error(ErrorCode::ShapeMismatch, "Buffer::view",
               [&] { (void)b.view(2, std::numeric_limits<std::size_t>::max()); }, "'count' = 18446744073709551615");
  expect_error(ErrorCode::ShapeMismatch, "Buffer::view",
               [&] { (void)b.view(std::numeric_limits<std::size_t>::max(), 2); });

  // A view of a view is bounded by the inner view and offsets compose.
  Buffer inner = mid.view(1, 3);
  EXPECT_EQ(inner.data(), base + 4 * 2);
  expect_error(ErrorCode::ShapeMismatch, "Buffer::view", [&] { (void)mid.view(2, 3); });
}

TEST(BufferApi, ViewsDoNotOwn) {
  CpuBackend cpu;
  Buffer b = cpu.upload(std::vector<float>{1, 2, 3, 4}, DType::F32);
  { Buffer v = b.view(1, 2); }  // destroying a view must not free the parent
  EXPECT_EQ(cpu.download(b), (std::vector<float>{1, 2, 3, 4}));
  Buffer v = b.view(1, 2);
  cpu.write(v, std::vector<float>{20, 30});
  EXPECT_EQ(cpu.download(b), (std::vector<float>{1, 20, 30, 4}));
}

TEST(BufferApi, MoveTransfersOwnership) {
  CpuBackend cpu;
  Buffer a = cpu.upload(std::vector<float>{5, 6}, DType::F32);
  const void* data = a.data();
  Buffer b = std::move(a);
  EXPECT_TRUE(a.is_null());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(b.data(), data);
  EXPECT_TRUE(b.owns_memory());
  Buffer c = cpu.alloc(DType::F32, 3);
  c = std::move(b);  // releases c's old memory, takes b's
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(cpu.download(c), (std::vector<float>{5, 6}));
}

// x = x.view(...): the view keeps the allocation it lies in (before, the
// assignment freed it under the view); a view of other memory does not.
TEST(BufferApi, AViewAssignedOverItsParentKeepsTheMemory) {
  CpuBackend cpu;
  Buffer x = cpu.upload(std::vector<float>{1, 2, 3, 4, 5, 6}, DType::F32);
  x = x.view(2, 3);
  EXPECT_TRUE(x.owns_memory());
  EXPECT_EQ(cpu.download(x), (std::vector<float>{3, 4, 5}));
  x = x.view(1, 1);  // and again, from a view that now owns
  EXPECT_EQ(cpu.download(x), (std::vector<float>{4}));
  Buffer other = cpu.upload(std::vector<float>{7, 8}, DType::F32);
  x = other.view(0, 2);  // frees x's allocation: the new view is not inside it
  EXPECT_FALSE(x.owns_memory());
  EXPECT_EQ(cpu.download(x), (std::vector<float>{7, 8}));
}

// A Buffer narrowed by x = x.view(...) still holds the whole allocation: a
// later view of it outside the narrowed window, assigned over it, keeps the
// memory too (before, the window was the test, and that assignment freed
// the allocation under the view: a use after free).
TEST(BufferApi, AViewOfTheAllocationOutsideTheNarrowedWindowKeepsTheMemory) {
  CpuBackend cpu;
  Buffer kv = cpu.upload(std::vector<float>{1, 2, 3, 4, 5, 6}, DType::F32);
  Buffer k = kv.view(0, 3), v = kv.view(3, 3);
  kv = std::move(k);
  ASSERT_TRUE(kv.owns_memory());
  kv = std::move(v);  // outside [0, 3), inside the allocation
  EXPECT_TRUE(kv.owns_memory());
  EXPECT_EQ(cpu.download(kv), (std::vector<float>{4, 5, 6}));
  cpu.write(kv, std::vector<float>{7, 8, 9}, 0);
  EXPECT_EQ(cpu.download(kv), (std::vector<float>{7, 8, 9}));
  // Moved on: the allocation goes with the Buffer it was handed to.
  Buffer moved = std::move(kv);
  EXPECT_TRUE(moved.owns_memory());
  EXPECT_FALSE(kv.owns_memory());
  EXPECT_EQ(cpu.download(moved), (std::vector<float>{7, 8, 9}));
}

// host_memory(): alloc_host's Buffers and their views, not alloc's; a move
// carries it.
TEST(BufferApi, HostMemoryFollowsTheAllocation) {
  CpuBackend cpu;
  Buffer host = cpu.alloc_host(DType::F32, 4);
  Buffer own = cpu.alloc(DType::F32, 4);
  EXPECT_TRUE(host.host_memory());
  EXPECT_TRUE(host.view(1, 2).host_memory());
  EXPECT_FALSE(own.host_memory());
  EXPECT_FALSE(own.view(1, 2).host_memory());
  own = std::move(host);
  EXPECT_TRUE(own.host_memory());
  EXPECT_FALSE(Buffer().host_memory());
  float local[4] = {};
  EXPECT_FALSE(Buffer::wrap(cpu, local, DType::F32, 4).host_memory()) << "CpuBackend's own kind of memory";
}

// A Buffer may outlive its backend: it reports no backend, no op takes it
// (WrongBackend, not a call into the destroyed backend), and destroying it
// still frees its memory (before, it called the destroyed backend).
TEST(BufferApi, ABufferOutlivingItsBackend) {
  Buffer kept, view;
  {
    CpuBackend gone;
    kept = gone.upload(std::vector<float>{1, 2}, DType::F32);
    view = kept.view(0, 1);
    EXPECT_EQ(kept.backend(), &gone);
  }
  EXPECT_EQ(kept.backend(), nullptr);
  EXPECT_EQ(view.backend(), nullptr);
  EXPECT_TRUE(kept.owns_memory());
  EXPECT_FALSE(kept.is_null());
  CpuBackend cpu;
  expect_error(ErrorCode::WrongBackend, "download", [&] { (void)cpu.download(kept); }, "since destroyed");
  view = Buffer();
  kept = Buffer();  // frees through the deallocator the backend left behind
  EXPECT_TRUE(kept.is_null());
}

TEST(BufferApi, WrapHostMemory) {
  CpuBackend cpu;
  std::vector<std::uint16_t> host(8);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = f32_to_f16(static_cast<float>(i));
  Buffer w = Buffer::wrap(cpu, host.data(), DType::F16, host.size());
  EXPECT_FALSE(w.owns_memory());
  EXPECT_EQ(w.data(), host.data());
  EXPECT_EQ(cpu.download(w), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Ops write straight into the caller's memory.
  Buffer ones = cpu.upload(std::vector<float>(8, 1.0f), DType::F16);
  cpu.add_inplace(w, ones, 8);
  for (std::size_t i = 0; i < host.size(); ++i) EXPECT_EQ(f16_to_f32(host[i]), static_cast<float>(i) + 1.0f);
  // Off the element grid: refused.
  auto* odd = reinterpret_cast<std::uint8_t*>(host.data()) + 1;
  expect_error(ErrorCode::Misaligned, "Buffer::wrap", [&] { (void)Buffer::wrap(cpu, odd, DType::F16, 2); }, "'ptr'");
  expect_error(ErrorCode::InvalidArgument, "Buffer::wrap", [&] { (void)Buffer::wrap(cpu, host.data(), DType::F16, 0); },
               "'numel' = 0");
  expect_error(
      ErrorCode::InvalidArgument, "Buffer::wrap",
      [&] { (void)Buffer::wrap(cpu, host.data(), DType::F32, std::numeric_limits<std::size_t>::max() / 2); },
      "overflow");
  expect_error(ErrorCode::NullBuffer, "Buffer::wrap", [&] { (void)Buffer::wrap(cpu, nullptr, DType::F16, 2); },
               "'ptr'");
}

// ── Error ────────────────────────────────────────────────────────────────────

TEST(ErrorApi, CodeAndMessage) {
  const Error e(ErrorCode::ShapeMismatch, "rms_norm: argument 'w' is short");
  EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
  const std::string what = e.what();
  EXPECT_NE(what.find("ShapeMismatch"), std::string::npos) << what;
  EXPECT_NE(what.find("rms_norm: argument 'w' is short"), std::string::npos) << what;
  const std::runtime_error& base = e;  // catchable as std::runtime_error
  EXPECT_STREQ(base.what(), e.what());
}

TEST(ErrorApi, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int c = static_cast<int>(ErrorCode::InvalidArgument); c <= static_cast<int>(ErrorCode::Internal); ++c) {
    const std::string n(to_string(static_cast<ErrorCode>(c)));
    EXPECT_NE(n, "Unknown") << c;
    EXPECT_TRUE(names.insert(n).second) << "duplicate name " << n;
  }
  EXPECT_EQ(names.size(), 15u);
}

TEST(ErrorApi, EveryOpHasADistinctName) {
  std::set<std::string> names;
  for (int o = 0; o < kNumOps; ++o) {
    const std::string n(to_string(static_cast<Op>(o)));
    EXPECT_NE(n, "unknown_op") << o;
    EXPECT_TRUE(names.insert(n).second) << "duplicate name " << n;
  }
}

TEST(ErrorApi, MessagesNameOpArgumentAndValue) {
  CpuBackend cpu;
  Buffer x = zeros(cpu, DType::F16, 24), w = zeros(cpu, DType::F16, 7), out = zeros(cpu, DType::F16, 24);
  try {
    cpu.rms_norm(x, w, 1e-6f, out, 3, 8);
    FAIL() << "rms_norm with a 7-element weight for dim 8 did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
    for (const char* part : {"rms_norm", "'w'", "7", "8"}) EXPECT_NE(what.find(part), std::string::npos) << part << " in " << what;
  }
  try {
    cpu.gemm(x, x, out, 1, 1, 0);
    FAIL() << "gemm with k = 0 did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    for (const char* part : {"gemm", "'k'", "0"}) EXPECT_NE(what.find(part), std::string::npos) << part << " in " << what;
  }
  try {
    cpu.rms_norm(x, w, std::numeric_limits<float>::quiet_NaN(), out, 3, 8);
    FAIL() << "rms_norm with eps NaN did not throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    for (const char* part : {"rms_norm", "'eps'", "nan"}) EXPECT_NE(what.find(part), std::string::npos) << part << " in " << what;
  }
}

// ── supports() agrees with behaviour, for every Op ───────────────────────────

class ApiOnBackend : public BackendTest {};

TEST_P(ApiOnBackend, SupportsMatchesBehaviour) {
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    SCOPED_TRACE(cat(to_string(op), backend().supports(op) ? " (supported)" : " (not supported)"));
    if (backend().supports(op)) {
      EXPECT_NO_THROW(call_op_validly(backend(), op));
    } else {
      expect_error(ErrorCode::Unsupported, to_string(op), [&] { call_op_validly(backend(), op); });
    }
    EXPECT_FALSE(backend().is_capturing());
  }
}

// supports_head_dim() agrees with behaviour: the five attention and RoPE ops
// run at every head size it says yes to, giving CpuBackend's values (random
// inputs: a kernel instance that indexes wrongly shows), and throw
// Unsupported at the others (CpuBackend: every size; CudaBackend: attention
// 64 / 128 / 256, RoPE up to 512); every other op answers supports(op) at any
// size.
TEST_P(ApiOnBackend, SupportsHeadDimMatchesBehaviour) {
  FERRUM_SEEDED_RNG(rng);
  Backend& be = backend();
  CpuBackend cpu;  // the oracle (the Cpu instance compares CpuBackend with itself)
  using Outputs = std::vector<std::vector<float>>;
  // run_on(b): the op on backend b from the host inputs, its outputs downloaded.
  auto expect_runs_as_said = [&](Op op, std::size_t hd, const std::function<Outputs(Backend&)>& run_on) {
    SCOPED_TRACE(cat(to_string(op), " head_dim=", hd));
    if (be.supports_head_dim(op, hd)) {
      Outputs got;
      EXPECT_NO_THROW(got = run_on(be));
      const Outputs want = run_on(cpu);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        // Attention is a convex combination of v, RoPE rows are O(1): op_scale::kUnit.
        EXPECT_TRUE(all_close(got[i], want[i], DType::F16)) << "output " << i;
      }
    } else {
      expect_error(ErrorCode::Unsupported, to_string(op), [&] { run_on(be); }, "head_dim");
    }
  };
  auto up = [](Backend& b, const HostTensor& t) { return b.upload(t.values, t.dtype); };
  // An output's values once its guards are checked (outputs are GuardedOutputs:
  // poisoned, or holding their initial rows, with sentinels past both ends).
  auto guarded_values = [](const GuardedOutput& o, Op op, const char* name) {
    EXPECT_TRUE(o.check_guard(to_string(op), name, "head_dim sweep"));
    return o.values();
  };
  for (std::size_t hd : {8, 16, 48, 64, 96, 128, 256, 384, 512, 640}) {
    const std::size_t heads = 2, kv_heads = 1, kv_len = 3, max_pos = 4;
    const std::size_t q_size = heads * hd, cache_size = kv_heads * kv_len * hd;
    const HostTensor q = random_normal(rng, DType::F16, q_size);
    const HostTensor k = random_normal(rng, DType::F16, cache_size);
    const HostTensor v = random_normal(rng, DType::F16, cache_size);
    // Random tables, not rotations: every pair's partner and table entry shows.
    const HostTensor cos = random_uniform(rng, DType::F32, max_pos * hd / 2);
    const HostTensor sin = random_uniform(rng, DType::F32, max_pos * hd / 2);
    const HostTensor norm_w = random_uniform(rng, DType::F16, hd, 0.5f, 1.5f);
    const HostTensor qkv = random_normal(rng, DType::F16, (heads + 2 * kv_heads) * hd);

    const AttnConfig cfg{.num_heads = heads, .num_kv_heads = kv_heads, .head_dim = hd, .causal = true};
    expect_runs_as_said(Op::FlashAttention, hd, [&](Backend& b) {
      const Buffer bq = up(b, q), bk = up(b, k), bv = up(b, v);
      GuardedOutput out(b, DType::F16, q_size);
      b.flash_attention(bq, bk, bv, out.view(), 1, 1, kv_len, kv_len - 1, cfg);
      b.synchronize();
      return Outputs{guarded_values(out, Op::FlashAttention, "out")};
    });
    expect_runs_as_said(Op::QkNormRope, hd, [&](Backend& b) {
      const Buffer bq = up(b, q), w = up(b, norm_w), bcos = up(b, cos), bsin = up(b, sin);
      GuardedOutput out(b, DType::F16, q_size);
      b.qk_norm_rope(bq, &w, bcos, bsin, out.view(), 1, heads, hd, 2, max_pos, 1e-6f, RopeMode::NormAndRope);
      b.synchronize();
      return Outputs{guarded_values(out, Op::QkNormRope, "output")};
    });
    // One sequence of the ragged forms (batch 1, cache capacity kv_len).
    const AttnConfig ragged{.num_heads = heads, .num_kv_heads = kv_heads, .head_dim = hd, .kv_seq_stride = kv_len};
    expect_runs_as_said(Op::FlashDecodeRagged, hd, [&](Backend& b) {
      const Buffer bq = up(b, q), bk = up(b, k), bv = up(b, v);
      const Buffer kv_lens = b.upload(std::vector<float>{static_cast<float>(kv_len)}, DType::I32);
      GuardedOutput out(b, DType::F16, q_size);
      b.flash_decode_ragged(bq, bk, bv, out.view(), kv_lens, 1, ragged);
      b.synchronize();
      return Outputs{guarded_values(out, Op::FlashDecodeRagged, "out")};
    });
    // The appends: q_out and both caches (initially k and v: the rows the
    // append must keep), at position 1 / 2 of the 3.
    auto run_append = [&](Backend& b, bool ragged_form) {
      const Buffer bqkv = up(b, qkv), w = up(b, norm_w), bcos = up(b, cos), bsin = up(b, sin);
      GuardedOutput q_out(b, DType::F16, q_size), k_cache(b, k), v_cache(b, v);
      if (ragged_form) {
        const QkvRopeAppendConfig append{.heads = heads, .kv_heads = kv_heads, .head_dim = hd, .capacity = kv_len,
                                         .max_pos = max_pos, .mode = RopeMode::NormAndRope};
        const Buffer positions = b.upload(std::vector<float>{2.0f}, DType::I32);
        b.qkv_rope_append_ragged(bqkv, &w, &w, bcos, bsin, q_out.view(), k_cache.view(), v_cache.view(), positions, 1,
                                 append);
      } else {
        const QkvRopeAppendConfig append{
            .heads = heads, .kv_heads = kv_heads, .head_dim = hd, .capacity = kv_len, .max_pos = max_pos};
        b.qkv_rope_append(bqkv, nullptr, nullptr, bcos, bsin, q_out.view(), k_cache.view(), v_cache.view(), 1, 1,
                          append);
      }
      b.synchronize();
      const Op op = ragged_form ? Op::QkvRopeAppendRagged : Op::QkvRopeAppend;
      return Outputs{guarded_values(q_out, op, "q_out"), guarded_values(k_cache, op, "k_cache"),
                     guarded_values(v_cache, op, "v_cache")};
    };
    expect_runs_as_said(Op::QkvRopeAppend, hd, [&](Backend& b) { return run_append(b, false); });
    expect_runs_as_said(Op::QkvRopeAppendRagged, hd, [&](Backend& b) { return run_append(b, true); });
  }
  const std::set<Op> head_dim_ops = {Op::FlashAttention, Op::FlashDecodeRagged, Op::QkNormRope, Op::QkvRopeAppend,
                                     Op::QkvRopeAppendRagged};
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    if (head_dim_ops.count(op) == 0) {
      EXPECT_EQ(be.supports_head_dim(op, 12345), be.supports(op)) << to_string(op);
    } else if (!be.supports(op)) {
      EXPECT_FALSE(be.supports_head_dim(op, 128)) << to_string(op);
    }
  }
}

// A value outside the Op enum is no op on either backend (CudaBackend once
// answered true through its switch's default).
TEST_P(ApiOnBackend, ValuesOutsideTheOpEnumAreNotSupported) {
  for (const int o : {-1, kNumOps, kNumOps + 3}) {
    const Op op = static_cast<Op>(o);
    EXPECT_FALSE(backend().supports(op)) << o;
    EXPECT_FALSE(backend().supports_head_dim(op, 128)) << o;
  }
}

TEST(CpuSupports, ExactlyTheDocumentedSet) {
  CpuBackend cpu;
  const std::set<Op> unsupported = {Op::MlaAttention, Op::GraphCapture};
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    EXPECT_EQ(cpu.supports(op), unsupported.count(op) == 0) << to_string(op);
  }
  EXPECT_EQ(cpu.kind(), BackendKind::Cpu);
  EXPECT_FALSE(cpu.name().empty());
  EXPECT_FALSE(cpu.is_capturing());
  EXPECT_EQ(cpu.held_graph(), 0u);
  EXPECT_FALSE(cpu.replay_last_graph());
  EXPECT_NO_THROW(cpu.reset_graph());
}

TEST(DefaultBackend, FollowsDeviceCount) {
  const std::unique_ptr<Backend> be = make_default_backend();
  ASSERT_NE(be, nullptr);
  // The overload with a config says why it chose the CPU, and only then.
  std::string why = "untouched";
  const std::unique_ptr<Backend> configured = make_default_backend(CudaBackendConfig{}, &why);
  ASSERT_NE(configured, nullptr);
  EXPECT_EQ(configured->kind(), be->kind());
  if (be->kind() == BackendKind::Cuda) {
    EXPECT_EQ(why, "untouched");
  } else {
    EXPECT_NE(why, "untouched");
    if (!FERRUM_TEST_CUDA_BUILT) {
      EXPECT_EQ(why, "ferrum was built without CUDA (FERRUM_CUDA is OFF)");
    } else if (cuda_device_count() == 0) {
      EXPECT_EQ(why, "no CUDA device visible");
    }
  }
  if (cuda_device_count() == 0) {
    EXPECT_EQ(be->kind(), BackendKind::Cpu);
    return;
  }
  // A GPU: CUDA, unless this build's kernels cannot run on it (CudaBackend's
  // constructor says Unsupported), where the CPU serves.
  bool runs_here = true;
  try {
    CudaBackend probe;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Unsupported) throw;
    runs_here = false;
  }
  EXPECT_EQ(be->kind(), runs_here ? BackendKind::Cuda : BackendKind::Cpu);
}

// A FERRUM_CUDA=OFF library (the CPU-only build, which tests/CMakeLists.txt's
// install_and_consume_cpu_only test builds and runs this in): the public API
// is the same, and the CUDA half refuses by name or finds no GPU.
TEST(CpuOnlyBuild, CudaBackendRefusesByNameAndTheCpuServes) {
  if (FERRUM_TEST_CUDA_BUILT) GTEST_SKIP() << "this library was built with CUDA (FERRUM_CUDA=ON)";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_FALSE(Communicator::available());
  expect_error(ErrorCode::Unsupported, "CudaBackend::CudaBackend", [] { CudaBackend cuda; }, "FERRUM_CUDA is OFF");
  std::string why;
  const std::unique_ptr<Backend> be = make_default_backend(CudaBackendConfig{}, &why);
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->kind(), BackendKind::Cpu);
  EXPECT_EQ(why, "ferrum was built without CUDA (FERRUM_CUDA is OFF)");
  // Host arithmetic of the CUDA backend's config, the same in both builds.
  EXPECT_EQ(attention_decode_workspace_bytes(2, 32, 128, 32768), 4u * 2u * 32u * 16u * 129u);
  expect_error(ErrorCode::InvalidArgument, "attention_decode_workspace_bytes",
               [] { (void)attention_decode_workspace_bytes(0, 32, 128, 1024); }, "'batch'");
}

// In a forked child: `body` after the address space is bounded to grow by
// `growth` more bytes; prints what came out (the error's message, or
// "returned") on stderr for EXPECT_EXIT to match, then exits 0.
template <class Body>
void run_in_bounded_memory(std::size_t growth, Body&& body) {
  bound_address_space_growth(growth);
  try {
    body();
    std::fprintf(stderr, "returned\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "not a ferrum::Error: %s\n", e.what());
  }
  std::fflush(stderr);
  std::_Exit(0);
}

// Host staging that cannot be had is OutOfMemory naming the op, not a
// std::bad_alloc past the API: a child whose address space may grow by
// 160 MiB downloads 32 Mi f16 values (64 MiB of raw staging, then 128 MiB
// of floats, which no longer fit).
void download_in_bounded_memory() {
  CpuBackend be(CpuBackendConfig{.num_threads = 1});
  Buffer b = be.alloc(DType::F16, std::size_t{32} << 20);
  run_in_bounded_memory(std::size_t{160} << 20, [&] { (void)be.download(b); });
}

// The same for an op's own working storage (Backend's check.run): rms_norm
// over one row of 32 Mi f16 values decodes the weight into 128 MiB of
// floats, past a 96 MiB bound.
void rms_norm_in_bounded_memory() {
  CpuBackend be(CpuBackendConfig{.num_threads = 1});
  const std::size_t dim = std::size_t{32} << 20;
  Buffer x = be.alloc(DType::F16, dim), w = be.alloc(DType::F16, dim), out = be.alloc(DType::F16, dim);
  run_in_bounded_memory(std::size_t{96} << 20, [&] { be.rms_norm(x, w, 1e-5f, out, 1, dim); });
}

// And for load_gptq, whose CPU weight is the dequantized [n, k] in floats:
// 4096 x 4096 (8 MiB packed) needs 64 MiB, past a 32 MiB bound.
void load_gptq_in_bounded_memory() {
  CpuBackend be(CpuBackendConfig{.num_threads = 1});
  const std::size_t k = 4096, n = 4096, groups = k / 128;
  const std::vector<std::int32_t> qweight(k / 8 * n, 0x12345678), qzeros(groups * n / 8, 0x77777777);
  const std::vector<float> scales(groups * n, 0.5f);
  const GptqHostTensors t{.qweight = qweight, .qzeros = qzeros, .scales = scales, .k = k, .n = n};
  run_in_bounded_memory(std::size_t{32} << 20, [&] { (void)be.load_gptq(t); });
}

// Under AddressSanitizer a failed mmap is a report and an exit, not a
// std::bad_alloc (GCC defines __SANITIZE_ADDRESS__, Clang has the feature).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

TEST(HostStagingDeathTest, OutOfHostMemoryIsAnError) {
  if (kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer exits on a failed mmap instead of throwing std::bad_alloc";
  EXPECT_EXIT(download_in_bounded_memory(), ::testing::ExitedWithCode(0),
              "\\[OutOfMemory\\] download: host staging of 33554432 elements of 4 bytes");
}

TEST(HostMemoryDeathTest, RunningOutInsideAnOpIsOutOfMemoryNamingTheOp) {
  if (kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer exits on a failed mmap instead of throwing std::bad_alloc";
  EXPECT_EXIT(rms_norm_in_bounded_memory(), ::testing::ExitedWithCode(0),
              "\\[OutOfMemory\\] rms_norm: host memory for the op's working storage could not be allocated");
  EXPECT_EXIT(load_gptq_in_bounded_memory(), ::testing::ExitedWithCode(0),
              "\\[OutOfMemory\\] load_gptq: host memory for the op's working storage could not be allocated");
}

TEST(CpuDeterminism, ResultsDoNotDependOnThreadCount) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend one(CpuBackendConfig{1});
  CpuBackend three(CpuBackendConfig{3});
  const auto norm = make_rms_norm_case(rng, DType::BF16, 83, 769);
  expect_same_outputs(run(three, norm), run(one, norm), Match::Exact);
  const auto mm = make_gemm_case(rng, DType::F16, 83, 769, 513);
  expect_same_outputs(run(three, mm), run(one, mm), Match::Exact);
  AttnConfig cfg;
  cfg.num_heads = 8;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  const auto attn = make_flash_case(rng, DType::F16, 2, 37, 37, 0, cfg);
  expect_same_outputs(run(three, attn), run(one, attn), Match::Exact);
}

// ── Device-state mode flag ───────────────────────────────────────────────────

TEST_P(ApiOnBackend, DeviceStateModeFlag) {
  EXPECT_FALSE(backend().device_state_mode());
  backend().set_device_state_mode(true);
  EXPECT_TRUE(backend().device_state_mode());
  EXPECT_FALSE(other().device_state_mode()) << "the mode is per backend object";
  backend().set_device_state_mode(false);
  EXPECT_FALSE(backend().device_state_mode());
}

// ── advance_decode_state: the decode step on the device ──────────────────────
// Two steps from (token 5, pos 10) write their tokens at positions 11 and 12
// of the log; a device-state embedding lookup then reads the last token (the
// host id is a decoy), and a third step's slot (13) shows pos moved by one
// each time. Past the log nothing is written: CpuBackend throws at once,
// CudaBackend at synchronize().
TEST_P(ApiOnBackend, AdvanceDecodeStateStepsTheState) {
  Backend& be = backend();
  constexpr std::size_t kLog = 16, kRows = 12, kDim = 8;
  std::vector<float> want(kLog, -1.0f);
  Buffer log = be.upload(want, DType::I32);
  Buffer next = be.alloc(DType::I32, 1);
  auto advance_with = [&](std::int32_t token) {
    be.write_bytes(next, &token, sizeof token);
    be.advance_decode_state(next, log);
  };
  be.set_decode_state(5, 10);
  advance_with(7);
  advance_with(9);
  want[11] = 7.0f;
  want[12] = 9.0f;
  EXPECT_EQ(be.download(log), want);

  std::vector<float> table(kRows * kDim);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);  // exact in f16
  const Buffer rows = be.upload(table, DType::F16);
  const std::vector<float> decoy_id = {3.0f};
  const Buffer ids = be.upload(decoy_id, DType::I32);
  Buffer out = be.alloc(DType::F16, kDim);
  {
    DeviceStateScope scope(be, true);
    be.embedding_lookup(rows, ids, out, 1, kDim, kRows);
  }
  EXPECT_EQ(be.download(out), std::vector<float>(table.begin() + 9 * kDim, table.begin() + 10 * kDim))
      << "the state's token is the last advance's";
  advance_with(4);
  want[13] = 4.0f;
  EXPECT_EQ(be.download(log), want);

  be.set_decode_state(0, kLog - 1);  // the next slot, kLog, is past the log
  if (be.kind() == BackendKind::Cpu) {
    expect_error(ErrorCode::CapacityExceeded, "advance_decode_state", [&] { advance_with(1); }, "token_log");
  } else {
    advance_with(1);
    expect_error(ErrorCode::DeviceCheck, "advance_decode_state", [&] { be.synchronize(); },
                 cat("token_log slot ", kLog, " (the decode-state position + 1) outside [0, token_log size = ", kLog,
                     ")"));
  }
  EXPECT_EQ(be.download(log), want);
}

// A token log longer than int32 positions can index: refused before the
// state moves (a position could wrap while the log still had room). The
// wrapped buffer's extent is never touched: the check comes first.
TEST(BufferApi, AdvanceDecodeStateRefusesALogPastInt32Positions) {
  CpuBackend cpu;
  std::vector<std::int32_t> slots(8, -1);
  const std::size_t too_long = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()) + 1;
  Buffer log = Buffer::wrap(cpu, slots.data(), DType::I32, too_long);
  Buffer next = cpu.upload(std::vector<float>{3.0f}, DType::I32);
  cpu.set_decode_state(5, 0);
  expect_error(ErrorCode::InvalidArgument, "advance_decode_state", [&] { cpu.advance_decode_state(next, log); },
               cat("'token_log' holds ", too_long, " positions, past INT32_MAX"));
  EXPECT_EQ(slots, std::vector<std::int32_t>(8, -1));
  Buffer fits = Buffer::wrap(cpu, slots.data(), DType::I32, slots.size());
  cpu.advance_decode_state(next, fits);
  EXPECT_EQ(slots[1], 3) << "the state did not move on the refusal";
}

// write_bytes / read_bytes with a host range inside the buffer's own bytes
// (memcpy is undefined on overlap): refused, naming both ranges; the same
// range (nothing to do), zero bytes and a host range beside them are taken.
TEST(BufferApi, HostRangesOverlappingTheBufferAreRefused) {
  CpuBackend cpu;
  Buffer b = cpu.upload(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, DType::F32);
  auto* bytes = static_cast<std::uint8_t*>(b.data());
  expect_error(ErrorCode::InvalidArgument, "write_bytes", [&] { cpu.write_bytes(b, bytes + 4, 8, 0); },
               "overlaps 'dst'");
  expect_error(ErrorCode::InvalidArgument, "read_bytes", [&] { cpu.read_bytes(b, bytes + 12, 8, 8); },
               "overlaps 'src'");
  EXPECT_EQ(cpu.download(b), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  cpu.write_bytes(b, bytes + 8, 8, 8);  // the same range
  cpu.read_bytes(b, bytes + 4, 0, 0);   // nothing
  EXPECT_EQ(cpu.download(b), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  cpu.read_bytes(b, bytes + 16, 16, 0);  // [0, 16) into [16, 32): apart
  EXPECT_EQ(cpu.download(b), (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
}

// ── World size 1 collectives ─────────────────────────────────────────────────

TEST_P(ApiOnBackend, WorldSizeOneCollectives) {
  FERRUM_SEEDED_RNG(rng);
  EXPECT_EQ(backend().world_size(), 1u);
  EXPECT_EQ(backend().rank(), 0u);
  for (DType dt : {DType::F16, DType::BF16, DType::F32}) {
    // Odd lengths too (1, 7: under one vector; 1000; 4097: past a round count).
    for (std::size_t len : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4097}}) {
      const HostTensor data = random_uniform(rng, dt, len);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod, ReduceOp::Avg}) {
        SCOPED_TRACE(cat(to_string(dt), " len=", len, " all_reduce op ", static_cast<int>(op)));
        GuardedOutput buf(backend(), data);
        backend().all_reduce(buf.view(), len, op);
        backend().synchronize();
        EXPECT_TRUE(buf.check_guard());
        EXPECT_TRUE(bitwise_equal(buf.bytes(), encode_bytes(data), size_of(dt)));
      }
      {
        SCOPED_TRACE(cat(to_string(dt), " len=", len, " all_gather"));
        const DeviceTensor local(backend(), data);
        GuardedOutput global(backend(), dt, len);
        backend().all_gather(local.view(), global.view(), len);
        backend().synchronize();
        EXPECT_TRUE(global.check_guard());
        EXPECT_TRUE(bitwise_equal(global.bytes(), encode_bytes(data), size_of(dt)));
      }
      {
        SCOPED_TRACE(cat(to_string(dt), " len=", len, " broadcast"));
        GuardedOutput buf(backend(), data);
        backend().broadcast(buf.view(), len, 0);
        backend().synchronize();
        EXPECT_TRUE(buf.check_guard());
        EXPECT_TRUE(bitwise_equal(buf.bytes(), encode_bytes(data), size_of(dt)));
        expect_error(ErrorCode::InvalidArgument, "broadcast", [&] { backend().broadcast(buf.view(), len, 1); },
                     "'src_rank'");
      }
    }
  }
}

// ── Upload / download / write / read round trips ─────────────────────────────

TEST_P(ApiOnBackend, RoundTripEveryDType) {
  FERRUM_SEEDED_RNG(rng);
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(to_string(dt));
    // Representable values come back exactly.
    const HostTensor t = dt == DType::I32  ? make_tensor(dt, uniform_values(rng, 777, -1e7f, 1e7f))
                         : dt == DType::U8 ? make_tensor(dt, uniform_values(rng, 777, 0.0f, 255.0f))
                                           : random_normal(rng, dt, 777, 0.0f, 100.0f);
    Buffer b = backend().upload(t.values, dt);
    EXPECT_EQ(b.numel(), 777u);
    EXPECT_EQ(b.dtype(), dt);
    EXPECT_EQ(backend().download(b), t.values);
    std::vector<std::uint8_t> raw(b.nbytes());
    backend().read_bytes(b, raw.data(), raw.size());
    EXPECT_TRUE(bitwise_equal(raw, encode_bytes(t), size_of(dt)));
    // Partial download, partial write at an offset, raw read / write at byte offsets.
    EXPECT_EQ(backend().download(b, 5), std::vector<float>(t.values.begin(), t.values.begin() + 5));
    backend().write(b, std::vector<float>{1.0f, 2.0f, 3.0f}, 774);
    const std::vector<float> tail = backend().download(b);
    EXPECT_EQ(std::vector<float>(tail.end() - 3, tail.end()), (std::vector<float>{1.0f, 2.0f, 3.0f}));
    EXPECT_EQ(tail[773], t.values[773]);
    const std::size_t es = size_of(dt);
    std::vector<std::uint8_t> patch(3 * es, 0x11);
    backend().write_bytes(b, patch.data(), patch.size(), 10 * es);
    std::vector<std::uint8_t> back(5 * es);
    backend().read_bytes(b, back.data(), back.size(), 9 * es);
    EXPECT_TRUE(std::equal(patch.begin(), patch.end(), back.begin() + static_cast<std::ptrdiff_t>(es)));
    EXPECT_TRUE(std::equal(raw.begin() + static_cast<std::ptrdiff_t>(9 * es),
                           raw.begin() + static_cast<std::ptrdiff_t>(10 * es), back.begin()));
  }
}

TEST_P(ApiOnBackend, UploadConvertsLikeTheDocumentation) {
  FERRUM_SEEDED_RNG(rng);
  // Halves: round to nearest even (ferrum/half.hpp, tested in test_half).
  const std::vector<float> any = normal_values(rng, 4096, 0.0f, 1000.0f);
  for (DType dt : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(to_string(dt));
    std::vector<float> want(any.size());
    for (std::size_t i = 0; i < any.size(); ++i) want[i] = round_to(dt, any[i]);
    EXPECT_EQ(backend().download(backend().upload(any, dt)), want);
  }
  // f32: every bit pattern, including NaN payloads, infinities and -0.
  std::vector<float> specials = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                                 bits_to_f32(0x7fc01234u), bits_to_f32(0xff800001u)};
  Buffer f = backend().upload(specials, DType::F32);
  std::vector<std::uint32_t> bits(specials.size());
  backend().read_bytes(f, bits.data(), bits.size() * 4);
  for (std::size_t i = 0; i < specials.size(); ++i) EXPECT_EQ(bits[i], f32_to_bits(specials[i])) << i;
  // Integers: truncation toward zero.
  EXPECT_EQ(backend().download(backend().upload(std::vector<float>{0.0f, 1.9f, -1.9f, -7.5f, 123456.7f, 16777216.0f},
                                                DType::I32)),
            (std::vector<float>{0.0f, 1.0f, -1.0f, -7.0f, 123456.0f, 16777216.0f}));
  // The i32 range's ends as f32 holds them: -2^31 fits, 2^31 does not.
  EXPECT_EQ(backend().download(backend().upload(std::vector<float>{-2147483648.0f}, DType::I32)),
            (std::vector<float>{-2147483648.0f}));
  expect_error(ErrorCode::InvalidArgument, "upload",
               [&] { (void)backend().upload(std::vector<float>{2147483648.0f}, DType::I32); }, "does not fit an i32");
  expect_error(ErrorCode::InvalidArgument, "write", [&] {
    Buffer b = backend().alloc(DType::U8, 1);
    backend().write(b, std::vector<float>{256.0f});
  }, "does not fit a u8");
  // Nothing to upload is named as upload's own argument, not alloc's.
  expect_error(ErrorCode::InvalidArgument, "upload", [&] { (void)backend().upload({}, DType::F16); }, "'host' is empty");
  EXPECT_EQ(backend().download(backend().upload(std::vector<float>{0.0f, 1.5f, 254.9f, 255.0f}, DType::U8)),
            (std::vector<float>{0.0f, 1.0f, 254.0f, 255.0f}));
}

// alloc_host: the host writes and reads it through data(); copy_slice moves
// it to and from the backend's memory; ops take it like any Buffer; it
// belongs to its backend (another backend's ops refuse it).
TEST_P(ApiOnBackend, HostBufferIsWrittenDirectlyAndCopied) {
  FERRUM_SEEDED_RNG(rng);
  constexpr std::size_t kN = 1001;
  Buffer host = backend().alloc_host(DType::I32, kN);
  ASSERT_EQ(host.numel(), kN);
  ASSERT_EQ(host.dtype(), DType::I32);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(host.data()) % 16, 0u) << "16-byte aligned, like alloc";
  auto* values = static_cast<std::int32_t*>(host.data());
  std::vector<float> want(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    values[i] = static_cast<std::int32_t>(rng.below(1u << 24)) - (1 << 23);  // exact as f32 (download)
    want[i] = static_cast<float>(values[i]);
  }
  Buffer device = zeros(backend(), DType::I32, kN);
  backend().copy_slice(host, 0, device, 0, kN);
  EXPECT_EQ(backend().download(device), want);
  EXPECT_EQ(backend().download(host), want) << "download reads it like any Buffer";
  // Back into the host buffer (at an offset), read straight from memory
  // after a synchronize.
  backend().write(device, std::vector<float>{-5.0f, 6.0f, 7.0f}, 0);
  backend().copy_slice(device, 0, host, 10, 3);
  backend().synchronize();
  EXPECT_EQ(values[9], static_cast<std::int32_t>(want[9]));
  EXPECT_EQ(values[10], -5);
  EXPECT_EQ(values[11], 6);
  EXPECT_EQ(values[12], 7);
  // An op reads and writes it: embedding_lookup with its ids in host memory.
  Buffer ids = backend().alloc_host(DType::I32, 2);
  static_cast<std::int32_t*>(ids.data())[0] = 2;
  static_cast<std::int32_t*>(ids.data())[1] = 0;
  std::vector<float> table_values(3 * 8);  // [3, 8]: row r holds 8r .. 8r + 7
  for (std::size_t i = 0; i < table_values.size(); ++i) table_values[i] = static_cast<float>(i);
  const Buffer table = backend().upload(table_values, DType::F16);
  Buffer rows = backend().alloc_host(DType::F16, 16);
  backend().embedding_lookup(table, ids, rows, 2, 8, 3);
  std::vector<float> want_rows(table_values.begin() + 16, table_values.end());
  want_rows.insert(want_rows.end(), table_values.begin(), table_values.begin() + 8);
  EXPECT_EQ(backend().download(rows), want_rows);
  // Another backend's host buffer is not this one's.
  expect_error(ErrorCode::WrongBackend, "copy_slice", [&] { other().copy_slice(host, 0, device, 0, 1); }, "'src'");
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(ApiOnBackend);

}  // namespace
}  // namespace ferrum::test
