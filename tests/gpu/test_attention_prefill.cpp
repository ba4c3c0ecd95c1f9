// flash_attention at prefill shapes (q_len > 1), through the public API:
// CudaBackend against CpuBackend (the fp64 oracle), every element within the
// tolerance table. Every case runs on both prefill kernels:
//   - the default backend (PrefillKernel::Auto): on an H100 / H200 with the
//     default sm_90a build, the wgmma kernel of
//     kernels/attention_prefill_wgmma.cu for head_dim 64 / 128 (blocks of
//     one warpgroup, 64 query rows, for small grids, and of two, 128 rows,
//     once ceil(q_len / 128) * heads * batch >= SMs: LargeGrid and the
//     batch-invariance test reach it; CudaPrefillWgmma.BothBlockShapesGive-
//     TheSameBits pins that both shapes give the same bits), the mma.sync
//     kernel for head_dim 256;
//   - a backend with PrefillKernel::MmaSync: the mma.sync kernel of
//     kernels/attention_prefill.cu for every head_dim. It has two
//     query-block shapes: 64 rows (one m16 tile per warp) for small grids
//     and 128 rows (two per warp) once ceil(q_len / 128) * heads * batch >=
//     4 * SMs. Both must give the same bits.
// CudaPrefillWgmma.RunsWhereItShould checks that the wgmma kernel is what
// Auto runs where it should (else the sweep would test the mma.sync kernel
// twice), and MmaSyncBackendRunsTheOtherKernel that the mma_sync backend
// then does not run it (else the sweep would test wgmma twice).
//
// Sweep (small grids: mostly the 64-row shapes): q_len {2, 7, 17, 64, 127, 129,
// 257, 1000} (below, at and across the 64- and 128-row query tiles and the
// 32/64-key tiles) x head_dim {64, 128, 256} x causal / not, with GQA ratios
// 1 / 4 / 8 and three placements of the queries cycled through it:
//   from empty  pos_offset 0, kv_len = q_len, kv_seq_stride = kv_len
//   chunk       pos_offset P > 0, kv_len = P + q_len (chunked prefill against
//               an existing cache), kv_seq_stride > kv_len
//   inside      the queries end before kv_len (causal sees a prefix of the
//               cache, non-causal all of it), kv_seq_stride > kv_len
// Batch 2 everywhere.
//
// LargeGrid: batch 8 x 64 heads, so even at 2 query tiles the grid has 1024
// blocks of 128 rows: the mma.sync kernel's 128-row shape on any device up
// to 256 SMs (head_dim 64 / 128; one causal head_dim 256 row with a custom
// scale on its 64-row shape). q_len leaves the last block partly or almost
// wholly empty (129: one row).
//
// Cache rows past kv_len hold NaN (make_flash_case), so a read past kv_len
// shows up as NaN. Plus determinism (repeated runs are bitwise equal) and
// batch invariance: a sequence computed inside a batch gives the bits it
// gives alone (for the mma.sync kernel on the H200's 132 SMs the batch of 2
// runs the 128-row shape, each sequence alone the 64-row shape).
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "ferrum/cuda_backend.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_prefill.hpp"
#include "support/attention_args.hpp"
#include "support/captured_launches.hpp"
#include "support/device_bytes.hpp"
#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

struct PrefillSpec {
  std::size_t batch, q_len, kv_len, pos_offset;
  AttnConfig cfg;
};

enum class Placement { FromEmpty, Chunk, Inside };

