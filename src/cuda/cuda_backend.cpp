// CudaBackend: construction, memory, the decode state and the graph slot.
// The ops live one family per file (cuda_backend_<family>.cpp): each do_*
// turns validated Buffers into raw pointers and calls the kernel family's
// launcher (kernels/*.hpp) on the device's one stream, and none allocates,
// synchronizes or touches pageable memory. Only setup-time calls do, which
// the base class keeps out of graph capture: the buffer calls here (alloc,
// write, read) and load_gptq (cuda_backend_gptq.cpp).
#include "ferrum/cuda_backend.hpp"

#include <fmt/format.h>

#include <cuda.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "common/device_memory.hpp"
#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "cuda/device_errors.hpp"
#include "cuda/nccl_check.hpp"
#include "kernels/common/check.hpp"
#include "kernels/attention.hpp"
#include "kernels/gemm_skinny.hpp"
#include "kernels/gptq_gemm.hpp"
#include "kernels/rope.hpp"

namespace ferrum {

using detail::check_cublas;
using detail::check_cuda;
using detail::ptr;

namespace {

// The driver's cuMemGetAddressRange, or null where the driver lacks it.
using GetAddressRangeFn = CUresult (*)(CUdeviceptr* base, std::size_t* size, CUdeviceptr ptr);
GetAddressRangeFn get_address_range_fn() {
  static const auto fn = reinterpret_cast<GetAddressRangeFn>(kernels::driver_entry_point("cuMemGetAddressRange"));
  return fn;
}

}  // namespace

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for callers
    return 0;
  }
  return count;
}

namespace {

// The driver calls device_owning_memory makes: none creates a context or
// touches the runtime's last-error state (cuPointerGetAttribute answers
// under unified addressing without a current context). Looking them up
// once goes through the runtime (see device_memory.hpp).
struct PointerQuery {
  using CtxGetCurrentFn = CUresult (*)(CUcontext*);
  using DeviceGetFn = CUresult (*)(CUdevice*, int);
  using PrimaryCtxGetStateFn = CUresult (*)(CUdevice, unsigned*, int*);
  using PointerGetAttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  int devices = 0;
  CtxGetCurrentFn ctx_get_current = nullptr;
  DeviceGetFn device_get = nullptr;
  PrimaryCtxGetStateFn primary_ctx_get_state = nullptr;
  PointerGetAttributeFn pointer_get_attribute = nullptr;

  bool usable() const noexcept {
    return devices > 0 && ctx_get_current && device_get && primary_ctx_get_state && pointer_get_attribute;
  }
  // Device memory needs a context: one current on this thread, or a
  // device's primary context (the runtime's) active.
  bool any_context() const noexcept {
    CUcontext current = nullptr;
    if (ctx_get_current(&current) == CUDA_SUCCESS && current != nullptr) return true;
    for (int d = 0; d < devices; ++d) {
      CUdevice device = 0;
      unsigned flags = 0;
      int active = 0;
      if (device_get(&device, d) == CUDA_SUCCESS && primary_ctx_get_state(device, &flags, &active) == CUDA_SUCCESS &&
          active != 0) {
        return true;
      }
    }
    return false;
  }
};

// Looked up once: the device count (which initializes the driver, not a
// context) and the entry points.
const PointerQuery& pointer_query() {
  static const PointerQuery query = [] {
    PointerQuery q;
    q.devices = cuda_device_count();
    if (q.devices == 0) return q;
    q.ctx_get_current = reinterpret_cast<PointerQuery::CtxGetCurrentFn>(kernels::driver_entry_point("cuCtxGetCurrent"));
    q.device_get = reinterpret_cast<PointerQuery::DeviceGetFn>(kernels::driver_entry_point("cuDeviceGet"));
    q.primary_ctx_get_state =
        reinterpret_cast<PointerQuery::PrimaryCtxGetStateFn>(kernels::driver_entry_point("cuDevicePrimaryCtxGetState"));
    q.pointer_get_attribute =
        reinterpret_cast<PointerQuery::PointerGetAttributeFn>(kernels::driver_entry_point("cuPointerGetAttribute"));
    return q;
  }();
  return query;
}

}  // namespace

