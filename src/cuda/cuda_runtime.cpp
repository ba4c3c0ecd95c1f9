#include "cuda/cuda_runtime.hpp"

#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include "common/fail.hpp"
#include "kernels/common/check.hpp"
#include "kernels/common/per_device.hpp"

namespace ferrum::detail {
namespace {

using kernels::kMaxDevices;

// The current device into *device; false when the query fails, its error
// cleared (the callers treat that as "no device", and the error must not
// stay behind for the next op's launch check to report under its name).
bool query_current_device(int* device) noexcept {
  if (cudaGetDevice(device) == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

std::mutex g_runtimes_mutex;
// Held through a whole cuda_runtime() call, so runtimes are made one at a
// time: a second caller for the same device waits, then finds the first's
// runtime and compares its config with it (two racing first backends would
// otherwise both make one, and the loser's would leak unchecked). Taken
// before g_runtimes_mutex, never while holding it.
std::mutex g_create_mutex;
std::array<CudaRuntime*, kMaxDevices> g_runtimes{};
// Per device, read by every launch without a lock: 0 no runtime yet (a
// launcher used on its own, e.g. by a tuning bench: the device decides PDL,
// the A/B switches are off), else kConfigured | the kLaunch* bits of the
// runtime's config. Set once when the device's runtime is created.
constexpr int kConfigured = 1, kLaunchPdl = 2, kLaunchTrigger = 4, kLaunchGemmPrefetch = 8, kLaunchGemmWeights = 16,
              kLaunchGptqEvictFirst = 32, kLaunchChainRelease = 64;
std::array<std::atomic<int>, kMaxDevices> g_launch_state{};

int launch_state_of_current_device() {
  const int device = kernels::try_current_device_index();
  if (device < 0) return 0;
  return g_launch_state[device].load(std::memory_order_relaxed);
}

CudaRuntime* runtime_of(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lock(g_runtimes_mutex);
  return g_runtimes[device];
}

CudaRuntime* runtime_of_current_device() noexcept {
  int device = -1;
  if (!query_current_device(&device)) return nullptr;
  return runtime_of(device);
}

// cudaFree on `device` (cudaFreeHost for alloc_host's page-locked memory),
// the caller's current device restored.
void free_now(void* ptr, int device) noexcept {
  int current = -1;
  if (!query_current_device(&current)) current = -1;
  // A failed call here must not stay behind as the thread's last error, to
  // be reported by the next op's launch check under that op's name.
  if (current != device && cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
  // Which allocator made it, asked of the driver (frees are setup-time):
  // alloc_host's page-locked memory reads as host memory, cudaMalloc's as
  // device memory.
  cudaPointerAttributes attr{};
  bool host = false;
  if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess) {
    host = attr.type == cudaMemoryTypeHost;
  } else {
    (void)cudaGetLastError();
  }
  if ((host ? cudaFreeHost(ptr) : cudaFree(ptr)) != cudaSuccess) (void)cudaGetLastError();
  if (current != device && current >= 0 && cudaSetDevice(current) != cudaSuccess) (void)cudaGetLastError();
}

void free_all(std::vector<void*>& ptrs, int device) noexcept {
  for (void* p : ptrs) free_now(p, device);
  ptrs.clear();
}

// What create_runtime made before a step failed (it throws on): nothing of
// it stays behind, so a retry (e.g. with a smaller workspace) starts clean.
void release_partial_runtime(CudaRuntime* rt) noexcept {
  if (rt->error_host != nullptr) (void)cudaFreeHost(rt->error_host);
  if (rt->decode_state != nullptr) (void)cudaFree(rt->decode_state);
  if (rt->attention_workspace != nullptr) (void)cudaFree(rt->attention_workspace);
  if (rt->one_zero != nullptr) (void)cudaFree(const_cast<float*>(rt->one_zero));
  if (rt->cublas_workspace != nullptr) (void)cudaFree(rt->cublas_workspace);
  if (rt->cublas != nullptr) (void)cublasDestroy(rt->cublas);
  if (rt->stream != nullptr) (void)cudaStreamDestroy(rt->stream);
  (void)cudaGetLastError();
  delete rt;
}

CudaRuntime* create_runtime_steps(CudaRuntime* rt, const CudaBackendConfig& config) {
  rt->device = config.device;
  const char* op = "CudaBackend";
  check_cuda(cudaSetDevice(config.device), op, "cudaSetDevice");
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, config.device), op,
             "cudaDeviceGetAttribute");
  if (const cudaError_t image = kernels::probe_kernel_image();
      image == cudaErrorNoKernelImageForDevice || image == cudaErrorInvalidDeviceFunction ||
      image == cudaErrorUnsupportedPtxVersion) {
    int minor = 0;
    (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, config.device);
    fail(ErrorCode::Unsupported,
         "CudaBackend: device {} (compute capability {}.{}) cannot run this build's kernels ({}); build with "
         "CMAKE_CUDA_ARCHITECTURES covering it (the default 90a runs on 9.0 only; e.g. \"80;90a\")",
         config.device, major, minor, cudaGetErrorString(image));
  } else {
    check_cuda(image, op, "cudaFuncGetAttributes (kernel image probe)");
  }
  rt->pdl_capable = major >= 9;
  rt->pdl = config.programmatic_dependent_launch && rt->pdl_capable;
  rt->pdl_trigger = rt->pdl && config.pdl_early_trigger;
  rt->pdl_chain = rt->pdl && config.pdl_chain_release;
  rt->gemm_prefetch = config.gemm_prefetch_before_wait;
  rt->gemm_weights = config.gemm_weights_before_wait;
  rt->attention_kv = config.attention_kv_before_wait;
  rt->gptq_evict_first = config.gptq_weights_evict_first;
  check_cuda(cudaDeviceGetAttribute(&rt->num_sms, cudaDevAttrMultiProcessorCount, config.device), op,
             "cudaDeviceGetAttribute");
  check_cuda(cudaStreamCreateWithFlags(&rt->stream, cudaStreamNonBlocking), op, "cudaStreamCreate");

  check_cublas(cublasCreate(&rt->cublas), op, "cublasCreate");
  check_cublas(cublasSetStream(rt->cublas, rt->stream), op, "cublasSetStream");
  rt->cublas_workspace_bytes = config.cublas_workspace_bytes;
  // Device memory through device_malloc, as alloc's: a failure names the free memory.
  rt->cublas_workspace = device_malloc(rt->cublas_workspace_bytes, config.device, op, "cuBLAS workspace");
  check_cublas(cublasSetWorkspace(rt->cublas, rt->cublas_workspace, rt->cublas_workspace_bytes), op,
               "cublasSetWorkspace");
  // Device-resident alpha/beta: a captured gemm must not hold a host pointer.
  check_cublas(cublasSetPointerMode(rt->cublas, CUBLAS_POINTER_MODE_DEVICE), op, "cublasSetPointerMode");
  const float one_zero[2] = {1.0f, 0.0f};
  auto* const one_zero_dev = static_cast<float*>(device_malloc(sizeof one_zero, config.device, op, "alpha/beta"));
  rt->one_zero = one_zero_dev;
  check_cuda(cudaMemcpy(one_zero_dev, one_zero, sizeof one_zero, cudaMemcpyHostToDevice), op, "cudaMemcpy(alpha/beta)");

  rt->attention_workspace_bytes = config.attention_workspace_bytes;
  if (rt->attention_workspace_bytes > 0) {
    rt->attention_workspace =
        static_cast<float*>(device_malloc(rt->attention_workspace_bytes, config.device, op, "attention workspace"));
  }
  rt->decode_state =
      static_cast<kernels::DecodeState*>(device_malloc(sizeof(kernels::DecodeState), config.device, op, "decode state"));
  const kernels::DecodeState initial{0, 0, 1};
  check_cuda(cudaMemcpy(rt->decode_state, &initial, sizeof initial, cudaMemcpyHostToDevice), op,
             "cudaMemcpy(decode state)");

  check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&rt->error_host), sizeof(kernels::DeviceErrorLog),
                           cudaHostAllocMapped),
             op, "cudaHostAlloc(device error log)");
  *rt->error_host = kernels::DeviceErrorLog{};
  check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&rt->error_device), rt->error_host, 0), op,
             "cudaHostGetDevicePointer(device error log)");
  // The copies above (alpha/beta, the decode state) went through the legacy
  // stream from pageable memory: cudaMemcpy may return before their DMA
  // lands, and the runtime's non-blocking stream does not wait for that
  // stream. Done once, before any op can read them.
  check_cuda(cudaDeviceSynchronize(), op, "cudaDeviceSynchronize");
  return rt;
}

