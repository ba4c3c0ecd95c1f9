// CudaBackend::argmax (kernels/argmax.cu: a row split over a cluster of 8
// blocks where one can be resident) against CpuBackend, index for index, into poisoned, guarded
// outputs; its values are also checked on every backend by
// tests/cpu/test_argmax.cpp (the Cuda instance runs where a GPU is visible).
//
// - MatchesCpuOnEveryRowCount: rows 1..16 x cols {7, 769, 4104} and rows
//   {1, 2, 3, 8, 16} x cols {128257, 151936}, f16 / bf16 / f32, aligned and
//   one element in (the scalar path); a single odd row takes 16-byte vectors
//   plus a scalar tail. Ties, NaN, -inf and constant rows by row
//   (tests/support/argmax_cases.hpp).
// - TiesAcrossSegmentsTakeTheSmallerIndex: the same maximum (a number, NaN,
//   +inf) at the last column of one block's segment and the first of the
//   next: the smaller index wins.
// - ManyRowsPerCluster: more rows than the grid has clusters.
// - RowLoopWithFewGroupsEitherGrouping: the same row loop through the
//   launcher with its grid capped at 1, 3 and 8 row groups (small enough for
//   racecheck), clustered and one block per row (the path of older devices
//   and of GPU partitions too small for a cluster of 8).
// - GraphReplayReadsTheCurrentInput: captured once, replayed after the input
//   changed ([1 x 4096] and a decode batch [16 x 151936]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ferrum/cuda_backend.hpp"
#include "kernels/argmax.hpp"
#include "support/argmax_cases.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using CudaArgmax = CudaTest;

// kernels/argmax.cu splits a row over this many blocks, in whole 16-byte
// vectors when the row allows (the view aligned, and cols a multiple of the
// vector or a single row), else in elements.
constexpr std::size_t kArgmaxClusterBlocks = 8;

// The first column of block b's segment (1 <= b < kArgmaxClusterBlocks).
std::size_t segment_start(DType dtype, std::size_t rows, std::size_t cols, std::size_t lead, std::size_t b) {
  const std::size_t wide = 16 / size_of(dtype);
  const std::size_t vw = lead == 0 && (cols % wide == 0 || rows == 1) ? wide : 1;
  const std::size_t nvec = cols / vw;
  const std::size_t per_block = (nvec + kArgmaxClusterBlocks - 1) / kArgmaxClusterBlocks;
  return std::min(nvec, b * per_block) * vw;
}

void expect_matches_cpu(Backend& cuda, Backend& cpu, const HostTensor& x, DType dt, std::size_t rows,
                        std::size_t cols, std::size_t lead) {
  SCOPED_TRACE(cat(to_string(dt), " rows=", rows, " cols=", cols, " lead=", lead));
  EXPECT_EQ(run_argmax(cuda, x, rows, cols, lead), run_argmax(cpu, x, rows, cols, lead));
}

TEST_F(CudaArgmax, MatchesCpuOnEveryRowCount) {
  FERRUM_SEEDED_RNG(rng);
  for (DType dt : kArgmaxDTypes) {
    for (std::size_t lead : {0u, 1u}) {
      for (std::size_t cols : {7u, 769u, 4104u}) {  // 4104 = 8 * 513: segments of unequal length
        for (std::size_t rows = 1; rows <= 16; ++rows) {
          expect_matches_cpu(cuda(), cpu(), argmax_input(rng, dt, rows, cols), dt, rows, cols, lead);
        }
      }
      for (std::size_t cols : {128257u, 151936u}) {  // odd; qwen3's vocabulary
        for (std::size_t rows : {1u, 2u, 3u, 8u, 16u}) {
          expect_matches_cpu(cuda(), cpu(), argmax_input(rng, dt, rows, cols), dt, rows, cols, lead);
        }
      }
    }
  }
}

