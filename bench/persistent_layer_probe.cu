// ferrum_persistent_layer_probe: what a persistent decode-layer kernel could
// buy the GPTQ decode step before anyone writes one (engine_decode.md, road
// (b)). It streams the llama3-8b GPTQ step's weight bytes (per layer: q|k|v,
// o, gate|up, down as INT4 plus g128 f16 scales, 32 layers, 3.6 GB, so that
// nothing is left in L2 from one pass to the next) with a plain read loop
// and no arithmetic, so every figure is an upper bound on its schedule:
//   ceiling          one launch reads all the bytes (bench/read_ceiling.cu)
//   graph            one kernel per projection (128 a pass), one CUDA graph
//   graph_pdl        the same with programmatic dependent launch: each
//                    kernel releases the next at its top and waits before
//                    its reads (launches run two kernels ahead, as the
//                    engine's norms do under pdl_chain_release)
//   graph_pdl_after  each kernel releases the next right after its own
//                    wait (one kernel ahead: the library's default)
//   graph_pdl_pf,    and before its wait each CTA asks L2 for the first
//   graph_pdl_after_pf  --prefetch-kb of its share (the weights-before-wait
//                    promise: the engine's GEMMs fill their rings so)
//   persistent       one cooperative kernel, a grid barrier between
//                    projections (what a persistent layer kernel pays)
//   persistent_pf    and before each barrier each CTA asks L2 for the first
//                    --prefetch-kb of its share of the next projection
// and the boundaries alone (the same passes with no bytes): µs per kernel
// boundary or grid barrier. Each table is repeated with --work dependent
// multiply-adds per 16-byte vector, a stand-in for the dequantization and
// MMAs that hold up a GEMM's next loads. The engine's GEMMs (engine_decode.md, session 60,
// H100) take 51.7 µs a layer against 37.8 of bytes: if `graph_pdl_pf` sits
// near `ceiling`, the boundaries are not what costs the GEMMs their 14 µs,
// and a persistent kernel would have to win inside the GEMMs; if
// `persistent_pf` beats `graph_pdl_pf` by several µs a layer, that is what
// a persistent kernel can win on the schedule alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comma_items.hpp"
#include "cuda_check.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/mma.cuh"
#include "load_once.cuh"
#include "median.hpp"
#include "option_value.hpp"
#include "read_ceiling.cuh"

namespace {

using ferrum::bench::load_once;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2;     // a kernel's CTAs per SM; the next one's fit beside them (4 x 256 threads)
constexpr int kMinBlocksPerSm = 4;  // so the register cap leaves room for both
constexpr int kInFlight = 8;        // 16-byte loads per thread before any is used
constexpr int kProjections = 4;     // q|k|v, o, gate|up, down

// One layer's projections, in the step's order: INT4 bytes k * n / 2 plus
// g128 f16 scales k / 128 * n * 2 (llama3-8b: hidden 4096, kv 1024,
// intermediate 14336; gate|up joined).
constexpr long long kProjectionBytes[kProjections] = {
    4096LL * 6144 / 2 + 4096LL / 128 * 6144 * 2,      // q|k|v
    4096LL * 4096 / 2 + 4096LL / 128 * 4096 * 2,      // o
    4096LL * 28672 / 2 + 4096LL / 128 * 28672 * 2,    // gate|up
    14336LL * 4096 / 2 + 14336LL / 128 * 4096 * 2};   // down

// Where the pass's projections lie in one buffer: projection j of layer l
// starts at l * layer_vecs + offset[j] (16-byte vectors).
struct PassPlan {
  long long vecs[kProjections];
  long long offset[kProjections];
  long long layer_vecs;
  int layers;
};

// The CTA's contiguous share [begin, end) of `vecs` vectors (as a GEMM's
// CTA streams its own column blocks).
struct Share {
  long long begin, end;
};
__device__ __forceinline__ Share share_of(long long vecs) {
  const long long per = (vecs + gridDim.x - 1) / gridDim.x;
  const long long begin = min(vecs, per * blockIdx.x);
  return {begin, min(vecs, begin + per)};
}

// `work`: dependent multiply-adds per 16-byte vector after its load, a
// stand-in for the GEMM's dequantization and MMAs (0: a plain read), so that
// the schedules are also compared where arithmetic holds up the next loads.
__device__ __forceinline__ std::uint32_t read_share(const uint4* __restrict__ src, long long vecs, int work) {
  const Share s = share_of(vecs);
  std::uint32_t acc = 0;
  for (long long base = s.begin + threadIdx.x; base < s.end; base += kThreads * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const long long at = base + static_cast<long long>(i) * kThreads;
      v[i] = at < s.end ? load_once(src + at) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      std::uint32_t x = v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
      for (int k = 0; k < work; ++k) x = x * 0x9e3779b1u + 0x7f4a7c15u;
      acc ^= x;
    }
  }
  return acc;
}

