#include <memory>

#include "ferrum/cpu_backend.hpp"
#include "ferrum/cuda_backend.hpp"

namespace ferrum {

std::unique_ptr<Backend> make_default_backend() {
  if (cuda_device_count() > 0) return std::make_unique<CudaBackend>();
  return std::make_unique<CpuBackend>();
}

}  // namespace ferrum