std::vector<PrefillSpec> prefill_specs() {
  constexpr std::size_t kQLens[] = {2, 7, 17, 64, 127, 129, 257, 1000};
  // Cached keys before the chunk: not multiples of the 32/64-key tiles,
  // except 64 and 128 (a chunk starting exactly on a tile boundary).
  constexpr std::size_t kCached[] = {300, 77, 129, 64, 37, 128, 191, 1};
  static_assert(std::size(kQLens) == std::size(kCached));
  constexpr std::size_t kHeadDims[] = {64, 128, 256};
  constexpr std::pair<std::size_t, std::size_t> kHeads[] = {{4, 4}, {8, 2}, {8, 1}};  // GQA 1, 4, 8
  constexpr Placement kPlacements[] = {Placement::FromEmpty, Placement::Chunk, Placement::Inside};
  std::vector<PrefillSpec> specs;
  for (std::size_t qi = 0; qi < std::size(kQLens); ++qi) {
    for (std::size_t hi = 0; hi < std::size(kHeadDims); ++hi) {
      for (std::size_t ci = 0; ci < 2; ++ci) {
        // Cycled so every q_len meets every GQA ratio and every placement
        // twice, and every head_dim meets every GQA ratio.
        const auto [nh, nkv] = kHeads[(hi + ci + qi) % 3];
        const Placement place = kPlacements[(2 * hi + ci + qi) % 3];
        const std::size_t q_len = kQLens[qi];
        AttnConfig cfg;
        cfg.num_heads = nh;
        cfg.num_kv_heads = nkv;
        cfg.head_dim = kHeadDims[hi];
        cfg.causal = ci == 0;
        // Chosen per (q_len, head_dim), so it comes with both causal values:
        // every head_dim meets a custom scale at two q_lens, causal and not.
        cfg.scale = (qi * std::size(kHeadDims) + hi) % 4 == 3 ? 0.3f : 0.0f;  // 0: 1/sqrt(head_dim)
        std::size_t pos = 0, kv_len = q_len;
        switch (place) {
          case Placement::FromEmpty:
            break;
          case Placement::Chunk:
            pos = kCached[qi];
            kv_len = pos + q_len;
            cfg.kv_seq_stride = kv_len + 19;
            break;
          case Placement::Inside:
            pos = kCached[qi] / 2;
            kv_len = kCached[qi] + q_len + 23;
            cfg.kv_seq_stride = kv_len + 45;
            break;
        }
        specs.push_back({2, q_len, kv_len, pos, cfg});
      }
    }
  }
  return specs;
}

// The backend that runs the mma.sync prefill kernel for every head_dim.
std::unique_ptr<Backend> make_mma_sync_backend() {
  CudaBackendConfig config;
  config.prefill_kernel = PrefillKernel::MmaSync;
  return std::make_unique<CudaBackend>(config);
}

// A fixture that runs its cases on both prefill backends: the default one
// and the mma.sync one (skipped where CUDA has no attention kernel).
template <class Base>
class BothPrefillKernels : public Base {
 protected:
  void SetUp() override {
    Base::SetUp();
    if (this->IsSkipped()) return;
    if (!this->cuda().supports(Op::FlashAttention)) {
      GTEST_SKIP() << "CudaBackend::supports(Op::FlashAttention) is false: no CUDA attention kernel to compare yet";
    }
    mma_sync_ = make_mma_sync_backend();
  }
  // Both backends, named for traces.
  std::array<std::pair<const char*, Backend*>, 2> prefill_backends() {
    return {{{"auto", &this->cuda()}, {"mma_sync", mma_sync_.get()}}};
  }
  std::unique_ptr<Backend> mma_sync_;
};

class CudaPrefillAttention : public BothPrefillKernels<CaseParamTest<CudaParamTest<DTypeCaseParam>>> {
 protected:
  // Every case on the default backend and on the mma.sync one.
  void expect_both_match_cpu(const FlashCase& c) {
    const OpResult want = run(cpu(), c);
    for (auto [name, be] : prefill_backends()) {
      SCOPED_TRACE(name);
      // A convex combination of v: outputs are O(1) (op_scale::kUnit).
      expect_same_outputs(run(*be, c), want, Match::Close);
    }
  }
};

TEST_P(CudaPrefillAttention, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const PrefillSpec s = prefill_specs()[index()];
  const FlashCase c = make_flash_case(rng, dt(), s.batch, s.q_len, s.kv_len, s.pos_offset, s.cfg);
  SCOPED_TRACE(describe(c));
  expect_both_match_cpu(c);
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaPrefillAttention, ::testing::ValuesIn(dtype_case_params(prefill_specs().size())),
                         dtype_case_param_name);

// 8 sequences x 64 heads (GQA 1 / 4 / 8): >= 1024 blocks of 128 rows.
std::vector<PrefillSpec> large_grid_specs() {
  struct Row {
    std::size_t hd, nkv;
    bool causal;
    float scale;  // 0: 1/sqrt(head_dim)
    std::size_t q_len;
    Placement place;
    std::size_t cached;
  };
  constexpr Row kRows[] = {
      {128, 8, true, 0.0f, 129, Placement::FromEmpty, 0},    // last block: 1 row
      {128, 16, true, 0.0f, 300, Placement::Chunk, 77},      // last block: 44 rows (warps 2, 3 idle)
      {128, 64, true, 0.3f, 200, Placement::Inside, 500},    // a prefix of a longer cache
      {128, 8, false, 0.0f, 257, Placement::Chunk, 64},      // chunk on a tile boundary
      {128, 16, false, 0.0f, 180, Placement::Inside, 91},
      {64, 64, true, 0.3f, 250, Placement::Chunk, 129},
      {64, 8, false, 0.0f, 129, Placement::FromEmpty, 0},
      {64, 16, true, 0.0f, 300, Placement::Inside, 37},
      {256, 16, true, 0.3f, 150, Placement::Chunk, 77},      // head_dim 256: the mma.sync kernel's only (64-row) shape
  };
  std::vector<PrefillSpec> specs;
  for (const Row& r : kRows) {
    AttnConfig cfg;
    cfg.num_heads = 64;
    cfg.num_kv_heads = r.nkv;
    cfg.head_dim = r.hd;
    cfg.causal = r.causal;
    cfg.scale = r.scale;
    std::size_t pos = 0, kv_len = r.q_len;
    switch (r.place) {
      case Placement::FromEmpty:
        break;
      case Placement::Chunk:
        pos = r.cached;
        kv_len = pos + r.q_len;
        cfg.kv_seq_stride = kv_len + 13;
        break;
      case Placement::Inside:
        pos = r.cached / 2;
        kv_len = r.cached + r.q_len + 23;
        cfg.kv_seq_stride = kv_len + 45;
        break;
    }
    specs.push_back({8, r.q_len, kv_len, pos, cfg});
  }
  return specs;
}

