// CudaBackend::argmax against CpuBackend (and the independent reference),
// index for index: f16, bf16 and f32; cols that take the 16-byte path
// (multiples of 8 / 4 on an aligned row, up to a 128k vocabulary) and the
// scalar path (odd cols, a misaligned view); ties, NaN, -inf; graph replay.
#include <gtest/gtest.h>

#include "support/argmax_cases.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using CudaArgmax = CudaTest;

TEST_F(CudaArgmax, MatchesCpuIndexForIndex) {
  FERRUM_SEEDED_RNG(rng);
  for (DType dt : kArgmaxDTypes) {
    for (std::size_t rows : {1u, 5u, 16u}) {
      for (std::size_t cols : {1u, 7u, 769u, 4096u, 128256u}) {
        for (std::size_t lead : {0u, 1u}) {
          SCOPED_TRACE(cat(to_string(dt), " rows=", rows, " cols=", cols, " lead=", lead));
          const HostTensor x = argmax_input(rng, dt, rows, cols);
          const std::vector<std::int32_t> want = argmax_reference(x, rows, cols);
          EXPECT_EQ(run_argmax(cpu(), x, rows, cols, lead), want);
          EXPECT_EQ(run_argmax(cuda(), x, rows, cols, lead), want);
        }
      }
    }
  }
}

// Captured once, replayed after the input changed: the new row's argmax.
TEST_F(CudaArgmax, GraphReplayReadsTheCurrentInput) {
  FERRUM_SEEDED_RNG(rng);
  constexpr std::size_t kCols = 4096;
  const HostTensor first = random_normal(rng, DType::F16, kCols);
  DeviceTensor x(cuda(), first);
  Buffer out = cuda().alloc(DType::I32, 1);
  cuda().begin_graph_capture();
  cuda().argmax(x.view(), out, 1, kCols);
  cuda().end_graph_capture();
  for (int step = 0; step < 4; ++step) {
    const HostTensor row = random_normal(rng, DType::F16, kCols);
    const std::vector<std::uint8_t> bytes = encode_bytes(row);
    cuda().write_bytes(x.view(), bytes.data(), bytes.size());
    const std::int32_t poison = -7;  // a replay that did not run cannot pass
    cuda().write_bytes(out, &poison, sizeof poison);
    ASSERT_TRUE(cuda().replay_last_graph());
    std::int32_t got = -1;
    cuda().read_bytes(out, &got, sizeof got);
    EXPECT_EQ(got, argmax_reference(row, 1, kCols)[0]) << "step " << step;
  }
  cuda().reset_graph();
}

}  // namespace
}  // namespace ferrum::test
