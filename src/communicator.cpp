// Communicator (communicator.hpp) and the NCCL calls behind CudaBackend's
// collectives (nccl_check.hpp). The only file that includes nccl.h. Built
// without NCCL, the factories check their arguments and then throw
// ErrorCode::Unsupported; nothing else can run because no Communicator can
// exist. That build needs no CUDA either, so a FERRUM_CUDA=OFF library
// compiles this file too (FERRUM_WITH_NCCL needs FERRUM_CUDA).
//
// NVLink multicast (NVLS) must stay off on the H200 machines: nothing here
// calls cuMulticastCreate, and the processes that create communicators there
// (tests, benchmark, engines) set NCCL_NVLS_ENABLE=0 first. The library does
// not touch the environment itself.
#include "ferrum/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "common/fail.hpp"
#include "cuda/nccl_check.hpp"

#if defined(FERRUM_WITH_NCCL) && FERRUM_WITH_NCCL
#define FERRUM_HAVE_NCCL 1
#include <nccl.h>

#include "cuda/cuda_runtime.hpp"
#else
#define FERRUM_HAVE_NCCL 0
#endif

namespace ferrum {

struct Communicator::Impl {
  int world_size = 1;
  int rank = 0;
  int device = 0;
  // Guards `comm` and `reason` against abort() racing a poll of the
  // asynchronous error (abort may come from a watchdog thread).
  mutable std::mutex mutex;
  std::atomic<bool> aborted{false};
  std::string reason;
#if FERRUM_HAVE_NCCL
  ncclComm_t comm = nullptr;
#endif
};

namespace detail {

struct CommunicatorAccess {
  static Communicator::Impl& impl(Communicator& c) noexcept { return *c.impl_; }
  static std::shared_ptr<Communicator> make(std::unique_ptr<Communicator::Impl> impl) {
    return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
  }
};

namespace {

using Impl = Communicator::Impl;

[[noreturn]] void fail_without_nccl(const char* op) {
  fail(ErrorCode::Unsupported,
       "{}: ferrum was built without NCCL (FERRUM_WITH_NCCL is OFF), so it has no communicator; rebuild with "
       "NCCL found (NCCL_ROOT) for tensor parallelism",
       op);
}

// The device exists (checked after the NCCL check, so that a build without
// NCCL says so first).
[[maybe_unused]] void check_device(const char* op, const char* arg, int device) {
  const int count = cuda_device_count();
  if (count == 0) fail(ErrorCode::Cuda, "{}: no CUDA device is available (argument '{}' = {})", op, arg, device);
  if (device >= count) {
    fail(ErrorCode::InvalidArgument, "{}: argument '{}' = {} but only {} device(s) exist", op, arg, device, count);
  }
}

#if FERRUM_HAVE_NCCL

// Makes `device` current for its lifetime, restoring the previous device
// (errors ignored: used on teardown paths).
class DeviceScope {
 public:
  explicit DeviceScope(int device) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
    cudaGetLastError();
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
    cudaGetLastError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

static_assert(sizeof(ncclUniqueId) == sizeof(CommUniqueId::bytes), "CommUniqueId must hold an ncclUniqueId");

[[noreturn]] void fail_nccl(ncclResult_t result, const char* op, const char* what) {
  abandon_capture_on_current_device();
  const char* last = ncclGetLastError(nullptr);
  fail(ErrorCode::Nccl, "{}: {} failed: {} (ncclResult {}){}{}", op, what, ncclGetErrorString(result),
       static_cast<int>(result), (last != nullptr && *last != '\0') ? "; NCCL says: " : "",
       last != nullptr ? last : "");
}

void check_nccl(ncclResult_t result, const char* op, const char* what) {
  if (result != ncclSuccess) fail_nccl(result, op, what);
}

ncclDataType_t nccl_dtype(DType dtype, const char* op) {
  switch (dtype) {
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::F32: return ncclFloat32;
    default: break;
  }
  abandon_capture_on_current_device();
  fail(ErrorCode::Internal, "{}: dtype {} reached NCCL unvalidated", op, to_string(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op, const char* name) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Prod: return ncclProd;
    case ReduceOp::Avg: return ncclAvg;  // NCCL >= 2.10
  }
  abandon_capture_on_current_device();
  fail(ErrorCode::Internal, "{}: ReduceOp {} reached NCCL unvalidated", name, static_cast<int>(op));
}

// The live NCCL handle, or a throw naming why it is gone.
ncclComm_t live(Impl& im, const char* op) {
  if (im.aborted.load(std::memory_order_acquire)) {
    abandon_capture_on_current_device();
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(im.mutex);
      reason = im.reason;
    }
    fail(ErrorCode::Nccl, "{}: the communicator (rank {} of {}, device {}) was aborted: {}", op, im.rank,
         im.world_size, im.device, reason);
  }
  return im.comm;
}

void abort_locked(Impl& im, std::string reason) noexcept {
  if (im.aborted.load(std::memory_order_acquire)) return;
  im.reason = std::move(reason);
  im.aborted.store(true, std::memory_order_release);
  if (im.comm != nullptr) {
    DeviceScope scope(im.device);
    ncclCommAbort(im.comm);  // makes kernels waiting on peers return; frees the communicator
    im.comm = nullptr;
  }
}

// The communicator's pending asynchronous error, ncclSuccess where there is
// none (ncclInProgress is none); a failing query counts as one.
ncclResult_t pending_async_error(ncclComm_t comm) noexcept {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm, &async);
  if (query != ncclSuccess) return query;
  return async == ncclInProgress ? ncclSuccess : async;
}

#endif  // FERRUM_HAVE_NCCL

}  // namespace

// ── Collectives (nccl_check.hpp) ───────────────────────────────────────────

#if FERRUM_HAVE_NCCL

void nccl_all_reduce(Communicator& comm, void* buf, std::size_t len, DType dtype, ReduceOp op, cudaStream_t stream) {
  Impl& im = CommunicatorAccess::impl(comm);
  const ncclComm_t c = live(im, "all_reduce");
  check_nccl(ncclAllReduce(buf, buf, len, nccl_dtype(dtype, "all_reduce"), nccl_op(op, "all_reduce"), c, stream),
             "all_reduce", "ncclAllReduce");
}

void nccl_all_gather(Communicator& comm, const void* local, void* global, std::size_t len, DType dtype,
                     cudaStream_t stream) {
  Impl& im = CommunicatorAccess::impl(comm);
  const ncclComm_t c = live(im, "all_gather");
  check_nccl(ncclAllGather(local, global, len, nccl_dtype(dtype, "all_gather"), c, stream), "all_gather",
             "ncclAllGather");
}

void nccl_broadcast(Communicator& comm, void* buf, std::size_t len, DType dtype, int root, cudaStream_t stream) {
  Impl& im = CommunicatorAccess::impl(comm);
  const ncclComm_t c = live(im, "broadcast");
  check_nccl(ncclBroadcast(buf, buf, len, nccl_dtype(dtype, "broadcast"), root, c, stream), "broadcast",
             "ncclBroadcast");
}

void nccl_reduce_scatter(Communicator& comm, const void* input, void* output, std::size_t len, DType dtype,
                         ReduceOp op, cudaStream_t stream) {
  Impl& im = CommunicatorAccess::impl(comm);
  const ncclComm_t c = live(im, "reduce_scatter");
  check_nccl(ncclReduceScatter(input, output, len, nccl_dtype(dtype, "reduce_scatter"),
                               nccl_op(op, "reduce_scatter"), c, stream),
             "reduce_scatter", "ncclReduceScatter");
}

std::string nccl_async_error(Communicator& comm) {
  Impl& im = CommunicatorAccess::impl(comm);
  std::lock_guard<std::mutex> lock(im.mutex);
  if (im.aborted.load(std::memory_order_acquire) || im.comm == nullptr) return {};
  const ncclResult_t async = pending_async_error(im.comm);
  if (async == ncclSuccess) return {};
  const char* last = ncclGetLastError(im.comm);
  return fmt::format("{} (ncclResult {}){}{}", ncclGetErrorString(async), static_cast<int>(async),
                     (last != nullptr && *last != '\0') ? "; NCCL says: " : "", last != nullptr ? last : "");
}

void nccl_abort(Communicator& comm, const std::string& reason) noexcept {
  Impl& im = CommunicatorAccess::impl(comm);
  std::lock_guard<std::mutex> lock(im.mutex);
  abort_locked(im, reason);
}

#else  // !FERRUM_HAVE_NCCL: unreachable, since no Communicator can be made.

void nccl_all_reduce(Communicator&, void*, std::size_t, DType, ReduceOp, cudaStream_t) {
  fail_without_nccl("all_reduce");
}
void nccl_all_gather(Communicator&, const void*, void*, std::size_t, DType, cudaStream_t) {
  fail_without_nccl("all_gather");
}
void nccl_broadcast(Communicator&, void*, std::size_t, DType, int, cudaStream_t) { fail_without_nccl("broadcast"); }
void nccl_reduce_scatter(Communicator&, const void*, void*, std::size_t, DType, ReduceOp, cudaStream_t) {
  fail_without_nccl("reduce_scatter");
}
std::string nccl_async_error(Communicator&) { return {}; }
void nccl_abort(Communicator& comm, const std::string& reason) noexcept {
  Impl& im = CommunicatorAccess::impl(comm);
  std::lock_guard<std::mutex> lock(im.mutex);
  if (im.aborted.load()) return;
  im.reason = reason;
  im.aborted.store(true);
}

#endif  // FERRUM_HAVE_NCCL

}  // namespace detail

