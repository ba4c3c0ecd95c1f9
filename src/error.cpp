#include "ferrum/error.hpp"

#include <string>

namespace ferrum {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::ShapeMismatch: return "ShapeMismatch";
    case ErrorCode::DTypeMismatch: return "DTypeMismatch";
    case ErrorCode::Misaligned: return "Misaligned";
    case ErrorCode::NullBuffer: return "NullBuffer";
    case ErrorCode::CapacityExceeded: return "CapacityExceeded";
    case ErrorCode::WrongBackend: return "WrongBackend";
    case ErrorCode::Unsupported: return "Unsupported";
    case ErrorCode::GraphCapture: return "GraphCapture";
    case ErrorCode::DeviceCheck: return "DeviceCheck";
    case ErrorCode::Cuda: return "Cuda";
    case ErrorCode::Cublas: return "Cublas";
    case ErrorCode::Nccl: return "Nccl";
    case ErrorCode::OutOfMemory: return "OutOfMemory";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error("ferrum [" + std::string(to_string(code)) + "] " + message), code_(code) {}

}  // namespace ferrum
