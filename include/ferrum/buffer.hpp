// Buffer: a typed span of memory that one Backend owns (device memory for
// CudaBackend, host memory for CpuBackend). RAII, move-only.
#pragma once

#include <cstddef>

#include "ferrum/dtype.hpp"

namespace ferrum {

class Backend;

class Buffer {
 public:
  Buffer() noexcept = default;  // the null buffer: ops reject it (ErrorCode::NullBuffer)
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  DType dtype() const noexcept { return dtype_; }
  std::size_t numel() const noexcept { return numel_; }
  std::size_t nbytes() const noexcept { return numel_ * size_of(dtype_); }
  Backend* backend() const noexcept { return backend_; }
  bool owns_memory() const noexcept { return owning_; }
  bool is_null() const noexcept { return data_ == nullptr; }

  // A non-owning window of `count` elements starting at element `offset`.
  // The parent must outlive the view. Throws ShapeMismatch past the end.
  Buffer view(std::size_t offset, std::size_t count) const;

  // Wraps memory the caller owns (device memory for CudaBackend, host memory
  // for CpuBackend) so engines can pass their own allocations to ops.
  // Throws Misaligned if `ptr` is not aligned to the element size,
  // InvalidArgument for numel 0, a byte count past size_t, or memory the
  // backend's ops cannot reach (CudaBackend: pageable host memory, another
  // device's memory). CudaBackend also refuses device memory whose
  // allocation (as the driver reports it for cudaMalloc / cuMemAlloc) ends
  // before ptr + numel elements; elsewhere the extent is the caller's promise.
  static Buffer wrap(Backend& backend, void* ptr, DType dtype, std::size_t numel);

 private:
  friend class Backend;
  Buffer(Backend* backend, void* data, DType dtype, std::size_t numel, bool owning) noexcept
      : backend_(backend), data_(data), numel_(numel), dtype_(dtype), owning_(owning) {}
  void release() noexcept;

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  std::size_t numel_ = 0;
  DType dtype_ = DType::F16;
  bool owning_ = false;
};

}  // namespace ferrum