// ── Communicator ───────────────────────────────────────────────────────────

using detail::CommunicatorAccess;
using detail::fail;

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() {
#if FERRUM_HAVE_NCCL
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->aborted.load() && impl_->comm != nullptr) {
    detail::DeviceScope scope(impl_->device);
    // A communicator with a pending asynchronous error cannot be destroyed
    // cleanly (destroy would wait on a peer that is gone): abort it instead.
    if (detail::pending_async_error(impl_->comm) != ncclSuccess) {
      ncclCommAbort(impl_->comm);
    } else {
      ncclCommDestroy(impl_->comm);  // communicators of one create_all are released together by NCCL
    }
    impl_->comm = nullptr;
  }
#endif
}

bool Communicator::available() noexcept { return FERRUM_HAVE_NCCL != 0; }

CommUniqueId Communicator::new_unique_id() {
#if FERRUM_HAVE_NCCL
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);  // needs no CUDA context
  if (r != ncclSuccess) detail::fail_nccl(r, "Communicator::new_unique_id", "ncclGetUniqueId");
  CommUniqueId id;
  std::memcpy(id.bytes.data(), uid.internal, sizeof uid.internal);
  return id;
#else
  detail::fail_without_nccl("Communicator::new_unique_id");
#endif
}

std::shared_ptr<Communicator> Communicator::create(const CommUniqueId& id, int world_size, int rank, int device) {
  const char* op = "Communicator::create";
  if (world_size < 1) fail(ErrorCode::InvalidArgument, "{}: argument 'world_size' = {}, must be at least 1", op, world_size);
  if (rank < 0 || rank >= world_size) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'rank' = {} is not in [0, world_size = {})", op, rank, world_size);
  }
  if (device < 0) fail(ErrorCode::InvalidArgument, "{}: argument 'device' = {} is negative", op, device);
  if (std::all_of(id.bytes.begin(), id.bytes.end(), [](char c) { return c == 0; })) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'id' is all zeros; make it with Communicator::new_unique_id()", op);
  }
