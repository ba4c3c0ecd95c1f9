// L2 residency probe: how much faster is a decode GEMM (m = 1, the skinny
// path) whose weight sits in L2, and does staging the weight there first
// give that speed?
//
//   ferrum_bench_l2_residency [--reps N] [--window W] [--only SUBSTR] [--modes a,b,...]
//
// --only keeps the shapes whose name contains SUBSTR, --modes the named modes
// (a traced run stays small: bench/l2_residency_trace.py reads the CUPTI
// trace of one, `scripts/gpu_suite.sh l2probe`).
// Session 6 measured the bulk L2 prefetch hint in the llama3-8b step, where
// the step is bound by bandwidth, and saw no GEMM get faster. A small model's
// step (qwen3-0.6b: 26 µs per layer against 7.5 µs of weight bytes) is bound
// by latency instead, with DRAM idle most of the time: a next-layer prefetch
// could only pay there. Per weight shape [n x k] (f16), one graph holds `sets`
// repetitions of
//     [stage(weight_s)]  W x rms_norm  gemm(x, weight_s)
// with the weights rotated through >= 512 MiB (each is cold in L2 when its
// repetition starts) unless the mode says otherwise. Modes:
//   cold   no stage
//   hot    the same weight every repetition (the previous repetition's GEMM
//          read it)
//   coldF, hotF  the same with a 128 MiB read before each window (L2 emptied,
//          and the translations of ~64 more pages loaded)
//   On a graph branch forked before the window (one side stream, joined once
//   at the end; the branch runs beside the window and may still run, or not
//   have started, when the GEMM does):
//   fork   an empty kernel (the fork's own cost)
//   hint   cp.async.bulk.prefetch.L2 of the weight, one CTA per SM
//   lines  prefetch.global.L2 of each 128-byte line (2 CTAs per SM)
//   load   the weight read once (ld.global.cg, 2 CTAs per SM, results dropped)
//   load4  each line read from four CTAs on different SMs
//   self   the same skinny GEMM on the weight (same grid)
//   In series, on the main stream before the window (complete when the
//   window starts, nothing beside the GEMM):
//   loadS  the weight read once, as load
//   linesS the line prefetch, as lines
//   selfS  the same skinny GEMM on the weight
// Figures: median µs per repetition over `reps` replays (CUDA events), and
// "gemm_us" = that minus a baseline without the GEMM: the window alone for
// cold, hot and the branch modes (so theirs is the GEMM's time net of the
// branch's cost), the flush and the window for coldF / hotF, the stage and the
// window for the serial modes. What it showed: docs/design/engine_decode.md
// (session 56).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

#include "bench/comma_items.hpp"
#include "bench/cuda_check.hpp"
#include "bench/median.hpp"
#include "bench/read_ceiling.cuh"
#include "kernels/gemm_skinny.hpp"
#include "l2_residency.cuh"

namespace {

using ferrum::Buffer;
using ferrum::CudaBackend;
using ferrum::DType;
using ferrum::bench::L2Stage;

enum class Mode { Cold, Hot, ColdFlush, HotFlush, Fork, Hint, Lines, Load, Load4, Self, LoadSerial, LinesSerial, SelfSerial };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Cold: return "cold";
    case Mode::Hot: return "hot";
    case Mode::ColdFlush: return "coldF";
    case Mode::HotFlush: return "hotF";
    case Mode::Fork: return "fork";
    case Mode::Hint: return "hint";
    case Mode::Lines: return "lines";
    case Mode::Load: return "load";
    case Mode::Load4: return "load4";
    case Mode::Self: return "self";
    case Mode::LoadSerial: return "loadS";
    case Mode::LinesSerial: return "linesS";
    case Mode::SelfSerial: return "selfS";
  }
  return "?";
}
bool on_branch(Mode m) {
  return m == Mode::Fork || m == Mode::Hint || m == Mode::Lines || m == Mode::Load || m == Mode::Load4 ||
         m == Mode::Self;
}
bool in_series(Mode m) { return m == Mode::LoadSerial || m == Mode::LinesSerial || m == Mode::SelfSerial; }
bool hot_weight(Mode m) { return m == Mode::Hot || m == Mode::HotFlush; }
bool flushes(Mode m) { return m == Mode::ColdFlush || m == Mode::HotFlush; }

struct Shape {
  const char* name;
  std::size_t n, k;
};

constexpr std::size_t kMaxN = 8192, kMaxK = 4096;  // the largest shape's (x, the self GEMM's output)

