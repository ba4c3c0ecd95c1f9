// ferrum/half.hpp: the host f32 <-> f16 / bf16 conversions every upload,
// download and CpuBackend result goes through.
//   * Decoding: all 65536 patterns of each format against the format's
//     definition (support/half_reference.hpp, double arithmetic).
//   * Round trip: every non-NaN pattern survives 16 -> 32 -> 16 exactly;
//     NaNs stay NaN.
//   * Encoding: f32 -> 16 against the independent double-based reference
//     (round to nearest, ties to even, subnormals, overflow to infinity) on
//     hand-picked edge cases with their expected bits written out, on the
//     neighbourhood of every representable value (exact values, midpoints,
//     one f32 ulp either side), on a strided sweep of all 2^32 f32 patterns,
//     and on millions of fresh random patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "ferrum/half.hpp"
#include "support/half_reference.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using ref::HalfFormat;

struct Format {
  const char* name;
  const HalfFormat& spec;
  float (*to_f32)(std::uint16_t);
  std::uint16_t (*from_f32)(float);
};

const Format kF16Format{"f16", ref::kF16, &f16_to_f32, &f32_to_f16};
const Format kBF16Format{"bf16", ref::kBF16, &bf16_to_f32, &f32_to_bf16};

std::string hex(std::uint32_t v) { return cat("0x", std::hex, v); }

// f32 -> 16 of one f32 pattern agrees with the reference (NaN: any NaN).
::testing::AssertionResult encodes_like_reference(const Format& f, std::uint32_t f32_bits) {
  const float x = bits_to_f32(f32_bits);
  const std::uint16_t got = f.from_f32(x);
  if (std::isnan(x)) {
    if (ref::is_nan_pattern(got, f.spec)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << f.name << ": NaN " << hex(f32_bits) << " became non-NaN " << hex(got);
  }
  const std::uint16_t want = ref::encode_half(static_cast<double>(x), f.spec);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << f.name << ": f32 " << hex(f32_bits) << " (" << x << ") encoded as "
                                       << hex(got) << ", reference " << hex(want);
}

// Runs encodes_like_reference over many patterns and reports the count and
// the first few failures as one assertion.
class EncodeChecker {
 public:
  explicit EncodeChecker(const Format& f) : f_(f) {}
  void check(std::uint32_t bits) {
    ++checked_;
    const ::testing::AssertionResult r = encodes_like_reference(f_, bits);
    if (!r) {
      if (failures_ < 8) first_ += cat("\n  ", r.message());
      ++failures_;
    }
  }
  ::testing::AssertionResult result() const {
    if (failures_ == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << failures_ << " of " << checked_ << " patterns differ:" << first_;
  }

 private:
  const Format& f_;
  std::size_t checked_ = 0;
  std::size_t failures_ = 0;
  std::string first_;
};

class HalfFormatTest : public ::testing::TestWithParam<const Format*> {
 protected:
  const Format& fmt() const { return *GetParam(); }
};

TEST_P(HalfFormatTest, ReferenceIsSelfConsistent) {
  // The reference decoder and encoder are inverses on every non-NaN pattern;
  // this guards the reference itself.
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (ref::is_nan_pattern(bits, fmt().spec)) continue;
    ASSERT_EQ(ref::encode_half(ref::decode_half(bits, fmt().spec), fmt().spec), bits) << hex(h);
  }
}

TEST_P(HalfFormatTest, DecodeAllPatternsMatchesDefinition) {
  std::size_t failures = 0;
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float got = fmt().to_f32(bits);
    const double want = ref::decode_half(bits, fmt().spec);
    const bool ok = std::isnan(want) ? std::isnan(got)
                                     : (static_cast<double>(got) == want && std::signbit(got) == std::signbit(want));
    if (!ok && ++failures <= 8) ADD_FAILURE() << fmt().name << " " << hex(h) << " decoded to " << got << ", want " << want;
  }
  EXPECT_EQ(failures, 0u);
}

