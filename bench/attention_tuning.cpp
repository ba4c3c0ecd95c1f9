// Sweeps the tensor-core decode's launch knobs (kernels/attention.hpp,
// DecodeTuning) on the decode shapes issue 3 names, straight through the
// launcher: the A/B runs of docs/design/decode_attention.md in one binary.
// None of the knobs changes a result, only where the bytes come from and
// who merges the slices. Not part of the library.
//
//   ferrum_attention_tuning            f16, GQA 32/8, hd 128
//
// Method: CUDA events around R back-to-back launches (R so that a sample is
// >= ~200 us), K/V rotated over sets >= 256 MiB together (past the 50 MB
// L2), median of 15 samples, K+V bytes counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "kernels/attention.hpp"

namespace {

using ferrum::kernels::AttentionArgs;
using ferrum::kernels::DecodeTuning;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void* device_fill(std::size_t bytes, int byte) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  check(cudaMemset(p, byte, bytes), "cudaMemset");  // 0x2c2c: 0.067 in f16, finite
  return p;
}

struct Shape {
  int batch;
  long long kv;
};

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no GPU: nothing to tune\n");
    return 0;
  }
  constexpr int kHeads = 32, kKvHeads = 8, kHd = 128;
  constexpr double kRotateBytes = 256.0 * 1024 * 1024;
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  auto* error_flag = static_cast<std::uint32_t*>(device_fill(sizeof(std::uint32_t), 0));

  std::printf("%-5s %-7s %-9s %-10s %-6s %10s %9s\n", "B", "L", "l2_ahead", "prefetch", "fused", "median_us", "GB/s");
  const Shape shapes[] = {{1, 1024},  {1, 4096},  {1, 8192},  {1, 32768}, {1, 131072},
                          {16, 8192}, {16, 32768}, {64, 8192}, {64, 32768}};
  for (const Shape& sh : shapes) {
    const std::size_t kv_bytes = static_cast<std::size_t>(sh.batch) * kKvHeads * sh.kv * kHd * 2;
    const double call_bytes = 2.0 * static_cast<double>(kv_bytes);
    const int sets = std::max(2, static_cast<int>(std::ceil(kRotateBytes / call_bytes)));
    std::vector<void*> k(sets), v(sets);
    for (int s = 0; s < sets; ++s) {
      k[s] = device_fill(kv_bytes, 0x2c);
      v[s] = device_fill(kv_bytes, 0x2c);
    }
    const std::size_t q_bytes = static_cast<std::size_t>(sh.batch) * kHeads * kHd * 2;
    void* q = device_fill(q_bytes, 0x2c);
    void* out = device_fill(q_bytes, 0);
    const std::size_t ws = ferrum::kernels::attention_workspace_floats(sh.batch, kHeads, 1, kHd, sh.kv);
    auto* partials = static_cast<float*>(device_fill(std::max<std::size_t>(ws, 1) * sizeof(float), 0));

    for (int ahead : {0, 1, 2}) {
      for (double prefetch : {0.0, 36.0 * 1024 * 1024, 64.0 * 1024 * 1024}) {
        for (bool fused : {true, false}) {
          AttentionArgs a;
          a.dtype = ferrum::DType::F16;
          a.q = q;
          a.out = out;
          a.batch = sh.batch;
          a.num_heads = kHeads;
          a.num_kv_heads = kKvHeads;
          a.q_len = 1;
          a.head_dim = kHd;
          a.kv_stride = sh.kv;
          a.kv_len = static_cast<int>(sh.kv);
          a.pos_offset = sh.kv - 1;
          a.error_flag = error_flag;
          a.scale = 1.0f / std::sqrt(static_cast<float>(kHd));
          ferrum::kernels::set_decode_workspace(a, partials, ws);
          a.decode_tuning.l2_ahead = ahead;
          a.decode_tuning.l2_prefetch_bytes = prefetch;
          a.decode_tuning.fused_merge = fused;
          const int reps = std::max(1, static_cast<int>(200e-6 * 4e12 / std::max(call_bytes, 4e6)));
          std::vector<float> samples;
          try {
            for (int sample = -2; sample < 15; ++sample) {  // two warm-up samples
              check(cudaEventRecord(e0, stream), "cudaEventRecord");
              for (int r = 0; r < reps; ++r) {
                a.k = k[r % sets];
                a.v = v[r % sets];
                ferrum::kernels::launch_attention(a, stream);
              }
              check(cudaEventRecord(e1, stream), "cudaEventRecord");
              check(cudaEventSynchronize(e1), "cudaEventSynchronize");
              float ms = 0;
              check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
              if (sample >= 0) samples.push_back(ms * 1000.0f / static_cast<float>(reps));
            }
          } catch (const std::exception& e) {
            std::printf("%-5d %-7lld %-9d %-10.0f %-6d  failed: %s\n", sh.batch, sh.kv, ahead, prefetch / 1048576.0,
                        fused ? 1 : 0, e.what());
            continue;
          }
          std::sort(samples.begin(), samples.end());
          const double us = samples[samples.size() / 2];
          std::printf("%-5d %-7lld %-9d %-10.0f %-6d %10.2f %9.0f\n", sh.batch, sh.kv, ahead, prefetch / 1048576.0,
                      fused ? 1 : 0, us, call_bytes / us / 1e3);
        }
      }
    }
    for (int s = 0; s < sets; ++s) {
      check(cudaFree(k[s]), "cudaFree");
      check(cudaFree(v[s]), "cudaFree");
    }
    check(cudaFree(q), "cudaFree");
    check(cudaFree(out), "cudaFree");
    check(cudaFree(partials), "cudaFree");
  }
  return 0;
}