// Asks L2 for the first `bytes` of the CTA's share, 16 KiB per bulk prefetch,
// one per thread of warp 0.
__device__ __forceinline__ void prefetch_share(const uint4* src, long long vecs, int bytes) {
  if (bytes <= 0 || threadIdx.x >= 32) return;
  const Share s = share_of(vecs);
  const long long first = min(s.end, s.begin + bytes / 16);
  constexpr long long kChunkVecs = 16 * 1024 / 16;
  for (long long at = s.begin + threadIdx.x * kChunkVecs; at < first; at += 32 * kChunkVecs) {
    ferrum::kernels::prefetch_l2_bulk(src + at, static_cast<std::uint32_t>(min(kChunkVecs, first - at) * 16));
  }
}

// Every warp's XOR decides a store (lane 0 compares it with a constant the
// filled bytes never give), so no warp's loads can be dropped, and almost
// nothing is written.
__device__ __forceinline__ void publish(std::uint32_t acc, std::uint32_t* sink) {
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// Where a PDL projection kernel releases the next one (graph variants).
enum class Release { None, BeforeWait, AfterWait };

// One projection as its own kernel (graph variants).
template <Release kRelease>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    projection_kernel(const uint4* __restrict__ src, long long vecs, std::uint32_t* sink, int prefetch_bytes,
                      int work) {
  if constexpr (kRelease != Release::None) {
    prefetch_share(src, vecs, prefetch_bytes);
    if constexpr (kRelease == Release::BeforeWait) ferrum::kernels::pdl_trigger_dependents();
    ferrum::kernels::pdl_begin();
    if constexpr (kRelease == Release::AfterWait) ferrum::kernels::pdl_trigger_dependents();
  }
  publish(read_share(src, vecs, work), sink);
}

// A sense-reversing grid barrier over co-resident CTAs (cooperative launch):
// thread 0 of each CTA arrives on `count`; the last one resets it and bumps
// `generation`, which the others spin on.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(generation) : "memory");
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      *count = 0;
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(generation), "r"(gen + 1) : "memory");
    } else {
      unsigned now = gen;
      while (now == gen) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(generation) : "memory");
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    persistent_kernel(const uint4* __restrict__ base, PassPlan plan, std::uint32_t* sink, unsigned* count,
                      unsigned* generation, int prefetch_bytes, int work) {
  std::uint32_t acc = 0;
  for (int l = 0; l < plan.layers; ++l) {
#pragma unroll  // (constant indices into plan: no copy of it in local memory)
    for (int j = 0; j < kProjections; ++j) {
      acc ^= read_share(base + l * plan.layer_vecs + plan.offset[j], plan.vecs[j], work);
      const int nl = j + 1 < kProjections ? l : l + 1, nj = (j + 1) % kProjections;
      if (nl < plan.layers) prefetch_share(base + nl * plan.layer_vecs + plan.offset[nj], plan.vecs[nj], prefetch_bytes);
      grid_barrier(count, generation);
    }
  }
  publish(acc, sink);
}

struct Options {
  int layers = 32;
  int reps = 20;
  std::vector<int> prefetch_kb = {16, 64};
  std::vector<int> work = {0, 32};
};

void usage() {
  std::printf(
      "usage: ferrum_persistent_layer_probe [--layers N] [--reps N] [--prefetch-kb LIST] [--work LIST]\n"
      "  --layers N        layers a pass streams (default 32: 3.6 GB, past L2 from pass to pass)\n"
      "  --reps N          timed passes per variant, after 3 warm-up passes (default 20; the median is printed)\n"
      "  --prefetch-kb L   comma list of KiB per CTA asked into L2 ahead in the _pf variants (default 16,64)\n"
      "  --work L          comma list of dependent multiply-adds per 16-byte vector, one table each\n"
      "                    (default 0,32: a plain read, and arithmetic that holds up the next loads)\n");
}

