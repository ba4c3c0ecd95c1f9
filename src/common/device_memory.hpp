// Whether a pointer is CUDA device memory, asked from code that includes no
// CUDA header (CpuBackend's Buffer::wrap check). Private to src/.
#pragma once

namespace ferrum::detail {

// The device whose memory `ptr` is (cudaMalloc-style device memory, which
// the host cannot dereference), or -1: host, pinned or managed memory, an
// address the driver does not know, no context in the process (so no
// device memory either), or no CUDA driver or device at all. Asks the
// driver: it creates no context. Its first call looks up the device count
// and the driver entry points through the runtime (initializing the driver
// where one is installed; a failed lookup clears the runtime's last error);
// later calls leave the runtime alone.
int device_owning_memory(const void* ptr) noexcept;

}  // namespace ferrum::detail
