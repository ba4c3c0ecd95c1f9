#include "ferrum/buffer.hpp"

#include <cstdint>
#include <limits>
#include <utility>

#include "common/fail.hpp"
#include "ferrum/backend.hpp"

namespace ferrum {

Buffer::Buffer(std::shared_ptr<detail::BufferOwner> owner, void* data, DType dtype, std::size_t numel, void* alloc,
               bool host_memory) noexcept
    : owner_(std::move(owner)),
      data_(data),
      numel_(numel),
      dtype_(dtype),
      host_memory_(host_memory),
      alloc_(alloc),
      alloc_bytes_(alloc != nullptr ? numel * size_of(dtype) : 0) {}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::move(other.owner_)),
      data_(std::exchange(other.data_, nullptr)),
      numel_(std::exchange(other.numel_, 0)),
      dtype_(other.dtype_),
      host_memory_(std::exchange(other.host_memory_, false)),
      alloc_(std::exchange(other.alloc_, nullptr)),
      alloc_bytes_(std::exchange(other.alloc_bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this == &other) return *this;
  // What this Buffer held: an allocation it frees, and that allocation's
  // whole extent (not the window it spans now, which x = x.view(...) may
  // have narrowed).
  std::shared_ptr<detail::BufferOwner> old_owner = std::move(owner_);
  void* const old_alloc = std::exchange(alloc_, nullptr);
  const std::size_t old_alloc_bytes = std::exchange(alloc_bytes_, 0);
  owner_ = std::move(other.owner_);
  data_ = std::exchange(other.data_, nullptr);
  numel_ = std::exchange(other.numel_, 0);
  dtype_ = other.dtype_;
  host_memory_ = std::exchange(other.host_memory_, false);
  alloc_ = std::exchange(other.alloc_, nullptr);
  alloc_bytes_ = std::exchange(other.alloc_bytes_, 0);
  if (old_alloc != nullptr) {
    // x = x.view(...), or any view of the allocation x holds: the view
    // keeps the allocation it lies in, rather than pointing into memory
    // freed under it.
    const auto* const old_begin = static_cast<const std::uint8_t*>(old_alloc);
    const auto* const old_end = old_begin + old_alloc_bytes;
    const auto* const begin = static_cast<const std::uint8_t*>(data_);
    const bool inside = alloc_ == nullptr && owner_ == old_owner && begin != nullptr && begin >= old_begin &&
                        begin + nbytes() <= old_end;
    if (inside) {
      alloc_ = old_alloc;
      alloc_bytes_ = old_alloc_bytes;
    } else if (old_owner != nullptr && old_owner->free != nullptr) {
      old_owner->free(old_alloc, old_owner->device);
    }
  }
  return *this;
}

void Buffer::release() noexcept {
  if (alloc_ != nullptr && owner_ != nullptr && owner_->free != nullptr) owner_->free(alloc_, owner_->device);
  owner_.reset();
  data_ = nullptr;
  numel_ = 0;
  alloc_ = nullptr;
  alloc_bytes_ = 0;
  host_memory_ = false;
}

Backend* Buffer::backend() const noexcept {
  return owner_ != nullptr ? owner_->live() : nullptr;
}

Buffer Buffer::view(std::size_t offset, std::size_t count) const {
  if (data_ == nullptr) detail::fail(ErrorCode::NullBuffer, "Buffer::view: the buffer is null");
  if (offset > numel_ || count > numel_ - offset) {
    detail::fail(ErrorCode::ShapeMismatch,
                 "Buffer::view: a window of argument 'count' = {} elements at argument 'offset' = {} runs past the "
                 "buffer's {} elements",
                 count, offset, numel_);
  }
  auto* base = static_cast<std::uint8_t*>(data_) + offset * size_of(dtype_);
  return Buffer(owner_, base, dtype_, count, /*alloc=*/nullptr, host_memory_);
}

Buffer Buffer::wrap(Backend& backend, void* ptr, DType dtype, std::size_t numel) {
  if (ptr == nullptr) detail::fail(ErrorCode::NullBuffer, "Buffer::wrap: argument 'ptr' is null");
  if (size_of(dtype) == 0) {
    detail::fail(ErrorCode::InvalidArgument, "Buffer::wrap: argument 'dtype' = {} is not a DType", static_cast<int>(dtype));
  }
  if (reinterpret_cast<std::uintptr_t>(ptr) % size_of(dtype) != 0) {
    detail::fail(ErrorCode::Misaligned,
                 "Buffer::wrap: argument 'ptr' = {} is not aligned to the {}-byte {} element", ptr,
                 size_of(dtype), to_string(dtype));
  }
  if (numel == 0) detail::fail(ErrorCode::InvalidArgument, "Buffer::wrap: argument 'numel' = 0, must be at least 1");
  if (numel > std::numeric_limits<std::size_t>::max() / size_of(dtype)) {
    detail::fail(ErrorCode::InvalidArgument, "Buffer::wrap: argument 'numel' = {} {} elements overflow a byte count",
                 numel, to_string(dtype));
  }
  const bool host_memory = backend.check_wrapped(ptr, numel * size_of(dtype));
  return Buffer(backend.owner_, ptr, dtype, numel, /*alloc=*/nullptr, host_memory);
}

}  // namespace ferrum