TEST_F(CudaArgmax, TiesAcrossSegmentsTakeTheSmallerIndex) {
  FERRUM_SEEDED_RNG(rng);
  const float kTied[] = {8.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
  for (DType dt : kArgmaxDTypes) {
    for (std::size_t lead : {0u, 1u}) {
      for (std::size_t cols : {769u, 4104u, 128256u, 128257u}) {
        for (std::size_t rows : {1u, 16u}) {
          // Row r: boundary 1 + r % 7, the tied value kTied[r % 3] (normal
          // values elsewhere stay far below 8).
          HostTensor x = random_normal(rng, dt, rows * cols);
          std::vector<std::int32_t> want(rows);
          for (std::size_t r = 0; r < rows; ++r) {
            const std::size_t at = segment_start(dt, rows, cols, lead, 1 + r % 7);
            ASSERT_GT(at, 0u);
            ASSERT_LT(at, cols);
            x.values[r * cols + at - 1] = x.values[r * cols + at] = kTied[r % 3];
            want[r] = static_cast<std::int32_t>(at - 1);
          }
          ASSERT_EQ(argmax_reference(x, rows, cols), want);  // the planted tie is each row's answer
          expect_matches_cpu(cuda(), cpu(), x, dt, rows, cols, lead);
        }
      }
    }
  }
}

TEST_F(CudaArgmax, ManyRowsPerCluster) {
  FERRUM_SEEDED_RNG(rng);
  constexpr std::size_t kRows = kernels::kArgmaxMaxRowGroups + 37;  // past the launcher's cap on its grid
  for (DType dt : kArgmaxDTypes) {
    for (std::size_t cols : {7u, 8u}) {  // 8: one vector, in the first block of each row
      expect_matches_cpu(cuda(), cpu(), argmax_input(rng, dt, kRows, cols), dt, kRows, cols, 0);
    }
  }
}

// kernels::launch_argmax with its grid capped at max_row_groups: every group
// walks its rows in turn (37 rows: groups take 37, 12-13 or 4-5 rows), the
// loop ManyRowsPerCluster reaches only past 65536 rows. Both groupings: the
// cluster the H200 runs, and the one block per row that older devices and
// GPU partitions too small for a cluster run. Scalar (7), one vector (8) and
// eight-segment (4104) rows, and 40000- and 40003-column rows (several batches of
// loads per thread with one block per row), into a guarded output.
TEST_F(CudaArgmax, RowLoopWithFewGroupsEitherGrouping) {
  FERRUM_SEEDED_RNG(rng);
  constexpr std::size_t kRows = 37;
  auto& be = static_cast<CudaBackend&>(cuda());
  using kernels::ArgmaxGrouping;
  for (ArgmaxGrouping grouping : {ArgmaxGrouping::ClusterWhereResident, ArgmaxGrouping::OneBlockPerRow}) {
    for (DType dt : kArgmaxDTypes) {
      for (std::size_t cols : {7u, 8u, 4104u, 40000u, 40003u}) {
        for (long long groups : {1LL, 3LL, 8LL}) {
          SCOPED_TRACE(cat(to_string(dt), " cols=", cols, " groups=", groups, " one block per row=",
                           grouping == ArgmaxGrouping::OneBlockPerRow));
          const HostTensor x = argmax_input(rng, dt, kRows, cols);
          const std::vector<std::int32_t> got = run_argmax_with(be, x, kRows, 0, [&](const Buffer& xb, Buffer& out) {
            kernels::launch_argmax(dt, xb.data(), static_cast<std::int32_t*>(out.data()),
                                   static_cast<long long>(kRows), static_cast<long long>(cols), groups, grouping,
                                   be.stream());
          });
          EXPECT_EQ(got, argmax_reference(x, kRows, cols));
        }
      }
    }
  }
  // A cap outside 1 .. kArgmaxMaxRowGroups is refused as a launcher misuse, naming it.
  for (long long groups : {0LL, kernels::kArgmaxMaxRowGroups + 1}) {
    expect_error(ErrorCode::Internal, "argmax",
                 [&] {
                   kernels::launch_argmax(DType::F32, nullptr, nullptr, 1, 1, groups,
                                          kernels::ArgmaxGrouping::ClusterWhereResident, be.stream());
                 },
                 "max_row_groups");
  }
}

// Captured once, replayed after the input changed: the new rows' argmax.
void expect_replays_read_current_input(Backend& cuda, Rng& rng, DType dt, std::size_t rows, std::size_t cols) {
  SCOPED_TRACE(cat(to_string(dt), " rows=", rows, " cols=", cols));
  DeviceTensor x(cuda, random_normal(rng, dt, rows * cols));
  constexpr std::size_t kGuard = 4;  // ints past out's rows that must keep the poison
  Buffer out_storage = cuda.alloc(DType::I32, rows + kGuard);
  Buffer out = out_storage.view(0, rows);
  cuda.begin_graph_capture();
  cuda.argmax(x.view(), out, rows, cols);
  cuda.end_graph_capture();
  for (int step = 0; step < 4; ++step) {
    const HostTensor input = argmax_input(rng, dt, rows, cols);
    const std::vector<std::uint8_t> bytes = encode_bytes(input);
    cuda.write_bytes(x.view(), bytes.data(), bytes.size());
    const std::vector<std::int32_t> poison(rows + kGuard, -7);  // a replay that did not run cannot pass
    cuda.write_bytes(out_storage, poison.data(), poison.size() * sizeof(std::int32_t));
    ASSERT_TRUE(cuda.replay_last_graph());
    std::vector<std::int32_t> got(rows + kGuard, -1);
    cuda.read_bytes(out_storage, got.data(), got.size() * sizeof(std::int32_t));
    EXPECT_EQ(std::vector<std::int32_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(rows)),
              argmax_reference(input, rows, cols))
        << "step " << step;
    EXPECT_EQ(std::vector<std::int32_t>(got.begin() + static_cast<std::ptrdiff_t>(rows), got.end()),
              std::vector<std::int32_t>(kGuard, -7))
        << "step " << step << ": argmax wrote past 'out'";
  }
  cuda.reset_graph();
}

TEST_F(CudaArgmax, GraphReplayReadsTheCurrentInput) {
  FERRUM_SEEDED_RNG(rng);
  expect_replays_read_current_input(cuda(), rng, DType::F16, 1, 4096);
  for (DType dt : kArgmaxDTypes) expect_replays_read_current_input(cuda(), rng, dt, 16, 151936);
}

}  // namespace
}  // namespace ferrum::test
