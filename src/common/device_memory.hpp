// Whether a pointer is CUDA device memory, asked from code that includes no
// CUDA header (CpuBackend's Buffer::wrap check). Private to src/.
#pragma once

namespace ferrum::detail {

// The device whose memory `ptr` is (cudaMalloc-style device memory, which
// the host cannot dereference), or -1: host, pinned or managed memory, an
// address CUDA does not know, or no CUDA driver or device at all (then CUDA
// is not asked). On a machine with a GPU the question starts the CUDA
// runtime if nothing has yet.
int device_owning_memory(const void* ptr) noexcept;

}  // namespace ferrum::detail
