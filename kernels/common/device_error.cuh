#pragma once

#include <cstdint>

#include "kernels/decode_state.hpp"

namespace ferrum::kernels {

// Reports `value`, which broke `limit`, as the check `kind` (one plain
// 64-bit store into the host-mapped log; see DeviceErrorLog). A cold path:
// the kernels call it only on a bad value.
__device__ __forceinline__ void report_device_error(DeviceErrorLog* log, DeviceErrorKind kind, long long value,
                                                    long long limit) {
  if (log != nullptr) *reinterpret_cast<volatile std::uint64_t*>(&log->slots[kind]) = pack_device_error(value, limit);
}

}  // namespace ferrum::kernels
