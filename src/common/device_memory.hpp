// Whether a pointer is CUDA device memory, asked from code that includes no
// CUDA header (CpuBackend's Buffer::wrap check). Private to src/.
#pragma once

namespace ferrum::detail {

// The device whose memory `ptr` is (cudaMalloc-style device memory, which
// the host cannot dereference), or -1: host, pinned or managed memory, an
// address the driver does not know, no context in the process (so no
// device memory either), or no CUDA driver or device at all. Asks the
// driver only: it creates no context and leaves the runtime's last error
// alone (the first call looks up the device count, initializing the
// driver where one is installed).
int device_owning_memory(const void* ptr) noexcept;

}  // namespace ferrum::detail
