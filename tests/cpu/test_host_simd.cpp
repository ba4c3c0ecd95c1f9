// The host vector loops (src/common/host_simd.hpp) give the bits of
// their plain forms: the f16 decode for every one of the 65536 f16 values
// (at every offset of an 8-wide group, so NaN groups and tails go both ways),
// and the f64 dot products of gemm on random, cancelling and huge / tiny
// operands at lengths around the 4-wide lanes. Skipped where this CPU has no
// vector form (then CpuBackend runs the plain one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/host_simd.hpp"
#include "ferrum/half.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }

TEST(HostSimd, F16DecodeGivesThePlainBitsForEveryValue) {
#if FERRUM_CPU_X86_SIMD
  if (!detail::cpu_has_f16c()) GTEST_SKIP() << "no F16C on this CPU: CpuBackend decodes with f16_to_f32";
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  // Every offset into the 8-wide groups, and lengths with a tail.
  for (std::size_t offset : {0, 1, 3, 7}) {
    const std::size_t count = all.size() - offset;
    std::vector<float> got(count, -1.0f);
    detail::f16_to_f32_block_f16c(all.data() + offset, count, got.data());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (!same_bits(got[i], f16_to_f32(all[offset + i])) && bad++ < 4) {
        ADD_FAILURE() << "f16 0x" << std::hex << all[offset + i] << " at offset " << std::dec << offset;
      }
    }
    EXPECT_EQ(bad, 0u) << "offset " << offset;
  }
  // A signalling NaN alone in a group of finite values keeps its payload.
  std::vector<std::uint16_t> group = {0x3c00, 0x7c01, 0xc000, 0x0001, 0x7c00, 0xfc00, 0x8000, 0x7bff, 0x3555};
  std::vector<float> got(group.size());
  detail::f16_to_f32_block_f16c(group.data(), group.size(), got.data());
  for (std::size_t i = 0; i < group.size(); ++i) EXPECT_TRUE(same_bits(got[i], f16_to_f32(group[i]))) << i;
#else
  GTEST_SKIP() << "no x86 vector form in this build";
#endif
}

TEST(HostSimd, DotRowsGiveThePlainSums) {
#if FERRUM_CPU_X86_SIMD
  if (!detail::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 / FMA on this CPU: CpuBackend runs dot_rows_plain";
  FERRUM_SEEDED_RNG(rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-60, 60);
  for (std::size_t k : {0, 1, 3, 4, 5, 7, 8, 9, 63, 64, 65, 1023, 1024, 4099}) {
    for (int kind = 0; kind < 3; ++kind) {  // random; cancelling pairs; wide exponents
      constexpr std::size_t kRows = 4, kLda = 4100;
      std::vector<float> a(kRows * kLda), b(k + 1);
      for (float& x : a) x = normal(rng.engine());
      for (float& x : b) x = normal(rng.engine());
      if (kind == 1) {
        for (std::size_t i = 0; i + 1 < k; i += 2) b[i + 1] = -b[i] * (1.0f + 1e-7f);
      }
      if (kind == 2) {
        for (float& x : a) x = std::ldexp(x, exponent(rng.engine()));
      }
      SCOPED_TRACE(cat("k=", k, " kind ", kind));
      double plain[kRows], simd[kRows];
      detail::dot_rows_plain<kRows>(a.data(), kLda, b.data(), k, plain);
      detail::dot_rows_avx2<kRows>(a.data(), kLda, b.data(), k, simd);
      for (std::size_t r = 0; r < kRows; ++r) {
        EXPECT_EQ(std::memcmp(&plain[r], &simd[r], sizeof(double)), 0) << "row " << r << ": " << plain[r] << " vs " << simd[r];
      }
      detail::dot_rows_plain<1>(a.data() + kLda, kLda, b.data(), k, plain);
      detail::dot_rows_avx2<1>(a.data() + kLda, kLda, b.data(), k, simd);
      EXPECT_EQ(std::memcmp(&plain[0], &simd[0], sizeof(double)), 0) << "one row: " << plain[0] << " vs " << simd[0];
    }
  }
#else
  GTEST_SKIP() << "no x86 vector form in this build";
#endif
}

}  // namespace
}  // namespace ferrum::test