class Probe {
 public:
  Probe(const Options& opt, int num_sms) : opt_(opt), num_sms_(num_sms) {
    plan_.layers = opt.layers;
    long long at = 0;
    for (int j = 0; j < kProjections; ++j) {
      plan_.vecs[j] = kProjectionBytes[j] / 16;
      plan_.offset[j] = at;
      at += plan_.vecs[j];
    }
    plan_.layer_vecs = at;
    bytes_ = static_cast<std::size_t>(at) * 16 * static_cast<std::size_t>(opt.layers);
    check(cudaMalloc(&weights_, bytes_), "cudaMalloc weights");
    check(cudaMemset(weights_, 0x5a, bytes_), "cudaMemset weights");
    sink_words_ = std::max(ferrum::bench::read_ceiling_blocks(num_sms), num_sms * kMinBlocksPerSm);
    check(cudaMalloc(&sink_, sink_words_ * sizeof(std::uint32_t)), "cudaMalloc sink");
    check(cudaMalloc(&barrier_, 2 * sizeof(unsigned)), "cudaMalloc barrier");
    check(cudaMemset(barrier_, 0, 2 * sizeof(unsigned)), "cudaMemset barrier");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    int fit = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_kernel, kThreads, 0), "occupancy");
    if (fit < kBlocksPerSm) {
      std::fprintf(stderr, "persistent_kernel: %d CTAs per SM fit, %d needed\n", fit, kBlocksPerSm);
      std::exit(1);
    }
  }
  ~Probe() {
    warn_if_failed(cudaFree(weights_), "cudaFree");
    warn_if_failed(cudaFree(sink_), "cudaFree");
    warn_if_failed(cudaFree(barrier_), "cudaFree");
    warn_if_failed(cudaEventDestroy(start_), "cudaEventDestroy");
    warn_if_failed(cudaEventDestroy(stop_), "cudaEventDestroy");
    warn_if_failed(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  std::size_t bytes() const { return bytes_; }

  // The median µs of a pass run by `launch` (on stream_).
  template <class Launch>
  double time_pass(Launch&& launch) {
    for (int i = 0; i < 3; ++i) launch();
    check(cudaStreamSynchronize(stream_), "warm-up");
    std::vector<double> us;
    for (int r = 0; r < opt_.reps; ++r) {
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      launch();
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      us.push_back(1000.0 * ms);
    }
    return median(us);
  }

  double ceiling() {
    return time_pass([&] {
      ferrum::bench::launch_read_ceiling(weights_, bytes_, sink_, num_sms_, stream_);
    });
  }

  // One kernel per projection, captured once into a graph; `empty`: no bytes.
  double graph(Release release, int prefetch_bytes, int work, bool empty) {
    const bool pdl = release != Release::None;
    cudaGraph_t g = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int l = 0; l < plan_.layers; ++l) {
      for (int j = 0; j < kProjections; ++j) {
        const uint4* src = weights_ + l * plan_.layer_vecs + plan_.offset[j];
        const long long vecs = empty ? 0 : plan_.vecs[j];
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(num_sms_ * kBlocksPerSm));
        cfg.blockDim = dim3(kThreads);
        cfg.stream = stream_;
        cudaLaunchAttribute attr = {};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = pdl ? &attr : nullptr;
        cfg.numAttrs = pdl ? 1 : 0;
        auto* const kernel = release == Release::BeforeWait  ? projection_kernel<Release::BeforeWait>
                             : release == Release::AfterWait ? projection_kernel<Release::AfterWait>
                                                             : projection_kernel<Release::None>;
        check(cudaLaunchKernelEx(&cfg, kernel, src, vecs, sink_, prefetch_bytes, work), "launch");
      }
    }
    check(cudaStreamEndCapture(stream_, &g), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
    const double us = time_pass([&] { check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch"); });
    check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
    check(cudaGraphDestroy(g), "cudaGraphDestroy");
    return us;
  }

  double persistent(int prefetch_bytes, int work, bool empty) {
    PassPlan plan = plan_;
    if (empty) {
      for (long long& v : plan.vecs) v = 0;
    }
    const uint4* base = weights_;
    unsigned* count = barrier_;
    unsigned* generation = barrier_ + 1;
    void* args[] = {&base, &plan, &sink_, &count, &generation, &prefetch_bytes, &work};
    return time_pass([&] {
      check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(persistent_kernel),
                                        dim3(static_cast<unsigned>(num_sms_ * kBlocksPerSm)), dim3(kThreads), args, 0,
                                        stream_),
            "cudaLaunchCooperativeKernel");
    });
  }

  double copy_gbs() {
    constexpr std::size_t kCopy = std::size_t{1} << 30;
    const std::size_t half = std::min(kCopy, bytes_ / 2);
    const double us = time_pass([&] {
      check(cudaMemcpyAsync(reinterpret_cast<char*>(weights_) + half, weights_, half, cudaMemcpyDeviceToDevice,
                            stream_),
            "cudaMemcpyAsync");
    });
    return 2.0 * static_cast<double>(half) / (us * 1e3);
  }

 private:
  Options opt_;
  int num_sms_;
  PassPlan plan_{};
  std::size_t bytes_ = 0;
  uint4* weights_ = nullptr;
  std::uint32_t* sink_ = nullptr;
  int sink_words_ = 0;
  unsigned* barrier_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return option_value(argc, argv, i); };
    if (arg == "--layers") {
      opt.layers = std::atoi(value().c_str());
    } else if (arg == "--reps") {
      opt.reps = std::atoi(value().c_str());
    } else if (arg == "--prefetch-kb") {
      opt.prefetch_kb = comma_ints(value());
    } else if (arg == "--work") {
      opt.work = comma_ints(value());
    } else if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      usage();
      return 2;
    }
  }
  const auto outside = [](const std::vector<int>& v, int lo, int hi) {
    return v.empty() || std::any_of(v.begin(), v.end(), [&](int x) { return x < lo || x > hi; });
  };
  if (opt.layers < 1 || opt.layers > 64 || opt.reps < 1 || outside(opt.prefetch_kb, 1, 1024) ||
      outside(opt.work, 0, 4096)) {
    std::fprintf(stderr, "--layers takes 1..64, --reps at least 1, --prefetch-kb 1..1024 each, --work 0..4096 each\n");
    return 2;
  }
  cudaDeviceProp prop{};
  if (!hopper_device("ferrum_persistent_layer_probe", "needs sm_90 (bulk L2 prefetch, griddepcontrol)", false, prop)) {
    return 0;
  }
  Probe probe(opt, prop.multiProcessorCount);
  const double layer_mb = static_cast<double>(probe.bytes()) / opt.layers / 1e6;
  const double copy = probe.copy_gbs();
  const double ceiling = probe.ceiling();
  std::printf("# %s, %d SMs; %d layers of %.1f MB (llama3-8b GPTQ: q|k|v, o, gate|up, down); copy %.0f GB/s\n",
              prop.name, prop.multiProcessorCount, opt.layers, layer_mb, copy);
  auto row = [&](const std::string& name, double us) {
    const double per = us / opt.layers;
    const double gbs = static_cast<double>(probe.bytes()) / (us * 1e3);
    std::printf("| %s | %.2f | %.0f | %.3f | %.3f |\n", name.c_str(), per, gbs, ceiling / us, gbs / copy);
  };
  for (int work : opt.work) {
    std::printf("\nwork %d (dependent multiply-adds per 16-byte vector)\n\n", work);
    std::printf("| variant | µs / layer | GB/s | of ceiling | of copy |\n| --- | ---: | ---: | ---: | ---: |\n");
    row("ceiling (one launch, no work)", ceiling);
    row("graph", probe.graph(Release::None, 0, work, false));
    row("graph_pdl", probe.graph(Release::BeforeWait, 0, work, false));
    row("graph_pdl_after", probe.graph(Release::AfterWait, 0, work, false));
    for (int kb : opt.prefetch_kb) {
      row("graph_pdl_pf " + std::to_string(kb) + " KiB", probe.graph(Release::BeforeWait, kb * 1024, work, false));
      row("graph_pdl_after_pf " + std::to_string(kb) + " KiB", probe.graph(Release::AfterWait, kb * 1024, work, false));
    }
    row("persistent", probe.persistent(0, work, false));
    for (int kb : opt.prefetch_kb) {
      row("persistent_pf " + std::to_string(kb) + " KiB", probe.persistent(kb * 1024, work, false));
    }
  }
  // The boundaries alone: 4 a layer.
  const double boundaries = 4.0 * opt.layers;
  std::printf("\n| boundary, no bytes | µs each |\n| --- | ---: |\n");
  std::printf("| kernel in a graph | %.3f |\n", probe.graph(Release::None, 0, 0, true) / boundaries);
  std::printf("| kernel in a graph, PDL | %.3f |\n", probe.graph(Release::BeforeWait, 0, 0, true) / boundaries);
  std::printf("| kernel in a graph, PDL, released after the wait | %.3f |\n",
              probe.graph(Release::AfterWait, 0, 0, true) / boundaries);
  std::printf("| grid barrier | %.3f |\n", probe.persistent(0, 0, true) / boundaries);
  return 0;
}
