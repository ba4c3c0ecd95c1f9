// Timing shared by the launch-shape sweeps (norm_tuning, rope_tuning): the
// median of 50 samples after warm-up, each sample one launch per event pair
// ("single") or `chain` back-to-back launches per pair divided by `chain`
// (what a launch costs in a stream of them). launch(set) rotates through
// `sets` buffer sets. Tools only: errors print and exit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace ferrum::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Times {
  double single_us = 0.0;
  double chain_us = 0.0;
};

inline Times time_both(int sets, int chain, cudaStream_t stream, const std::function<void(int)>& launch) {
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
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return r;
}

}  // namespace ferrum::bench