CudaRuntime* create_runtime(const CudaBackendConfig& config) {
  auto* rt = new CudaRuntime();
  try {
    return create_runtime_steps(rt, config);
  } catch (...) {
    release_partial_runtime(rt);
    throw;
  }
}

}  // namespace

CudaRuntime& cuda_runtime(const CudaBackendConfig& config) {
  if (config.device < 0 || config.device >= kMaxDevices) {
    fail(ErrorCode::InvalidArgument, "CudaBackend: argument 'config.device' = {} is out of range", config.device);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    fail(ErrorCode::Cuda, "CudaBackend: no CUDA device is available");
  }
  if (config.device >= count) {
    fail(ErrorCode::InvalidArgument, "CudaBackend: argument 'config.device' = {} but only {} device(s) exist",
         config.device, count);
  }
  if (config.cublas_workspace_bytes == 0) {
    fail(ErrorCode::InvalidArgument, "CudaBackend: argument 'config.cublas_workspace_bytes' = 0");
  }
  std::lock_guard<std::mutex> create_lock(g_create_mutex);
  {
    std::lock_guard<std::mutex> lock(g_runtimes_mutex);
    CudaRuntime* existing = g_runtimes[config.device];
    if (existing != nullptr) {
      // Each per-device setting must agree with the device's runtime: as it
      // would run (the PDL switches are off without PDL) against as it runs.
      auto must_agree = [&](const char* field, auto asked, auto as_run, auto running) {
        if (as_run != running) {
          fail(ErrorCode::InvalidArgument, "CudaBackend: argument 'config.{}' = {} but device {} already runs with {}",
               field, asked, config.device, running);
        }
      };
      const bool pdl = config.programmatic_dependent_launch && existing->pdl_capable;
      must_agree("attention_workspace_bytes", config.attention_workspace_bytes, config.attention_workspace_bytes,
                 existing->attention_workspace_bytes);
      must_agree("programmatic_dependent_launch", config.programmatic_dependent_launch, pdl, existing->pdl);
      must_agree("pdl_early_trigger", config.pdl_early_trigger, config.pdl_early_trigger && existing->pdl,
                 existing->pdl_trigger);
      must_agree("pdl_chain_release", config.pdl_chain_release, config.pdl_chain_release && existing->pdl,
                 existing->pdl_chain);
      must_agree("gemm_prefetch_before_wait", config.gemm_prefetch_before_wait, config.gemm_prefetch_before_wait,
                 existing->gemm_prefetch);
      must_agree("gemm_weights_before_wait", config.gemm_weights_before_wait, config.gemm_weights_before_wait,
                 existing->gemm_weights);
      must_agree("attention_kv_before_wait", config.attention_kv_before_wait, config.attention_kv_before_wait,
                 existing->attention_kv);
      must_agree("gptq_weights_evict_first", config.gptq_weights_evict_first, config.gptq_weights_evict_first,
                 existing->gptq_evict_first);
      must_agree("cublas_workspace_bytes", config.cublas_workspace_bytes, config.cublas_workspace_bytes,
                 existing->cublas_workspace_bytes);
      return *existing;
    }
  }
  CudaRuntime* rt = create_runtime(config);
  std::lock_guard<std::mutex> lock(g_runtimes_mutex);
  g_runtimes[config.device] = rt;  // still empty: creations are serialized
  const CudaRuntime& made = *rt;
  g_launch_state[config.device].store(kConfigured | (made.pdl ? kLaunchPdl : 0) | (made.pdl_trigger ? kLaunchTrigger : 0) |
                                          (made.gemm_prefetch ? kLaunchGemmPrefetch : 0) |
                                          (made.gemm_weights ? kLaunchGemmWeights : 0) |
                                          (made.gptq_evict_first ? kLaunchGptqEvictFirst : 0) |
                                          (made.pdl_chain ? kLaunchChainRelease : 0),
                                      std::memory_order_relaxed);
  return *rt;
}

}  // namespace ferrum::detail

