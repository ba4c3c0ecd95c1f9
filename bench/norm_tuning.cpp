// Sweeps the norm kernels' launch shape (vectors per thread, block size) on
// the shapes the acceptance names, straight through the launcher. Used to
// pick NormArgs' defaults; not part of the library.
//
// Each configuration is timed two ways, medians of 50 samples after warm-up,
// buffers rotated through 1 GiB: one launch per event pair ("single"), and
// `chain` back-to-back launches per event pair divided by `chain` ("chain",
// what launches cost in a stream of them). Beside them, the same bytes moved
// by cudaMemcpyAsync and by a plain 16-byte copy kernel, timed the same ways:
// the ceiling at this size.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda_check.hpp"
#include "bench/read_ceiling.cuh"
#include "kernels/norm.hpp"

namespace {

struct Times {
  double single_us = 0.0;
  double chain_us = 0.0;
};

// Median time of launch(set) alone and per launch in chains of `chain`.
Times time_both(int sets, int chain, cudaStream_t stream, const std::function<void(int)>& launch) {
  constexpr int kSamples = 50;
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  int next = 0;
  auto median_of = [&](int per_sample) {
    for (int i = 0; i < 2 * sets; ++i) launch(next++ % sets);  // warm-up
    std::vector<float> t;
    for (int s = 0; s < kSamples; ++s) {
      check(cudaEventRecord(e0, stream), "cudaEventRecord");
      for (int c = 0; c < per_sample; ++c) launch(next++ % sets);
      check(cudaEventRecord(e1, stream), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      t.push_back(ms * 1000.0f / static_cast<float>(per_sample));
    }
    std::sort(t.begin(), t.end());
    return static_cast<double>(t[t.size() / 2]);
  };
  Times r;
  r.single_us = median_of(1);
  r.chain_us = median_of(chain);
  check(cudaEventDestroy(e0), "cudaEventDestroy");
  check(cudaEventDestroy(e1), "cudaEventDestroy");
  return r;
}

}  // namespace

// ferrum_norm_tuning [rms,add_rms,layer] [f16,bf16] [chain]: the kinds and
// dtypes to sweep (default: rms,add_rms f16) and launches per chained sample
// (default 8).
int main(int argc, char** argv) {
  const std::string kinds_arg = argc > 1 ? argv[1] : "rms,add_rms";
  const std::string dtypes_arg = argc > 2 ? argv[2] : "f16";
  const int chain = argc > 3 ? std::max(1, std::atoi(argv[3])) : 8;
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

  // The ceiling at each size: half the bytes copied (read + write = bytes).
  std::printf("%-22s %-7s %12s %9s %12s %9s\n", "copy (bytes moved)", "MB", "single_us", "GB/s", "chain_us", "GB/s");
  for (const std::size_t moved : {std::size_t{64} << 20, std::size_t{128} << 20, std::size_t{512} << 20,
                                  std::size_t{1024} << 20}) {
    const std::size_t half = moved / 2;
    const int sets = static_cast<int>(pool_bytes / moved);
    auto* base = static_cast<char*>(pool);
    const Times memcpy_t = time_both(sets, chain, stream, [&](int s) {
      check(cudaMemcpyAsync(base + s * moved + half, base + s * moved, half, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
    });
    const Times kernel_t = time_both(sets, chain, stream, [&](int s) {
      ferrum::bench::launch_copy_ceiling(base + s * moved, base + s * moved + half, half, sms, stream);
    });
    for (const auto& [name, t] : {std::pair{"cudaMemcpyAsync", memcpy_t}, std::pair{"copy kernel", kernel_t}}) {
      std::printf("%-22s %-7zu %12.2f %9.0f %12.2f %9.0f\n", name, moved >> 20, t.single_us,
                  static_cast<double>(moved) / t.single_us / 1e3, t.chain_us,
                  static_cast<double>(moved) / t.chain_us / 1e3);
    }
  }

  std::printf("\n%-8s %-5s %-6s %-7s %-6s %12s %9s %12s %9s\n", "kind", "dtype", "rows", "target", "block",
              "single_us", "GB/s", "chain_us", "GB/s");
  for (const ferrum::DType dtype : {ferrum::DType::F16, ferrum::DType::BF16}) {
    const char* dname = dtype == ferrum::DType::F16 ? "f16" : "bf16";
    if (!wanted(dtypes_arg, dname)) continue;
    for (NormKind kind : {NormKind::Rms, NormKind::AddRms, NormKind::Layer}) {
      const char* kname = kind == NormKind::Rms ? "rms" : kind == NormKind::AddRms ? "add_rms" : "layer";
      if (!wanted(kinds_arg, kname)) continue;
      for (int rows : {4096, 32768}) {
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
            Times t;
            try {
              t = time_both(sets, chain, stream, [&](int s) {
                auto* base = static_cast<char*>(pool) + static_cast<std::size_t>(s) * 3 * tensor;
                a.x = base;
                a.residual = base + tensor;
                a.out = base + 2 * tensor;
                ferrum::kernels::launch_norm(a, stream);
              });
            } catch (const std::exception& e) {
              std::printf("%-8s %-5s %-6d %-7d %-6d  not launchable: %s\n", kname, dname, rows, target, block, e.what());
              check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
              continue;
            }
            std::printf("%-8s %-5s %-6d %-7d %-6d %12.2f %9.0f %12.2f %9.0f\n", kname, dname, rows, target, block,
                        t.single_us, bytes / t.single_us / 1e3, t.chain_us, bytes / t.chain_us / 1e3);
          }
        }
      }
    }
  }
  return 0;
}
