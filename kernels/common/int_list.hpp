// A compile-time list of ints, for a set of template instances named once:
// the host-side predicate ("is this value one we built?") and the kernels'
// dispatch (dispatch_int in dtype.cuh) read the same list, so they cannot
// drift apart.
#pragma once

#include <cstddef>
#include <string>

namespace ferrum::kernels {

template <int... Values>
struct IntList {};

template <int... Values>
constexpr bool int_list_contains(IntList<Values...>, std::size_t value) {
  return ((value == static_cast<std::size_t>(Values)) || ...);
}

// "64, 128, 256": the list as an error message names it.
template <int... Values>
std::string int_list_text(IntList<Values...>) {
  std::string text;
  ((text += (text.empty() ? "" : ", ") + std::to_string(Values)), ...);
  return text;
}

}  // namespace ferrum::kernels
