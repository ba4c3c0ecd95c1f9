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

// The attention kernels, the GPTQ GEMMs and the collectives read device
// memory (bulk and tensor-map copies, NCCL): the InvalidArgument message for
// the first of `buffers` that is host memory (Buffer::host_memory), or ""
// when none is.
inline std::string host_memory_argument(std::initializer_list<NamedBuffer> buffers) {
  for (const auto& [name, b] : buffers) {
    if (b->host_memory()) {
      return fmt::format("argument '{}' at {} is host memory (alloc_host, or wrapped page-locked memory), which "
                         "this op cannot read: copy_slice it into a Buffer from alloc first",
                         name, b->data());
    }
  }
  return {};
}

}  // namespace ferrum::detail
