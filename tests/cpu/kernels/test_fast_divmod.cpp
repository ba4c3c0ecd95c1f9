// FastDivmod and IndexDivider (kernels/common/fast_divmod.cuh), the index
// division of the RoPE and row-copy kernels, checked on the CPU: the host path
// computes the same 32-bit multiply-high as the device's __umulhi, so equality
// here is equality there. Against the / and % of 64-bit integers: every
// numerator for two divisors; for thousands of divisors (all up to 4096,
// powers of two and their neighbours, the largest, random) the numerators
// around multiples near both ends of the range and random ones. Also the
// launchers' refusal of launches past its range.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ferrum/error.hpp"
#include "kernels/common/fast_divmod.cuh"
#include "kernels/rope.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using kernels::FastDivmod;
using kernels::kFastDivmodMax;

// Checks n against d; false (with a gtest failure) on the first mismatch.
bool agrees(const FastDivmod& f, std::uint32_t n) {
  std::uint32_t q = 0, r = 0;
  f.divmod(n, q, r);
  const std::uint32_t want_q = n / f.divisor, want_r = n % f.divisor;
  if (q == want_q && r == want_r && f.div(n) == want_q) return true;
  ADD_FAILURE() << "n = " << n << ", d = " << f.divisor << ": got " << q << " r " << r << ", want " << want_q
                << " r " << want_r;
  return false;
}

std::vector<std::uint32_t> divisors_to_check(std::mt19937_64& rng) {
  std::vector<std::uint32_t> d;
  for (std::uint32_t v = 1; v <= 4096; ++v) d.push_back(v);
  for (int b = 12; b <= 31; ++b) {
    const std::uint32_t p = std::uint32_t{1} << b;
    for (std::uint32_t v : {p - 1, p, p + 1}) {
      if (v >= 1 && v <= kFastDivmodMax) d.push_back(v);
    }
  }
  d.push_back(kFastDivmodMax);
  std::uniform_int_distribution<std::uint32_t> any(1, kFastDivmodMax);
  for (int i = 0; i < 2000; ++i) d.push_back(any(rng));
  return d;
}

TEST(FastDivmod, EveryNumeratorOfSomeDivisors) {
  // 15 and 65535 = 2^s - 1, where the rounding error e of the multiplier is
  // largest against 2^s (1 - 2^-s); 2^31 numerators each, about 3.5 s apiece
  // on the CI machine.
  for (std::uint32_t d : {15u, 65535u}) {
    const FastDivmod f(d);
    std::uint64_t bad = 0;
    for (std::uint64_t n = 0; n <= kFastDivmodMax; ++n) {
      const auto n32 = static_cast<std::uint32_t>(n);
      if (f.div(n32) != n32 / d) ++bad;
    }
    EXPECT_EQ(bad, 0u) << "d = " << d;
  }
}

TEST(FastDivmod, NumeratorsAroundMultiplesAndAtRandom) {
  FERRUM_SEEDED_RNG(seeded);
  std::mt19937_64& rng = seeded.engine();
  std::uniform_int_distribution<std::uint32_t> any(0, kFastDivmodMax);
  for (std::uint32_t d : divisors_to_check(rng)) {
    const FastDivmod f(d);
    // The first multiples, the last ones below the limit, and random ones:
    // each multiple minus one, itself, plus one.
    const std::uint32_t last = kFastDivmodMax / d;
    std::vector<std::uint64_t> multiples;
    for (std::uint64_t k = 0; k < 64 && k <= last; ++k) multiples.push_back(k);
    for (std::uint64_t k = 0; k < 64 && k <= last; ++k) multiples.push_back(last - k);
    for (int i = 0; i < 64; ++i) multiples.push_back(any(rng) / d);
    for (std::uint64_t k : multiples) {
      for (std::int64_t off : {-1, 0, 1}) {
        const std::int64_t n = static_cast<std::int64_t>(k * d) + off;
        if (n < 0 || n > kFastDivmodMax) continue;
        if (!agrees(f, static_cast<std::uint32_t>(n))) return;
      }
    }
    for (int i = 0; i < 64; ++i) {
      if (!agrees(f, any(rng))) return;
    }
    if (!agrees(f, kFastDivmodMax)) return;
  }
}

