// Sweeps the norm kernels' launch shape (vectors per thread, block size) on
// the shapes the acceptance names, straight through the launcher. Used to
// pick NormArgs' defaults; not part of the library.
#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/norm.hpp"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

// ferrum_norm_tuning [rms,add_rms,layer] [f16,bf16]: the kinds and dtypes to
// sweep (default: rms,add_rms f16).
int main(int argc, char** argv) {
  const std::string kinds_arg = argc > 1 ? argv[1] : "rms,add_rms";
  const std::string dtypes_arg = argc > 2 ? argv[2] : "f16";
  auto wanted = [](const std::string& list, const std::string& name) {
    return ("," + list + ",").find("," + name + ",") != std::string::npos;
  };
  using ferrum::kernels::NormArgs;
  using ferrum::kernels::NormKind;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no GPU: nothing to tune\n");
    return 0;
  }
  const int dim = 4096;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  const std::size_t pool_bytes = std::size_t{1} << 30;  // rotate through 1 GiB
  void* pool = nullptr;
  check(cudaMalloc(&pool, pool_bytes), "cudaMalloc");
  check(cudaMemset(pool, 0x3c, pool_bytes), "cudaMemset");  // 1.05 in f16: finite, non-zero
  void* weight = nullptr;
  check(cudaMalloc(&weight, dim * 2), "cudaMalloc");
  check(cudaMemset(weight, 0x3c, dim * 2), "cudaMemset");
  void* bias = nullptr;
  check(cudaMalloc(&bias, dim * 2), "cudaMalloc");
  check(cudaMemset(bias, 0x3c, dim * 2), "cudaMemset");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::printf("%-8s %-5s %-6s %-7s %-6s %10s %9s\n", "kind", "dtype", "rows", "target", "block", "median_us", "GB/s");
  for (const ferrum::DType dtype : {ferrum::DType::F16, ferrum::DType::BF16}) {
    const char* dname = dtype == ferrum::DType::F16 ? "f16" : "bf16";
    if (!wanted(dtypes_arg, dname)) continue;
    for (NormKind kind : {NormKind::Rms, NormKind::AddRms, NormKind::Layer}) {
      const char* kname = kind == NormKind::Rms ? "rms" : kind == NormKind::AddRms ? "add_rms" : "layer";
      if (!wanted(kinds_arg, kname)) continue;
      for (int rows : {4096, 32768, 16}) {
        const std::size_t tensor = static_cast<std::size_t>(rows) * dim * 2;
        const int sets = static_cast<int>(pool_bytes / (3 * tensor));
        const double bytes = static_cast<double>(tensor) * (kind == NormKind::AddRms ? 4 : 2);
        for (int target : {0, 1, 2, 4, 8}) {  // 0: the launcher's tuned value
          for (int block : {128, 256, 512}) {
            NormArgs a;
            a.kind = kind;
            a.dtype = dtype;
            a.weight = weight;
            a.bias = bias;
            a.rows = rows;
            a.dim = dim;
            a.eps = 1e-6f;
            a.num_sms = sms;
            a.target_vectors_per_thread = target;
            a.min_block_threads = block;
            std::vector<float> times;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            for (int rep = 0; rep < 60; ++rep) {
              auto* base = static_cast<char*>(pool) + static_cast<std::size_t>(rep % sets) * 3 * tensor;
              a.x = base;
              a.residual = base + tensor;
              a.out = base + 2 * tensor;
              cudaEventRecord(e0, stream);
              try {
                ferrum::kernels::launch_norm(a, stream);
              } catch (const std::exception& e) {
                std::printf("%-8s %-5s %-6d %-7d %-6d  not launchable: %s\n", kname, dname, rows, target, block,
                            e.what());
                times.clear();
                break;
              }
              cudaEventRecord(e1, stream);
              cudaEventSynchronize(e1);
              float ms = 0;
              cudaEventElapsedTime(&ms, e0, e1);
              if (rep >= 10) times.push_back(ms * 1000.0f);
            }
            if (times.empty()) continue;
            std::sort(times.begin(), times.end());
            const double us = times[times.size() / 2];
            std::printf("%-8s %-5s %-6d %-7d %-6d %10.2f %9.0f\n", kname, dname, rows, target, block, us,
                        bytes / us / 1e3);
          }
        }
      }
    }
  }
  return 0;
}
