// What the launchers remember about a device: occupancy and cluster
// placement answers, shared-memory opt-ins. They are the device's, not the
// process's: one process may drive GPUs of different kinds, or MIG slices of
// different sizes, and a kernel's shared-memory opt-in is set per device.
// Host code only.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <type_traits>

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

// A small answer per device and key (a yes / no, a block count), asked one
// key at a time: get(device, key, ask) calls ask() the first time, and
// ask() returns the answer or std::nullopt where its query failed. A failed
// query is not remembered, so the next get() asks again. Reading a known
// answer takes one atomic load and no lock: threads racing on a key's
// first get() may each ask, and store the same answer. (PerDevice makes a
// whole value on a device's first use; this is for launch shapes that are
// asked about as they come.) Answer: bool, or an int >= 0 below INT_MAX.
template <class Answer, int kKeys>
class PerDeviceAnswers {
  static_assert(std::is_same_v<Answer, bool> || std::is_same_v<Answer, int>, "a yes / no or a count");
  static_assert(kKeys >= 1, "at least one key");

 public:
  template <class Ask>
  std::optional<Answer> get(int device, int key, Ask&& ask) {
    if (device < 0 || device >= kMaxDevices) throw_bad_dispatch("PerDeviceAnswers", "device", device);
    if (key < 0 || key >= kKeys) throw_bad_dispatch("PerDeviceAnswers", "key", key);
    std::atomic<Stored>& slot = slots_[static_cast<std::size_t>(device)][static_cast<std::size_t>(key)];
    const Stored known = slot.load(std::memory_order_relaxed);
    if (known != 0) return static_cast<Answer>(known - 1);
    const std::optional<Answer> answer = ask();
    if (answer) {
      if constexpr (std::is_same_v<Answer, int>) {
        if (*answer < 0 || *answer == std::numeric_limits<int>::max()) {
          throw_bad_dispatch("PerDeviceAnswers", "answer", *answer);
        }
      }
      slot.store(static_cast<Stored>(*answer + 1), std::memory_order_relaxed);
    }
    return answer;
  }

 private:
  // The answer + 1; 0: not asked yet (or no answer so far).
  using Stored = std::conditional_t<std::is_same_v<Answer, bool>, std::uint8_t, int>;
  std::array<std::array<std::atomic<Stored>, kKeys>, kMaxDevices> slots_{};
};

}  // namespace ferrum::kernels
