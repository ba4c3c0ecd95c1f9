// GPTQ repack for the CUDA kernels (src/quant/gptq_repack.hpp), on the host:
//   * Round trips: random weights -> pack_gptq -> repack_gptq -> unpack_repacked
//     give back exactly what unpack_gptq reads from the checkpoint (q, true
//     zeros, scales, g_idx, perm, act_order), for group sizes 32, 64, 128, -1,
//     symmetric and asymmetric, V1 and V2, with and without act-order, square
//     and non-square k / n, sizes that need padding, and the general
//     (non-fused) layouts: group sizes 8 and 24, uneven act-order groups.
//   * The checkpoint's path (weights straight from qweight) gives the bits of
//     repack after unpack, every field and word.
//   * Layout: the mma.sync B fragments a lane gets from its 16-byte word group
//     with the magic-number extraction ((w >> 4i) & 0x000F000F) are the ones
//     the PTX fragment definition asks for, and a lane's 8 consecutive scales
//     are those of its 8 n tiles. Written here from the definitions.
//   * Bad input: each check throws ferrum::Error with the right code and the
//     op name.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ferrum/error.hpp"
#include "ferrum/half.hpp"
#include "quant/gptq_format.hpp"
#include "quant/gptq_repack.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using detail::GptqPacked;
using detail::GptqRepacked;
using detail::GptqUnpacked;

struct RepackCase {
  std::size_t k, n;
  int group_size;
  bool symmetric;
  bool act_order;
  GptqZeroFormat format;
};

std::string describe(const RepackCase& c) {
  return "k " + std::to_string(c.k) + " n " + std::to_string(c.n) + " group " + std::to_string(c.group_size) +
         (c.symmetric ? " sym" : " asym") + (c.act_order ? " act-order" : "") +
         (c.format == GptqZeroFormat::V1 ? " v1" : " v2");
}

// A random checkpoint: q in 0..15, zeros 8 (symmetric) or anything the format
// holds, scales of mixed magnitude and sign, g_idx shuffled for act-order.
GptqPacked random_checkpoint(const RepackCase& c, Rng& rng) {
  GptqUnpacked w;
  w.k = c.k;
  w.n = c.n;
  w.group_size = c.group_size;
  const std::size_t rows = c.group_size == -1 ? c.k : static_cast<std::size_t>(c.group_size);
  w.groups = c.k / rows;
  std::uniform_int_distribution<int> q(0, 15), zero_v1(1, 16), zero_v2(0, 15);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  w.q.resize(c.k * c.n);
  for (auto& v : w.q) v = static_cast<std::uint8_t>(q(rng.engine()));
  w.zero.resize(w.groups * c.n);
  for (auto& v : w.zero) {
    auto& zero = c.format == GptqZeroFormat::V1 ? zero_v1 : zero_v2;
    v = static_cast<std::uint8_t>(c.symmetric ? 8 : zero(rng.engine()));
  }
  w.scale.resize(w.groups * c.n);
  for (auto& v : w.scale) v = scale(rng.engine());
  w.g_idx.resize(c.k);
  for (std::size_t r = 0; r < c.k; ++r) w.g_idx[r] = static_cast<std::int32_t>(r / rows);
  if (c.act_order) std::shuffle(w.g_idx.begin(), w.g_idx.end(), rng.engine());
  return detail::pack_gptq(w, c.format);
}

void expect_same_weight(const GptqUnpacked& got, const GptqUnpacked& want) {
  EXPECT_EQ(got.k, want.k);
  EXPECT_EQ(got.n, want.n);
  EXPECT_EQ(got.groups, want.groups);
  EXPECT_EQ(got.group_size, want.group_size);
  EXPECT_TRUE(got.q == want.q) << "q differs";
  EXPECT_TRUE(got.zero == want.zero) << "zeros differ";
  EXPECT_TRUE(got.scale == want.scale) << "scales differ";
  EXPECT_TRUE(got.g_idx == want.g_idx) << "g_idx differs";
  EXPECT_TRUE(got.perm == want.perm) << "perm differs";
  EXPECT_EQ(got.act_order, want.act_order);
}

