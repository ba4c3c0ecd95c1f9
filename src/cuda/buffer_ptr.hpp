// Typed raw pointers out of validated Buffers, for the CudaBackend's do_*
// methods (one file per op family: cuda_backend*.cpp).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "ferrum/buffer.hpp"

namespace ferrum::detail {

template <class T = void>
T* ptr(Buffer& b) {
  return static_cast<T*>(b.data());
}
template <class T = void>
const T* ptr(const Buffer& b) {
  return static_cast<const T*>(b.data());
}

// A named operand, for the check below.
using NamedBuffer = std::pair<const char*, const Buffer*>;

// The kernels move rows as 16-byte vectors: the Misaligned message for the
// first of `buffers` whose data is not 16-byte aligned, or "" when all are.
inline std::string misaligned_16(std::initializer_list<NamedBuffer> buffers) {
  for (const auto& [name, b] : buffers) {
    if ((reinterpret_cast<std::uintptr_t>(b->data()) & 15u) != 0) {
      return fmt::format("argument '{}' at {} is not 16-byte aligned", name, b->data());
    }
  }
  return {};
}

}  // namespace ferrum::detail
