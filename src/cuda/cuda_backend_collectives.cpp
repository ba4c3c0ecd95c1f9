// CudaBackend: the collectives (all_reduce, all_gather, broadcast,
// reduce_scatter) over NCCL.
// The checks are Backend's (src/backend.cpp).
#include "ferrum/cuda_backend.hpp"

#include <initializer_list>
#include <string>
#include <utility>

#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "cuda/nccl_check.hpp"

namespace ferrum {

using detail::ptr;

// Without a communicator the base class's world-size-1 identities apply. With
// one, each op is one NCCL call on the device's stream: no host sync, no
// allocation, so they can be captured into a graph like any kernel. Host
// memory is refused either way, so a call valid at one rank is valid at many.

// A capture records one communicator's collectives (the graph keeps that
// one alive): the first collective of a capture names it, and one of
// another communicator (another backend on this device) ends the capture
// with GraphCapture.
void CudaBackend::check_collective(const char* op,
                                   std::initializer_list<std::pair<const char*, const Buffer*>> buffers) {
  if (std::string host = detail::host_memory_argument(buffers); !host.empty()) {
    abandon_capture();
    detail::fail(ErrorCode::InvalidArgument, "{}: {}", op, host);
  }
  if (comm_ == nullptr || !rt_->capturing) return;
  if (rt_->capture_communicator == nullptr) {
    rt_->capture_communicator = comm_;
  } else if (rt_->capture_communicator != comm_) {
    const Communicator& held = *rt_->capture_communicator;
    const int rank = held.rank(), world = held.world_size();
    abandon_capture();
    detail::fail(ErrorCode::GraphCapture,
                 "{}: the capture in progress already holds collectives of another communicator (rank {} of {}), "
                 "not this backend's (rank {} of {}); one graph holds one communicator's collectives",
                 op, rank, world, comm_->rank(), comm_->world_size());
  }
}

void CudaBackend::do_all_reduce(Buffer& buf, std::size_t len, ReduceOp op) {
  check_collective("all_reduce", {{"buf", &buf}});
  if (comm_ == nullptr) return Backend::do_all_reduce(buf, len, op);
  detail::activate_device(device_);
  detail::nccl_all_reduce(*comm_, ptr(buf), len, buf.dtype(), op, rt_->stream);
}

void CudaBackend::do_all_gather(const Buffer& local, Buffer& global, std::size_t local_len) {
  check_collective("all_gather", {{"local", &local}, {"global", &global}});
  if (comm_ == nullptr) return Backend::do_all_gather(local, global, local_len);
  detail::activate_device(device_);
  detail::nccl_all_gather(*comm_, ptr(local), ptr(global), local_len, local.dtype(), rt_->stream);
}

void CudaBackend::do_broadcast(Buffer& buf, std::size_t len, std::size_t src_rank) {
  check_collective("broadcast", {{"buf", &buf}});
  if (comm_ == nullptr) return Backend::do_broadcast(buf, len, src_rank);
  detail::activate_device(device_);
  detail::nccl_broadcast(*comm_, ptr(buf), len, buf.dtype(), static_cast<int>(src_rank), rt_->stream);
}

void CudaBackend::do_reduce_scatter(const Buffer& input, Buffer& output, std::size_t len, ReduceOp op) {
  check_collective("reduce_scatter", {{"input", &input}, {"output", &output}});
  if (comm_ == nullptr) return Backend::do_reduce_scatter(input, output, len, op);
  detail::activate_device(device_);
  detail::nccl_reduce_scatter(*comm_, ptr(input), ptr(output), len, input.dtype(), op, rt_->stream);
}

}  // namespace ferrum