TEST(GptqRepack, RoundTripIsExactForEveryStandardLayout) {
  FERRUM_SEEDED_RNG(rng);
  std::vector<RepackCase> cases;
  for (int gs : {32, 64, 128, -1}) {
    for (bool sym : {true, false}) {
      for (bool act : {false, true}) {
        if (gs == -1 && act) continue;
        for (GptqZeroFormat f : {GptqZeroFormat::V1, GptqZeroFormat::V2}) {
          cases.push_back({256, 72, gs, sym, act, f});   // n padded to 128
          cases.push_back({384, 192, gs, sym, act, f});  // k padded to 512 (128, -1 fit exactly)
        }
      }
    }
  }
  cases.push_back({128, 8, 32, false, true, GptqZeroFormat::V1});
  cases.push_back({96, 136, 32, false, true, GptqZeroFormat::V2});  // k padded by a whole group
  cases.push_back({16, 8, -1, true, false, GptqZeroFormat::V1});    // the tiniest legal weight
  cases.push_back({1024, 64, 128, false, true, GptqZeroFormat::V2});
  for (const RepackCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const GptqPacked packed = random_checkpoint(c, rng);
    const GptqUnpacked original = detail::unpack_gptq(packed.host_tensors());
    const GptqRepacked r = detail::repack_gptq(packed.host_tensors());
    EXPECT_EQ(r.k_pad % 128, 0u);
    EXPECT_EQ(r.n_pad % 64, 0u);
    EXPECT_LT(r.k_pad - r.k, 128u);
    EXPECT_LT(r.n_pad - r.n, 64u);
    EXPECT_TRUE(r.fused()) << "a standard checkpoint must take the fused kernel";
    EXPECT_EQ(r.group_rows, c.group_size == -1 ? r.k_pad : static_cast<std::size_t>(c.group_size));
    EXPECT_EQ(r.scale_rows, r.k_pad / r.group_rows);
    EXPECT_EQ(r.act_order, c.act_order);
    EXPECT_EQ(r.uniform_zero, c.symmetric);
    if (c.symmetric) EXPECT_EQ(r.zero_value, 8);
    // Rows of one group are contiguous in the repacked order.
    for (std::size_t j = 0; j < r.k; ++j) ASSERT_EQ(static_cast<std::size_t>(r.row_group[j]), j / r.group_rows);
    expect_same_weight(detail::unpack_repacked(r), original);
    // And back into a checkpoint: the same words.
    const GptqPacked again = detail::pack_gptq(detail::unpack_repacked(r), c.format);
    EXPECT_TRUE(again.qweight == packed.qweight);
    EXPECT_TRUE(again.qzeros == packed.qzeros);
    EXPECT_TRUE(again.scales == packed.scales);
  }
}

// Every zero one value other than 8 (the two ends of each format's range,
// 0 in V2 and 16 in V1, and 3): the repack keeps no zeros array but that
// value (uniform_zero, zero_value), on both paths, and the weight round-trips;
// one zero changed makes the zeros per column again.
TEST(GptqRepack, OneZeroForEveryColumnIsKeptAsOneValue) {
  FERRUM_SEEDED_RNG(rng);
  const std::pair<int, GptqZeroFormat> zeros[] = {
      {0, GptqZeroFormat::V2}, {16, GptqZeroFormat::V1}, {3, GptqZeroFormat::V1}};
  for (const auto& [zero, format] : zeros) {
    for (const RepackCase& c : {RepackCase{384, 200, 128, false, false, format},
                                RepackCase{256, 136, 16, false, true, format}}) {
      SCOPED_TRACE(describe(c) + " every zero " + std::to_string(zero));
      GptqUnpacked w = detail::unpack_gptq(random_checkpoint(c, rng).host_tensors());
      std::fill(w.zero.begin(), w.zero.end(), static_cast<std::uint8_t>(zero));
      const GptqPacked packed = detail::pack_gptq(w, format);
      for (const GptqRepacked& r :
           {detail::repack_gptq(packed.host_tensors()), detail::repack_gptq(detail::unpack_gptq(packed.host_tensors()))}) {
        EXPECT_TRUE(r.uniform_zero);
        EXPECT_EQ(r.zero_value, zero);
        expect_same_weight(detail::unpack_repacked(r), w);
      }
      w.zero[w.zero.size() / 2] = static_cast<std::uint8_t>(zero == 3 ? 4 : 8);
      EXPECT_FALSE(detail::repack_gptq(detail::pack_gptq(w, format).host_tensors()).uniform_zero);
    }
  }
}

