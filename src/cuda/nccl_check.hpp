// The NCCL side of CudaBackend's collectives, kept behind plain types so that
// nccl.h is included only by communicator.cpp (and only in FERRUM_WITH_NCCL
// builds). Private to src/.
//
// Every function expects the communicator's device to be current (the
// backend activates it first): on any failure it abandons a capture in
// progress on that device, then throws ErrorCode::Nccl with NCCL's error
// string and its last-error text. A communicator that was aborted makes every
// call throw at once.
#pragma once

#include <cstddef>
#include <string>

#include "ferrum/backend.hpp"
#include "ferrum/communicator.hpp"
#include "ferrum/cuda_backend.hpp"  // cudaStream_t, declared without the CUDA headers

namespace ferrum::detail {

// buf[len] in place.
void nccl_all_reduce(Communicator& comm, void* buf, std::size_t len, DType dtype, ReduceOp op, cudaStream_t stream);
// local[len] -> global[world * len], rank r's slice at r * len.
void nccl_all_gather(Communicator& comm, const void* local, void* global, std::size_t len, DType dtype,
                     cudaStream_t stream);
// buf[len] in place, from rank `root`.
void nccl_broadcast(Communicator& comm, void* buf, std::size_t len, DType dtype, int root, cudaStream_t stream);
// input[world * len] -> output[len].
void nccl_reduce_scatter(Communicator& comm, const void* input, void* output, std::size_t len, DType dtype,
                         ReduceOp op, cudaStream_t stream);

// ncclCommGetAsyncError. "" while healthy (or already aborted); otherwise
// the error's description. It does not abort: the caller does, after
// destroying any graph that holds the communicator's collectives (NCCL's
// abort waits for those graphs to go).
std::string nccl_async_error(Communicator& comm);

// Aborts the communicator with `reason` (kept for later errors). Idempotent.
void nccl_abort(Communicator& comm, const std::string& reason) noexcept;

}  // namespace ferrum::detail
