// Error reporting shared by every launcher. The throwing side lives in
// src/cuda/cuda_runtime.cpp so that .cu files never include fmt.
#pragma once

#include <cuda_runtime_api.h>

namespace ferrum::kernels {

// Throws ferrum::Error (ErrorCode::Cuda) naming the op and what failed.
[[noreturn]] void throw_cuda_error(const char* op, const char* what, cudaError_t err);
// Throws ferrum::Error (ErrorCode::Internal): a launcher got a value that the
// validating layer should have refused.
[[noreturn]] void throw_bad_dispatch(const char* op, const char* what, long long value);
// Throws ferrum::Error (ErrorCode::Unsupported): a size the public checks
// allow but a kernel's grid or indices cannot take (e.g. more than 2^31 - 1
// blocks), naming the op, what it is, its value and the limit.
[[noreturn]] void throw_size_limit(const char* op, const char* what, long long value, long long limit);
// The most blocks a launch may ask for along grid.x (sm_30 and later).
inline constexpr long long kMaxGridX = 2147483647;

// Whether launches on the current device use programmatic dependent launch
// (see kernels/common/launch.cuh): the device's CudaBackend config decides;
// without a backend, whether the device has it (sm_90+), cached per device.
bool pdl_available();
// Whether the current device is sm_90 or later (thread-block clusters), cached per device.
bool device_is_sm90_or_later();
// Multiprocessors of the current device, cached per device. Throws
// ferrum::Error (ErrorCode::Cuda) naming `op` when the query fails.
int device_sm_count(const char* op);
// Bytes of L2 cache of the current device, cached per device; throws as
// device_sm_count does.
int device_l2_bytes(const char* op);
// A dynamic shared-memory size (up to 128 bytes past the least) of which
// two blocks without static shared memory never fit on one SM of the
// current device, from its shared memory per SM and per-block reserve; 0
// where that passes the per-block opt-in. Cached per device; throws as
// device_sm_count does.
int device_sole_block_smem(const char* op);
// Whether the current device runs sm_90a code (compute capability exactly
// 9.0: the arch-specific features such as wgmma), cached per device.
bool device_is_sm90a();
// The current device's launch switches, the CudaBackendConfig fields of
// the same names (pdl_early_trigger and pdl_chain_release false without
// PDL; all false without a backend), from one read of the device's state:
// a launcher asks once per launch and reads the fields it concerns.
struct LaunchSwitches {
  bool gemm_prefetch_before_wait = false;
  bool gemm_weights_before_wait = false;
  bool gptq_weights_evict_first = false;
  bool pdl_early_trigger = false;
  bool pdl_chain_release = false;
};
LaunchSwitches launch_switches();

// The driver function `name` (CUDA 12 ABI) through the runtime's entry-point
// query, so nothing links libcuda; null where the driver lacks it (the
// failed query is cleared, not sticky). Callers cache it in a static.
void* driver_entry_point(const char* name) noexcept;

// Every <<<>>> launch is followed by this: an unchecked launch is a silent
// failure. (launch_pdl and launch_pdl_clustered check their own
// cudaLaunchKernelEx.)
inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(op, "kernel launch", err);
}

}  // namespace ferrum::kernels