// repack_gptq on the checkpoint (load_gptq's path, the weights straight from
// qweight) and on its unpacked form (a byte per weight in between): the same
// repacked weight, every field and every word, padding included.
TEST(GptqRepack, StraightPathGivesTheTwoStepBits) {
  FERRUM_SEEDED_RNG(rng);
  std::vector<RepackCase> cases;
  for (int gs : {32, 128, -1}) {
    for (bool act : {false, true}) {
      if (gs == -1 && act) continue;
      cases.push_back({384, 200, gs, false, act, GptqZeroFormat::V1});  // k and n padded
      cases.push_back({256, 64, gs, true, act, GptqZeroFormat::V2});
    }
  }
  cases.push_back({64, 24, 8, false, false, GptqZeroFormat::V1});   // general layouts
  cases.push_back({96, 136, 24, false, true, GptqZeroFormat::V2});
  cases.push_back({16, 8, -1, true, false, GptqZeroFormat::V1});
  for (const RepackCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const GptqPacked packed = random_checkpoint(c, rng);
    const GptqRepacked straight = detail::repack_gptq(packed.host_tensors());
    const GptqRepacked two_step = detail::repack_gptq(detail::unpack_gptq(packed.host_tensors()));
    EXPECT_EQ(straight.k_pad, two_step.k_pad);
    EXPECT_EQ(straight.n_pad, two_step.n_pad);
    EXPECT_EQ(straight.groups, two_step.groups);
    EXPECT_EQ(straight.group_rows, two_step.group_rows);
    EXPECT_EQ(straight.scale_rows, two_step.scale_rows);
    EXPECT_EQ(straight.act_order, two_step.act_order);
    EXPECT_EQ(straight.uniform_zero, two_step.uniform_zero);
    EXPECT_EQ(straight.zero_value, two_step.zero_value);
    EXPECT_TRUE(straight.qweight == two_step.qweight) << "the weight words differ";
    EXPECT_TRUE(straight.scales == two_step.scales);
    EXPECT_TRUE(straight.zeros == two_step.zeros);
    EXPECT_TRUE(straight.perm == two_step.perm);
    EXPECT_TRUE(straight.row_group == two_step.row_group);
  }
  // Uneven act-order groups (g_idx drawn at random).
  RepackCase c{128, 40, 32, false, false, GptqZeroFormat::V1};
  GptqPacked packed = random_checkpoint(c, rng);
  std::uniform_int_distribution<int> group(0, 3);
  for (auto& g : packed.g_idx) g = group(rng.engine());
  packed.g_idx[0] = 1;
  EXPECT_TRUE(detail::repack_gptq(packed.host_tensors()).qweight ==
              detail::repack_gptq(detail::unpack_gptq(packed.host_tensors())).qweight);
}

