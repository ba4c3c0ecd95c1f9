// Throwing ferrum::Error with an fmt-formatted message. Private to src/.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "ferrum/error.hpp"

namespace ferrum::detail {

// Hidden: its many instances are the library's own business, and their
// signatures carry fmt types, which a shared library should not export.
template <class... Args>
[[noreturn, gnu::visibility("hidden")]] void fail(ErrorCode code, fmt::format_string<Args...> format,
                                                  Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ferrum::detail
