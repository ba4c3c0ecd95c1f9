// L2 residency probe: how much faster is a decode GEMM (m = 1, the skinny
// path) whose weight sits in L2, and does a prefetch on a graph branch, run
// while a window of small ops runs on the main stream, put it there?
//
//   ferrum_bench_l2_residency [--reps N] [--window W]
//
// Session 6 measured the bulk L2 prefetch hint in the llama3-8b step, where
// the step is bound by bandwidth, and saw no GEMM get faster. A small model's
// step (qwen3-0.6b: 26 µs per layer against 7.5 µs of weight bytes) is bound
// by latency instead, with DRAM idle most of the time: a next-layer prefetch
// could only pay there. This measures the premise first. Per weight shape
// [n x k] (f16), one graph holds `sets` repetitions of
//     [fork: prefetch(weight_s) on a side stream]  W x rms_norm  gemm(x, weight_s)
// with the side stream joined once at the end. Modes:
//   cold  weights rotated through >= 512 MB (each is cold in L2 when used)
//   hot   the same weight every repetition (in L2 after the first)
//   fork  rotated, the branch launches an empty kernel (the fork's own cost)
//   hint  rotated, the branch asks L2 for the weight (cp.async.bulk.prefetch.L2)
//   load  rotated, the branch reads the weight (ld.global.cg, results dropped)
//   load4 the same, four reads of each line from CTAs spread over the grid
//   self  rotated, the branch runs the same skinny GEMM on the weight (the
//         same grid: its lines land where the main GEMM's CTAs read them,
//         if placement repeats)
//   coldF, hotF  cold and hot with a 128 MiB read on the main stream before
//         each window (L2 emptied): separates L2 lines from what else a
//         repeated weight keeps warm
// Figures: median µs per repetition over `reps` replays (CUDA events), and
// "gemm_us" = that minus the window alone (the same graph without the gemm
// and without the branch; for coldF / hotF with the flush). What it showed
// (H100, session 56): docs/design/engine_decode.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

#include "kernels/gemm_skinny.hpp"
#include "l2_residency.cuh"

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

enum class Mode { Cold, Hot, Fork, Hint, Load, Load4, Self };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Cold: return "cold";
    case Mode::Hot: return "hot";
    case Mode::Fork: return "fork";
    case Mode::Hint: return "hint";
    case Mode::Load: return "load";
    case Mode::Load4: return "load4";
    case Mode::Self: return "self";
  }
  return "?";
}

struct Shape {
  const char* name;
  std::size_t n, k;
};

struct Rig {
  CudaBackend& be;
  cudaStream_t side = nullptr;
  std::vector<cudaEvent_t> forks;
  cudaEvent_t join = nullptr;
  std::uint32_t* sink = nullptr;
  Buffer self_out;  // the self branch's output, [n]
  Buffer flush;     // read to empty L2 (flush modes)
  int num_sms = 0;
};

