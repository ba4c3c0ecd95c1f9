#pragma once

#include <cstdint>

namespace ferrum::kernels {

__device__ __forceinline__ void report_device_error(std::uint32_t* flag, std::uint32_t bit) {
  if (flag != nullptr) *reinterpret_cast<volatile std::uint32_t*>(flag) = bit;
}

}  // namespace ferrum::kernels
