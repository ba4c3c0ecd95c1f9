#include "ferrum/buffer.hpp"

#include <cstdint>
#include <limits>
#include <utility>

#include "common/fail.hpp"
#include "ferrum/backend.hpp"

namespace ferrum {

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      numel_(std::exchange(other.numel_, 0)),
      dtype_(other.dtype_),
      owning_(std::exchange(other.owning_, false)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    numel_ = std::exchange(other.numel_, 0);
    dtype_ = other.dtype_;
    owning_ = std::exchange(other.owning_, false);
  }
  return *this;
}

void Buffer::release() noexcept {
  if (owning_ && data_ != nullptr && backend_ != nullptr) backend_->free_bytes(data_);
  data_ = nullptr;
  numel_ = 0;
  owning_ = false;
}

Buffer Buffer::view(std::size_t offset, std::size_t count) const {
  if (data_ == nullptr) detail::fail(ErrorCode::NullBuffer, "Buffer::view: the buffer is null");
  if (offset > numel_ || count > numel_ - offset) {
    detail::fail(ErrorCode::ShapeMismatch,
                 "Buffer::view: window [{}, {}) runs past the buffer's {} elements", offset,
                 offset + count, numel_);
  }
  auto* base = static_cast<std::uint8_t*>(data_) + offset * size_of(dtype_);
  return Buffer(backend_, base, dtype_, count, /*owning=*/false);
}

Buffer Buffer::wrap(Backend& backend, void* ptr, DType dtype, std::size_t numel) {
  if (ptr == nullptr) detail::fail(ErrorCode::NullBuffer, "Buffer::wrap: argument 'ptr' is null");
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
  backend.check_wrapped(ptr, numel * size_of(dtype));
  return Buffer(&backend, ptr, dtype, numel, /*owning=*/false);
}

}  // namespace ferrum
