// Launcher for prefetch_l2: asks the device's L2 cache to fetch a byte range
// (a hint: no result depends on it). The caller (CudaBackend) has validated
// the range against its buffer and picks the stream: prefetch_l2 runs it on
// a side stream, so the fetch overlaps the ops queued after it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferrum::kernels {

// Bytes one bulk prefetch instruction asks for. A thread issues one piece
// per instruction; the grid covers the range in one pass where it can.
inline constexpr std::size_t kL2PrefetchPieceBytes = std::size_t{16} << 10;

// Fetches [ptr, ptr + bytes) into L2, widened to whole 16-byte granules
// (cudaMalloc allocations are 256-byte aligned, so a widened range never
// leaves its allocation). The kernel only issues the requests and exits;
// the fetches finish behind it. A no-op below sm_90.
void launch_l2_prefetch(const void* ptr /*[bytes]*/, std::size_t bytes, int num_sms, cudaStream_t stream);

}  // namespace ferrum::kernels