TEST(GptqRepack, GeneralLayoutsRoundTripAndAreNotFused) {
  FERRUM_SEEDED_RNG(rng);
  // Group sizes the fused kernel does not take (8: a k16 step spans two
  // groups; 24: does not divide 128).
  for (const RepackCase& c : {RepackCase{64, 24, 8, false, false, GptqZeroFormat::V1},
                              RepackCase{96, 64, 24, false, true, GptqZeroFormat::V2},
                              RepackCase{16, 8, 8, true, false, GptqZeroFormat::V2}}) {
    SCOPED_TRACE(describe(c));
    const GptqPacked packed = random_checkpoint(c, rng);
    const GptqRepacked r = detail::repack_gptq(packed.host_tensors());
    EXPECT_FALSE(r.fused());
    EXPECT_EQ(r.scale_rows, r.groups);
    expect_same_weight(detail::unpack_repacked(r), detail::unpack_gptq(packed.host_tensors()));
  }
  // Act-order with uneven groups (g_idx drawn at random, group_size 32):
  // legal, but the groups are not group_size rows each.
  RepackCase c{128, 40, 32, false, false, GptqZeroFormat::V1};
  GptqPacked packed = random_checkpoint(c, rng);
  std::uniform_int_distribution<int> group(0, 3);
  for (auto& g : packed.g_idx) g = group(rng.engine());
  packed.g_idx[0] = 0;
  packed.g_idx[1] = 1;  // not monotonic, whatever the draw
  // Uneven, whatever the draw: one draw in about 1400 gives every group
  // exactly 32 rows, a plain act-order layout that the fused kernel takes.
  std::array<int, 4> rows_per_group{};
  for (const int g : packed.g_idx) ++rows_per_group[static_cast<std::size_t>(g)];
  if (rows_per_group == std::array<int, 4>{32, 32, 32, 32}) {
    *std::find(packed.g_idx.begin() + 2, packed.g_idx.end(), 0) = 1;
  }
  const GptqRepacked r = detail::repack_gptq(packed.host_tensors());
  EXPECT_FALSE(r.fused());
  EXPECT_TRUE(r.act_order);
  expect_same_weight(detail::unpack_repacked(r), detail::unpack_gptq(packed.host_tensors()));
  // A sorted g_idx with uneven groups: no permutation, still not fused.
  std::sort(packed.g_idx.begin(), packed.g_idx.end());
  const GptqRepacked sorted = detail::repack_gptq(packed.host_tensors());
  EXPECT_FALSE(sorted.act_order);
  expect_same_weight(detail::unpack_repacked(sorted), detail::unpack_gptq(packed.host_tensors()));
}

