// ferrum::Error: the one exception type every public op throws. Host memory
// running out inside an op (CpuBackend's scratch, load_gptq's host repack) is
// OutOfMemory too, not std::bad_alloc.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ferrum {

// What went wrong, coarsely, so that an engine can branch on it without
// parsing messages. The message says the rest (op, argument, value).
enum class ErrorCode {
  InvalidArgument,   // a size or scalar argument is out of its domain
  ShapeMismatch,     // a buffer is too small for the sizes given, or sizes disagree
  DTypeMismatch,     // a buffer has a dtype the op does not take
  Misaligned,        // a pointer is not aligned to what the op needs
  NullBuffer,        // an empty (null) buffer where data is required
  CapacityExceeded,  // a write would run past a cache or table capacity
  WrongBackend,      // a buffer belongs to another backend
  Unsupported,       // the op (or this variant of it) is not implemented here
  GraphCapture,      // a call not allowed during capture, or a capture-state error
  DeviceCheck,       // a kernel found a bad device-side value (reported at synchronize, download, read_bytes)
  Cuda,              // a CUDA runtime call failed
  Cublas,            // a cuBLAS call failed
  Nccl,              // an NCCL call failed
  OutOfMemory,       // an allocation failed
  Internal,          // a bug in ferrum
};

std::string_view to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace ferrum
