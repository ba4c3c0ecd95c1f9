// flash_attention at prefill shapes (q_len > 1), the tensor-core path of
// kernels/attention_prefill.cu, through the public API: CudaBackend against
// CpuBackend (the fp64 oracle), every element within the tolerance table.
//
// The sweep: q_len {2, 17, 64, 130, 1000} (below, at and across the 64-row
// query tile) x head_dim {64, 128, 256} x causal / not, with GQA ratios
// 1 / 4 / 8 and three placements of the queries cycled through it:
//   from empty  pos_offset 0, kv_len = q_len, kv_seq_stride = kv_len
//   chunk       pos_offset P > 0, kv_len = P + q_len (chunked prefill against
//               an existing cache), kv_seq_stride > kv_len
//   inside      the queries end before kv_len (causal sees a prefix of the
//               cache, non-causal all of it), kv_seq_stride > kv_len
// Batch 2 everywhere. Cache rows past kv_len hold NaN (make_flash_case), so
// a read past kv_len shows up as NaN. Plus determinism: repeated runs are
// bitwise equal.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cstddef>
#include <utility>
#include <vector>

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
  constexpr std::size_t kQLens[] = {2, 17, 64, 130, 1000};
  // Cached keys before the chunk: not multiples of the 32/64-key tiles,
  // except 64 (a chunk starting exactly on a tile boundary).
  constexpr std::size_t kCached[] = {300, 77, 129, 64, 37};
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
        cfg.scale = specs.size() % 4 == 3 ? 0.3f : 0.0f;  // 0: 1/sqrt(head_dim)
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

class CudaPrefillAttention : public CaseParamTest<CudaParamTest<DTypeCaseParam>> {
 protected:
  void SetUp() override {
    CaseParamTest<CudaParamTest<DTypeCaseParam>>::SetUp();
    if (IsSkipped()) return;
    if (!cuda().supports(Op::FlashAttention)) {
      GTEST_SKIP() << "CudaBackend::supports(Op::FlashAttention) is false: no CUDA attention kernel to compare yet";
    }
  }
};

TEST_P(CudaPrefillAttention, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const PrefillSpec s = prefill_specs()[index()];
  const FlashCase c = make_flash_case(rng, dt(), s.batch, s.q_len, s.kv_len, s.pos_offset, s.cfg);
  SCOPED_TRACE(describe(c));
  // A convex combination of v: outputs are O(1) (op_scale::kUnit).
  expect_same_outputs(run(cuda(), c), run(cpu(), c), Match::Close);
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaPrefillAttention, ::testing::ValuesIn(dtype_case_params(prefill_specs().size())),
                         dtype_case_param_name);

// Repeated launches of the same inputs give the same bits (no atomics, no
// order that depends on scheduling), causal and not, across several query
// tiles and GQA groups.
class CudaPrefillDeterminism : public CudaParamTest<DType> {};

TEST_P(CudaPrefillDeterminism, BitwiseRepeatable) {
  if (!cuda().supports(Op::FlashAttention)) {
    GTEST_SKIP() << "CudaBackend::supports(Op::FlashAttention) is false: no CUDA attention kernel to compare yet";
  }
  FERRUM_SEEDED_RNG(rng);
  for (bool causal : {true, false}) {
    AttnConfig cfg;
    cfg.num_heads = 8;
    cfg.num_kv_heads = 2;
    cfg.head_dim = 128;
    cfg.causal = causal;
    cfg.kv_seq_stride = 1200;
    const FlashCase c = make_flash_case(rng, GetParam(), 2, 1000, 1077, 77, cfg);
    SCOPED_TRACE(describe(c));
    const OpResult first = run(cuda(), c);
    ASSERT_TRUE(first.guards_ok());
    for (int rep = 0; rep < 3; ++rep) {
      const OpResult again = run(cuda(), c);
      EXPECT_TRUE(again.guards_ok());
      EXPECT_TRUE(bitwise_equal(again.at("out").bytes, first.at("out").bytes, size_of(GetParam())))
          << "repeat " << rep;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaPrefillDeterminism, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

}  // namespace
}  // namespace ferrum::test