int detail::device_owning_memory(const void* ptr) noexcept {
  const PointerQuery& q = pointer_query();
  if (ptr == nullptr || !q.usable() || !q.any_context()) return -1;
  const auto address = reinterpret_cast<CUdeviceptr>(ptr);
  unsigned managed = 0;  // managed memory reports its device, but the host reads it
  if (q.pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, address) != CUDA_SUCCESS || managed != 0) {
    return -1;
  }
  CUmemorytype type{};
  if (q.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) != CUDA_SUCCESS ||
      type != CU_MEMORYTYPE_DEVICE) {
    return -1;
  }
  int ordinal = -1;
  if (q.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address) != CUDA_SUCCESS) return -1;
  return ordinal;
}

namespace {

// The communicator must live on the backend's device and still be usable.
std::shared_ptr<Communicator> checked_communicator(const CudaBackendConfig& config) {
  if (config.collective_timeout.count() <= 0) {
    detail::fail(ErrorCode::InvalidArgument, "CudaBackend: argument 'config.collective_timeout' = {} ms, must be positive",
                 config.collective_timeout.count());
  }
  const std::shared_ptr<Communicator>& comm = config.communicator;
  if (comm == nullptr) return nullptr;
  if (comm->device() != config.device) {
    detail::fail(ErrorCode::InvalidArgument,
                 "CudaBackend: argument 'config.communicator' is on device {} (rank {} of {}) but 'config.device' = {}",
                 comm->device(), comm->rank(), comm->world_size(), config.device);
  }
  if (comm->aborted()) {
    detail::fail(ErrorCode::InvalidArgument, "CudaBackend: argument 'config.communicator' (rank {} of {}) was aborted: {}",
                 comm->rank(), comm->world_size(), comm->abort_reason());
  }
  return comm;
}

}  // namespace

namespace {

static_assert(kGemmSkinnyMaxM == kernels::kSkinnyMaxM, "the public bound is the kernel's");
static_assert(kGptqStreamMaxCtasPerSm == kernels::kGptqStreamMaxCtasPerSm, "the public bound is the kernel's");

int resolved_skinny_max_m(int requested) {
  if (requested < -1 || requested > kernels::kSkinnyMaxM) {
    detail::fail(ErrorCode::InvalidArgument,
                 "CudaBackend: CudaBackendConfig::gemm_skinny_max_m = {} is outside [-1, {}] (-1: the default)",
                 requested, kernels::kSkinnyMaxM);
  }
  return requested;
}

int checked_gptq_stream_ring(int requested) {
  if (requested < 0 || requested > kernels::kGptqStreamMaxRing) {
    detail::fail(ErrorCode::InvalidArgument,
                 "CudaBackend: CudaBackendConfig::gptq_stream_ring = {} is outside [0, {}] (0: the default)",
                 requested, kernels::kGptqStreamMaxRing);
  }
  return requested;
}

int checked_gptq_stream_ctas_per_sm(int requested) {
  if (requested < 0 || requested > kernels::kGptqStreamMaxCtasPerSm) {
    detail::fail(ErrorCode::InvalidArgument,
                 "CudaBackend: CudaBackendConfig::gptq_stream_ctas_per_sm = {} is outside [0, {}] (0: every resident "
                 "slot)",
                 requested, kernels::kGptqStreamMaxCtasPerSm);
  }
  return requested;
}

int checked_gptq_fused_max_m(int requested) {
  if (requested < -1) {
    detail::fail(ErrorCode::InvalidArgument,
                 "CudaBackend: CudaBackendConfig::gptq_fused_max_m = {} is below -1 (-1: the library's rule)",
                 requested);
  }
  return requested;
}

}  // namespace

