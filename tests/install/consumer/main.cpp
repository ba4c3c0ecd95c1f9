// Uses the installed library through its public headers only.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <ferrum/ferrum.hpp>

int main() {
  ferrum::CpuBackend cpu;
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> w = {1.0f, 1.0f, 1.0f, 1.0f};
  ferrum::Buffer xb = cpu.upload(x, ferrum::DType::F16);
  ferrum::Buffer wb = cpu.upload(w, ferrum::DType::F16);
  ferrum::Buffer out = cpu.alloc(ferrum::DType::F16, 4);
  cpu.rms_norm(xb, wb, 1e-6f, out, 1, 4);
  const std::vector<float> got = cpu.download(out);
  const float expect0 = 1.0f / std::sqrt(7.5f);
  if (std::fabs(got[0] - expect0) > 1e-3f) {
    std::printf("consumer: rms_norm gave %f, expected %f\n", got[0], expect0);
    return 1;
  }
  try {
    cpu.rms_norm(xb, wb, 1e-6f, out, 1, 5);
    std::printf("consumer: a bad size did not throw\n");
    return 1;
  } catch (const ferrum::Error& e) {
    if (e.code() != ferrum::ErrorCode::ShapeMismatch) return 1;
  }
  // The CUDA half links too (CudaBackend through make_default_backend, which
  // gives a CpuBackend on a machine without a GPU, and a size helper of the
  // CUDA backend's public API): a static package's link line must bring
  // cuBLAS and the rest.
  const std::unique_ptr<ferrum::Backend> be = ferrum::make_default_backend();
  if (be == nullptr) return 1;
  if (ferrum::attention_decode_workspace_bytes(1, 32, 128, 32768) != 4u * 32u * 16u * 129u) {
    std::printf("consumer: attention_decode_workspace_bytes disagrees\n");
    return 1;
  }
  std::printf("consumer: ok (%s; default backend %s; %d CUDA device(s))\n", cpu.name().c_str(), be->name().c_str(),
              ferrum::cuda_device_count());
  return 0;
}