namespace ferrum::kernels {

void* driver_entry_point(const char* name) noexcept {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess) {
    return p;
  }
  (void)cudaGetLastError();  // not sticky: a fallback's launch check must not see it
  return nullptr;
}

}  // namespace ferrum::kernels

namespace ferrum::detail {

void activate_device(int device) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "CudaBackend", "cudaGetDevice");
  if (current != device) check_cuda(cudaSetDevice(device), "CudaBackend", "cudaSetDevice");
}

void abandon_capture(CudaRuntime& rt) noexcept {
  if (!rt.capturing) return;
  rt.capturing = false;
  rt.capture_communicator.reset();
  cudaGraph_t partial = nullptr;
  // Fails with cudaErrorStreamCaptureInvalidated when an illegal call broke
  // the capture; either way the stream leaves capture mode.
  cudaStreamEndCapture(rt.stream, &partial);
  if (partial != nullptr) cudaGraphDestroy(partial);
  cudaGetLastError();
  capture_closed(rt, /*kept=*/false);
}

void free_device_memory(void* ptr, int device) noexcept {
  if (ptr == nullptr) return;
  if (CudaRuntime* rt = runtime_of(device)) {
    std::lock_guard<std::mutex> lock(rt->retire_mutex);
    std::vector<void*>* retire =
        rt->capture_open ? &rt->retired_capture : rt->graph_held ? &rt->retired_held : nullptr;
    if (retire != nullptr) {
      try {
        retire->push_back(ptr);
      } catch (...) {
        // No room to remember it: leaking it is safe, freeing it is not.
      }
      return;
    }
  }
  free_now(ptr, device);
}

