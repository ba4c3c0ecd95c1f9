#include <memory>
#include <string>

#include "ferrum/cpu_backend.hpp"
#include "ferrum/cuda_backend.hpp"
#include "ferrum/error.hpp"

namespace ferrum {

std::unique_ptr<Backend> make_default_backend() { return make_default_backend(CudaBackendConfig{}); }

std::unique_ptr<Backend> make_default_backend(const CudaBackendConfig& config, std::string* why) {
  if (!FERRUM_HAVE_CUDA) {  // a GPU may be there; this library cannot use it, and says so
    if (why != nullptr) *why = "ferrum was built without CUDA (FERRUM_CUDA is OFF)";
    return std::make_unique<CpuBackend>();
  }
  if (cuda_device_count() == 0) {
    if (why != nullptr) *why = "no CUDA device visible";
    return std::make_unique<CpuBackend>();
  }
  try {
    return std::make_unique<CudaBackend>(config);
  } catch (const Error& e) {
    // Unsupported: device 0 cannot run this build's kernels (e.g. a GPU
    // older than sm_90 under the default 90a build). The CPU serves, as on
    // a machine without a GPU; anything else (a driver failure, no memory)
    // is the caller's to see.
    if (e.code() != ErrorCode::Unsupported) throw;
    if (why != nullptr) *why = e.what();
  }
  return std::make_unique<CpuBackend>();
}

}  // namespace ferrum