struct Rig {
  CudaBackend& be;
  int num_sms = 0;
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  std::uint32_t* sink = nullptr;  // [read_ceiling_blocks(num_sms)] words
  Buffer self_out;                // [kMaxN], the self GEMMs' output
  Buffer flush;                   // read to empty L2 (flush modes)
};

// The stage of `mode` on `stream` (a branch or the main stream).
void stage(Rig& rig, Mode mode, const Buffer& x, const Buffer& w, const Shape& sh, cudaStream_t stream) {
  if (mode == Mode::Self || mode == Mode::SelfSerial) {
    if (!ferrum::kernels::launch_gemm_skinny(DType::F16, x.data(), w.data(), rig.self_out.data(), 1,
                                             static_cast<long long>(sh.n), static_cast<long long>(sh.k), rig.num_sms,
                                             stream)) {
      std::fprintf(stderr, "self: the skinny GEMM does not apply to %s\n", sh.name);
      std::exit(1);
    }
  } else {
    const L2Stage what = mode == Mode::Fork                                 ? L2Stage::Empty
                         : mode == Mode::Hint                               ? L2Stage::Hint
                         : mode == Mode::Lines || mode == Mode::LinesSerial ? L2Stage::Lines
                         : mode == Mode::Load || mode == Mode::LoadSerial   ? L2Stage::Load
                                                                            : L2Stage::Load4;
    ferrum::bench::launch_l2_stage(what, w.data(), w.nbytes(), rig.sink, rig.num_sms, stream);
  }
  check(cudaGetLastError(), "stage launch");
}

