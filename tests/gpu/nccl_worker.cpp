// ferrum_nccl_worker: one rank of a one-process-per-GPU communicator, started
// by test_nccl.cpp (OneProcessPerGpu) with posix_spawn.
//
//   ferrum_nccl_worker MODE RANK WORLD DEVICE ID_HEX
//
// MODE checks:     joins the communicator (Communicator::create with the id
//                  the parent made), runs nccl_checks.hpp's collective checks
//                  on a CudaBackend and exits 0 only if every one passed.
// MODE peer-gone:  after one all_reduce on every rank, every rank but 0
//                  exits abruptly; rank 0's next all_reduce + synchronize()
//                  must throw ErrorCode::Nccl (NCCL error, asynchronous
//                  error or timeout) and abort the communicator, and a later
//                  all_reduce must throw at once. Exit 0 if so.
// Exit codes: 0 pass, 1 a check failed, 2 bad arguments, 3 an unexpected error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gpu/nccl_checks.hpp"

namespace {

using namespace ferrum;
using namespace ferrum::test::nccl;

int run_checks(CudaBackend& be) {
  const std::vector<std::string> failures = run_collective_checks(be);
  for (const std::string& f : failures) std::fprintf(stderr, "ferrum_nccl_worker: FAIL %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

int run_peer_gone(CudaBackend& be) {
  Buffer buf = be.upload(std::vector<float>(1024, 1.0f), DType::F32);
  try {
    // NCCL may notice at the call already; otherwise synchronize must.
    be.all_reduce(buf, 1024, ReduceOp::Sum);
    be.synchronize();
    std::fprintf(stderr, "ferrum_nccl_worker: FAIL all_reduce + synchronize returned although the peer is gone\n");
    return 1;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Nccl) {
      std::fprintf(stderr, "ferrum_nccl_worker: FAIL all_reduce + synchronize threw %s: %s\n",
                   std::string(to_string(e.code())).c_str(), e.what());
      return 1;
    }
    std::fprintf(stderr, "ferrum_nccl_worker: the lost peer was reported as expected: %s\n", e.what());
  }
  if (!be.communicator()->aborted()) {
    std::fprintf(stderr, "ferrum_nccl_worker: FAIL the communicator is not aborted after the failed synchronize\n");
    return 1;
  }
  try {
    be.all_reduce(buf, 1024, ReduceOp::Sum);
    std::fprintf(stderr, "ferrum_nccl_worker: FAIL all_reduce on an aborted communicator did not throw\n");
    return 1;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Nccl) {
      std::fprintf(stderr, "ferrum_nccl_worker: FAIL all_reduce after abort threw %s: %s\n",
                   std::string(to_string(e.code())).c_str(), e.what());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s checks|peer-gone RANK WORLD DEVICE ID_HEX\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]), device = std::atoi(argv[4]);
  CommUniqueId id;
  if ((mode != "checks" && mode != "peer-gone") || !id_from_hex(argv[5], id)) {
    std::fprintf(stderr, "ferrum_nccl_worker: bad arguments (mode '%s')\n", mode.c_str());
    return 2;
  }
  keep_nvls_off();  // inherited from the parent too; set here for direct runs
  try {
    CudaBackendConfig config;
    config.device = device;
    config.communicator = Communicator::create(id, world, rank, device);
    config.collective_timeout = std::chrono::milliseconds(mode == "peer-gone" ? 10000 : 60000);
    CudaBackend be(config);
    if (mode == "peer-gone") {
      // One all_reduce on every rank first (NCCL connects lazily, on first
      // use); then every rank but 0 vanishes without a word, like a crashed
      // process, and rank 0's next all_reduce waits for it.
      Buffer warm = be.upload(std::vector<float>(1024, 1.0f), DType::F32);
      be.all_reduce(warm, 1024, ReduceOp::Sum);
      be.synchronize();
      if (rank != 0) std::_Exit(0);
    }
    return mode == "checks" ? run_checks(be) : run_peer_gone(be);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferrum_nccl_worker: rank %d: unexpected error: %s\n", rank, e.what());
    return 3;
  }
}