const CudaBackendConfig& CudaBackend::checked_config(const CudaBackendConfig& config) {
  (void)checked_communicator(config);
  (void)resolved_skinny_max_m(config.gemm_skinny_max_m);
  (void)checked_gptq_kernel(config.gptq_kernel);
  (void)checked_gptq_stream_ring(config.gptq_stream_ring);
  (void)checked_gptq_stream_ctas_per_sm(config.gptq_stream_ctas_per_sm);
  (void)checked_gptq_fused_max_m(config.gptq_fused_max_m);
  (void)checked_prefill_kernel(config.prefill_kernel);
  return config;
}

CudaBackend::CudaBackend(CudaBackendConfig config)
    : device_(config.device),
      rt_(&detail::cuda_runtime(checked_config(config))),
      comm_(checked_communicator(config)),
      collective_timeout_(config.collective_timeout),
      gemm_skinny_max_m_(resolved_skinny_max_m(config.gemm_skinny_max_m)),
      gptq_kernel_(checked_gptq_kernel(config.gptq_kernel)),
      gptq_stream_ring_(checked_gptq_stream_ring(config.gptq_stream_ring)),
      gptq_stream_ctas_per_sm_(checked_gptq_stream_ctas_per_sm(config.gptq_stream_ctas_per_sm)),
      gptq_cluster_reduce_(config.gptq_cluster_reduce),
      gptq_fused_max_m_(checked_gptq_fused_max_m(config.gptq_fused_max_m)),
      gptq_fuse_silu_mul_(config.gptq_fuse_silu_mul),
      gptq_fuse_residual_add_(config.gptq_fuse_residual_add),
      prefill_kernel_(checked_prefill_kernel(config.prefill_kernel)) {
  // Buffers free through the device alone, so one may outlive its
  // CudaBackend (the runtime is process-global); memory a graph of the
  // device may point at is retired until that graph is dropped.
  set_deallocator(detail::free_device_memory, device_);
}

CudaBackend::~CudaBackend() = default;

std::string CudaBackend::name() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) {
    (void)cudaGetLastError();  // a name without the model, not an error for the next op to report
    return fmt::format("cuda:{}", device_);
  }
  return fmt::format("cuda:{} ({})", device_, prop.name);
}

bool CudaBackend::supports(Op op) const noexcept {
  // A value outside the enum is no op (CpuBackend answers the same).
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= kNumOps) return false;
  switch (op) {
    case Op::MlaAttention:
      return false;
    default:
      return true;
  }
}

bool CudaBackend::supports_head_dim(Op op, std::size_t head_dim) const noexcept {
  if (!supports(op)) return false;
  switch (op) {
    case Op::FlashAttention:
    case Op::FlashDecodeRagged:
      return kernels::attention_head_dim_supported(head_dim);
    case Op::QkNormRope:
    case Op::QkvRopeAppend:
    case Op::QkvRopeAppendRagged:
      return kernels::rope_head_dim_supported(head_dim);
    default:
      return true;
  }
}

cudaStream_t CudaBackend::stream() const noexcept { return rt_->stream; }

std::size_t CudaBackend::world_size() const noexcept {
  return comm_ != nullptr ? static_cast<std::size_t>(comm_->world_size()) : 1;
}

std::size_t CudaBackend::rank() const noexcept { return comm_ != nullptr ? static_cast<std::size_t>(comm_->rank()) : 0; }

