// L2 prefetch probe: does Backend::prefetch_l2 of a decode GEMM's weight,
// queued before a window of small ops, shorten the GEMM that follows?
//
//   ferrum_bench_l2_prefetch [--reps N]
//
// Per weight shape [n x k] (f16, m = 1: the llama3-8b projections), window
// length W (rms_norm launches on [1 x 4096], ~2 µs each: a stand-in for the
// RoPE / attention / norm ops between two projections) and prefetch size P
// (0 = none), one graph is captured through the backend's API holding `sets`
// repetitions of
//     [prefetch_l2(weight_s, 0, P)]  W x rms_norm  gemm(x, weight_s)
// over `sets` distinct weights (>= 512 MB in all, so every weight is cold in
// L2 when its repetition starts). It is replayed `reps` times (CUDA events,
// after a warm-up); the figure is the median µs per repetition. "gemm_us" =
// that minus the same graph without the gemm (window alone).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

namespace {

using ferrum::Buffer;
using ferrum::CudaBackend;
using ferrum::DType;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  const char* name;
  std::size_t n, k;
};

// Median µs per repetition of the captured sequence.
double time_sequence(CudaBackend& be, std::size_t sets, int reps, bool with_gemm, std::size_t window,
                     std::size_t prefetch_bytes, std::vector<Buffer>& weights, const Buffer& x, const Buffer& norm_w,
                     Buffer& normed, Buffer& out, std::size_t n, std::size_t k) {
  be.begin_graph_capture();
  for (std::size_t s = 0; s < sets; ++s) {
    Buffer& w = weights[s % weights.size()];
    if (prefetch_bytes > 0) be.prefetch_l2(w, 0, std::min(prefetch_bytes, w.nbytes()));
    for (std::size_t i = 0; i < window; ++i) be.rms_norm(x, norm_w, 1e-5f, normed, 1, 4096);
    if (with_gemm) be.gemm(x.view(0, k), w, out, 1, n, k);
  }
  be.end_graph_capture();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) be.replay_last_graph();
  be.synchronize();
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(start, be.stream()), "cudaEventRecord");
    be.replay_last_graph();
    check(cudaEventRecord(stop, be.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    us.push_back(1000.0 * ms / static_cast<double>(sets));
  }
  be.synchronize();
  be.reset_graph();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 21;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: ferrum_bench_l2_prefetch [--reps N]\n");
      return 2;
    }
  }
  try {
    CudaBackend be;
    const Shape shapes[] = {{"o [4096 x 4096]", 4096, 4096},
                            {"qkv [6144 x 4096]", 6144, 4096},
                            {"down [4096 x 14336]", 4096, 14336},
                            {"gate_up [28672 x 4096]", 28672, 4096}};
    const Buffer x = be.upload(std::vector<float>(14336, 0.01f), DType::F16);
    const Buffer norm_w = be.upload(std::vector<float>(4096, 1.0f), DType::F16);
    Buffer normed = be.alloc(DType::F16, 4096);
    std::printf("%-24s %6s %8s %10s %10s %10s\n", "shape", "window", "P_MB", "set_us", "window_us", "gemm_us");
    for (const Shape& sh : shapes) {
      const std::size_t bytes = sh.n * sh.k * 2;
      const std::size_t copies = std::max<std::size_t>(4, ((std::size_t{512} << 20) + bytes - 1) / bytes);
      std::vector<Buffer> weights;
      for (std::size_t c = 0; c < copies; ++c) {
        weights.push_back(be.upload(std::vector<float>(sh.n * sh.k, 0.001f * static_cast<float>(c + 1)), DType::F16));
      }
      Buffer out = be.alloc(DType::F16, sh.n);
      const std::size_t sets = copies * 2;
      for (std::size_t window : {0, 2, 5}) {
        const double window_us =
            window == 0 ? 0.0 : time_sequence(be, sets, reps, false, window, 0, weights, x, norm_w, normed, out, sh.n, sh.k);
        for (std::size_t p_mb : {0, 8, 16, 24, 32, 48}) {
          const std::size_t p = p_mb << 20;
          if (p_mb > 0 && p > bytes + (std::size_t{8} << 20)) continue;
          const double set_us = time_sequence(be, sets, reps, true, window, p, weights, x, norm_w, normed, out, sh.n, sh.k);
          std::printf("%-24s %6zu %8zu %10.2f %10.2f %10.2f\n", sh.name, window, p_mb, set_us, window_us,
                      set_us - window_us);
          std::fflush(stdout);
        }
      }
    }
  } catch (const ferrum::Error& e) {
    std::fprintf(stderr, "ferrum_bench_l2_prefetch: %s\n", e.what());
    return 1;
  }
  return 0;
}