class CudaPrefillLargeGrid : public CudaPrefillAttention {};

TEST_P(CudaPrefillLargeGrid, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const PrefillSpec s = large_grid_specs()[index()];
  const FlashCase c = make_flash_case(rng, dt(), s.batch, s.q_len, s.kv_len, s.pos_offset, s.cfg);
  SCOPED_TRACE(describe(c));
  expect_both_match_cpu(c);
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaPrefillLargeGrid,
                         ::testing::ValuesIn(dtype_case_params(large_grid_specs().size())), dtype_case_param_name);

// Sequence b of a batched case as a batch-1 case (same cache stride).
FlashCase single_sequence(const FlashCase& c, std::size_t b) {
  const DType dt = c.q.dtype;
  const std::size_t q_seq = c.cfg.num_heads * c.q_len * c.cfg.head_dim;
  const std::size_t kv_seq = c.cfg.num_kv_heads * c.stride() * c.cfg.head_dim;
  const auto slice = [&](const HostTensor& t, std::size_t n) {
    return make_tensor(dt, {t.values.begin() + static_cast<std::ptrdiff_t>(b * n),
                            t.values.begin() + static_cast<std::ptrdiff_t>((b + 1) * n)});
  };
  return FlashCase{1,           c.q_len,           c.kv_len,          c.pos_offset, c.cfg,
                   c.valid_kv,  slice(c.q, q_seq), slice(c.k, kv_seq), slice(c.v, kv_seq)};
}

class CudaPrefillBatchInvariance : public BothPrefillKernels<CudaParamTest<DType>> {};