#if FERRUM_HAVE_NCCL
  detail::check_device(op, "device", device);
  detail::check_cuda(cudaSetDevice(device), op, "cudaSetDevice");
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes.data(), sizeof uid.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, uid, rank, &config);
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    detail::fail_nccl(r, op, fmt::format("ncclCommInitRankConfig(rank {} of {}, device {})", rank, world_size, device).c_str());
  }
  auto impl = std::make_unique<Impl>();
  impl->world_size = world_size;
  impl->rank = rank;
  impl->device = device;
  impl->comm = comm;
  return CommunicatorAccess::make(std::move(impl));
#else
  detail::fail_without_nccl(op);
#endif
}

std::vector<std::shared_ptr<Communicator>> Communicator::create_all(std::span<const int> devices) {
  const char* op = "Communicator::create_all";
  if (devices.empty()) fail(ErrorCode::InvalidArgument, "{}: argument 'devices' is empty", op);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0) fail(ErrorCode::InvalidArgument, "{}: argument 'devices[{}]' = {} is negative", op, i, devices[i]);
    for (std::size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        fail(ErrorCode::InvalidArgument, "{}: argument 'devices' lists device {} twice (at {} and {})", op,
             devices[i], j, i);
      }
    }
  }
#if FERRUM_HAVE_NCCL
  for (std::size_t i = 0; i < devices.size(); ++i) {
    detail::check_device(op, fmt::format("devices[{}]", i).c_str(), devices[i]);
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  if (r != ncclSuccess) {
    for (ncclComm_t c : comms) {
      if (c != nullptr) ncclCommAbort(c);
    }
    detail::fail_nccl(r, op, "ncclCommInitAll");
  }
  std::vector<std::shared_ptr<Communicator>> out;
  out.reserve(devices.size());
  for (int i = 0; i < n; ++i) {
    auto impl = std::make_unique<Impl>();
    impl->world_size = n;
    impl->rank = i;
    impl->device = devices[static_cast<std::size_t>(i)];
    impl->comm = comms[static_cast<std::size_t>(i)];
    out.push_back(CommunicatorAccess::make(std::move(impl)));
  }
  return out;
#else
  detail::fail_without_nccl(op);
#endif
}

void Communicator::group_start() {
#if FERRUM_HAVE_NCCL
  const ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) detail::fail_nccl(r, "Communicator::group_start", "ncclGroupStart");
#else
  detail::fail_without_nccl("Communicator::group_start");
#endif
}

void Communicator::group_end() {
#if FERRUM_HAVE_NCCL
  const ncclResult_t r = ncclGroupEnd();
  if (r != ncclSuccess) detail::fail_nccl(r, "Communicator::group_end", "ncclGroupEnd");
#else
  detail::fail_without_nccl("Communicator::group_end");
#endif
}

int Communicator::world_size() const noexcept { return impl_->world_size; }
int Communicator::rank() const noexcept { return impl_->rank; }
int Communicator::device() const noexcept { return impl_->device; }

void Communicator::abort() noexcept { detail::nccl_abort(*this, "Communicator::abort() was called"); }

bool Communicator::aborted() const noexcept { return impl_->aborted.load(std::memory_order_acquire); }

std::string Communicator::abort_reason() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->reason;
}

void* Communicator::native_handle() const noexcept {
#if FERRUM_HAVE_NCCL
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->comm;
#else
  return nullptr;
#endif
}

}  // namespace ferrum
