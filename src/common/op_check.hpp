// OpCheck: the argument checks every public op runs before its backend
// implementation. Each failure throws ferrum::Error naming the op, the
// argument and the offending value. Private to src/.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <new>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <fmt/ranges.h>

#include "common/fail.hpp"
#include "ferrum/backend.hpp"

namespace ferrum::detail {

class OpCheck {
 public:
  OpCheck(Backend& backend, std::string_view op) : backend_(backend), op_(op) {}

  std::string_view op() const { return op_; }
  Backend& backend() const { return backend_; }

  // Every failure of an op goes through here: a capture in progress is
  // abandoned first (a half-recorded graph must never be replayed, and the
  // stream must stay usable), then the error is thrown.
  template <class... Args>
  [[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) const {
    backend_.abandon_capture();
    detail::fail(code, format, std::forward<Args>(args)...);
  }

  // Runs the backend's implementation of the op. Host memory running out
  // inside it (CpuBackend's scratch rows, load_gptq's host unpack and
  // repack) is OutOfMemory naming the op, through fail (a capture in
  // progress is abandoned as for any failure), not a std::bad_alloc or
  // std::length_error past the API. No cost unless something throws.
  template <class Body>
  decltype(auto) run(Body&& body) const {
    try {
      return std::forward<Body>(body)();
    } catch (const std::bad_alloc&) {
    } catch (const std::length_error&) {
    }
    fail(ErrorCode::OutOfMemory, "{}: host memory for the op's working storage could not be allocated", op_);
  }

  // Not null, owned by this backend, element-aligned.
  void buffer(std::string_view arg, const Buffer& b) const {
    if (b.is_null()) fail(ErrorCode::NullBuffer, "{}: argument '{}' is a null buffer", op_, arg);
    owned(arg, b.backend());
    const auto addr = reinterpret_cast<std::uintptr_t>(b.data());
    if (addr % size_of(b.dtype()) != 0) {
      fail(ErrorCode::Misaligned, "{}: argument '{}' at {:#x} is not aligned to its {}-byte {} elements",
           op_, arg, addr, size_of(b.dtype()), to_string(b.dtype()));
    }
  }

  // `owner` (what a Buffer or QuantWeight reports: null once its backend is
  // destroyed) is this backend.
  void owned(std::string_view arg, const Backend* owner) const {
    if (owner != &backend_) {
      fail(ErrorCode::WrongBackend, "{}: argument '{}' belongs to another backend ({})", op_, arg,
           owner == nullptr ? std::string("one since destroyed") : owner->name());
    }
  }

  void dtype(std::string_view arg, const Buffer& b, DType want) const {
    if (b.dtype() != want) {
      fail(ErrorCode::DTypeMismatch, "{}: argument '{}' has dtype {}, expected {}", op_, arg,
           to_string(b.dtype()), to_string(want));
    }
  }

  // f16 or bf16.
  void activation(std::string_view arg, const Buffer& b) const {
    if (!is_half_precision(b.dtype())) {
      fail(ErrorCode::DTypeMismatch, "{}: argument '{}' has dtype {}, expected f16 or bf16", op_, arg,
           to_string(b.dtype()));
    }
  }

  void one_of(std::string_view arg, const Buffer& b, std::initializer_list<DType> allowed) const {
    for (DType t : allowed) {
      if (b.dtype() == t) return;
    }
    fail(ErrorCode::DTypeMismatch, "{}: argument '{}' has dtype {}, which this op does not take", op_,
         arg, to_string(b.dtype()));
  }

  void same_dtype(std::string_view arg, const Buffer& b, std::string_view ref_arg,
                  const Buffer& ref) const {
    if (b.dtype() != ref.dtype()) {
      fail(ErrorCode::DTypeMismatch, "{}: argument '{}' has dtype {} but '{}' has {}; they must match",
           op_, arg, to_string(b.dtype()), ref_arg, to_string(ref.dtype()));
    }
  }

  // The buffer holds at least `need` elements (`shape` says what they are).
  void holds(std::string_view arg, const Buffer& b, std::size_t need, std::string_view shape) const {
    if (b.numel() < need) {
      fail(ErrorCode::ShapeMismatch, "{}: argument '{}' has {} elements but {} needs {}", op_, arg,
           b.numel(), shape, need);
    }
  }

  // A size argument: at least 1 and small enough for 32-bit kernel indices
  // per dimension.
  void size(std::string_view arg, std::size_t v) const {
    if (v == 0) fail(ErrorCode::InvalidArgument, "{}: argument '{}' = 0, must be at least 1", op_, arg);
    if (v > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      fail(ErrorCode::InvalidArgument, "{}: argument '{}' = {} exceeds the 32-bit limit {}", op_, arg,
           v, std::numeric_limits<std::int32_t>::max());
    }
  }

  // A softmax scale: in [0, kMaxAttentionScale] (`zero_means`: what 0
  // selects). NaN fails the first comparison.
  void scale(std::string_view arg, float v, std::string_view zero_means) const {
    if (!(v >= 0.0f && v <= kMaxAttentionScale)) {
      fail(ErrorCode::InvalidArgument, "{}: {} = {} must be in [0, {}] (kMaxAttentionScale; 0 means {})", op_, arg,
           v, kMaxAttentionScale, zero_means);
    }
  }

  // A norm's epsilon: finite and >= 0. `prefix`: "" where the op takes eps
  // itself, "cfg." where a config struct carries it (joined only on failure).
  void eps(std::string_view prefix, float v) const {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      fail(ErrorCode::InvalidArgument, "{}: argument '{}eps' = {} must be finite and >= 0", op_, prefix, v);
    }
  }

  // holds() for a buffer of `dims` elements' product (overflow refused,
  // naming the argument, its shape and the sizes); returns that product.
  std::size_t holds(std::string_view arg, const Buffer& b, std::initializer_list<std::size_t> dims,
                    std::string_view shape) const {
    const std::size_t need = product_named(arg, shape, dims);
    holds(arg, b, need, shape);
    return need;
  }

  // a * b * ..., refusing overflow of size_t; `what` names the product in the
  // message (its shape, e.g. "[tokens, dim]").
  std::size_t product(std::string_view what, std::initializer_list<std::size_t> factors) const {
    return product_named({}, what, factors);
  }

 private:
  // `arg`: the argument whose size this is, or empty.
  std::size_t product_named(std::string_view arg, std::string_view what,
                            std::initializer_list<std::size_t> factors) const {
    std::size_t p = 1;
    for (std::size_t f : factors) {
      if (f != 0 && p > std::numeric_limits<std::size_t>::max() / f) {
        if (arg.empty()) {
          fail(ErrorCode::InvalidArgument, "{}: {} = {} overflows 64 bits", op_, what,
               fmt::join(factors, " x "));
        }
        fail(ErrorCode::InvalidArgument, "{}: argument '{}' {} = {} overflows 64 bits", op_, arg,
             what, fmt::join(factors, " x "));
      }
      p *= f;
    }
    return p;
  }

  Backend& backend_;
  std::string_view op_;
};

}  // namespace ferrum::detail
