// Typed raw pointers out of validated Buffers, for the CudaBackend's do_*
// methods (one file per op family: cuda_backend*.cpp).
#pragma once

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

}  // namespace ferrum::detail