// Median µs per repetition of the captured sequence (with_gemm false: the
// baseline, see the header; a branch mode's baseline is the window alone).
double time_sequence(Rig& rig, Mode mode, bool with_gemm, std::size_t sets, int reps, std::size_t window,
                     const std::vector<Buffer>& weights, const Buffer& x, const Buffer& norm_w, Buffer& normed,
                     Buffer& out, const Shape& sh) {
  CudaBackend& be = rig.be;
  const bool branch = with_gemm && on_branch(mode);
  be.begin_graph_capture();
  for (std::size_t s = 0; s < sets; ++s) {
    const Buffer& w = weights[hot_weight(mode) ? 0 : s % weights.size()];
    if (branch) {
      // Re-recording one event is legal in capture: each wait takes the
      // record before it.
      check(cudaEventRecord(rig.fork, be.stream()), "fork record");
      check(cudaStreamWaitEvent(rig.side, rig.fork, 0), "fork wait");
      stage(rig, mode, x, w, sh, rig.side);
    }
    if (in_series(mode)) stage(rig, mode, x, w, sh, be.stream());
    if (flushes(mode)) {
      ferrum::bench::launch_read_ceiling(rig.flush.data(), rig.flush.nbytes(), rig.sink, rig.num_sms, be.stream());
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
  auto replay = [&] {
    if (!be.replay_last_graph()) {
      std::fprintf(stderr, "no graph to replay\n");
      std::exit(1);
    }
  };
  for (int i = 0; i < 3; ++i) replay();
  be.synchronize();
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(start, be.stream()), "cudaEventRecord");
    replay();
    check(cudaEventRecord(stop, be.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    us.push_back(1000.0 * ms / static_cast<double>(sets));
  }
  be.synchronize();
  be.reset_graph();
  warn_if_failed(cudaEventDestroy(start), "cudaEventDestroy");
  warn_if_failed(cudaEventDestroy(stop), "cudaEventDestroy");
  return median(us);
}

}  // namespace

constexpr Mode kModes[] = {Mode::Cold,  Mode::Hot,  Mode::ColdFlush,  Mode::HotFlush,    Mode::Fork,
                           Mode::Hint,  Mode::Lines, Mode::Load,      Mode::Load4,       Mode::Self,
                           Mode::LoadSerial, Mode::LinesSerial, Mode::SelfSerial};

int main(int argc, char** argv) {
  int reps = 21;
  std::vector<std::size_t> windows = {0, 3, 6};
  std::string only;
  std::vector<Mode> modes(std::begin(kModes), std::end(kModes));
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--window") == 0 && i + 1 < argc) {
      windows = {static_cast<std::size_t>(std::max(0, std::atoi(argv[++i])))};
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--modes") == 0 && i + 1 < argc) {
      modes.clear();
      for (const std::string& name : comma_items(argv[++i])) {
        const auto* found = std::find_if(std::begin(kModes), std::end(kModes),
                                         [&](Mode m) { return name == mode_name(m); });
        if (found == std::end(kModes)) {
          std::fprintf(stderr, "--modes: no mode '%s'\n", name.c_str());
          return 2;
        }
        if (std::find(modes.begin(), modes.end(), *found) != modes.end()) {
          std::fprintf(stderr, "--modes: '%s' twice\n", name.c_str());
          return 2;
        }
        modes.push_back(*found);
      }
      if (modes.empty()) {
        std::fprintf(stderr, "--modes: no mode named\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: ferrum_bench_l2_residency [--reps N] [--window W] [--only SUBSTR] [--modes a,b,...]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (!hopper_device("ferrum_bench_l2_residency", "needs sm_90 (the bulk prefetch hint)", false, prop)) return 0;
  try {
    CudaBackend be;
    Rig rig{be};
    rig.num_sms = prop.multiProcessorCount;
    check(cudaStreamCreateWithFlags(&rig.side, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&rig.fork, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&rig.join, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaMalloc(reinterpret_cast<void**>(&rig.sink),
                     sizeof(std::uint32_t) * static_cast<std::size_t>(ferrum::bench::read_ceiling_blocks(rig.num_sms))),
          "cudaMalloc");
    rig.self_out = be.alloc(DType::F16, kMaxN);
    rig.flush = be.alloc(DType::F16, std::size_t{64} << 20);  // 128 MiB
    ferrum::bench::launch_fill_f16(rig.flush.data(), rig.flush.numel(), be.stream());
    check(cudaGetLastError(), "fill");
    // qwen3-0.6b's projections (hidden 1024), then two of llama3-8b's.
    const Shape shapes[] = {{"qwen3-0.6b q|k|v [4096 x 1024]", 4096, 1024},
                            {"qwen3-0.6b o [1024 x 2048]", 1024, 2048},
                            {"qwen3-0.6b gate|up [6144 x 1024]", 6144, 1024},
                            {"qwen3-0.6b down [1024 x 3072]", 1024, 3072},
                            {"llama3-8b o [4096 x 4096]", 4096, 4096},
                            {"llama3-8b q|k|v [6144 x 4096]", 6144, 4096}};
    const Buffer x = be.upload(std::vector<float>(kMaxK, 0.01f), DType::F16);
    std::printf("%-34s %6s %5s %9s %9s %9s %9s\n", "shape", "window", "mode", "MB", "set_us", "base_us", "gemm_us");
    for (const Shape& sh : shapes) {
      if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
      if (sh.n > kMaxN || sh.k > kMaxK) {
        std::fprintf(stderr, "%s is past the rig's %zu x %zu\n", sh.name, kMaxN, kMaxK);
        return 1;
      }
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
      for (std::size_t window : windows) {
        auto timed = [&](Mode mode, bool with_gemm) {
          return time_sequence(rig, mode, with_gemm, sets, reps, window, weights, xk, norm_w, normed, out, sh);
        };
        const bool any_window_base =
            std::any_of(modes.begin(), modes.end(), [](Mode m) { return !flushes(m) && !in_series(m); });
        const double window_us = window == 0 || !any_window_base ? 0.0 : timed(Mode::Cold, false);
        const bool any_flush = std::any_of(modes.begin(), modes.end(), flushes);
        const double flush_window_us = any_flush ? timed(Mode::ColdFlush, false) : 0.0;
        for (Mode mode : modes) {
          const double base_us = flushes(mode) ? flush_window_us : in_series(mode) ? timed(mode, false) : window_us;
          const double set_us = timed(mode, true);
          std::printf("%-34s %6zu %5s %9.1f %9.2f %9.2f %9.2f\n", sh.name, window, mode_name(mode),
                      static_cast<double>(bytes) / 1e6, set_us, base_us, set_us - base_us);
          std::fflush(stdout);
        }
      }
    }
    warn_if_failed(cudaStreamDestroy(rig.side), "cudaStreamDestroy");
    warn_if_failed(cudaEventDestroy(rig.fork), "cudaEventDestroy");
    warn_if_failed(cudaEventDestroy(rig.join), "cudaEventDestroy");
    warn_if_failed(cudaFree(rig.sink), "cudaFree");
  } catch (const ferrum::Error& e) {
    std::fprintf(stderr, "ferrum_bench_l2_residency: %s\n", e.what());
    return 1;
  }
  return 0;
}
