// The process-global CUDA state of one device (see cuda_backend.hpp for why
// it is process-global). Private to src/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ferrum/cuda_backend.hpp"
#include "kernels/decode_state.hpp"

namespace ferrum::detail {

struct CudaRuntime {
  int device = 0;
  int num_sms = 0;
  cudaStream_t stream = nullptr;  // every op of this device is queued here
  cublasHandle_t cublas = nullptr;  // bound to `stream`, CUBLAS_POINTER_MODE_DEVICE
  void* cublas_workspace = nullptr;
  std::size_t cublas_workspace_bytes = 0;
  const float* one_zero = nullptr;  // device [1.0f, 0.0f]: gemm alpha and beta
  float* attention_workspace = nullptr;  // decode split-K partials
  std::size_t attention_workspace_bytes = 0;
  kernels::DecodeState* decode_state = nullptr;  // device
  kernels::DeviceErrorLog* error_host = nullptr;    // host-mapped device error log
  kernels::DeviceErrorLog* error_device = nullptr;  // the same log as the device sees it
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  std::uint64_t graph_id = 0;     // Backend::held_graph(): 0 while graph_exec is null
  std::uint64_t graph_serial = 0;  // ids drawn so far
  // The communicator whose collectives the held graph holds (it lives as
  // long as the graph: the backend may go first), else the capturing
  // backend's (for reset_graph's bounded wait). Null with no graph held or
  // neither. graph_collectives: the graph holds collectives at all.
  std::shared_ptr<Communicator> graph_communicator;
  bool graph_collectives = false;
  // The held graph was destroyed to abort its communicator, perhaps while a
  // replay ran (CudaBackend::abort_communicator): until a drained stream,
  // the memory retired for it stays retired.
  bool graph_in_flight = false;
  // The communicator whose collectives the capture in progress recorded:
  // one per capture (the graph keeps that one alive), null before the first.
  std::shared_ptr<Communicator> capture_communicator;
  bool capturing = false;
  bool pdl_capable = false;  // sm_90+: programmatic dependent launch exists
  bool pdl = false;          // ... and config.programmatic_dependent_launch asked for it
  bool pdl_trigger = false;  // ... and config.pdl_early_trigger
  bool pdl_chain = false;    // ... and config.pdl_chain_release
  bool gptq_evict_first = false;      // config.gptq_weights_evict_first
  bool gemm_prefetch = false;  // config.gemm_prefetch_before_wait
  bool gemm_weights = false;   // config.gemm_weights_before_wait
  bool attention_kv = false;   // config.attention_kv_before_wait

  // Library device memory freed while a graph may point at it (see
  // free_device_memory), under retire_mutex: a Buffer may be destroyed on
  // any thread.
  std::mutex retire_mutex;
  bool graph_held = false;    // the slot holds a graph (mirrors graph_exec != nullptr)
  bool capture_open = false;  // a capture is in progress (mirrors capturing)
  std::vector<void*> retired_held;     // freed while only the held graph existed
  std::vector<void*> retired_capture;  // freed during the capture in progress
};

// The runtime of config.device, created on first use and never freed.
CudaRuntime& cuda_runtime(const CudaBackendConfig& config);

// Makes `device` current on this thread if it is not already.
void activate_device(int device);

// Frees library device memory of `device` (Buffers' allocations, GPTQ
// workspaces), unless a graph of that device may point at it: while the
// slot holds a graph or a capture is open, the memory is retired instead and
// freed once every graph that may have captured it is gone. So a replay
// never touches memory freed (and perhaps handed out again) under it.
void free_device_memory(void* ptr, int device) noexcept;
// The slot's transitions, which free what no graph can point at any more:
// a capture opened; one closed (`kept`: its graph is the slot's now, the
// previous one already dropped through graph_dropped; else discarded); the
// held graph destroyed (after the stream drained).
void capture_opened(CudaRuntime& rt) noexcept;
void capture_closed(CudaRuntime& rt, bool kept) noexcept;
void graph_dropped(CudaRuntime& rt) noexcept;
// How many allocations are retired for graphs now.
std::size_t retired_allocations(CudaRuntime& rt) noexcept;

// Ends and discards a capture in progress on rt.stream; clears the error.
void abandon_capture(CudaRuntime& rt) noexcept;
// The same for the runtime of the current device, if it has one (NCCL errors).
void abandon_capture_on_current_device() noexcept;

// cudaMalloc of `bytes` on the current device (`device`, for the message).
// A failure throws ErrorCode::OutOfMemory naming `op`, what the memory is
// for (`what`, e.g. "GPTQ workspace"; null: nothing), the size, the device
// and its free / total memory at that moment, so a reader can tell a full
// device from a request larger than the whole device.
void* device_malloc(std::size_t bytes, int device, const char* op, const char* what);

// Throw ferrum::Error for a failed CUDA / cuBLAS call, abandoning any
// capture on the current device first.
void check_cuda(cudaError_t err, const char* op, const char* what);
void check_cublas(cublasStatus_t status, const char* op, const char* what);

}  // namespace ferrum::detail