// Median µs per repetition of the captured sequence.
// flush: each repetition starts with a read of rig.flush (2.5x L2) on the
// main stream, so no line of the previous repetitions is left in L2.
double time_sequence(Rig& rig, Mode mode, bool with_gemm, std::size_t sets, int reps, std::size_t window,
                     bool flush, const std::vector<Buffer>& weights, const Buffer& x, const Buffer& norm_w,
                     Buffer& normed, Buffer& out, const Shape& sh) {
  CudaBackend& be = rig.be;
  const bool branch = with_gemm && (mode != Mode::Cold && mode != Mode::Hot);
  be.begin_graph_capture();
  for (std::size_t s = 0; s < sets; ++s) {
    const Buffer& w = weights[mode == Mode::Hot ? 0 : s % weights.size()];
    if (branch) {
      check(cudaEventRecord(rig.forks[s], be.stream()), "fork record");
      check(cudaStreamWaitEvent(rig.side, rig.forks[s], 0), "fork wait");
      const std::size_t bytes = w.nbytes();
      using ferrum::bench::L2Branch;
      if (mode == Mode::Self) {
        if (!ferrum::kernels::launch_gemm_skinny(DType::F16, x.data(), w.data(), rig.self_out.data(), 1,
                                                 static_cast<long long>(sh.n), static_cast<long long>(sh.k), rig.num_sms,
                                                 rig.side)) {
          std::fprintf(stderr, "self: the skinny GEMM does not apply to %s\n", sh.name);
          std::exit(1);
        }
      } else {
        ferrum::bench::launch_l2_branch(mode == Mode::Fork   ? L2Branch::Empty
                                      : mode == Mode::Hint ? L2Branch::Hint
                                      : mode == Mode::Load ? L2Branch::Load
                                                           : L2Branch::Load4,
                                      w.data(), bytes, rig.sink, rig.side);
      }
      check(cudaGetLastError(), "branch launch");
    }
    if (flush) {
      ferrum::bench::launch_l2_branch(ferrum::bench::L2Branch::Load, rig.flush.data(), rig.flush.nbytes(), rig.sink,
                                      be.stream());
      check(cudaGetLastError(), "flush launch");
    }
    for (std::size_t i = 0; i < window; ++i) be.rms_norm(x, norm_w, 1e-5f, normed, 1, sh.k);
    if (with_gemm) be.gemm(x, w, out, 1, sh.n, sh.k);
  }
  if (branch) {
    check(cudaEventRecord(rig.join, rig.side), "join record");
    check(cudaStreamWaitEvent(be.stream(), rig.join, 0), "join wait");
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
  std::vector<std::size_t> windows = {0, 3, 6};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--window") == 0 && i + 1 < argc) {
      windows = {static_cast<std::size_t>(std::max(0, std::atoi(argv[++i])))};
    } else {
      std::fprintf(stderr, "usage: ferrum_bench_l2_residency [--reps N] [--window W]\n");
      return 2;
    }
  }
  try {
    CudaBackend be;
    Rig rig{be};
    check(cudaStreamCreateWithFlags(&rig.side, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&rig.join, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaMalloc(reinterpret_cast<void**>(&rig.sink), sizeof(std::uint32_t)), "cudaMalloc");
    check(cudaDeviceGetAttribute(&rig.num_sms, cudaDevAttrMultiProcessorCount, be.device()), "SM count");
    rig.self_out = be.alloc(DType::F16, 8192);
    rig.flush = be.alloc(DType::F16, std::size_t{64} << 20);  // 128 MiB
    ferrum::bench::launch_fill_f16(rig.flush.data(), rig.flush.numel(), be.stream());
    // qwen3-0.6b's projections (hidden 1024), then two of llama3-8b's.
    const Shape shapes[] = {{"qwen3-0.6b q|k|v [4096 x 1024]", 4096, 1024},
                            {"qwen3-0.6b o [1024 x 2048]", 1024, 2048},
                            {"qwen3-0.6b gate|up [6144 x 1024]", 6144, 1024},
                            {"qwen3-0.6b down [1024 x 3072]", 1024, 3072},
                            {"llama3-8b o [4096 x 4096]", 4096, 4096},
                            {"llama3-8b q|k|v [6144 x 4096]", 6144, 4096}};
    const Buffer x = be.upload(std::vector<float>(4096, 0.01f), DType::F16);
    std::printf("%-34s %6s %5s %9s %9s %9s %9s\n", "shape", "window", "mode", "MB", "set_us", "window_us", "gemm_us");
    for (const Shape& sh : shapes) {
      const std::size_t numel = sh.n * sh.k, bytes = numel * 2;
      const std::size_t copies = std::max<std::size_t>(4, ((std::size_t{512} << 20) + bytes - 1) / bytes);
      std::vector<Buffer> weights;
      for (std::size_t c = 0; c < copies; ++c) {
        weights.push_back(be.alloc(DType::F16, numel));
        ferrum::bench::launch_fill_f16(weights.back().data(), numel, be.stream());
        check(cudaGetLastError(), "fill");
      }
      be.synchronize();
      const Buffer xk = x.view(0, sh.k);
      const Buffer norm_w = be.upload(std::vector<float>(sh.k, 1.0f), DType::F16);
      Buffer normed = be.alloc(DType::F16, sh.k);
      Buffer out = be.alloc(DType::F16, sh.n);
      const std::size_t sets = copies * 2;
      rig.forks.resize(sets);
      for (auto& e : rig.forks) {
        if (e == nullptr) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      }
      for (std::size_t window : windows) {
        const double window_us = window == 0 ? 0.0
                                             : time_sequence(rig, Mode::Cold, false, sets, reps, window, false,
                                                             weights, xk, norm_w, normed, out, sh);
        for (Mode mode : {Mode::Cold, Mode::Hot, Mode::Fork, Mode::Hint, Mode::Load, Mode::Load4, Mode::Self}) {
          const double set_us =
              time_sequence(rig, mode, true, sets, reps, window, false, weights, xk, norm_w, normed, out, sh);
          std::printf("%-34s %6zu %5s %9.1f %9.2f %9.2f %9.2f\n", sh.name, window, mode_name(mode),
                      static_cast<double>(bytes) / 1e6, set_us, window_us, set_us - window_us);
          std::fflush(stdout);
        }
        // Cold and hot again with L2 emptied before each window: if hot
        // stays fast, what it keeps is not L2 lines (translations, say).
        const double flush_window_us =
            time_sequence(rig, Mode::Cold, false, sets, reps, window, true, weights, xk, norm_w, normed, out, sh);
        for (Mode mode : {Mode::Cold, Mode::Hot}) {
          const double set_us =
              time_sequence(rig, mode, true, sets, reps, window, true, weights, xk, norm_w, normed, out, sh);
          std::printf("%-34s %6zu %5s %9.1f %9.2f %9.2f %9.2f\n", sh.name, window,
                      mode == Mode::Cold ? "coldF" : "hotF", static_cast<double>(bytes) / 1e6, set_us, flush_window_us,
                      set_us - flush_window_us);
          std::fflush(stdout);
        }
      }
    }
  } catch (const ferrum::Error& e) {
    std::fprintf(stderr, "ferrum_bench_l2_residency: %s\n", e.what());
    return 1;
  }
  return 0;
}
