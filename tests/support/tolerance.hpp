// The ONE tolerance table every numeric comparison in the test suites uses.
//
// An element passes only if
//     |got - ref| <= atol * scale + rtol * |ref|
// and neither value is NaN. Every element must pass; there is no "99% of
// elements" escape hatch anywhere.
//
// `scale` is a per-op magnitude factor, documented next to each use through
// the constants below. It accounts for how large an op's outputs and their
// legitimate accumulated error grow with its sizes; it is never tuned to make
// a particular failure go away. Do not widen these numbers to make a test
// pass: a failure is a finding to report.
#pragma once

#include <cmath>
#include <cstddef>

#include "ferrum/dtype.hpp"

namespace ferrum::test {

struct Tolerance {
  double atol;
  double rtol;
};

// f16 keeps 11 significant bits: rtol 2^-9 allows two ulps. bf16 keeps 8:
// rtol 2^-6 allows two ulps. The absolute terms cover results near zero
// (cancellation, subnormal outputs).
constexpr Tolerance tolerance_for(DType dtype) noexcept {
  switch (dtype) {
    case DType::F16:
      return {1e-3, 1.0 / 512.0};
    case DType::BF16:
      return {8e-3, 1.0 / 64.0};
    case DType::F32:
      return {1e-5, 1e-5};
    case DType::I32:
    case DType::U8:
      return {0.0, 0.0};  // integers: exact
  }
  return {0.0, 0.0};
}

// Per-op scale factors (the `scale` of the formula above).
namespace op_scale {
// Row ops, elementwise ops, RoPE, attention (a convex combination of v):
// outputs are O(1) for O(1) inputs.
constexpr double kUnit = 1.0;
// gemm: a k-term dot product of O(1) values has magnitude and accumulated
// rounding error growing like sqrt(k).
inline double gemm(std::size_t k) { return std::sqrt(static_cast<double>(k)); }
}  // namespace op_scale

}  // namespace ferrum::test
