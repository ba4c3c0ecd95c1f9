// Error helpers for the engine: every problem is a ferrum::Error whose
// message names the file / tensor / argument and the offending value.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include <ferrum/ferrum.hpp>

namespace ferrum::engine {

// Concatenates its arguments with operator<< (GCC 12 has no std::format).
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <class... Parts>
[[noreturn]] void fail(ErrorCode code, Parts&&... parts) {
  throw Error(code, concat(std::forward<Parts>(parts)...));
}

}  // namespace ferrum::engine