TEST_P(HalfFormatTest, RoundTripAllPatterns) {
  std::size_t failures = 0;
  std::size_t nans = 0;
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const std::uint16_t back = fmt().from_f32(fmt().to_f32(bits));
    bool ok;
    if (ref::is_nan_pattern(bits, fmt().spec)) {
      ++nans;
      ok = ref::is_nan_pattern(back, fmt().spec);
    } else {
      ok = back == bits;
    }
    if (!ok && ++failures <= 8) ADD_FAILURE() << fmt().name << " " << hex(h) << " came back as " << hex(back);
  }
  EXPECT_EQ(failures, 0u);
  // Every NaN pattern was exercised: 2 signs x (2^mant_bits - 1) payloads.
  EXPECT_EQ(nans, 2u * ((1u << fmt().spec.mant_bits) - 1u));
}

TEST_P(HalfFormatTest, EncodeNeighbourhoodOfEveryValue) {
  // For every finite 16-bit value v and its successor: v itself, the exact
  // midpoint (a tie), and one f32 ulp either side of the midpoint.
  EncodeChecker checker(fmt());
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const auto next = static_cast<std::uint16_t>(h + 1);
    if (ref::is_nan_pattern(bits, fmt().spec) || std::isinf(fmt().to_f32(bits))) continue;
    const double lo = ref::decode_half(bits, fmt().spec);
    double hi = ref::decode_half(next, fmt().spec);
    if ((bits & 0x7fffu) == 0x7fffu || std::isnan(hi)) continue;
    if (std::isinf(hi)) {  // past the largest finite value: the next step up would be 2^(max_exp+1)
      hi = std::ldexp(1.0, fmt().spec.max_exp() + 1) * (std::signbit(lo) ? -1.0 : 1.0);
    }
    const double mid = (lo + hi) / 2.0;  // exact in double
    const float midf = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midf), mid) << "midpoint not representable in f32 for " << hex(h);
    checker.check(f32_to_bits(static_cast<float>(lo)));
    checker.check(f32_to_bits(midf));
    checker.check(f32_to_bits(std::nextafter(midf, 0.0f)));
    checker.check(f32_to_bits(std::nextafter(midf, std::numeric_limits<float>::infinity())));
    checker.check(f32_to_bits(std::nextafter(midf, -std::numeric_limits<float>::infinity())));
  }
  EXPECT_TRUE(checker.result());
}

TEST_P(HalfFormatTest, EncodeStridedSweepOfAllF32Patterns) {
  // Every 1021st pattern of all 2^32 (a prime stride: all low-bit residues
  // occur), from a random start.
  FERRUM_SEEDED_RNG(rng);
  EncodeChecker checker(fmt());
  const std::uint64_t start = rng.below(1021);
  for (std::uint64_t bits = start; bits <= 0xffffffffull; bits += 1021) checker.check(static_cast<std::uint32_t>(bits));
  EXPECT_TRUE(checker.result());
}

TEST_P(HalfFormatTest, EncodeRandomPatterns) {
  FERRUM_SEEDED_RNG(rng);
  EncodeChecker checker(fmt());
  for (int i = 0; i < (1 << 22); ++i) checker.check(rng.bits32());
  // Random values in the ranges activations live in, too.
  for (int i = 0; i < (1 << 20); ++i) checker.check(f32_to_bits(rng.normal(0.0f, 4.0f)));
  EXPECT_TRUE(checker.result());
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfFormatTest, ::testing::Values(&kF16Format, &kBF16Format),
                         [](const ::testing::TestParamInfo<const Format*>& info) {
                           return std::string(info.param->name);
                         });

// ── Hand-picked edge cases with their expected bits ──────────────────────────

struct Edge {
  std::uint32_t f32_bits;
  std::uint16_t want;
  const char* what;
};

void check_edges(const Format& f, std::initializer_list<Edge> edges) {
  for (const Edge& e : edges) {
    SCOPED_TRACE(cat(f.name, " ", e.what, " (f32 ", hex(e.f32_bits), ")"));
    EXPECT_EQ(f.from_f32(bits_to_f32(e.f32_bits)), e.want) << "got " << hex(f.from_f32(bits_to_f32(e.f32_bits)));
    // And the reference agrees with the written-out expectation.
    EXPECT_EQ(ref::encode_half(static_cast<double>(bits_to_f32(e.f32_bits)), f.spec), e.want);
  }
}

