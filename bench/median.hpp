// The median of a sample (the mean of the middle two for an even count; NaN
// for none), shared by the benchmark tools that report medians.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