TEST_P(CudaPrefillBatchInvariance, SequenceAloneIsBitwiseTheSame) {
  FERRUM_SEEDED_RNG(rng);
  for (auto [name, be] : prefill_backends()) {
  SCOPED_TRACE(name);
  for (std::size_t hd : {std::size_t{64}, std::size_t{128}}) {
    for (bool causal : {true, false}) {
      AttnConfig cfg;
      cfg.num_heads = 64;
      cfg.num_kv_heads = 8;
      cfg.head_dim = hd;
      cfg.causal = causal;
      cfg.kv_seq_stride = 1100;
      // 8 query tiles of 128 x 64 heads: 1024 blocks for the batch, 512 per
      // sequence. Queries at positions 77.., a partial last tile.
      const FlashCase c = make_flash_case(rng, GetParam(), 2, 1000, 1077, 77, cfg);
      SCOPED_TRACE(describe(c));
      const OpResult all = run(*be, c);
      ASSERT_TRUE(all.guards_ok());
      const auto& bytes = all.at("out").bytes;
      const std::size_t es = size_of(GetParam());
      const std::size_t seq_bytes = cfg.num_heads * c.q_len * hd * es;
      for (std::size_t b = 0; b < c.batch; ++b) {
        const OpResult one = run(*be, single_sequence(c, b));
        ASSERT_TRUE(one.guards_ok());
        const std::vector<std::uint8_t> mine(bytes.begin() + static_cast<std::ptrdiff_t>(b * seq_bytes),
                                             bytes.begin() + static_cast<std::ptrdiff_t>((b + 1) * seq_bytes));
        EXPECT_TRUE(bitwise_equal(mine, one.at("out").bytes, es)) << "sequence " << b;
      }
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaPrefillBatchInvariance, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// Repeated launches of the same inputs give the same bits (no atomics, no
// order that depends on scheduling), causal and not, across several query
// tiles and GQA groups, in both block shapes.
class CudaPrefillDeterminism : public BothPrefillKernels<CudaParamTest<DType>> {};

TEST_P(CudaPrefillDeterminism, BitwiseRepeatable) {
  FERRUM_SEEDED_RNG(rng);
  for (auto [name, be] : prefill_backends()) {
  SCOPED_TRACE(name);
  // 8 heads x batch 2: the mma.sync kernel's 64-row shape (and the wgmma
  // kernel's one-warpgroup blocks on devices of more than 128 SMs); 64 heads
  // x batch 4: the 128-row / two-warpgroup shapes.
  for (std::size_t heads : {std::size_t{8}, std::size_t{64}}) {
    for (bool causal : {true, false}) {
      AttnConfig cfg;
      cfg.num_heads = heads;
      cfg.num_kv_heads = heads / 4;
      cfg.head_dim = 128;
      cfg.causal = causal;
      cfg.kv_seq_stride = 1200;
      const FlashCase c = make_flash_case(rng, GetParam(), heads == 8 ? 2 : 4, 1000, 1077, 77, cfg);
      SCOPED_TRACE(describe(c));
      const OpResult first = run(*be, c);
      ASSERT_TRUE(first.guards_ok());
      for (int rep = 0; rep < 3; ++rep) {
        const OpResult again = run(*be, c);
        EXPECT_TRUE(again.guards_ok());
        EXPECT_TRUE(bitwise_equal(again.at("out").bytes, first.at("out").bytes, size_of(GetParam())))
            << "repeat " << rep;
      }
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaPrefillDeterminism, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// At the edge of the range where the ops promise exact weights
// (kAttentionExactLogit: one FMA per score rounds the row max in base-2
// units), with q and k at f16's largest (a tiny scale) and at 2^-4 (a scale
// up to kMaxAttentionScale): every kernel's outputs are finite and convex in
// v, as CpuBackend's (past ~2^30 they were NaN rows, session 75). Not
// compared element by element: at these logits fp32 and fp64 q·k round
// apart by more than f16's tolerance moves a weight. Decode (q_len 1,
// without and with a split over the keys) and both prefill kernels, every
// head_dim.
class CudaAttentionExactEdge : public BothPrefillKernels<CudaParamTest<DType>> {};

TEST_P(CudaAttentionExactEdge, OutputsStayFiniteAndConvexInV) {
  FERRUM_SEEDED_RNG(rng);
  for (float magnitude : {65504.0f, 0.0625f}) {
    for (std::size_t hd : {64, 128, 256}) {
      for (auto [q_len, kv_len] : {std::pair<std::size_t, std::size_t>{1, 40}, {1, 3000}, {130, 300}}) {
        const FlashCase c = with_scores_at_the_exact_edge(
            make_flash_case(rng, GetParam(), 2, q_len, kv_len, kv_len - q_len, attn_config(8, 2, hd, kv_len + 9)),
            magnitude);
        SCOPED_TRACE(describe(c));
        const OpResult want = run(cpu(), c);
        ASSERT_TRUE(want.guards_ok());
        ASSERT_TRUE(convex_in_v(c, want.at("out"))) << "CpuBackend";
        for (auto [name, be] : prefill_backends()) {
          SCOPED_TRACE(name);
          const OpResult got = run(*be, c);
          EXPECT_TRUE(got.guards_ok());
          EXPECT_TRUE(convex_in_v(c, got.at("out")));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaAttentionExactEdge, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// Where the build holds sm_90a code and the device is compute capability
// 9.0, the wgmma launcher takes head_dim 64 and 128 (and not 256), so Auto
// runs it and the sweep above covers it. Elsewhere: skipped, naming why.
class CudaPrefillWgmma : public CudaTest {
 protected:
  // Empty where the wgmma prefill can run (a build with sm_90a code on a
  // compute-capability 9.0 device), else why not.
  static std::string why_not_here() {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
      return "cudaDeviceGetAttribute failed";
    }
    if (kernels::attention_prefill_wgmma_built() && major == 9 && minor == 0) return {};
    return cat("the wgmma prefill needs a build with sm_90a code (built: ", kernels::attention_prefill_wgmma_built(),
               ") on a 9.0 device (this one: ", major, ".", minor, ")");
  }
};

TEST_F(CudaPrefillWgmma, RunsWhereItShould) {
  cuda();  // device 0 current
  if (const std::string why = why_not_here(); !why.empty()) GTEST_SKIP() << why;
  struct Geometry {
    int q_len, kv_len, kv_stride, kv_heads;
    long long pos;
    bool causal;
  };
  constexpr int kHeads = 4, kMaxRows = 70, kMaxHd = 256;
  const Geometry geometries[] = {
      {70, 70, 70, kHeads, 0, true},   // two query blocks, the second one partial
      {2, 70, 70, kHeads, 68, false},  // q_len 2
      {70, 70, 70, 1, 0, true},        // GQA 4
      {2, 2, 2, kHeads, 0, true},      // a two-row cache
      {30, 40, 64, kHeads, 10, true},  // kv_len below one tile, kv_stride > kv_len
  };
  const std::size_t bytes = std::size_t{kHeads} * kMaxRows * kMaxHd * 2;
  DeviceBytes dq_mem(bytes), dk_mem(bytes), dv_mem(bytes), dout_mem(bytes);
  dq_mem.fill(0);
  dk_mem.fill(0);
  dv_mem.fill(0);
  void *const dq = dq_mem.get(), *const dk = dk_mem.get(), *const dv = dv_mem.get(), *const dout = dout_mem.get();
  for (DType dt : kHalfDTypes) {
    for (int hd : {64, 128, 256}) {
      for (const Geometry& geo : geometries) {
        kernels::AttentionArgs a = attention_args(dt, dq, dk, dv, dout,
                                                  {.heads = kHeads,
                                                   .kv_heads = geo.kv_heads,
                                                   .q_len = geo.q_len,
                                                   .head_dim = hd,
                                                   .kv_stride = geo.kv_stride,
                                                   .kv_len = geo.kv_len,
                                                   .pos_offset = geo.pos,
                                                   .causal = geo.causal});
        a.scale = 0.125f;
        SCOPED_TRACE(cat(to_string(dt), " head_dim ", hd, " q_len ", a.q_len, " kv_len ", a.kv_len, " kv_stride ",
                         a.kv_stride, " kv heads ", a.num_kv_heads));
        for (const bool producer_warp : {false, true}) {
          a.prefill_tuning.wgmma_producer_warp = producer_warp;
          EXPECT_EQ(kernels::launch_attention_prefill_wgmma(a, nullptr), hd != 256) << "producer warp " << producer_warp;
          EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
      }
    }
  }
  // An empty cache: either kernel may take it; whichever does writes zeros
  // (the wgmma kernel with and without its producer warp at hd 64 and 128,
  // the mma.sync kernel at every head_dim: no key tile at all).
  for (const int hd : {64, 128, 256}) {
    kernels::AttentionArgs empty = attention_args(
        DType::F16, dq, dk, dv, dout,
        {.heads = kHeads, .kv_heads = kHeads, .q_len = 5, .head_dim = hd, .kv_stride = 8, .kv_len = 0});
    empty.scale = 0.125f;
    ASSERT_TRUE(kernels::prefill_tc_applies(empty)) << "hd " << hd << ": the mma.sync kernel takes an empty cache";
    for (const int variant : {0, 1, 2}) {  // wgmma; wgmma with the producer warp; mma.sync
      if (variant < 2 && hd == 256) continue;
      empty.prefill_tuning.wgmma_producer_warp = variant == 1;
      empty.prefill_wgmma = variant < 2;
      dout_mem.fill(kPoisonByte);
      kernels::launch_attention(empty, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::uint8_t> got = dout_mem.read();
      for (std::size_t i = 0; i < std::size_t{kHeads} * 5 * static_cast<std::size_t>(hd) * 2; ++i) {
        ASSERT_EQ(got[i], 0u) << "byte " << i << ", hd " << hd << ", variant " << variant;
      }
    }
  }
}

// The kernels one prefill flash_attention call ([1 x 4 heads x 256] over
// 256 keys, GQA 2, causal) launches on `be`.
std::vector<CapturedLaunch> prefill_launches(Backend& be, DType dt, std::size_t head_dim) {
  AttnConfig cfg;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = head_dim;
  constexpr std::size_t kBatch = 1, kLen = 256;
  Buffer q = be.alloc(dt, kBatch * cfg.num_heads * kLen * head_dim);
  Buffer k = be.alloc(dt, kBatch * cfg.num_kv_heads * kLen * head_dim);
  Buffer v = be.alloc(dt, kBatch * cfg.num_kv_heads * kLen * head_dim);
  Buffer out = be.alloc(dt, kBatch * cfg.num_heads * kLen * head_dim);
  return captured_launches(dynamic_cast<CudaBackend&>(be),
                           [&] { be.flash_attention(q, k, v, out, kBatch, kLen, kLen, 0, cfg); });
}

// Where Auto runs the wgmma kernel, a backend built with
// PrefillKernel::MmaSync must launch the other one: were the setting lost on
// the way to the launch, both would run wgmma, every prefill test would
// still pass and the mma.sync kernel at head_dim 64 / 128 would go untested.
// The launched kernel is read from a captured graph's nodes by name. (The
// two kernels' outputs cannot tell them apart: on the H100 they agreed to the
// bit on every prefill spec, session 58.)
TEST_F(CudaPrefillWgmma, MmaSyncBackendRunsTheOtherKernel) {
  cuda();  // device 0 current
  if (const std::string why = why_not_here(); !why.empty()) GTEST_SKIP() << why;
  const std::unique_ptr<Backend> mma_sync = make_mma_sync_backend();
  for (DType dt : kHalfDTypes) {
    for (std::size_t head_dim : {64u, 128u}) {
      SCOPED_TRACE(cat(to_string(dt), " head_dim=", head_dim));
      const std::vector<CapturedLaunch> by_auto = prefill_launches(cuda(), dt, head_dim);
      const std::vector<CapturedLaunch> by_mma_sync = prefill_launches(*mma_sync, dt, head_dim);
      EXPECT_TRUE(launched(by_auto, "attention_prefill_wgmma_kernel")) << "auto: " << describe_launches(by_auto);
      EXPECT_TRUE(launched(by_mma_sync, "attention_prefill")) << "mma_sync: " << describe_launches(by_mma_sync);
      EXPECT_FALSE(launched(by_mma_sync, "wgmma")) << "mma_sync: " << describe_launches(by_mma_sync);
    }
  }
}

// pos_offset only places the causal mask: a non-causal call may pass any
// value (the shared checks bound it only when causal), and it must change
// neither the kernel nor the bits. One past 2^63 used to reach the kernels
// negative, which turned both tensor-core prefills off: the call then ran
// the CUDA-core fallback, slower and with other bits.
TEST_F(CudaPrefillWgmma, NonCausalIgnoresPosOffset) {
  cuda();  // device 0 current
  if (const std::string why = why_not_here(); !why.empty()) GTEST_SKIP() << why;
  FERRUM_SEEDED_RNG(rng);
  AttnConfig cfg;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 128;
  cfg.causal = false;
  constexpr std::size_t kQLen = 70, kKvLen = 90;
  for (DType dt : kHalfDTypes) {
    SCOPED_TRACE(to_string(dt));
    Buffer q = cuda().upload(uniform_values(rng, cfg.num_heads * kQLen * cfg.head_dim, -1.0f, 1.0f), dt);
    Buffer k = cuda().upload(uniform_values(rng, cfg.num_kv_heads * kKvLen * cfg.head_dim, -1.0f, 1.0f), dt);
    Buffer v = cuda().upload(uniform_values(rng, cfg.num_kv_heads * kKvLen * cfg.head_dim, -1.0f, 1.0f), dt);
    std::vector<std::uint8_t> at_zero;
    for (const std::size_t pos : {std::size_t{0}, std::size_t{20}, std::size_t{1} << 63, SIZE_MAX}) {
      SCOPED_TRACE(cat("pos_offset ", pos));
      GuardedOutput out(cuda(), dt, cfg.num_heads * kQLen * cfg.head_dim);
      const std::vector<CapturedLaunch> launches =
          captured_launches(dynamic_cast<CudaBackend&>(cuda()),
                            [&] { cuda().flash_attention(q, k, v, out.view(), 1, kQLen, kKvLen, pos, cfg); });
      EXPECT_TRUE(launched(launches, "attention_prefill_wgmma_kernel")) << describe_launches(launches);
      out.poison();
      cuda().flash_attention(q, k, v, out.view(), 1, kQLen, kKvLen, pos, cfg);
      EXPECT_TRUE(out.check_guard("flash_attention", "out", cat(to_string(dt), " pos_offset ", pos)));
      if (pos == 0) {
        at_zero = out.bytes();
      } else {
        EXPECT_TRUE(bitwise_equal(out.bytes(), at_zero, size_of(dt)));
      }
    }
  }
}

// Straight through the launcher: blocks of one and of two warpgroups, the
// automatic choice and the warp-specialized experiment (a producer warp,
// full / empty barriers per slot) give the same bytes (one warpgroup's within
// the tolerance table of CpuBackend's), on random inputs with
// a partial last block, GQA, a chunk at pos_offset > 0 over a longer cache.
TEST_F(CudaPrefillWgmma, BothBlockShapesGiveTheSameBits) {
  cuda();  // device 0 current
  if (const std::string why = why_not_here(); !why.empty()) GTEST_SKIP() << why;
  FERRUM_SEEDED_RNG(rng);
  struct Case {
    int hd, heads, kv_heads, q_len, kv_len, kv_stride;
    long long pos;
    bool causal;
  };
  // The last two wrap the producer-warp variant's 5 / 8-slot rings many
  // times (both mbarrier parities, every slot); the last has one 64-row
  // block, so the other warpgroups skip every tile.
  const Case cases[] = {{128, 8, 2, 300, 300, 300, 0, true},     {128, 8, 8, 193, 700, 730, 507, true},
                        {64, 8, 1, 129, 1000, 1000, 0, false},   {64, 4, 4, 250, 377, 400, 127, true},
                        {128, 4, 1, 65, 90, 96, 25, true},       {128, 8, 2, 1100, 2200, 2200, 1100, true},
                        {64, 4, 4, 64, 1300, 1300, 0, false},    {128, 8, 2, 200, 1500, 1600, 0, false}};
  for (DType dt : kHalfDTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cat(to_string(dt), " hd ", c.hd, " heads ", c.heads, "/", c.kv_heads, " q_len ", c.q_len,
                       " kv_len ", c.kv_len, " pos ", c.pos, c.causal ? " causal" : ""));
      const std::size_t batch = 2;
      // The case as the op runners hold it (k / v rows past kv_len up to the
      // stride NaN: never read), for CpuBackend's reference below.
      AttnConfig cfg = attn_config(static_cast<std::size_t>(c.heads), static_cast<std::size_t>(c.kv_heads),
                                   static_cast<std::size_t>(c.hd), static_cast<std::size_t>(c.kv_stride));
      cfg.causal = c.causal;
      const FlashCase fc = make_flash_case(rng, dt, batch, static_cast<std::size_t>(c.q_len),
                                           static_cast<std::size_t>(c.kv_len), static_cast<std::size_t>(c.pos), cfg);
      const std::vector<std::uint8_t> q = encode_bytes(fc.q), k = encode_bytes(fc.k), v = encode_bytes(fc.v);
      const DeviceBytes dq(q), dk(k), dv(v);
      DeviceBytes dout(q.size());
      auto run_with = [&](int warpgroups, bool producer_warp = false) {
        dout.fill(kPoisonByte);
        kernels::AttentionArgs a = attention_args(dt, dq.get(), dk.get(), dv.get(), dout.get(),
                                                  {.batch = static_cast<int>(batch),
                                                   .heads = c.heads,
                                                   .kv_heads = c.kv_heads,
                                                   .q_len = c.q_len,
                                                   .head_dim = c.hd,
                                                   .kv_stride = c.kv_stride,
                                                   .kv_len = c.kv_len,
                                                   .pos_offset = c.pos,
                                                   .causal = c.causal});
        a.prefill_tuning.wgmma_warpgroups = warpgroups;
        a.prefill_tuning.wgmma_producer_warp = producer_warp;
        EXPECT_TRUE(kernels::launch_attention_prefill_wgmma(a, nullptr));
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return dout.read();
      };
      const std::vector<std::uint8_t> one = run_with(1);
      // One warpgroup's bytes against CpuBackend; the others against it bitwise.
      EXPECT_TRUE(all_close(decode_bytes(dt, one), run(cpu(), fc).at("out").values, dt)) << "one warpgroup";
      EXPECT_TRUE(bitwise_equal(run_with(2), one, size_of(dt))) << "two warpgroups";
      EXPECT_TRUE(bitwise_equal(run_with(0), one, size_of(dt))) << "automatic choice";
      EXPECT_TRUE(bitwise_equal(run_with(2, true), one, size_of(dt))) << "producer warp, two warpgroups";
      EXPECT_TRUE(bitwise_equal(run_with(3, true), one, size_of(dt))) << "producer warp, three warpgroups";
    }
  }
}

// Warpgroup counts the wgmma prefill has no instance for (3 without the
// producer warp, 1 or 4 with it) are a named error from the launcher, with
// nothing launched: out keeps its poison.
TEST_F(CudaPrefillWgmma, WarpgroupCountsWithoutAnInstanceAreNamedErrors) {
  cuda();  // device 0 current
  if (const std::string why = why_not_here(); !why.empty()) GTEST_SKIP() << why;
  FERRUM_SEEDED_RNG(rng);
  const FlashCase fc = make_flash_case(rng, DType::F16, 1, 100, 100, 0, attn_config(8, 2, 128, 100));
  const std::vector<std::uint8_t> q = encode_bytes(fc.q);
  const DeviceBytes dq(q), dk(encode_bytes(fc.k)), dv(encode_bytes(fc.v));
  DeviceBytes dout(q.size());
  dout.fill(kPoisonByte);
  const std::pair<int, bool> unbuilt[] = {{3, false}, {1, true}, {4, true}};
  for (const auto& [warpgroups, producer_warp] : unbuilt) {
    SCOPED_TRACE(cat("warpgroups ", warpgroups, producer_warp ? " with the producer warp" : ""));
    kernels::AttentionArgs a = attention_args(
        DType::F16, dq.get(), dk.get(), dv.get(), dout.get(),
        {.batch = 1, .heads = 8, .kv_heads = 2, .q_len = 100, .head_dim = 128, .kv_stride = 100, .kv_len = 100});
    a.prefill_tuning.wgmma_warpgroups = warpgroups;
    a.prefill_tuning.wgmma_producer_warp = producer_warp;
    expect_error(ErrorCode::Internal, "flash_attention", [&] { kernels::launch_attention_prefill_wgmma(a, nullptr); },
                 "PrefillTuning::wgmma_warpgroups");
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint8_t> out = dout.read();
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == kPoisonByte; }));
}

// Rows the kernels cannot move as 16-byte vectors: each of q, k, v and out
// 2 bytes off (element-aligned, so Buffer::wrap takes it), at prefill, at
// decode and in the ragged decode, refused as Misaligned naming it; the
// backend works afterwards.
class CudaAttentionAlignment : public CudaTest {};
TEST_F(CudaAttentionAlignment, MisalignedRowsAreRefused) {
  Backend& be = cuda();
  constexpr std::size_t kHd = 64, kKeys = 8, kQLen = 4, kHeads = 2;
  AttnConfig cfg;
  cfg.num_heads = kHeads;
  cfg.num_kv_heads = 1;
  cfg.head_dim = kHd;
  const std::size_t q_elems = kHeads * kQLen * kHd, kv_elems = kKeys * kHd;
  auto padded = [&](std::size_t n) { return be.upload(std::vector<float>(n + 8, 0.25f), DType::F16); };
  Buffer q = padded(q_elems), k = padded(kv_elems), v = padded(kv_elems), out = padded(q_elems);
  auto off = [&](Buffer& b, std::size_t n) {
    return Buffer::wrap(be, static_cast<std::uint8_t*>(b.data()) + 2, DType::F16, n);
  };
  Buffer q_off = off(q, q_elems), k_off = off(k, kv_elems), v_off = off(v, kv_elems), out_off = off(out, q_elems);
  const Buffer kv_lens = be.upload(std::vector<float>{static_cast<float>(kKeys)}, DType::I32);
  struct Operands {
    const char* name;
    const Buffer *q, *k, *v;
    Buffer* out;
  };
  for (const Operands& o : {Operands{"'q'", &q_off, &k, &v, &out}, Operands{"'k'", &q, &k_off, &v, &out},
                            Operands{"'v'", &q, &k, &v_off, &out}, Operands{"'out'", &q, &k, &v, &out_off}}) {
    SCOPED_TRACE(o.name);
    for (const std::size_t q_len : {kQLen, std::size_t{1}}) {
      SCOPED_TRACE(cat("q_len ", q_len));
      cfg.kv_seq_stride = 0;
      expect_error(ErrorCode::Misaligned, "flash_attention",
                   [&] { be.flash_attention(*o.q, *o.k, *o.v, *o.out, 1, q_len, kKeys, kKeys - q_len, cfg); },
                   o.name);
    }
    cfg.kv_seq_stride = kKeys;
    expect_error(ErrorCode::Misaligned, "flash_decode_ragged",
                 [&] { be.flash_decode_ragged(*o.q, *o.k, *o.v, *o.out, kv_lens, 1, cfg); }, o.name);
  }
  cfg.kv_seq_stride = 0;
  // out poisoned first (it was uploaded holding 0.25, the expected value),
  // its 8 elements past q_elems the guard.
  constexpr float kPoison = -7.0f;
  be.write(out, std::vector<float>(q_elems + 8, kPoison));
  be.flash_attention(q, k, v, out, 1, kQLen, kKeys, kKeys - kQLen, cfg);
  const std::vector<float> got = be.download(out, q_elems + 8);
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + q_elems), std::vector<float>(q_elems, 0.25f))
      << "equal values: every output is v's 0.25";
  EXPECT_EQ(std::vector<float>(got.begin() + q_elems, got.end()), std::vector<float>(8, kPoison))
      << "flash_attention wrote past 'out'";
}

TEST_F(CudaPrefillWgmma, ConfigOutsideTheEnumIsRefused) {
  for (int bad : {-1, 2, 7}) {
    CudaBackendConfig config;
    config.prefill_kernel = static_cast<PrefillKernel>(bad);
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(config); }, "prefill_kernel");
  }
  CudaBackendConfig mma;
  mma.prefill_kernel = PrefillKernel::MmaSync;
  EXPECT_EQ(CudaBackend(mma).prefill_kernel(), PrefillKernel::MmaSync);
  EXPECT_EQ(CudaBackend().prefill_kernel(), PrefillKernel::Auto);
}

}  // namespace
}  // namespace ferrum::test
