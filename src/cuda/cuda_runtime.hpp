// The process-global CUDA state of one device (see cuda_backend.hpp for why
// it is process-global). Private to src/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ferrum/cuda_backend.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::detail {

struct CudaRuntime {
  int device = 0;
  int num_sms = 0;
  cudaStream_t stream = nullptr;  // every op of this device is queued here
  // prefetch_l2's side stream: forked from `stream` at side_fork, joined back
  // at side_join (join_side_stream) before every wait on `stream` and before
  // a capture ends, so nothing outlives a synchronize or a captured graph.
  cudaStream_t side_stream = nullptr;
  cudaEvent_t side_fork = nullptr;
  cudaEvent_t side_join = nullptr;
  bool side_pending = false;  // side_stream has work `stream` has not joined
  cublasHandle_t cublas = nullptr;  // bound to `stream`, CUBLAS_POINTER_MODE_DEVICE
  void* cublas_workspace = nullptr;
  std::size_t cublas_workspace_bytes = 0;
  const float* one_zero = nullptr;  // device [1.0f, 0.0f]: gemm alpha and beta
  float* attention_workspace = nullptr;  // decode split-K partials
  std::size_t attention_workspace_bytes = 0;
  kernels::DecodeState* decode_state = nullptr;  // device
  std::uint32_t* error_host = nullptr;    // host-mapped error word (kernels::DeviceErrorBits)
  std::uint32_t* error_device = nullptr;  // the same word as the device sees it
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  bool capturing = false;
  bool pdl_capable = false;  // sm_90+: programmatic dependent launch exists
  bool pdl = false;          // ... and config.programmatic_dependent_launch asked for it
  bool pdl_trigger = false;  // ... and config.pdl_early_trigger
  bool gemm_prefetch = false;  // config.gemm_prefetch_before_wait
};

// The runtime of config.device, created on first use and never freed.
CudaRuntime& cuda_runtime(const CudaBackendConfig& config);

// Makes `device` current on this thread if it is not already.
void activate_device(int device);

// Makes rt.stream wait for the work queued on rt.side_stream (nothing when
// none is pending). Capture-safe: inside a capture it joins the branch.
cudaError_t join_side_stream(CudaRuntime& rt) noexcept;

// Ends and discards a capture in progress on rt.stream; clears the error.
void abandon_capture(CudaRuntime& rt) noexcept;
// The same for the runtime of the current device, if it has one (NCCL errors).
void abandon_capture_on_current_device() noexcept;

// Throw ferrum::Error for a failed CUDA / cuBLAS call, abandoning any
// capture on the current device first.
void check_cuda(cudaError_t err, const char* op, const char* what);
void check_cublas(cublasStatus_t status, const char* op, const char* what);

}  // namespace ferrum::detail