TEST(HalfEdges, F16) {
  check_edges(kF16Format, {
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f800000u, 0x3c00, "1"},
      {0xbf800000u, 0xbc00, "-1"},
      {0x3f801000u, 0x3c00, "1 + 2^-11: tie, to even (down)"},
      {0x3f803000u, 0x3c02, "1 + 3*2^-11: tie, to even (up)"},
      {0x3f801001u, 0x3c01, "just above a tie"},
      {0x3f800fffu, 0x3c00, "just below a tie"},
      {0x477fe000u, 0x7bff, "65504, the largest finite"},
      {0x477fefffu, 0x7bff, "just below 65520"},
      {0x477ff000u, 0x7c00, "65520: tie to even overflows to inf"},
      {0x501502f9u, 0x7c00, "1e10 -> inf"},
      {0x7f7fffffu, 0x7c00, "f32 max -> inf"},
      {0x7f800000u, 0x7c00, "+inf"},
      {0xff800000u, 0xfc00, "-inf"},
      {0xc77ff000u, 0xfc00, "-65520 -> -inf"},
      {0x33800000u, 0x0001, "2^-24, the smallest subnormal"},
      {0x33000000u, 0x0000, "2^-25: tie between 0 and 2^-24, to even (0)"},
      {0x33000001u, 0x0001, "just above 2^-25"},
      {0xb3000000u, 0x8000, "-2^-25 -> -0"},
      {0x33c00000u, 0x0002, "3*2^-25 = 1.5 quanta: tie, to even (2)"},
      {0x33a00000u, 0x0001, "5*2^-26 = 1.25 quanta"},
      {0x34200000u, 0x0002, "2.5 quanta: tie, to even (2)"},
      {0x34400000u, 0x0003, "3 quanta, exact"},
      {0x387fc000u, 0x03ff, "the largest subnormal"},
      {0x387fe000u, 0x0400, "largest subnormal + half quantum: tie, rounds into the smallest normal"},
      {0x38800000u, 0x0400, "2^-14, the smallest normal"},
      {0x00000001u, 0x0000, "the smallest f32 subnormal -> 0"},
      {0x80000001u, 0x8000, "the smallest negative f32 subnormal -> -0"},
      {0x40490fdbu, 0x4248, "pi"},
  });
}

TEST(HalfEdges, BF16) {
  check_edges(kBF16Format, {
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f800000u, 0x3f80, "1"},
      {0x3f808000u, 0x3f80, "tie, to even (down)"},
      {0x3f818000u, 0x3f82, "tie, to even (up)"},
      {0x3f808001u, 0x3f81, "just above a tie"},
      {0x3f807fffu, 0x3f80, "just below a tie"},
      {0x7f7f0000u, 0x7f7f, "the largest finite bf16"},
      {0x7f7f7fffu, 0x7f7f, "just below the overflow tie"},
      {0x7f7f8000u, 0x7f80, "tie above the largest finite: to even overflows to inf"},
      {0x7f7fffffu, 0x7f80, "f32 max -> inf"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x00000001u, 0x0000, "the smallest f32 subnormal -> 0"},
      {0x00008000u, 0x0000, "subnormal tie, to even (0)"},
      {0x00018000u, 0x0002, "subnormal tie, to even (up)"},
      {0x00008001u, 0x0001, "just above a subnormal tie"},
      {0x007f8000u, 0x0080, "largest subnormal tie rounds into the smallest normal"},
      {0x00800000u, 0x0080, "the smallest normal"},
      {0x40490fdbu, 0x4049, "pi"},
  });
}

TEST(HalfEdges, NaNsStayNaN) {
  // Quiet and signalling NaNs of both signs, including payloads that live
  // only in the low bits (truncation alone would turn them into infinity).
  for (std::uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f801fffu, 0x7fbfffffu,
                             0x7f80ffffu, 0xffffffffu}) {
    SCOPED_TRACE(hex(bits));
    EXPECT_TRUE(ref::is_nan_pattern(f32_to_f16(bits_to_f32(bits)), ref::kF16));
    EXPECT_TRUE(ref::is_nan_pattern(f32_to_bf16(bits_to_f32(bits)), ref::kBF16));
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xfc01)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7fc0)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0xff81)));
  // The poison pattern the tests fill outputs with is NaN in both formats.
  EXPECT_TRUE(std::isnan(f16_to_f32(0xffff)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0xffff)));
}

}  // namespace
}  // namespace ferrum::test
