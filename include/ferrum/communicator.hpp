// Communicator: an NCCL communicator for tensor parallelism, created
// explicitly by the engine and attached to a CudaBackend through
// CudaBackendConfig::communicator. world_size, rank and device come from it
// (no environment variables are read).
//
// Two ways to make one:
//   one process per GPU   rank 0 calls new_unique_id(), hands the 128 bytes
//                         to every process (its own transport), and each
//                         process calls create(id, world_size, rank, device);
//                         create blocks until all world_size ranks joined.
//   one process, N GPUs   create_all(devices): one communicator per device,
//                         rank i on devices[i] (ncclCommInitAll).
//
// NCCL itself never appears in this header (nccl.h stays private).
// Built without NCCL (FERRUM_WITH_NCCL off), every factory throws
// ErrorCode::Unsupported and available() is false.
//
// Threads: like the NCCL communicator it wraps, a Communicator (and the
// backends holding it) is used by one thread at a time. A process driving
// several GPUs issues each rank's collectives from its own thread, or from
// one thread between group_start() and group_end(). abort() may be called
// from any thread while another waits in CudaBackend::synchronize(), not
// while another thread is inside a collective call on the same communicator.
//
// Workplace rule on the H200 machines: NVLink multicast (NVLS) must stay off.
// ferrum never calls cuMulticastCreate; the tests and benchmark set
// NCCL_NVLS_ENABLE=0 (unless already set) before creating communicators, and
// engines running there must do the same.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ferrum {

namespace detail {
struct CommunicatorAccess;
}

// The bootstrap id of one communicator (ncclUniqueId's bytes).
struct CommUniqueId {
  std::array<char, 128> bytes{};
};

class Communicator {
 public:
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Whether this build has NCCL (FERRUM_WITH_NCCL).
  static bool available() noexcept;

  // A fresh id (ncclGetUniqueId). Needs no CUDA context, so a launcher can
  // call it before it starts the per-GPU processes.
  static CommUniqueId new_unique_id();

  // Joins communicator `id` as `rank` of `world_size` on `device`. Blocks
  // until every rank has joined. InvalidArgument for world_size < 1,
  // rank outside [0, world_size) or a device that does not exist.
  static std::shared_ptr<Communicator> create(const CommUniqueId& id, int world_size, int rank, int device);

  // One communicator per device, rank i on devices[i]. InvalidArgument for an
  // empty list, a negative or missing device, or a device listed twice.
  static std::vector<std::shared_ptr<Communicator>> create_all(std::span<const int> devices);

  // Brackets collectives of several ranks issued from one thread (ncclGroupStart/End).
  static void group_start();
  static void group_end();

  int world_size() const noexcept;
  int rank() const noexcept;
  int device() const noexcept;

  // Aborts the communicator (ncclCommAbort): kernels waiting on peers return,
  // the NCCL resources are freed and every later collective throws
  // ErrorCode::Nccl. Idempotent. NCCL's abort waits until every CUDA graph
  // holding this communicator's collectives is destroyed: reset_graph() on
  // the backends holding one first (or let collective_timeout abort it,
  // which destroys the waiting backend's graph first), or this never
  // returns. With create_all's communicators, the last of the group to be
  // aborted waits for the graphs of the whole group.
  void abort() noexcept;
  bool aborted() const noexcept;
  // Why it was aborted ("" while it is not).
  std::string abort_reason() const;

  // The ncclComm_t, for engines that issue NCCL calls of their own on the
  // backend's stream; null once aborted.
  void* native_handle() const noexcept;

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  friend struct detail::CommunicatorAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferrum
