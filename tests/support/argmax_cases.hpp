// Argmax test inputs shared by the CPU and CUDA tests: random rows with the
// cases the semantics are about planted in them (ties, NaN, -inf), and an
// independent reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace ferrum::test {

inline constexpr DType kArgmaxDTypes[] = {DType::F16, DType::BF16, DType::F32};

// Row r of `rows` x `cols` normal values, then by r % 7: 0 as drawn; 1 the
// row maximum copied to an earlier column (a tie the first copy must win);
// 2 a NaN planted (it wins; two NaNs: the first); 3 every value -inf (column
// 0 wins); 4 every value equal (column 0 wins); 5 -0 in column 0 and +0
// everywhere else (equal values: column 0 wins, not a bit-pattern order);
// 6 +inf planted twice (the first wins).
inline HostTensor argmax_input(Rng& rng, DType dtype, std::size_t rows, std::size_t cols) {
  HostTensor t = random_normal(rng, dtype, rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = t.values.data() + r * cols;
    switch (r % 7) {
      case 1: {
        std::size_t best = 0;
        for (std::size_t c = 1; c < cols; ++c) best = row[c] > row[best] ? c : best;
        row[rng.below(static_cast<std::uint32_t>(best + 1))] = row[best];
        break;
      }
      case 2: {
        const std::size_t at = rng.below(static_cast<std::uint32_t>(cols));
        row[at] = std::numeric_limits<float>::quiet_NaN();
        if (at + 1 < cols) row[at + 1 + rng.below(static_cast<std::uint32_t>(cols - at - 1))] = -row[at];
        break;
      }
      case 3:
        for (std::size_t c = 0; c < cols; ++c) row[c] = -std::numeric_limits<float>::infinity();
        break;
      case 4:
        for (std::size_t c = 0; c < cols; ++c) row[c] = 0.5f;
        break;
      case 5:
        for (std::size_t c = 0; c < cols; ++c) row[c] = 0.0f;
        row[0] = -0.0f;
        break;
      case 6: {
        const std::size_t at = rng.below(static_cast<std::uint32_t>(cols));
        row[at] = std::numeric_limits<float>::infinity();
        if (at + 1 < cols) row[at + 1 + rng.below(static_cast<std::uint32_t>(cols - at - 1))] = row[at];
        break;
      }
      default:
        break;
    }
  }
  return t;
}

// The first NaN if any, else the first column holding the maximum.
inline std::vector<std::int32_t> argmax_reference(const HostTensor& t, std::size_t rows, std::size_t cols) {
  std::vector<std::int32_t> ids(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = t.values.data() + r * cols;
    std::size_t best = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      if (std::isnan(row[c])) {
        best = c;
        break;
      }
      if (row[c] > row[best]) best = c;
    }
    ids[r] = static_cast<std::int32_t>(best);
  }
  return ids;
}

// out[0 .. rows) after launch(x, out) on `t` uploaded with `lead` elements
// of offset, into a poisoned, guarded output (its guards are checked here).
template <class Launch>
std::vector<std::int32_t> run_argmax_with(Backend& backend, const HostTensor& t, std::size_t rows, std::size_t lead,
                                          Launch&& launch) {
  DeviceTensor x(backend, t, lead);
  GuardedOutput out(backend, DType::I32, rows, lead);
  launch(x.view(), out.view());
  EXPECT_TRUE(out.check_guard()) << "argmax wrote outside 'out'";
  const std::vector<std::uint8_t> bytes = out.bytes();
  std::vector<std::int32_t> got(rows);
  std::memcpy(got.data(), bytes.data(), rows * sizeof(std::int32_t));
  return got;
}

// The same through backend.argmax.
inline std::vector<std::int32_t> run_argmax(Backend& backend, const HostTensor& t, std::size_t rows,
                                            std::size_t cols, std::size_t lead = 0) {
  return run_argmax_with(backend, t, rows, lead,
                         [&](const Buffer& x, Buffer& out) { backend.argmax(x, out, rows, cols); });
}

}  // namespace ferrum::test
