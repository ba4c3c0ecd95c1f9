// argmax on every backend (CpuBackend, and CudaBackend where a GPU is
// visible) against an independent reference, index for index: f16, bf16 and
// f32; cols that take CUDA's 16-byte path (multiples of 8 / 4 on an aligned
// row, up to a 128k vocabulary) and the scalar path (odd cols, a misaligned
// view); ties, NaN, -inf and constant rows (tests/support/argmax_cases.hpp).
// Graph replay: tests/gpu/test_argmax_cuda.cpp.
#include <gtest/gtest.h>

#include "support/argmax_cases.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

class Argmax : public BackendTest {};

TEST_P(Argmax, MatchesReferenceWithTiesNanAndInfinities) {
  FERRUM_SEEDED_RNG(rng);
  for (DType dt : kArgmaxDTypes) {
    for (std::size_t rows : {1u, 5u, 16u}) {
      for (std::size_t cols : {1u, 2u, 7u, 769u, 4096u, 128256u}) {
        for (std::size_t lead : {0u, 1u}) {
          SCOPED_TRACE(cat(to_string(dt), " rows=", rows, " cols=", cols, " lead=", lead));
          const HostTensor x = argmax_input(rng, dt, rows, cols);
          EXPECT_EQ(run_argmax(backend(), x, rows, cols, lead), argmax_reference(x, rows, cols));
        }
      }
    }
  }
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(Argmax);

}  // namespace
}  // namespace ferrum::test
