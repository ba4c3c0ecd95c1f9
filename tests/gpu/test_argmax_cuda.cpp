// CudaBackend::argmax under graph replay. Its values, index for index, are
// checked on every backend by tests/cpu/test_argmax.cpp (the Cuda instance
// runs where a GPU is visible).
#include <gtest/gtest.h>

#include "support/argmax_cases.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using CudaArgmax = CudaTest;

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