// The graph slot's capture, or one the caller opened on stream() directly
// (interop): setup ops that synchronize or copy from pageable memory are
// refused during either.
bool CudaBackend::is_capturing() const noexcept {
  if (rt_->capturing) return true;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(rt_->stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // answered, not sticky
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

std::uint64_t CudaBackend::held_graph() const noexcept { return rt_->graph_exec != nullptr ? rt_->graph_id : 0; }

void CudaBackend::abandon_capture() noexcept { detail::abandon_capture(*rt_); }

void CudaBackend::synchronize() {
  if (rt_->capturing) {
    detail::abandon_capture(*rt_);
    detail::fail(ErrorCode::GraphCapture, "synchronize: not allowed while a graph is being captured");
  }
  if (is_capturing()) {  // the caller's own capture on stream(): left open, theirs to end
    detail::fail(ErrorCode::GraphCapture,
                 "synchronize: not allowed while a graph is being captured (the caller's capture on stream())");
  }
  detail::activate_device(device_);
  wait_stream("synchronize");
  report_device_errors("synchronize");
}

void CudaBackend::report_device_errors(const char* op) {
  const std::string found = detail::take_device_errors(*rt_->error_host);
  if (!found.empty()) detail::fail(ErrorCode::DeviceCheck, "{}: a kernel found a bad device-side value: {}", op, found);
}

// Without a communicator: cudaStreamSynchronize. With one, a collective may
// wait forever on a peer that is gone, so the stream is polled instead: each
// round checks the communicator's asynchronous error, and past
// collective_timeout the communicator is aborted (its kernels then return).
// Either way the error is ErrorCode::Nccl and the communicator stays aborted.
void CudaBackend::wait_stream(const char* op, std::shared_ptr<Communicator> comm) {
  if (comm == nullptr) {
    check_cuda(cudaStreamSynchronize(rt_->stream), op, "cudaStreamSynchronize");
    return;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const auto spin = std::chrono::milliseconds(1);  // then sleep between polls
  for (;;) {
    const cudaError_t q = cudaStreamQuery(rt_->stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) check_cuda(q, op, "cudaStreamQuery");
    const std::string async = detail::nccl_async_error(*comm);
    if (!async.empty()) {
      abort_communicator(*comm, "asynchronous NCCL error: " + async);
      detail::fail(ErrorCode::Nccl,
                   "{}: NCCL reported an asynchronous error on rank {} of {} (device {}): {}; the communicator was "
                   "aborted (a peer may be gone)",
                   op, comm->rank(), comm->world_size(), device_, async);
    }
    const Clock::duration waited = Clock::now() - start;
    if (waited > collective_timeout_) {
      if (comm->aborted()) {
        detail::fail(ErrorCode::Nccl,
                     "{}: the stream of device {} did not finish within collective_timeout = {} ms; its communicator "
                     "(rank {} of {}) was already aborted: {}",
                     op, device_, collective_timeout_.count(), comm->rank(), comm->world_size(),
                     comm->abort_reason());
      }
      abort_communicator(*comm, fmt::format("{} timed out after collective_timeout = {} ms", op,
                                            collective_timeout_.count()));
      detail::fail(ErrorCode::Nccl,
                   "{}: timeout: the stream of device {} did not finish within collective_timeout = {} ms (a "
                   "collective waits for a peer that is gone or never issued it); the communicator (rank {} of {}) "
                   "was aborted",
                   op, device_, collective_timeout_.count(), comm->rank(), comm->world_size());
    }
    if (waited < spin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

// NCCL's abort waits until every graph holding the communicator's
// collectives is destroyed (their plans are the graph's), so the slot's
// graph goes first: an exec still in flight is freed when it completes,
// which the abort lets its collectives do. What it may point at stays
// retired until the stream has drained (here, within collective_timeout,
// else at reset_graph or the next end_graph_capture). Only this device's slot: another device's graph holding a
// communicator of the same create_all group is its backend's to reset.
void CudaBackend::abort_communicator(Communicator& comm, const std::string& reason) {
  if (rt_->graph_collectives && rt_->graph_communicator.get() == &comm) {
    if (rt_->graph_exec != nullptr && cudaGraphExecDestroy(rt_->graph_exec) != cudaSuccess) (void)cudaGetLastError();
    if (rt_->graph != nullptr && cudaGraphDestroy(rt_->graph) != cudaSuccess) (void)cudaGetLastError();
    rt_->graph_exec = nullptr;
    rt_->graph = nullptr;
    rt_->graph_id = 0;
    rt_->graph_collectives = false;
    rt_->graph_communicator.reset();
    rt_->graph_in_flight = true;  // retired memory waits for a drained stream
  }
  detail::nccl_abort(comm, reason);
  if (!rt_->graph_in_flight) return;
  // The aborted collectives return: once the stream drains (within the
  // timeout; else reset_graph waits for it), the retired memory goes now,
  // not at a reset_graph that held_graph() = 0 gives no reason to call.
  const auto deadline = std::chrono::steady_clock::now() + collective_timeout_;
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(rt_->stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (q == cudaSuccess) {
    rt_->graph_in_flight = false;
    detail::graph_dropped(*rt_);
  } else if (q != cudaErrorNotReady) {
    (void)cudaGetLastError();  // the caller's Nccl error says what happened; reset_graph reports this
  }
}

// ── Memory ─────────────────────────────────────────────────────────────────

void* CudaBackend::allocate_bytes(std::size_t bytes) {
  detail::activate_device(device_);
  return detail::device_malloc(bytes, device_, "alloc", nullptr);
}

void* CudaBackend::allocate_host_bytes(std::size_t bytes) {
  detail::activate_device(device_);
  void* p = nullptr;
  // Portable: every device's context may copy from it (a tensor-parallel
  // engine's backends share one process).
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    detail::fail(ErrorCode::OutOfMemory, "alloc_host: cudaHostAlloc of {} bytes failed: {}", bytes,
                 cudaGetErrorString(err));
  }
  return p;
}

bool CudaBackend::check_wrapped(const void* ptr, std::size_t bytes) const {
  detail::activate_device(device_);  // devicePointer below is as this device sees it
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // answered, not sticky
    detail::fail(ErrorCode::InvalidArgument, "Buffer::wrap: argument 'ptr' = {} ({} bytes): CUDA cannot tell what it is ({})",
                 ptr, bytes, cudaGetErrorString(err));
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device != device_) {
        detail::fail(ErrorCode::InvalidArgument,
                     "Buffer::wrap: argument 'ptr' = {} is memory of device {}, but this CudaBackend runs on device {}",
                     ptr, attr.device, device_);
      }
      // The extent, where the driver can tell the allocation that holds ptr
      // (cudaMalloc / cuMemAlloc; not knowable for every allocator).
      if (const GetAddressRangeFn range = get_address_range_fn()) {
        CUdeviceptr base = 0;
        std::size_t size = 0;
        if (range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
          const std::size_t room = static_cast<std::size_t>(base + size - reinterpret_cast<CUdeviceptr>(ptr));
          if (bytes > room) {
            detail::fail(ErrorCode::InvalidArgument,
                         "Buffer::wrap: argument 'numel' makes {} bytes from 'ptr' = {}, past the end of its "
                         "allocation ({} bytes from there)",
                         bytes, ptr, room);
          }
        }
        (void)cudaGetLastError();
      }
      return false;
    case cudaMemoryTypeHost:     // pinned (mapped under unified addressing)
    case cudaMemoryTypeManaged:  // migrates on access
      if (attr.devicePointer != ptr) {
        detail::fail(ErrorCode::InvalidArgument,
                     "Buffer::wrap: argument 'ptr' = {} is host memory that device {} reaches only at {}, not at "
                     "the same address (pinned without cudaHostAllocPortable / mapped?)",
                     ptr, device_, attr.devicePointer);
      }
      // Pinned memory is host memory (read over the bus); managed memory
      // is the device's while a kernel touches it.
      return attr.type == cudaMemoryTypeHost;
    default:
      detail::fail(ErrorCode::InvalidArgument,
                   "Buffer::wrap: argument 'ptr' = {} is pageable host memory, which CudaBackend's kernels cannot "
                   "read: wrap device, pinned or managed memory",
                   ptr);
  }
}


void CudaBackend::do_write_bytes(const char* op, Buffer& dst, std::size_t dst_byte_offset, const void* host,
                                 std::size_t bytes) {
  detail::activate_device(device_);
  check_cuda(cudaMemcpyAsync(ptr<std::uint8_t>(dst) + dst_byte_offset, host, bytes, cudaMemcpyDefault,
                             rt_->stream),
             op, "cudaMemcpyAsync");
  wait_stream(op);
}

void CudaBackend::do_read_bytes(const char* op, const Buffer& src, std::size_t src_byte_offset, void* host,
                                std::size_t bytes) {
  detail::activate_device(device_);
  check_cuda(cudaMemcpyAsync(host, ptr<std::uint8_t>(src) + src_byte_offset, bytes, cudaMemcpyDefault,
                             rt_->stream),
             op, "cudaMemcpyAsync");
  wait_stream(op);
  // The bytes just read may be what a bad device-side value left (zeros,
  // unwritten rows): say so here, as synchronize() would.
  report_device_errors(op);
}

void CudaBackend::do_copy_slice(const char* op, const Buffer& src, std::size_t src_offset, Buffer& dst,
                                std::size_t dst_offset, std::size_t len) {
  detail::activate_device(device_);
  const std::size_t es = size_of(src.dtype());
  check_cuda(cudaMemcpyAsync(ptr<std::uint8_t>(dst) + dst_offset * es, ptr<std::uint8_t>(src) + src_offset * es,
                             len * es, cudaMemcpyDefault, rt_->stream),
             op, "cudaMemcpyAsync");
}

void CudaBackend::do_set_decode_state(std::int32_t token, std::int32_t pos, std::int32_t kv_len) {
  detail::activate_device(device_);
  kernels::launch_set_decode_state(rt_->decode_state, token, pos, kv_len, rt_->stream);
}

void CudaBackend::do_advance_decode_state(const Buffer& next_token, Buffer& token_log) {
  detail::activate_device(device_);
  kernels::launch_advance_decode_state(rt_->decode_state, ptr<std::int32_t>(next_token), ptr<std::int32_t>(token_log),
                                       static_cast<long long>(token_log.numel()), rt_->error_device, rt_->stream);
}

// ── Graph slot ─────────────────────────────────────────────────────────────

void CudaBackend::do_begin_graph_capture() {
  detail::activate_device(device_);
  // Relaxed: other threads may still call capture-unsafe APIs (e.g. a
  // cudaMalloc by the engine's allocator) without breaking our capture.
  check_cuda(cudaStreamBeginCapture(rt_->stream, cudaStreamCaptureModeRelaxed), "begin_graph_capture",
             "cudaStreamBeginCapture");
  rt_->capture_communicator.reset();
  rt_->capturing = true;
  detail::capture_opened(*rt_);
}

void CudaBackend::do_end_graph_capture() {
  if (!rt_->capturing) {  // the stream's capture is the caller's own (is_capturing)
    detail::fail(ErrorCode::GraphCapture,
                 "end_graph_capture: the capture on this device's stream was opened by the caller "
                 "(cudaStreamBeginCapture), not by begin_graph_capture; end it with cudaStreamEndCapture");
  }
  detail::activate_device(device_);
  rt_->capturing = false;
  // The communicator whose collectives the graph holds (any backend of the
  // device may have recorded them), else this backend's (as the wait in
  // reset_graph uses it).
  std::shared_ptr<Communicator> recorded = std::move(rt_->capture_communicator);
  // However this ends, memory freed during the capture is retired for the
  // graph now held (the new one, or the previous one when this one fails),
  // or freed when none is.
  struct CloseCapture {
    detail::CudaRuntime& rt;
    bool kept = false;
    ~CloseCapture() { detail::capture_closed(rt, kept); }
  } close{*rt_};
  cudaGraph_t graph = nullptr;
  const cudaError_t end_err = cudaStreamEndCapture(rt_->stream, &graph);
  if (end_err != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    detail::fail(ErrorCode::GraphCapture, "end_graph_capture: the capture was invalidated: {}",
                 cudaGetErrorString(end_err));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst_err = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  if (inst_err != cudaSuccess) {
    cudaGraphDestroy(graph);
    check_cuda(inst_err, "end_graph_capture", "cudaGraphInstantiateWithFlags");
  }
  // Upload now so the first replay does not pay for it (and so a failure
  // shows here, not at an arbitrary later replay).
  const cudaError_t up_err = cudaGraphUpload(exec, rt_->stream);
  if (up_err != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    check_cuda(up_err, "end_graph_capture", "cudaGraphUpload");
  }
  try {
    do_reset_graph();  // may throw (a sticky error, a collective past its timeout): then the new graph goes too
  } catch (...) {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    throw;
  }
  rt_->graph = graph;
  rt_->graph_exec = exec;
  rt_->graph_id = ++rt_->graph_serial;
  rt_->graph_collectives = recorded != nullptr;
  rt_->graph_communicator = recorded != nullptr ? std::move(recorded) : comm_;
  close.kept = true;
}

bool CudaBackend::do_replay_last_graph() {
  if (rt_->graph_exec == nullptr) return false;
  // Its collectives would run on freed NCCL state, or wait forever.
  if (const Communicator* c = rt_->graph_communicator.get(); rt_->graph_collectives && c != nullptr && c->aborted()) {
    detail::fail(ErrorCode::Nccl,
                 "replay_last_graph: the held graph's collectives run on a communicator (rank {} of {}) that was "
                 "aborted; reset_graph() and capture again with a new communicator",
                 c->rank(), c->world_size());
  }
  detail::activate_device(device_);
  check_cuda(cudaGraphLaunch(rt_->graph_exec, rt_->stream), "replay_last_graph", "cudaGraphLaunch");
  return true;
}

void CudaBackend::do_reset_graph() {
  if (rt_->graph_exec == nullptr && rt_->graph == nullptr) {
    if (rt_->graph_in_flight) {
      // abort_communicator destroyed a graph that may still have been
      // running: free what it may read only once the stream has drained
      // (its collectives return, their communicator being aborted).
      detail::activate_device(device_);
      wait_stream("reset_graph", /*comm=*/nullptr);
      rt_->graph_in_flight = false;
    }
    detail::graph_dropped(*rt_);
    return;
  }
  detail::activate_device(device_);
  // A replay may still be running; let it finish before freeing the graph.
  // A replayed collective may wait on a peer that is gone: the same bounded
  // wait as synchronize() (on timeout the graph is destroyed, the
  // communicator aborted, its kernels return, and this throws Nccl; a later
  // reset_graph() frees what the graph pointed at, once the stream drained).
  // The held graph's collectives are its communicator's (perhaps not this
  // backend's): a replay stuck on a peer is that one's to time out.
  wait_stream("reset_graph", rt_->graph_communicator != nullptr ? rt_->graph_communicator : comm_);
  // The stream drained above, so these free only host-side objects; a
  // failure leaks them and must not be reported by the next op as its own.
  if (rt_->graph_exec != nullptr && cudaGraphExecDestroy(rt_->graph_exec) != cudaSuccess) (void)cudaGetLastError();
  if (rt_->graph != nullptr && cudaGraphDestroy(rt_->graph) != cudaSuccess) (void)cudaGetLastError();
  rt_->graph_exec = nullptr;
  rt_->graph = nullptr;
  rt_->graph_id = 0;
  detail::graph_dropped(*rt_);  // the stream drained above: no replay still runs
  rt_->graph_communicator.reset();  // after the graph: it may be the last owner
  rt_->graph_collectives = false;
}

std::size_t CudaBackend::graph_retained_allocations() const noexcept { return detail::retired_allocations(*rt_); }

}  // namespace ferrum
