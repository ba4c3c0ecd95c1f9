// Buffer: a typed span of memory that one Backend owns (device memory for
// CudaBackend, host memory for CpuBackend; Backend::alloc_host gives
// page-locked host memory on CudaBackend). RAII, move-only.
#pragma once

#include <cstddef>
#include <memory>

#include "ferrum/dtype.hpp"

namespace ferrum {

class Backend;
namespace detail {
struct BufferOwner;  // ferrum/backend.hpp
}

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
  // The backend whose memory this is; null for the null buffer and once
  // that backend is destroyed (a Buffer may outlive its backend: its memory
  // stays valid and is freed with it, but no op takes it any more).
  Backend* backend() const noexcept;
  // Whether destroying it frees memory (an allocation, not a view or a wrap).
  bool owns_memory() const noexcept { return alloc_ != nullptr; }
  bool is_null() const noexcept { return data_ == nullptr; }
  // Whether it is host memory rather than the backend's own: alloc_host's
  // (on either backend), or a pointer that CudaBackend's Buffer::wrap found
  // to be page-locked host memory; views inherit it. The ops that need
  // device memory (CudaBackend's attention, GPTQ GEMMs and collectives)
  // refuse it.
  bool host_memory() const noexcept { return host_memory_; }

  // A non-owning window of `count` elements starting at element `offset`.
  // The parent must outlive the view, except that assigning a view over its
  // own parent (x = x.view(...)) hands it the parent's allocation. Throws
  // ShapeMismatch past the end.
  Buffer view(std::size_t offset, std::size_t count) const;

  // Wraps memory the caller owns (device memory for CudaBackend, host memory
  // for CpuBackend) so engines can pass their own allocations to ops. The
  // memory must outlive every captured graph that used it (the library
  // keeps its own allocations alive for graphs, not the caller's:
  // CudaBackend::graph_retained_allocations).
  // Throws Misaligned if `ptr` is not aligned to the element size,
  // InvalidArgument for numel 0, a byte count past size_t, or memory the
  // backend's ops cannot reach (CudaBackend: pageable host memory, another
  // device's memory; CpuBackend: CUDA device memory). CudaBackend also refuses device memory whose
  // allocation (as the driver reports it for cudaMalloc / cuMemAlloc) ends
  // before ptr + numel elements; elsewhere the extent is the caller's promise.
  static Buffer wrap(Backend& backend, void* ptr, DType dtype, std::size_t numel);

 private:
  friend class Backend;
  // `alloc`: the allocation the new Buffer frees, which starts at `data` and
  // spans its numel elements; null for a view or a wrap.
  Buffer(std::shared_ptr<detail::BufferOwner> owner, void* data, DType dtype, std::size_t numel, void* alloc,
         bool host_memory) noexcept;
  void release() noexcept;

  std::shared_ptr<detail::BufferOwner> owner_;  // shared with the backend, outlives it
  void* data_ = nullptr;
  std::size_t numel_ = 0;
  DType dtype_ = DType::F16;
  bool host_memory_ = false;
  void* alloc_ = nullptr;  // the allocation this Buffer frees (at or before data_); null: none
  // The allocation's whole extent in bytes, which x = x.view(...) keeps
  // while the window (data_, numel_) narrows; 0 with no allocation.
  std::size_t alloc_bytes_ = 0;
};

}  // namespace ferrum