// IndexDivider takes FastDivmod only where the whole launch is in its
// range, and divides the same either way.
TEST(IndexDivider, PicksFastDivmodOnlyWithinItsRange) {
  using kernels::IndexDivider;
  EXPECT_TRUE(IndexDivider(512, 1 << 20).fast_ok);
  EXPECT_TRUE(IndexDivider(512, static_cast<long long>(kFastDivmodMax) + 1).fast_ok);   // indices up to 2^31 - 1
  EXPECT_FALSE(IndexDivider(512, static_cast<long long>(kFastDivmodMax) + 2).fast_ok);  // 2^31 itself: 64-bit
  EXPECT_FALSE(IndexDivider(static_cast<long long>(kFastDivmodMax) + 1, 1 << 20).fast_ok);
  EXPECT_FALSE(IndexDivider(0, 1 << 20).fast_ok);  // never divided by; not a FastDivmod either
  FERRUM_SEEDED_RNG(seeded);
  std::mt19937_64& rng = seeded.engine();
  for (long long d : {1LL, 3LL, 16LL, 512LL, 4097LL, 1LL << 31, (1LL << 33) + 5}) {
    for (long long limit : {1LL << 20, static_cast<long long>(kFastDivmodMax) + 1, 1LL << 40}) {
      const IndexDivider div(d, limit);
      std::uniform_int_distribution<long long> any(0, limit - 1);
      for (int i = 0; i < 2000; ++i) {
        const long long n = i < 3 ? (i == 0 ? 0 : i == 1 ? limit - 1 : limit / 2) : any(rng);
        ASSERT_EQ(div.div(n), n / d) << "n = " << n << ", d = " << d << ", limit = " << limit;
      }
    }
  }
}

TEST(FastDivmod, RefusesDivisorsOutsideItsRange) {
  // A divisor no launch should build: a dispatch bug (Internal), named.
  expect_error(ErrorCode::Internal, "FastDivmod", [] { (void)FastDivmod(0u); }, "divisor (1 .. 2^31 - 1) = 0");
  expect_error(ErrorCode::Internal, "FastDivmod", [] { (void)FastDivmod(kFastDivmodMax + 1u); },
               cat("= ", kFastDivmodMax + 1u));
  EXPECT_NO_THROW(FastDivmod(kFastDivmodMax));
}

// The RoPE launchers refuse more head rows than FastDivmod takes, with a
// named Unsupported, before touching the device (null pointers count as
// aligned, so qk_norm_rope takes its 16-byte path).
TEST(RopeLaunchers, RefuseRowsPastTheDividersRange) {
  kernels::RopeArgs rope;
  rope.tokens = 65536;
  rope.heads = 32768;  // 2^31 rows
  rope.head_dim = 128;
  rope.max_pos = 65536;
  expect_error(ErrorCode::Unsupported, "qk_norm_rope", [&] { kernels::launch_qk_norm_rope(rope, nullptr); },
               "rows (tokens x heads)");
  kernels::QkvRopeAppendArgs qkv;
  qkv.tokens = 16384;
  qkv.heads = 65536;
  qkv.kv_heads = 32768;  // 16384 x (65536 + 65536) = 2^31 rows
  qkv.head_dim = 128;
  qkv.capacity = 16384;
  qkv.max_pos = 16384;
  expect_error(ErrorCode::Unsupported, "qkv_rope_append", [&] { kernels::launch_qkv_rope_append(qkv, nullptr); },
               "rows (tokens x (heads + 2 kv_heads))");
}

}  // namespace
}  // namespace ferrum::test
