// gelu_erf (kernels/common/activation.cuh), the exact-GELU formula of the
// CUDA gelu kernel, proved on the CPU. Every step of it but the two SFU
// approximations is IEEE fp32 arithmetic (fmaf, fminf, fmaxf, fabsf, *) that
// the device rounds exactly as the host does, so the device result is one of
// the results of gelu_erf_with(x, sfu) over every sfu whose values stay within
// the documented device errors: rcp.approx within 1 ulp, ex2.approx within
// 2 ulp (CUDA's exp2f) and flushed to 0 below 2^-126. PickSfu enumerates
// them (all reciprocals within 1 ulp, both extremes of the 2^a interval: the
// result is monotone in it). Each is checked against g = x * Phi(x) in long
// double (erfcl for the tail: no cancellation where x < 0):
//   (1) |r - g| <= (5e-7 + 6e-8 x^2) |g| + 2^-124, for every input;
//   (2) r rounded to f16 / bf16 is within 1 ulp of g correctly rounded, for
//       every f16 and every bf16 input (bf16 |g| < 2^-120 excepted: flushed,
//       where the f32 erf formula already gives 0 below x = -5.9);
// on all 2 x 65536 16-bit inputs, a dense sweep of [-14, 14], a strided sweep
// of all f32 patterns and fresh random inputs; plus the special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/common/activation.cuh"
#include "ferrum/half.hpp"
#include "support/half_reference.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using kernels::gelu_erf;
using kernels::gelu_erf_with;
using LD = long double;

// x * Phi(x) = x (1 - Q(|x|)) for x >= 0, x Q(|x|) for x < 0, Q(t) = erfc(t / sqrt 2) / 2.
LD gelu_ref(float xf) {
  const LD x = xf;
  const LD q = 0.5L * std::erfc(std::fabs(x) / std::sqrt(2.0L));
  return x >= 0 ? x * (1 - q) : x * q;
}

// The spacing of the f32 values in the binade of v (v > 0; subnormals: 2^-149).
LD f32_ulp(LD v) {
  if (v < 0x1p-126L) return 0x1p-149L;
  int e = 0;
  std::frexp(v, &e);  // v in [2^(e-1), 2^e)
  return std::ldexp(1.0L, e - 1 - 23);
}
float f32_at_least(LD v) {  // the smallest float >= v
  float f = static_cast<float>(v);
  if (static_cast<LD>(f) < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}
float f32_at_most(LD v) {  // the largest float <= v
  float f = static_cast<float>(v);
  if (static_cast<LD>(f) > v) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}

// One of the results the device SFUs may give: reciprocal candidate `rcp_pick`
// (those within 1 ulp of the exact 1/v, in increasing order; `*missing` set
// when there are fewer) and the low (`exp2_high` false) or high end of the
// floats within 2 ulp of 2^a.
struct PickSfu {
  int rcp_pick;
  bool exp2_high;
  bool* missing;
  float rcp(float v) const {
    const LD exact = 1.0L / v;
    const LD ulp = f32_ulp(exact);
    float c = std::nextafter(std::nextafter(static_cast<float>(exact), 0.0f), 0.0f);
    int seen = 0;
    for (int i = 0; i < 5; ++i, c = std::nextafter(c, 1.0f)) {
      if (std::fabs(static_cast<LD>(c) - exact) <= ulp && seen++ == rcp_pick) return c;
    }
    *missing = true;
    return 0.0f;
  }
  float exp2(float a) const {
    const LD exact = std::exp2(static_cast<LD>(a));  // NaN stays NaN
    const LD err = 2 * f32_ulp(exact);
    const LD end = exp2_high ? exact + err : exact - err;
    if (end < 0x1p-126L) return 0.0f;  // .ftz
    return exp2_high ? f32_at_most(end) : f32_at_least(end);
  }
};

// The error bound (1).
LD bound(float x, LD g) { return (5e-7L + 6e-8L * static_cast<LD>(x) * x) * std::fabs(g) + 0x1p-124L; }

// Index of the format value nearest to v (ties to even) among all its
// values in order, +-0 -> 0: two values are n ulps apart iff their indices
// differ by n. Overflow: one past the largest finite value.
long long rounded_index(LD v, const ref::HalfFormat& f) {
  const LD a = std::fabs(v);
  if (a == 0) return 0;
  int e2 = 0;
  std::frexp(a, &e2);
  const int e = std::max(e2 - 1, f.min_exp());
  const LD q = std::nearbyint(std::ldexp(a, f.mant_bits - e));  // exact scaling; default rounding: to nearest even
  const long long one = 1LL << f.mant_bits;
  const long long max_index = (static_cast<long long>(f.max_exp() - f.min_exp()) + 2) * one - 1;
  const long long index =
      std::min(static_cast<long long>(e - f.min_exp()) * one + static_cast<long long>(q), max_index + 1);
  return v < 0 ? -index : index;
}

struct Stats {
  LD worst_ratio = 0;  // max |r - g| / bound
  float worst_x = 0;
  long long evaluations = 0;
};

// Checks (1) for every device-possible result at x, and (2) against `format`
// when given. Returns false on the first failure (reported).
bool check_input(float x, const ref::HalfFormat* format, Stats& stats) {
  const LD g = gelu_ref(x);
  bool missing = false;  // no reciprocal candidate `rcp_pick` within 1 ulp: every one was tried
  // Up to 4 floats lie within 1 ulp of 1/v (4 when 1/v is a power of two).
  for (int rcp_pick = 0; rcp_pick < 5 && !missing; ++rcp_pick) {
    for (bool high : {false, true}) {
      const float r = gelu_erf_with(x, PickSfu{rcp_pick, high, &missing});
      if (missing) break;
      ++stats.evaluations;
      const LD err = std::fabs(static_cast<LD>(r) - g);
      const LD ratio = err / bound(x, g);
      if (!(ratio <= 1)) {  // NaN fails too
        ADD_FAILURE() << "gelu_erf(" << std::hexfloat << x << ") = " << r << ", reference " << static_cast<double>(g)
                      << std::defaultfloat << ": error " << static_cast<double>(err) << " > bound "
                      << static_cast<double>(bound(x, g)) << " (rcp pick " << rcp_pick << ", ex2 "
                      << (high ? "high" : "low") << ")";
        return false;
      }
      if (ratio > stats.worst_ratio) {
        stats.worst_ratio = ratio;
        stats.worst_x = x;
      }
      if (format != nullptr && !(format == &ref::kBF16 && std::fabs(g) < 0x1p-120L)) {
        const long long got = rounded_index(r, *format);
        const long long want = rounded_index(g, *format);
        if (std::llabs(got - want) > 1) {
          ADD_FAILURE() << "gelu_erf(" << std::hexfloat << x << ") = " << r << std::defaultfloat << " rounds "
                        << std::llabs(got - want) << " ulps from the correctly rounded " << static_cast<double>(g)
                        << " (format mant_bits " << format->mant_bits << ")";
          return false;
        }
      }
    }
  }
  return true;
}

// The margin left, in the test's XML output (--gtest_output=xml).
void record(const Stats& stats) {
  ::testing::Test::RecordProperty("max_error_over_bound", std::to_string(static_cast<double>(stats.worst_ratio)));
  ::testing::Test::RecordProperty("at_x", cat(stats.worst_x));
}

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

void check_every_half(const ref::HalfFormat& format, float (*decode)(std::uint16_t)) {
  Stats stats;
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float x = decode(static_cast<std::uint16_t>(bits));
    if (!std::isfinite(x)) continue;  // SpecialValues
    if (!check_input(x, &format, stats)) return;
  }
  record(stats);
  EXPECT_GT(stats.evaluations, 4 * 60000);  // the SFU extremes were really enumerated
}