void capture_opened(CudaRuntime& rt) noexcept {
  std::lock_guard<std::mutex> lock(rt.retire_mutex);
  rt.capture_open = true;
}

void capture_closed(CudaRuntime& rt, bool kept) noexcept {
  std::vector<void*> to_free;
  {
    std::lock_guard<std::mutex> lock(rt.retire_mutex);
    if (!rt.capture_open) return;
    rt.capture_open = false;
    // Kept: the new graph may point at what its capture saw freed (the
    // previous graph and its retirees went in graph_dropped). Discarded with
    // a graph held: that graph may point at it. Either way it waits for the
    // held graph; a failed merge leaves it in retired_capture, which
    // graph_dropped frees too.
    if (kept) rt.graph_held = true;
    if (rt.graph_held) {
      try {
        rt.retired_held.insert(rt.retired_held.end(), rt.retired_capture.begin(), rt.retired_capture.end());
        rt.retired_capture.clear();
      } catch (...) {
      }
    } else {
      to_free.swap(rt.retired_capture);
    }
  }
  free_all(to_free, rt.device);
}

void graph_dropped(CudaRuntime& rt) noexcept {
  std::vector<void*> held, captured;
  {
    std::lock_guard<std::mutex> lock(rt.retire_mutex);
    rt.graph_held = false;
    held.swap(rt.retired_held);
    if (!rt.capture_open) captured.swap(rt.retired_capture);
  }
  free_all(held, rt.device);
  free_all(captured, rt.device);
}

std::size_t retired_allocations(CudaRuntime& rt) noexcept {
  std::lock_guard<std::mutex> lock(rt.retire_mutex);
  return rt.retired_held.size() + rt.retired_capture.size();
}

void abandon_capture_on_current_device() noexcept {
  if (CudaRuntime* rt = runtime_of_current_device()) abandon_capture(*rt);
}

void* device_malloc(std::size_t bytes, int device, const char* op, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaSuccess) return p;
  (void)cudaGetLastError();
  std::size_t free_bytes = 0, total_bytes = 0;
  const bool known = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  if (!known) (void)cudaGetLastError();
  fail(ErrorCode::OutOfMemory, "{}: cudaMalloc of {} bytes{}{} on device {} failed: {}{}", op, bytes,
       what != nullptr ? " of " : "", what != nullptr ? what : "", device, cudaGetErrorString(err),
       known ? fmt::format(" ({} of the device's {} bytes free)", free_bytes, total_bytes)
             : std::string(" (free memory unknown: cudaMemGetInfo failed too)"));
}

void check_cuda(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return;
  kernels::throw_cuda_error(op, what, err);
}

void check_cublas(cublasStatus_t status, const char* op, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  abandon_capture_on_current_device();
  fail(ErrorCode::Cublas, "{}: {} failed: {} ({})", op, what, cublasGetStatusName(status),
       cublasGetStatusString(status));
}

}  // namespace ferrum::detail