// The PTX m16n8k16 B fragment (16 x 8, "col"): lane L holds
//   b0, b1: rows 2 * (L % 4) + {0, 1},     column L / 4
//   b2, b3: rows 2 * (L % 4) + 8 + {0, 1}, column L / 4
// Register i of word j must give n tile 2j (i = 0, 1) or 2j + 1 (i = 2, 3),
// rows {b0, b1} (i even) or {b2, b3} (i odd), low half first.
TEST(GptqRepack, LaneWordsHoldExactlyTheMmaBFragments) {
  FERRUM_SEEDED_RNG(rng);
  const RepackCase c{256, 192, 64, false, true, GptqZeroFormat::V2};
  const GptqPacked packed = random_checkpoint(c, rng);
  const GptqUnpacked w = detail::unpack_gptq(packed.host_tensors());
  const GptqRepacked r = detail::repack_gptq(packed.host_tensors());
  // q of repacked (permuted) row j, column col.
  auto q_at = [&](std::size_t j, std::size_t col) -> int {
    if (j >= w.k || col >= w.n) return 0;
    return w.q[static_cast<std::size_t>(w.perm[j]) * w.n + col];
  };
  std::size_t checked = 0;
  for (std::size_t nb = 0; nb < r.n_pad / 64; ++nb) {
    for (std::size_t kt = 0; kt < r.k_pad / 16; ++kt) {
      for (std::size_t lane = 0; lane < 32; ++lane) {
        const std::size_t gid = lane / 4, t = lane % 4;
        for (std::size_t j = 0; j < 4; ++j) {
          const std::uint32_t word = r.qweight[((nb * (r.k_pad / 16) + kt) * 32 + lane) * 4 + j];
          for (std::size_t i = 0; i < 4; ++i) {
            const std::uint32_t reg = (word >> (4 * i)) & 0x000F000Fu;
            const std::size_t tile = 2 * j + i / 2;
            const std::size_t row = kt * 16 + 2 * t + (i % 2 == 1 ? 8 : 0);
            const std::size_t col = nb * 64 + tile * 8 + gid;
            ASSERT_EQ(static_cast<int>(reg & 0xFu), q_at(row, col)) << "nb " << nb << " kt " << kt << " lane " << lane;
            ASSERT_EQ(static_cast<int>(reg >> 16), q_at(row + 1, col)) << "nb " << nb << " kt " << kt << " lane " << lane;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, r.k_pad * r.n_pad / 2);  // two values per register
  // f16 magic: (w & 0x000F000F) | 0x64006400 is the half2 (1024 + q0, 1024 + q1).
  const std::uint32_t word = r.qweight[0];
  const std::uint32_t h2 = (word & 0x000F000Fu) | 0x64006400u;
  EXPECT_EQ(f16_to_f32(static_cast<std::uint16_t>(h2 & 0xFFFFu)), 1024.0f + static_cast<float>(q_at(0, 0)));
  EXPECT_EQ(f16_to_f32(static_cast<std::uint16_t>(h2 >> 16)), 1024.0f + static_cast<float>(q_at(1, 0)));
  // Second nibble: 1024 + 16 q (scaled by 1/16 in the kernel).
  const std::uint32_t h2hi = (word & 0x00F000F0u) | 0x64006400u;
  EXPECT_EQ(f16_to_f32(static_cast<std::uint16_t>(h2hi & 0xFFFFu)), 1024.0f + 16.0f * static_cast<float>(q_at(8, 0)));
  // bf16 magic: | 0x43004300 is (128 + q0, 128 + q1).
  const std::uint32_t b2 = (word & 0x000F000Fu) | 0x43004300u;
  EXPECT_EQ(bf16_to_f32(static_cast<std::uint16_t>(b2 & 0xFFFFu)), 128.0f + static_cast<float>(q_at(0, 0)));
  EXPECT_EQ(bf16_to_f32(static_cast<std::uint16_t>(b2 >> 16)), 128.0f + static_cast<float>(q_at(1, 0)));

  // Scales and zeros: lane gid's 8 consecutive entries are n tiles 0..7, column tile * 8 + gid.
  for (std::size_t g = 0; g < w.groups; ++g) {
    for (std::size_t nb = 0; nb < r.n_pad / 64; ++nb) {
      for (std::size_t gid = 0; gid < 8; ++gid) {
        for (std::size_t tile = 0; tile < 8; ++tile) {
          const std::size_t at = g * r.n_pad + nb * 64 + gid * 8 + tile;
          const std::size_t col = nb * 64 + tile * 8 + gid;
          const float want_scale = col < w.n ? w.scale[g * w.n + col] : 0.0f;
          const int want_zero = col < w.n ? w.zero[g * w.n + col] : 0;
          ASSERT_EQ(r.scales[at], want_scale);
          ASSERT_EQ(r.zeros[at], want_zero);
        }
      }
    }
  }
}

TEST(GptqRepack, ScalesConvertToEachActivationDtype) {
  FERRUM_SEEDED_RNG(rng);
  const GptqPacked packed = random_checkpoint({128, 64, 32, false, false, GptqZeroFormat::V1}, rng);
  const GptqRepacked r = detail::repack_gptq(packed.host_tensors());
  const std::vector<std::uint16_t> h = detail::gptq_scales_as(r, DType::F16);
  const std::vector<std::uint16_t> b = detail::gptq_scales_as(r, DType::BF16);
  ASSERT_EQ(h.size(), r.scales.size());
  ASSERT_EQ(b.size(), r.scales.size());
  for (std::size_t i = 0; i < r.scales.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_f16(r.scales[i]));
    ASSERT_EQ(b[i], f32_to_bf16(r.scales[i]));
  }
}

// ── Bad input ────────────────────────────────────────────────────────────────

// A valid act-order checkpoint to break one rule at a time, drawn from rng_,
// whose seed every test traces.
class GptqRepackBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    packed_ = random_checkpoint({128, 64, 32, false, true, GptqZeroFormat::V1}, rng_);
    w_ = detail::unpack_gptq(packed_.host_tensors());
  }
  Rng rng_;
  GptqPacked packed_;
  GptqUnpacked w_;
};

TEST_F(GptqRepackBadInput, UnpackedValuesOutOfRange) {
  SCOPED_TRACE(rng_.describe());
  GptqUnpacked w = w_;
  w.q[5] = 16;
  expect_error(ErrorCode::InvalidArgument, "repack_gptq", [&] { detail::repack_gptq(w); }, "'q' entry 5");
  w = w_;
  w.zero[3] = 17;
  expect_error(ErrorCode::InvalidArgument, "repack_gptq", [&] { detail::repack_gptq(w); }, "'zero' entry 3");
  w = w_;
  w.scale[2] = std::numeric_limits<float>::infinity();
  expect_error(ErrorCode::InvalidArgument, "repack_gptq", [&] { detail::repack_gptq(w); }, "'scale' entry 2");
  w = w_;
  w.g_idx[7] = 4;
  expect_error(ErrorCode::InvalidArgument, "repack_gptq", [&] { detail::repack_gptq(w); }, "'g_idx' entry 7");
  w = w_;
  w.perm[1] = w.perm[0];
  expect_error(ErrorCode::InvalidArgument, "repack_gptq", [&] { detail::repack_gptq(w); }, "not a permutation");
}

TEST_F(GptqRepackBadInput, UnpackedSizesMustAgree) {
  SCOPED_TRACE(rng_.describe());
  GptqUnpacked w = w_;
  w.q.pop_back();
  expect_error(ErrorCode::ShapeMismatch, "repack_gptq", [&] { detail::repack_gptq(w); }, "'q'");
  w = w_;
  w.scale.push_back(1.0f);
  expect_error(ErrorCode::ShapeMismatch, "repack_gptq", [&] { detail::repack_gptq(w); }, "'scale'");
  w = w_;
  w.groups = 3;
  expect_error(ErrorCode::ShapeMismatch, "repack_gptq", [&] { detail::repack_gptq(w); }, "'groups' = 3");
  w = w_;
  w.perm.pop_back();
  expect_error(ErrorCode::ShapeMismatch, "repack_gptq", [&] { detail::repack_gptq(w); }, "'perm'");
  w = w_;
  w.n = 60;
  expect_error(ErrorCode::InvalidArgument, "repack_gptq", [&] { detail::repack_gptq(w); }, "multiples of 8");
}

TEST_F(GptqRepackBadInput, CheckpointErrorsKeepTheCallersOpName) {
  SCOPED_TRACE(rng_.describe());
  GptqHostTensors t = packed_.host_tensors();
  t.bits = 8;
  expect_error(ErrorCode::Unsupported, "load_gptq", [&] { detail::repack_gptq(t, "load_gptq"); }, "'bits' = 8");
}

TEST_F(GptqRepackBadInput, UnpackRefusesCorruptRepackedWeights) {
  SCOPED_TRACE(rng_.describe());
  const GptqRepacked good = detail::repack_gptq(w_);
  GptqRepacked r = good;
  r.qweight.pop_back();
  expect_error(ErrorCode::ShapeMismatch, "unpack_repacked", [&] { detail::unpack_repacked(r); }, "'qweight'");
  // A nonzero nibble in the column padding (n = 64 needs none; use a padded weight).
  GptqRepacked padded = detail::repack_gptq(random_checkpoint({128, 8, 32, false, false, GptqZeroFormat::V1}, rng_)
                                                .host_tensors());
  const detail::GptqNibbleAddress at = detail::gptq_nibble_address(padded.k_pad, 0, 9);
  padded.qweight[at.word] |= 1u << (4 * at.slot);
  expect_error(ErrorCode::InvalidArgument, "unpack_repacked", [&] { detail::unpack_repacked(padded); },
               "padding value");
  r = good;
  r.row_group[0] = 1;  // the fused layout has row 0 in group 0
  expect_error(ErrorCode::InvalidArgument, "unpack_repacked", [&] { detail::unpack_repacked(r); }, "'row_group'");
  r = good;
  r.perm[0] = -1;
  expect_error(ErrorCode::InvalidArgument, "unpack_repacked", [&] { detail::unpack_repacked(r); }, "'perm'");
  r = good;
  r.k_pad += 128;
  expect_error(ErrorCode::ShapeMismatch, "unpack_repacked", [&] { detail::unpack_repacked(r); }, "'k_pad'");
  expect_error(ErrorCode::InvalidArgument, "gptq_scales_as", [&] { detail::gptq_scales_as(good, DType::F32); },
               "'dtype' = f32");
}

}  // namespace
}  // namespace ferrum::test