TEST(GeluErf, EveryF16InputWithinBoundAndOneUlp) { check_every_half(ref::kF16, &f16_to_f32); }

TEST(GeluErf, EveryBF16InputWithinBoundAndOneUlp) { check_every_half(ref::kBF16, &bf16_to_f32); }

TEST(GeluErf, DenseF32SweepsWithinBound) {
  Stats stats;
  // [-14, 14] every 2^-12: the whole nontrivial range (past the underflow
  // at -13.1, up to the clamp).
  for (int i = -14 * 4096; i <= 14 * 4096; ++i) {
    if (!check_input(static_cast<float>(i) / 4096.0f, nullptr, stats)) return;
  }
  // Every 16411th f32 pattern of either sign: all magnitudes, subnormals to
  // the largest finite.
  for (std::uint64_t b = 0; b < 0x7f800000u; b += 16411u) {
    const float x = from_bits(static_cast<std::uint32_t>(b));
    if (!check_input(x, nullptr, stats) || !check_input(-x, nullptr, stats)) return;
  }
  record(stats);
}

TEST(GeluErf, FreshRandomInputsWithinBound) {
  FERRUM_SEEDED_RNG(rng);
  Stats stats;
  for (int i = 0; i < 100000; ++i) {
    if (!check_input(rng.uniform(-14.0f, 14.0f), nullptr, stats)) return;
  }
}

TEST(GeluErf, SpecialValues) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int rcp_pick = 0; rcp_pick < 2; ++rcp_pick) {
    for (bool high : {false, true}) {
      bool missing = false;
      const PickSfu sfu{rcp_pick, high, &missing};
      EXPECT_EQ(gelu_erf_with(kInf, sfu), kInf);
      const float at_minus_inf = gelu_erf_with(-kInf, sfu);
      EXPECT_EQ(at_minus_inf, 0.0f);
      EXPECT_TRUE(std::signbit(at_minus_inf));  // as x * Phi(x)
      EXPECT_TRUE(std::isnan(gelu_erf_with(std::numeric_limits<float>::quiet_NaN(), sfu)));
      EXPECT_TRUE(std::isnan(gelu_erf_with(-std::numeric_limits<float>::quiet_NaN(), sfu)));
      // Past the clamp: exactly max(x, 0), the largest f16 / bf16 included.
      for (float x : {14.0f, 20.0f, 65504.0f, 3.3895314e38f, std::numeric_limits<float>::max()}) {
        EXPECT_EQ(gelu_erf_with(x, sfu), x);
        EXPECT_EQ(gelu_erf_with(-x, sfu), 0.0f);
      }
      EXPECT_EQ(gelu_erf_with(0.0f, sfu), 0.0f);
      EXPECT_TRUE(std::signbit(gelu_erf_with(-0.0f, sfu)));
      EXPECT_FALSE(missing);
    }
  }
}

}  // namespace
}  // namespace ferrum::test