namespace ferrum::kernels {

void throw_cuda_error(const char* op, const char* what, cudaError_t err) {
  detail::abandon_capture_on_current_device();
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::OutOfMemory
                         : (err == cudaErrorStreamCaptureUnsupported || err == cudaErrorStreamCaptureInvalidated)
                             ? ErrorCode::GraphCapture
                             : ErrorCode::Cuda;
  detail::fail(code, "{}: {} failed: {} ({})", op, what, cudaGetErrorName(err), cudaGetErrorString(err));
}

LaunchSwitches launch_switches() {
  const int state = detail::launch_state_of_current_device();
  LaunchSwitches s;
  s.gemm_prefetch_before_wait = (state & detail::kLaunchGemmPrefetch) != 0;
  s.gemm_weights_before_wait = (state & detail::kLaunchGemmWeights) != 0;
  s.gptq_weights_evict_first = (state & detail::kLaunchGptqEvictFirst) != 0;
  s.pdl_early_trigger = (state & detail::kLaunchTrigger) != 0;
  s.pdl_chain_release = (state & detail::kLaunchChainRelease) != 0;
  return s;
}

namespace {

// Attribute kAttr of `device`, cached per device (attributes never change;
// a race only repeats the query).
template <cudaDeviceAttr kAttr>
cudaError_t cached_device_attribute(int device, int* value) {
  static PerDeviceAnswers<int, 1> known;
  if (device < 0 || device >= kMaxDevices) return cudaDeviceGetAttribute(value, kAttr, device);
  cudaError_t err = cudaSuccess;
  const std::optional<int> answer = known.get(device, 0, [&]() -> std::optional<int> {
    err = cudaDeviceGetAttribute(value, kAttr, device);
    if (err != cudaSuccess || *value < 0 || *value == std::numeric_limits<int>::max()) return std::nullopt;
    return *value;
  });
  if (answer) *value = *answer;
  return err;
}

// The current device's compute capability as major * 10 + minor (0: no
// device, or the query failed).
int current_device_cc() {
  int device = -1, major = 0, minor = 0;
  if (!detail::query_current_device(&device)) return 0;
  if (cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device, &major) != cudaSuccess ||
      cached_device_attribute<cudaDevAttrComputeCapabilityMinor>(device, &minor) != cudaSuccess) {
    (void)cudaGetLastError();  // answered "no device", not raised
    return 0;
  }
  return major * 10 + minor;
}

// Attribute kAttr of `device`, cached; throws ferrum::Error
// (ErrorCode::Cuda) naming `op` and `what` when a query fails.
template <cudaDeviceAttr kAttr>
int device_attribute(int device, const char* op, const char* what) {
  int value = 0;
  const cudaError_t err = cached_device_attribute<kAttr>(device, &value);
  if (err != cudaSuccess) throw_cuda_error(op, what, err);
  return value;
}

template <cudaDeviceAttr kAttr>
int current_device_attribute(const char* op, const char* what) {
  return device_attribute<kAttr>(current_device_index(op), op, what);
}

}  // namespace

int current_device_index(const char* op) {
  int device = -1;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaGetDevice", err);
  if (device < 0 || device >= kMaxDevices) {
    detail::abandon_capture_on_current_device();
    detail::fail(ErrorCode::Unsupported, "{}: the current device {} is past the {} devices this library keeps state for",
                 op, device, kMaxDevices);
  }
  return device;
}

bool device_is_sm90_or_later() { return current_device_cc() >= 90; }

int device_sm_count(const char* op) {
  return current_device_attribute<cudaDevAttrMultiProcessorCount>(op, "cudaDeviceGetAttribute (multiprocessors)");
}

int device_l2_bytes(const char* op) {
  return current_device_attribute<cudaDevAttrL2CacheSize>(op, "cudaDeviceGetAttribute (L2 cache size)");
}

int device_sole_block_smem(const char* op) {
  // Asked on every decode plan: one device lookup for the three.
  const int device = current_device_index(op);
  const int per_sm = device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(
      device, op, "cudaDeviceGetAttribute (shared memory per SM)");
  const int reserved = device_attribute<cudaDevAttrReservedSharedMemoryPerBlock>(
      device, op, "cudaDeviceGetAttribute (reserved shared memory per block)");
  const int optin = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(
      device, op, "cudaDeviceGetAttribute (shared memory per block, opt-in)");
  // Two blocks need 2 x (bytes + reserved) <= per_sm; 128 past half of that
  // keeps the second out.
  const int sole = per_sm / 2 - reserved + 128;
  return sole <= optin ? sole : 0;
}

bool device_is_sm90a() { return current_device_cc() == 90; }

bool pdl_available() {
  const int device = try_current_device_index();
  if (device < 0) return false;
  // The device's CudaBackend runtime decides (its config).
  const int configured = detail::g_launch_state[device].load(std::memory_order_relaxed);
  if (configured != 0) return (configured & detail::kLaunchPdl) != 0;
  // A launcher used without a backend (a tuning bench): the device decides.
  return device_is_sm90_or_later();
}

// Both end a capture in progress first, as throw_cuda_error does: the stream
// stays usable and no graph silently lacks the op.
void throw_bad_dispatch(const char* op, const char* what, long long value) {
  detail::abandon_capture_on_current_device();
  detail::fail(ErrorCode::Internal, "{}: no kernel instance for {} = {}", op, what, value);
}

void throw_size_limit(const char* op, const char* what, long long value, long long limit) {
  detail::abandon_capture_on_current_device();
  detail::fail(ErrorCode::Unsupported, "{}: {} = {} is past the CUDA kernel's limit {}", op, what, value, limit);
}

}  // namespace ferrum::kernels
