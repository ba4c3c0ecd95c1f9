#include <memory>

#include "ferrum/cpu_backend.hpp"
#include "ferrum/cuda_backend.hpp"
#include "ferrum/error.hpp"

namespace ferrum {

std::unique_ptr<Backend> make_default_backend() {
  if (cuda_device_count() > 0) {
    try {
      return std::make_unique<CudaBackend>();
    } catch (const Error& e) {
      // Unsupported: device 0 cannot run this build's kernels (e.g. a GPU
      // older than sm_90 under the default 90a build). The CPU serves, as on
      // a machine without a GPU; anything else (a driver failure, no memory)
      // is the caller's to see.
      if (e.code() != ErrorCode::Unsupported) throw;
    }
  }
  return std::make_unique<CpuBackend>();
}

}  // namespace ferrum
