// CpuBackend::argmax against an independent reference: f16, bf16 and f32,
// odd sizes, ties, NaN, -inf and constant rows (tests/support/argmax_cases.hpp).
#include <gtest/gtest.h>

#include "support/argmax_cases.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

TEST(CpuArgmax, MatchesReferenceWithTiesNanAndInfinities) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  for (DType dt : kArgmaxDTypes) {
    for (std::size_t rows : {1u, 5u, 14u}) {
      for (std::size_t cols : {1u, 2u, 7u, 769u, 4096u}) {
        SCOPED_TRACE(cat(to_string(dt), " rows=", rows, " cols=", cols));
        const HostTensor x = argmax_input(rng, dt, rows, cols);
        EXPECT_EQ(run_argmax(cpu, x, rows, cols), argmax_reference(x, rows, cols));
      }
    }
  }
}

}  // namespace
}  // namespace ferrum::test
