// What the launchers remember about a device: occupancy and cluster
// placement answers, shared-memory opt-ins. They are the device's, not the
// process's: one process may drive GPUs of different kinds, or MIG slices of
// different sizes, and a kernel's shared-memory opt-in is set per device.
// Host code only.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>

#include <cuda_runtime_api.h>

#include "kernels/common/check.hpp"  // throw_bad_dispatch

namespace ferrum::kernels {

// The devices a process may use through this library (CudaBackend refuses a
// larger index; a launcher used without a backend gets current_device_index's
// named error).
inline constexpr int kMaxDevices = 64;

// The current device's index, in [0, kMaxDevices). A failed query throws
// ferrum::Error (ErrorCode::Cuda) naming `op`, an index past kMaxDevices
// ErrorCode::Unsupported.
int current_device_index(const char* op);

// The same for callers whose answer without a device is "no": -1 where the
// query fails (its error cleared, so the next launch check does not report
// it under another op's name) or the index is past kMaxDevices.
inline int try_current_device_index() noexcept {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device >= 0 && device < kMaxDevices ? device : -1;
}

// One T per device, made on the device's first use by make(device) (with
// that device current) and kept for the life of the process. A make() that
// throws leaves the device's value unmade, so the next use asks again (a
// failed query is not an answer). Reading a made value takes one atomic
// load; making one holds a lock, so make() runs once per device even when
// threads race.
template <class T>
class PerDevice {
 public:
  // `device` in [0, kMaxDevices) (current() guarantees it; otherwise a
  // named Internal error).
  template <class Make>
  const T& at(int device, Make&& make) {
    if (device < 0 || device >= kMaxDevices) throw_bad_dispatch("PerDevice", "device", device);
    Slot& slot = slots_[static_cast<std::size_t>(device)];
    if (!slot.made.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!slot.made.load(std::memory_order_relaxed)) {
        slot.value = make(device);
        slot.made.store(true, std::memory_order_release);
      }
    }
    return slot.value;
  }

  // at() for the current device; `op` names the failed device query.
  template <class Make>
  const T& current(const char* op, Make&& make) {
    return at(current_device_index(op), static_cast<Make&&>(make));
  }

 private:
  struct Slot {
    std::atomic<bool> made{false};
    T value{};
  };
  std::array<Slot, kMaxDevices> slots_{};
  std::mutex mutex_;
};

}  // namespace ferrum::kernels
