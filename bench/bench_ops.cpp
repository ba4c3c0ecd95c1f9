// ferrum_bench: the benchmark behind every ferrum performance claim.
//
// Method (see also bench/torch_reference.py, which mirrors it for torch):
//   * All timing uses CUDA events recorded on CudaBackend::stream(), the stream
//     every ferrum op is queued on. Results are MEDIANS of many repetitions,
//     after a warm-up.
//   * Inputs and outputs rotate over `sets` copies, sets = max(2,
//     ceil(256 MiB / bytes_per_call)), so that the data cycled through is
//     several times the H200's ~60 MB L2 and every call sees cold data
//     (weights of the memory-bound GEMMs included).
//   * Large ops are timed one launch per event pair ("stream" mode). Tiny ops
//     (1..16 tokens) are timed under CUDA-graph replay ("graph" mode): graphs
//     of kGraphOps back-to-back launches, each launch on the next buffer set,
//     several graphs when the sets need more than one; time per op = replay
//     time / kGraphOps.
//   * Bandwidth counts bytes minimally (each input read once, each output
//     written once) and is reported against a device-to-device cudaMemcpyAsync
//     of 1 GiB measured in the same run (2x bytes, median of 20). GEMM also
//     reports TFLOP/s = 2mnk / time.
//   * Inputs are random (uniform in +-[1/64, 1], never zero), generated once
//     on the host, uploaded into a pool, and copied into each buffer set with
//     copy_slice from varying pool offsets.
//
// Usage: ferrum_bench [--json PATH] [--quick] [--filter SUBSTR[,SUBSTR...]]
//                     [--reps N] [--chain N] [--graph-api]
//                     [--prefill-kernel auto|mma_sync] [--pause-ms N] [--settle-gbps R]
//                     [--attention-kv-before-wait]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"
#include "median.hpp"
#include "ferrum/ferrum.hpp"

namespace {

using ferrum::Buffer;
using ferrum::DType;

// ── CUDA error checking ────────────────────────────────────────────────────

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::ostringstream os;
  os << file << ":" << line << ": " << call << " failed: " << cudaGetErrorName(err) << ": "
     << cudaGetErrorString(err);
  throw std::runtime_error(os.str());
}
#define FB_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)

// ── Constants ──────────────────────────────────────────────────────────────

constexpr double kRotateBytes = 256.0 * 1024.0 * 1024.0;  // working set cycled per rotation
constexpr std::size_t kMaxSets = 1u << 16;
constexpr int kGraphOps = 100;       // launches captured per graph
constexpr std::size_t kMaxGraphs = 512;
constexpr std::size_t kCopyBytes = std::size_t{1} << 30;
constexpr int kCopyReps = 20;
// The copy "at this size" moves at most this much each way: a copy that size
// already runs at the asymptotic rate, and a larger one, made while a case's
// own sets are alive, doubled its memory (B = 64 L = 128k holds 64 GiB of K
// and V; the uncapped copy wanted 64 GiB more and ran out of memory on an
// 80 GB card, discarding the case's timing).
constexpr std::size_t kCopySameMaxHalf = std::size_t{4} << 30;
constexpr std::size_t kAlignElems = 128;  // set stride alignment (>= 256 bytes for 2-byte types)
constexpr std::size_t kPoolElems = std::size_t{1} << 24;
constexpr std::size_t kHidden = 4096;
constexpr std::size_t kIntermediate = 14336;
constexpr std::size_t kVocab = 128256;
constexpr float kEps = 1e-6f;

std::string dt_name(DType dt) { return std::string(ferrum::to_string(dt)); }
double dbl(std::size_t x) { return static_cast<double>(x); }

// ── Small helpers ──────────────────────────────────────────────────────────

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

struct Rng {  // xorshift64*: fast enough for hundreds of MB of host data
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed ? seed : 0x9E3779B97F4A7C15ull) {}
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform magnitude in [1/64, 1], random sign: never zero, never subnormal.
  float nonzero() {
    const float mag = static_cast<float>(1.0 / 64.0 + unit() * (1.0 - 1.0 / 64.0));
    return (next() & 1) ? mag : -mag;
  }
};

class Events {  // RAII event pairs
 public:
  explicit Events(std::size_t n) : start_(n, nullptr), stop_(n, nullptr) {
    for (std::size_t i = 0; i < n; ++i) {
      FB_CUDA(cudaEventCreate(&start_[i]));
      FB_CUDA(cudaEventCreate(&stop_[i]));
    }
  }
  ~Events() {  // a destructor: warn, never throw
    for (auto e : start_)
      if (e) warn_if_failed(cudaEventDestroy(e), "cudaEventDestroy");
    for (auto e : stop_)
      if (e) warn_if_failed(cudaEventDestroy(e), "cudaEventDestroy");
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t start(std::size_t i) const { return start_[i]; }
  cudaEvent_t stop(std::size_t i) const { return stop_[i]; }
  // Elapsed microseconds of each pair (events must have completed).
  std::vector<double> elapsed_us() const {
    std::vector<double> us(start_.size());
    for (std::size_t i = 0; i < us.size(); ++i) {
      float ms = 0.0f;
      FB_CUDA(cudaEventElapsedTime(&ms, start_[i], stop_[i]));
      us[i] = 1000.0 * static_cast<double>(ms);
    }
    return us;
  }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

class GraphExecs {  // RAII instantiated graphs
 public:
  GraphExecs() = default;
  ~GraphExecs() {  // a destructor: warn, never throw
    for (auto g : execs)
      if (g) warn_if_failed(cudaGraphExecDestroy(g), "cudaGraphExecDestroy");
  }
  GraphExecs(const GraphExecs&) = delete;
  GraphExecs& operator=(const GraphExecs&) = delete;
  std::vector<cudaGraphExec_t> execs;
};

// `sets` equally sized, 256-byte aligned slices of one allocation.
struct Rotated {
  Buffer parent;
  std::vector<Buffer> v;
  Buffer& operator[](std::size_t i) { return v[i]; }
  const Buffer& operator[](std::size_t i) const { return v[i]; }
};

// ── Options and records ────────────────────────────────────────────────────

struct Options {
  std::string json_path;
  std::vector<std::string> filters;
  bool quick = false;
  bool graph_api = false;  // use Backend::begin_graph_capture (one graph) instead of raw capture
  int reps = 0;            // 0: default for the mode
  // Stream mode: launches per event pair (consecutive sets); time per op =
  // elapsed / chain. 1 (default) times each launch alone; larger values show
  // what back-to-back launches cost in a stream (the event and launch gaps
  // amortized, each kernel's own ramp-up and tail still counted). The
  // same-size copy is chained the same way.
  int chain = 1;
  // Idle time before each case (the device synchronized first). A case
  // that starts within ~5 ms of one that freed tens of GB runs slow for
  // tens of ms (session 59, H100: B = 64 L = 8k decode right after
  // B = 16 L = 128k, which frees 2 x 17 GB of K / V: 811 us, 16 % slow,
  // after 0, 1 or 5 ms idle; 701 us, as alone, after 20 ms or more; SM
  // clock 1980 MHz throughout, 430 W at most, memory at 66 C at most;
  // a B = 16 L = 32k predecessor, 2 x 4 GB, none). The reading: the
  // driver zeroing the freed memory in the background, which takes
  // bandwidth from whatever runs. 50 ms was enough there, not after 34 GB
  // (settle_gbps below); --pause-ms 0 --settle-gbps 0 shows the effect.
  int pause_ms = 50;
  // More idle after a case that allocated much: its bytes / settle_gbps
  // (0: none). Session 62, H100: B = 64 L = 1k after B = 16 L = 128k
  // (which allocated 34 GB: K and V two 8.6 GB sets each, its copy
  // reference 2 x 8.6 GB) ran 114.6 us after 0 or 50 ms idle, 98-100
  // after 100 ms to 3 s, 100.0 alone; the copy reference timed right after
  // it read 2495 GB/s against 2881. 50 GB/s waits 0.69 s there and ~10 ms
  // after a case of 0.5 GB.
  double settle_gbps = 50.0;
  ferrum::PrefillKernel prefill_kernel = ferrum::PrefillKernel::Auto;
  // CudaBackendConfig::attention_kv_before_wait: the promise holds here
  // (nothing the benchmark runs writes a K / V cache that a decode reads).
  bool attention_kv_before_wait = false;
};

struct Record {
  std::string op, dtype, shape, mode;
  double us = std::numeric_limits<double>::quiet_NaN();
  double gbps = std::numeric_limits<double>::quiet_NaN();
  double tflops = std::numeric_limits<double>::quiet_NaN();
  double pct = std::numeric_limits<double>::quiet_NaN();
  // GB/s of a device copy moving the same bytes (read + write), rotated the
  // same way: the ceiling at this size, where ramp-up and tail cost more.
  double copy_same_gbps = std::numeric_limits<double>::quiet_NaN();
  double bytes = 0.0;
  double flops = 0.0;
  std::size_t sets = 0;
  std::size_t reps = 0;
  std::size_t graphs = 0;
  std::string note;
  std::string error;
};

struct Spec {
  std::string op;
  DType dt;
  std::string shape;
  bool graph;    // graph-replay mode (tiny shapes)
  double bytes;  // minimal bytes moved per call
  double flops;  // 0 when not meaningful
};

using Launch = std::function<void(std::size_t set)>;

struct Timing {
  double us = 0.0;
  std::size_t reps = 0;
  std::size_t graphs = 0;
  std::string note;
};

// ── The bench context ──────────────────────────────────────────────────────

class Bench {
 public:
  Bench(ferrum::CudaBackend& be, Options opt) : be_(be), st_(be.stream()), opt_(std::move(opt)) {}

  ferrum::CudaBackend& be() { return be_; }
  const Options& opt() const { return opt_; }
  double copy_gbps() const { return copy_gbps_; }
  double copy_us() const { return copy_us_; }
  const std::vector<Record>& records() const { return records_; }

  bool want(const Spec& s) const {
    if (opt_.filters.empty()) return true;
    const std::string key =
        s.op + " " + dt_name(s.dt) + " " + s.shape + " " + (s.graph ? "graph" : "stream");
    for (const auto& f : opt_.filters)
      if (key.find(f) != std::string::npos) return true;
    return false;
  }

  static std::size_t sets_for(double bytes_per_call) {
    const double n = std::ceil(kRotateBytes / std::max(bytes_per_call, 1.0));
    return std::clamp<std::size_t>(static_cast<std::size_t>(n), 2, kMaxSets);
  }

  // ── Data ──
  // Fills `dst` with random values of its dtype, copied from the pool.
  void fill(Buffer& dst) {
    const Buffer& pool = pool_for(dst.dtype());
    const std::size_t pn = pool.numel();
    std::size_t off = 0;
    while (off < dst.numel()) {
      const std::size_t start = static_cast<std::size_t>(fill_rng_.next() % pn);
      const std::size_t len = std::min(dst.numel() - off, pn - start);
      be_.copy_slice(pool, start, dst, off, len);
      off += len;
    }
  }

  // Every allocation of a case goes through these two: its bytes set the
  // idle before the next case (Options::settle_gbps).
  Buffer alloc(DType dt, std::size_t n) {
    Buffer b = be_.alloc(dt, n);
    case_bytes_ += n * ferrum::size_of(dt);
    return b;
  }
  Buffer upload(const std::vector<float>& host, DType dt) {
    Buffer b = be_.upload(host, dt);
    case_bytes_ += host.size() * ferrum::size_of(dt);
    return b;
  }

  Rotated rotated(DType dt, std::size_t per_set, std::size_t sets, bool random = true) {
    Rotated r;
    const std::size_t stride = round_up(per_set, kAlignElems);
    r.parent = alloc(dt, stride * sets);
    if (random) fill(r.parent);
    r.v.reserve(sets);
    for (std::size_t i = 0; i < sets; ++i) r.v.push_back(r.parent.view(i * stride, per_set));
    return r;
  }

  Buffer random_buffer(DType dt, std::size_t n) {
    Buffer b = alloc(dt, n);
    fill(b);
    return b;
  }

  // ── Copy reference ──
  void measure_copy() {
    Buffer src = be_.alloc(DType::U8, kCopyBytes);
    Buffer dst = be_.alloc(DType::U8, kCopyBytes);
    FB_CUDA(cudaMemsetAsync(src.data(), 0x5a, kCopyBytes, st_));
    FB_CUDA(cudaMemsetAsync(dst.data(), 0xa5, kCopyBytes, st_));
    for (int i = 0; i < 3; ++i)
      FB_CUDA(cudaMemcpyAsync(dst.data(), src.data(), kCopyBytes, cudaMemcpyDeviceToDevice, st_));
    Events ev(kCopyReps);
    for (int i = 0; i < kCopyReps; ++i) {
      FB_CUDA(cudaEventRecord(ev.start(i), st_));
      FB_CUDA(cudaMemcpyAsync(dst.data(), src.data(), kCopyBytes, cudaMemcpyDeviceToDevice, st_));
      FB_CUDA(cudaEventRecord(ev.stop(i), st_));
    }
    FB_CUDA(cudaStreamSynchronize(st_));
    copy_us_ = median(ev.elapsed_us());
    copy_gbps_ = 2.0 * static_cast<double>(kCopyBytes) / copy_us_ / 1e3;
  }

  // Copy of bytes/2 (so bytes are moved, read + write), rotated past L2 and
  // timed like the cases; cached by size.
  // The bytes each way of the copy "at the size" of a case moving `bytes`.
  static std::size_t copy_same_half(double bytes) {
    return std::min(static_cast<std::size_t>(bytes / 2.0), kCopySameMaxHalf) & ~std::size_t{255};
  }
  double copy_gbps_for(double bytes) {
    const std::size_t half = copy_same_half(bytes);
    if (half == 0) return std::numeric_limits<double>::quiet_NaN();
    auto it = copy_same_.find(half);
    if (it != copy_same_.end()) return it->second;
    const auto sets = std::max<std::size_t>(2, static_cast<std::size_t>(std::ceil(kRotateBytes / (2.0 * static_cast<double>(half)))));
    Buffer src = alloc(DType::U8, half * sets);
    Buffer dst = alloc(DType::U8, half * sets);
    FB_CUDA(cudaMemsetAsync(src.data(), 0x5a, half * sets, st_));
    auto* s8 = static_cast<unsigned char*>(src.data());
    auto* d8 = static_cast<unsigned char*>(dst.data());
    // Timed exactly as the cases are (time_stream: warm-up, reps, --chain).
    const Timing t = time_stream(
        [&](std::size_t k) {
          FB_CUDA(cudaMemcpyAsync(d8 + k * half, s8 + k * half, half, cudaMemcpyDeviceToDevice, st_));
        },
        sets);
    const double gbps = 2.0 * static_cast<double>(half) / t.us / 1e3;
    copy_same_.emplace(half, gbps);
    return gbps;
  }

  // ── Measurement ──
  // Runs `body` for one case; any exception becomes an error record.
  template <class F>
  void guarded(const Spec& spec, F&& body) {
    if (!want(spec)) return;
    std::fflush(stdout);
    try {
      // case_bytes_ holds what the case before allocated until it starts
      // counting this case's.
      const double settle_ms =
          opt_.settle_gbps > 0.0 ? static_cast<double>(case_bytes_) / (opt_.settle_gbps * 1e6) : 0.0;
      case_bytes_ = 0;
      const auto idle = std::chrono::microseconds(static_cast<long long>((opt_.pause_ms + settle_ms) * 1e3));
      if (idle.count() > 0) {
        be_.synchronize();
        std::this_thread::sleep_for(idle);
      }
      body();
    } catch (const std::exception& e) {
      Record r = base_record(spec, 0);
      r.error = e.what();
      print_row(r);
      records_.push_back(std::move(r));
      // Drain whatever is queued so the next case starts clean; a sticky
      // CUDA error will make every later case report it too. A failure here
      // is printed, not hidden, and the run carries on.
      try {
        be_.synchronize();
      } catch (const std::exception& sync_error) {  // ferrum::Error included
        std::fprintf(stderr, "ferrum_bench: synchronize after %s %s failed: %s\n", spec.op.c_str(),
                     spec.shape.c_str(), sync_error.what());
      } catch (...) {
        std::fprintf(stderr, "ferrum_bench: synchronize after %s %s failed\n", spec.op.c_str(), spec.shape.c_str());
      }
      (void)cudaGetLastError();
    }
  }

  void measure(const Spec& spec, std::size_t sets, const Launch& launch, const std::string& note = "") {
    Timing t = spec.graph ? time_graph(launch, sets) : time_stream(launch, sets);
    Record r = base_record(spec, sets);
    r.us = t.us;
    r.reps = t.reps;
    r.graphs = t.graphs;
    r.note = note.empty() ? t.note : (t.note.empty() ? note : note + "; " + t.note);
    if (spec.bytes > 0.0) {
      r.gbps = spec.bytes / t.us / 1e3;
      if (copy_gbps_ > 0.0) r.pct = 100.0 * r.gbps / copy_gbps_;
      if (!spec.graph && spec.flops == 0.0) {
        // The case's timing stands even where its reference copy cannot run.
        std::string copy_note;
        try {
          r.copy_same_gbps = copy_gbps_for(spec.bytes);
          char buf[96];
          std::snprintf(buf, sizeof buf, "copy at this size%s %.0f GB/s",
                        copy_same_half(spec.bytes) == kCopySameMaxHalf ? " (4 GiB each way)" : "",
                        r.copy_same_gbps);
          copy_note = buf;
        } catch (const std::exception& e) {
          copy_note = std::string("copy at this size not measured: ") + e.what();
          (void)cudaGetLastError();
        }
        r.note = r.note.empty() ? copy_note : r.note + "; " + copy_note;
      }
    }
    if (spec.flops > 0.0) r.tflops = spec.flops / t.us / 1e6;
    print_row(r);
    records_.push_back(std::move(r));
  }

  static void print_header() {
    std::printf("%-28s %-5s %-34s %-6s %11s %9s %8s %7s %6s  %s\n", "op", "dtype", "shape", "mode",
                "median_us", "GB/s", "TFLOP/s", "%copy", "sets", "note");
    std::printf("%s\n", std::string(130, '-').c_str());
  }

  static void print_row(const Record& r) {
    auto num = [](double v, const char* fmt) {
      if (!std::isfinite(v)) return std::string("-");
      char buf[64];
      std::snprintf(buf, sizeof buf, fmt, v);
      return std::string(buf);
    };
    if (!r.error.empty()) {
      std::printf("%-28s %-5s %-34s %-6s ERROR: %s\n", r.op.c_str(), r.dtype.c_str(), r.shape.c_str(),
                  r.mode.c_str(), r.error.c_str());
    } else {
      std::printf("%-28s %-5s %-34s %-6s %11s %9s %8s %7s %6zu  %s\n", r.op.c_str(), r.dtype.c_str(),
                  r.shape.c_str(), r.mode.c_str(), num(r.us, "%.2f").c_str(), num(r.gbps, "%.0f").c_str(),
                  num(r.tflops, "%.1f").c_str(), num(r.pct, "%.1f").c_str(), r.sets, r.note.c_str());
    }
    std::fflush(stdout);
  }

 private:
  Record base_record(const Spec& spec, std::size_t sets) const {
    Record r;
    r.op = spec.op;
    r.dtype = dt_name(spec.dt);
    r.shape = spec.shape;
    r.mode = spec.graph ? "graph" : "stream";
    r.bytes = spec.bytes;
    r.flops = spec.flops;
    r.sets = sets;
    return r;
  }

  const Buffer& pool_for(DType dt) {
    auto it = pools_.find(dt);
    if (it != pools_.end()) return it->second;
    Rng rng(0x1234567ull + static_cast<std::uint64_t>(dt) * 7919ull);
    std::vector<float> host(kPoolElems);
    if (dt == DType::I32 || dt == DType::U8) {
      for (auto& x : host) x = static_cast<float>(1 + rng.next() % 100);  // positive small ints
    } else {
      for (auto& x : host) x = rng.nonzero();
    }
    Buffer b = be_.upload(host, dt);
    return pools_.emplace(dt, std::move(b)).first->second;
  }

  std::size_t stream_reps() const {
    if (opt_.reps > 0) return static_cast<std::size_t>(opt_.reps);
    return opt_.quick ? 20 : 100;
  }
  std::size_t graph_reps() const {
    if (opt_.reps > 0) return static_cast<std::size_t>(opt_.reps);
    return opt_.quick ? 10 : 50;
  }

  Timing time_stream(const Launch& launch, std::size_t sets) {
    const std::size_t warm = std::max<std::size_t>(sets, opt_.quick ? 3 : 10);
    for (std::size_t i = 0; i < warm; ++i) launch(i % sets);
    be_.synchronize();
    const std::size_t reps = stream_reps();
    const auto chain = static_cast<std::size_t>(opt_.chain);
    Events ev(reps);
    std::size_t next = warm;
    for (std::size_t r = 0; r < reps; ++r) {
      FB_CUDA(cudaEventRecord(ev.start(r), st_));
      for (std::size_t c = 0; c < chain; ++c) launch(next++ % sets);
      FB_CUDA(cudaEventRecord(ev.stop(r), st_));
    }
    be_.synchronize();
    Timing t;
    t.us = median(ev.elapsed_us()) / static_cast<double>(chain);
    t.reps = reps;
    if (chain > 1) t.note = "chain " + std::to_string(chain);
    return t;
  }

  // Ends a raw capture that failed part-way, so the stream is usable again.
  void abandon_capture() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st_, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(st_, &g);
      // Runs while an exception is on its way out: warn rather than throw over it.
      if (g) warn_if_failed(cudaGraphDestroy(g), "cudaGraphDestroy");
    }
    (void)cudaGetLastError();
  }

  Timing time_graph(const Launch& launch, std::size_t sets) {
    // Eager warm-up outside capture (lazy module loading, first-call setup).
    for (std::size_t i = 0; i < std::min<std::size_t>(sets, 4); ++i) launch(i);
    be_.synchronize();
    if (!opt_.graph_api) {
      try {
        return time_graph_raw(launch, sets);
      } catch (const std::exception& e) {
        abandon_capture();
        try {
          be_.synchronize();
        } catch (...) {
        }
        Timing t = time_graph_backend(launch, sets);
        t.note = std::string("raw capture failed (") + e.what() + "); " + t.note;
        return t;
      }
    }
    return time_graph_backend(launch, sets);
  }

  // Several graphs, each of kGraphOps launches on consecutive sets, so that a
  // round of replays cycles through every set (cold L2).
  Timing time_graph_raw(const Launch& launch, std::size_t sets) {
    const std::size_t graphs =
        std::clamp<std::size_t>((sets + kGraphOps - 1) / kGraphOps, 1, kMaxGraphs);
    GraphExecs ge;
    for (std::size_t g = 0; g < graphs; ++g) {
      FB_CUDA(cudaStreamBeginCapture(st_, cudaStreamCaptureModeRelaxed));
      try {
        for (int i = 0; i < kGraphOps; ++i) launch((g * kGraphOps + static_cast<std::size_t>(i)) % sets);
      } catch (...) {
        abandon_capture();
        throw;
      }
      cudaGraph_t graph = nullptr;
      FB_CUDA(cudaStreamEndCapture(st_, &graph));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t err = cudaGraphInstantiateWithFlags(&exec, graph, 0);
      const cudaError_t destroyed = cudaGraphDestroy(graph);  // done with either way
      FB_CUDA(err);
      ge.execs.push_back(exec);  // owned before a throw below
      FB_CUDA(destroyed);
      FB_CUDA(cudaGraphUpload(exec, st_));
    }
    for (int w = 0; w < 2; ++w)
      for (auto exec : ge.execs) FB_CUDA(cudaGraphLaunch(exec, st_));
    be_.synchronize();
    const std::size_t reps = std::max(graph_reps(), graphs);
    Events ev(reps);
    for (std::size_t r = 0; r < reps; ++r) {
      FB_CUDA(cudaEventRecord(ev.start(r), st_));
      FB_CUDA(cudaGraphLaunch(ge.execs[r % graphs], st_));
      FB_CUDA(cudaEventRecord(ev.stop(r), st_));
    }
    be_.synchronize();
    Timing t;
    t.us = median(ev.elapsed_us()) / kGraphOps;
    t.reps = reps;
    t.graphs = graphs;
    return t;
  }

  // Through the backend's own capture API: it holds one graph, so only
  // min(sets, kGraphOps) sets are cycled and the data may sit in L2.
  Timing time_graph_backend(const Launch& launch, std::size_t sets) {
    const std::size_t used = std::min<std::size_t>(sets, kGraphOps);
    be_.begin_graph_capture();
    try {
      for (int i = 0; i < kGraphOps; ++i) launch(static_cast<std::size_t>(i) % used);
    } catch (...) {
      try {
        be_.end_graph_capture();
      } catch (...) {
      }
      abandon_capture();
      be_.reset_graph();
      throw;
    }
    be_.end_graph_capture();
    for (int w = 0; w < 3; ++w)
      if (!be_.replay_last_graph()) throw std::runtime_error("replay_last_graph: no graph held");
    be_.synchronize();
    const std::size_t reps = graph_reps();
    Events ev(reps);
    for (std::size_t r = 0; r < reps; ++r) {
      FB_CUDA(cudaEventRecord(ev.start(r), st_));
      be_.replay_last_graph();
      FB_CUDA(cudaEventRecord(ev.stop(r), st_));
    }
    be_.synchronize();
    be_.reset_graph();
    Timing t;
    t.us = median(ev.elapsed_us()) / kGraphOps;
    t.reps = reps;
    t.graphs = 1;
    t.note = "backend graph API: one graph over " + std::to_string(used) + " sets (L2-warm)";
    return t;
  }

  ferrum::CudaBackend& be_;
  cudaStream_t st_;
  Options opt_;
  double copy_gbps_ = 0.0;
  double copy_us_ = 0.0;
  std::map<std::size_t, double> copy_same_;
  std::size_t case_bytes_ = 0;  // allocated by the case running, or by the last one between cases
  std::vector<Record> records_;
  std::map<DType, Buffer> pools_;
  Rng fill_rng_{0xC0FFEEull};
};

// ── Shape strings (bench/torch_reference.py builds the same ones) ──────────

std::string shape_td(std::size_t t, std::size_t d) {
  return "[" + std::to_string(t) + " x " + std::to_string(d) + "]";
}
std::string shape_gemm(std::size_t m, std::size_t n, std::size_t k) {
  return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
}

// ── Cases ──────────────────────────────────────────────────────────────────

void bench_rms_norm(Bench& b, DType dt, std::size_t T, std::size_t D, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  Spec spec{"rms_norm", dt, shape_td(T, D), graph, dbl(2 * T * D * es + D * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated x = b.rotated(dt, T * D, sets), w = b.rotated(dt, D, sets), out = b.rotated(dt, T * D, sets);
    b.measure(spec, sets, [&](std::size_t s) { b.be().rms_norm(x[s], w[s], kEps, out[s], T, D); });
  });
}

void bench_fused_add_rms_norm(Bench& b, DType dt, std::size_t T, std::size_t D, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  // x read, residual read + write, out write, weights once.
  Spec spec{"fused_add_rms_norm", dt, shape_td(T, D), graph, dbl(4 * T * D * es + D * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated res = b.rotated(dt, T * D, sets), x = b.rotated(dt, T * D, sets), w = b.rotated(dt, D, sets),
            out = b.rotated(dt, T * D, sets);
    b.measure(spec, sets,
              [&](std::size_t s) { b.be().fused_add_rms_norm(res[s], x[s], w[s], kEps, out[s], T, D); });
  });
}

void bench_layer_norm(Bench& b, DType dt, std::size_t T, std::size_t D, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  Spec spec{"layer_norm", dt, shape_td(T, D), graph, dbl(2 * T * D * es + 2 * D * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated x = b.rotated(dt, T * D, sets), g = b.rotated(dt, D, sets), beta = b.rotated(dt, D, sets),
            out = b.rotated(dt, T * D, sets);
    b.measure(spec, sets,
              [&](std::size_t s) { b.be().layer_norm(x[s], g[s], beta[s], kEps, out[s], T, D); });
  });
}

void bench_gelu(Bench& b, DType dt, std::size_t T, std::size_t D, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::size_t n = T * D;
  Spec spec{"gelu", dt, shape_td(T, D), graph, dbl(2 * n * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated x = b.rotated(dt, n, sets), out = b.rotated(dt, n, sets);
    b.measure(spec, sets, [&](std::size_t s) {
      b.be().gelu(x[s], out[s], n, ferrum::GeluApproximation::Erf);
    }, "erf");
  });
}

void bench_add_inplace(Bench& b, DType dt, std::size_t T, std::size_t D, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::size_t n = T * D;
  Spec spec{"add_inplace", dt, shape_td(T, D), graph, dbl(3 * n * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated res = b.rotated(dt, n, sets), x = b.rotated(dt, n, sets);
    b.measure(spec, sets, [&](std::size_t s) { b.be().add_inplace(res[s], x[s], n); });
  });
}

// Greedy sampling over a vocabulary: reads rows x vocab logits, writes rows i32.
void bench_argmax(Bench& b, DType dt, std::size_t rows, std::size_t vocab, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  Spec spec{"argmax", dt, shape_td(rows, vocab), graph, dbl(rows * vocab * es + 4 * rows), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated x = b.rotated(dt, rows * vocab, sets), out = b.rotated(DType::I32, rows, sets, /*random=*/false);
    b.measure(spec, sets, [&](std::size_t s) { b.be().argmax(x[s], out[s], rows, vocab); });
  });
}

void bench_add_bias(Bench& b, DType dt, std::size_t rows, std::size_t cols, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  Spec spec{"add_bias", dt, shape_td(rows, cols), graph, dbl(2 * rows * cols * es + cols * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated data = b.rotated(dt, rows * cols, sets), bias = b.rotated(dt, cols, sets);
    b.measure(spec, sets, [&](std::size_t s) { b.be().add_bias(data[s], bias[s], rows, cols); });
  });
}

void bench_silu_mul(Bench& b, DType dt, std::size_t T, std::size_t im, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  Spec spec{"fused_silu_mul_split", dt, shape_td(T, im), graph, dbl(3 * T * im * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated gu = b.rotated(dt, T * 2 * im, sets), out = b.rotated(dt, T * im, sets);
    b.measure(spec, sets, [&](std::size_t s) { b.be().fused_silu_mul_split(gu[s], out[s], T, im); });
  });
}

void bench_split_qkv(Bench& b, DType dt, std::size_t T, std::size_t qd, std::size_t kvd, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::string shape =
      "T=" + std::to_string(T) + " q=" + std::to_string(qd) + " kv=" + std::to_string(kvd);
  Spec spec{"split_qkv", dt, shape, graph, dbl(2 * T * (qd + 2 * kvd) * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated qkv = b.rotated(dt, T * (qd + 2 * kvd), sets), q = b.rotated(dt, T * qd, sets),
            k = b.rotated(dt, T * kvd, sets), v = b.rotated(dt, T * kvd, sets);
    b.measure(spec, sets,
              [&](std::size_t s) { b.be().split_qkv(qkv[s], q[s], k[s], v[s], T, qd, kvd); });
  });
}

void bench_transpose(Bench& b, DType dt, std::size_t heads, std::size_t T, std::size_t dim, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::size_t n = heads * T * dim;
  const std::string shape =
      "[" + std::to_string(heads) + " x " + std::to_string(T) + " x " + std::to_string(dim) + "]";
  Spec spec{"transpose_head_to_token", dt, shape, graph, dbl(2 * n * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated src = b.rotated(dt, n, sets), dst = b.rotated(dt, n, sets);
    b.measure(spec, sets,
              [&](std::size_t s) { b.be().transpose_head_to_token(src[s], dst[s], T, heads, dim); });
  });
}

void bench_embedding(Bench& b, DType dt, std::size_t T, std::size_t vocab, std::size_t dim, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::string shape =
      "T=" + std::to_string(T) + " vocab=" + std::to_string(vocab) + " dim=" + std::to_string(dim);
  // rows gathered once, ids once, output once (the table is shared by all sets).
  Spec spec{"embedding_lookup", dt, shape, graph, dbl(2 * T * dim * es + 4 * T), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Buffer table = b.random_buffer(dt, vocab * dim);
    Rotated ids = b.rotated(DType::I32, T, sets, /*random=*/false);
    {
      const std::size_t stride = round_up(T, kAlignElems);
      std::vector<float> host(stride * sets, 0.0f);
      Rng rng(0xE1B0ull + T);
      for (auto& id : host) id = static_cast<float>(rng.next() % vocab);  // exact in f32 (< 2^24)
      b.be().write(ids.parent, host, 0);
    }
    Rotated out = b.rotated(dt, T * dim, sets);
    b.measure(spec, sets,
              [&](std::size_t s) { b.be().embedding_lookup(table, ids[s], out[s], T, dim, vocab); });
  });
}

// cos / sin [max_pos, hd / 2] f32 (theta 1e6), uploaded.
void upload_rope_tables(Bench& b, std::size_t max_pos, std::size_t hd, Buffer& cos_t, Buffer& sin_t) {
  const std::size_t half = hd / 2;
  std::vector<float> c(max_pos * half), sn(max_pos * half);
  for (std::size_t p = 0; p < max_pos; ++p) {
    for (std::size_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(1e6, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      c[p * half + i] = static_cast<float>(std::cos(dbl(p) * inv_freq));
      sn[p * half + i] = static_cast<float>(std::sin(dbl(p) * inv_freq));
    }
  }
  cos_t = b.upload(c, DType::F32);
  sin_t = b.upload(sn, DType::F32);
}

void bench_qk_norm_rope(Bench& b, DType dt, std::size_t T, std::size_t H, std::size_t hd, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::size_t half = hd / 2;
  const std::string shape =
      "T=" + std::to_string(T) + " H=" + std::to_string(H) + " hd=" + std::to_string(hd);
  // input + output, norm weight, the T rows of cos and sin (f32) used.
  Spec spec{"qk_norm_rope", dt, shape, graph, dbl(2 * T * H * hd * es + hd * es + 2 * T * half * 4), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    const std::size_t max_pos = std::max<std::size_t>(T, 4096);
    Buffer cos_t, sin_t;
    upload_rope_tables(b, max_pos, hd, cos_t, sin_t);
    Rotated in = b.rotated(dt, T * H * hd, sets), w = b.rotated(dt, hd, sets),
            out = b.rotated(dt, T * H * hd, sets);
    const std::size_t pos_span = max_pos - T + 1;
    b.measure(spec, sets, [&](std::size_t s) {
      const std::size_t pos = (s * 131) % pos_span;
      b.be().qk_norm_rope(in[s], &w[s], cos_t, sin_t, out[s], T, H, hd, pos, max_pos, kEps,
                          ferrum::RopeMode::NormAndRope);
    }, "NormAndRope");
  });
}

// qkv_rope_append: a decode step's split + ropes + append in one launch.
void bench_qkv_rope_append(Bench& b, DType dt, std::size_t T, std::size_t H, std::size_t nkv, std::size_t hd,
                           std::size_t cap, bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::size_t row = (H + 2 * nkv) * hd;
  const std::string shape = "T=" + std::to_string(T) + " H=" + std::to_string(H) + "/" + std::to_string(nkv) +
                            " hd=" + std::to_string(hd) + " cap=" + std::to_string(cap);
  // qkv in; q, k, v out (the same bytes); two norm weights; the cos / sin rows used.
  Spec spec{"qkv_rope_append", dt, shape, graph, dbl(2 * T * row * es + 2 * hd * es + 2 * T * (hd / 2) * 4), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Buffer cos_t, sin_t;
    upload_rope_tables(b, cap, hd, cos_t, sin_t);
    Rotated qkv = b.rotated(dt, T * row, sets), qn = b.rotated(dt, hd, sets), kn = b.rotated(dt, hd, sets),
            q_out = b.rotated(dt, T * H * hd, sets);
    // A few cache pairs shared by the sets (as bench_kv_append in graph mode),
    // each set appending at its own position.
    const std::size_t pairs = std::min<std::size_t>(sets, 4);
    Rotated kc = b.rotated(dt, nkv * cap * hd, pairs, false), vc = b.rotated(dt, nkv * cap * hd, pairs, false);
    const ferrum::QkvRopeAppendConfig cfg{.heads = H, .kv_heads = nkv, .head_dim = hd, .capacity = cap, .max_pos = cap,
                                          .eps = kEps, .mode = ferrum::RopeMode::NormAndRope};
    const std::size_t pos_span = cap - T + 1;
    b.measure(spec, sets, [&](std::size_t s) {
      b.be().qkv_rope_append(qkv[s], &qn[s], &kn[s], cos_t, sin_t, q_out[s], kc[s % pairs], vc[s % pairs], T,
                             (s * 131) % pos_span, cfg);
    }, "NormAndRope");
  });
}

void bench_kv_append(Bench& b, DType dt, std::size_t T, std::size_t nkv, std::size_t hd, std::size_t cap,
                     bool graph) {
  const std::size_t es = ferrum::size_of(dt);
  const std::string shape = "T=" + std::to_string(T) + " nkv=" + std::to_string(nkv) +
                            " hd=" + std::to_string(hd) + " cap=" + std::to_string(cap);
  // new K and V read once, written once into the cache.
  Spec spec{"kv_cache_append_head_major", dt, shape, graph, dbl(4 * nkv * T * hd * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated nk = b.rotated(dt, nkv * T * hd, sets), nv = b.rotated(dt, nkv * T * hd, sets);
    // Cache pairs: one per set when a set's caches are small next to what it
    // moves (large appends); otherwise a few pairs shared by the sets, each
    // set appending at its own position, so the writes still sweep > L2.
    const std::size_t cache_n = nkv * cap * hd;
    const bool per_set = !graph;
    const std::size_t pairs = per_set ? sets : std::min<std::size_t>(sets, 4);
    Rotated ck = b.rotated(dt, cache_n, pairs), cv = b.rotated(dt, cache_n, pairs);
    const std::size_t slots = cap / T;  // disjoint append positions per pair
    b.measure(spec, sets, [&](std::size_t s) {
      const std::size_t pair = s % pairs;
      const std::size_t cache_len = per_set ? cap - T : ((s / pairs) % slots) * T;
      b.be().kv_cache_append_head_major(ck[pair], cv[pair], cache_len, cap, nk[s], nv[s], T, nkv, hd);
    });
  });
}

void bench_gemm(Bench& b, DType dt, std::size_t m, std::size_t n, std::size_t k) {
  const std::size_t es = ferrum::size_of(dt);
  Spec spec{"gemm", dt, shape_gemm(m, n, k), false,
            dbl((m * k + n * k + m * n) * es), 2.0 * dbl(m) * dbl(n) * dbl(k)};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);  // weights rotate past L2 too
    Rotated a = b.rotated(dt, m * k, sets), w = b.rotated(dt, n * k, sets), out = b.rotated(dt, m * n, sets);
    b.measure(spec, sets, [&](std::size_t s) { b.be().gemm(a[s], w[s], out[s], m, n, k); });
  });
}

// Decode attention, GQA 32/8, hd 128: one query per sequence against L keys
// of a head-major cache. Bytes count K+V only (what bounds it).
void bench_attention_decode(Bench& b, DType dt, std::size_t B, std::size_t L) {
  constexpr std::size_t kNh = 32, kNkv = 8, kHd = 128;
  const std::size_t es = ferrum::size_of(dt);
  const bool graph = B == 1 && L <= 8192;  // tiny calls: graph replay
  const std::string shape = "B=" + std::to_string(B) + " L=" + std::to_string(L) + " h=32/8 hd=128";
  Spec spec{"attention_decode", dt, shape, graph, dbl(2 * B * kNkv * L * kHd * es), 0.0};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated q = b.rotated(dt, B * kNh * kHd, sets), out = b.rotated(dt, B * kNh * kHd, sets, false);
    Rotated k = b.rotated(dt, B * kNkv * L * kHd, sets), v = b.rotated(dt, B * kNkv * L * kHd, sets);
    ferrum::AttnConfig cfg;
    cfg.num_heads = kNh;
    cfg.num_kv_heads = kNkv;
    cfg.head_dim = kHd;
    cfg.kv_seq_stride = L;
    b.measure(spec, sets, [&](std::size_t s) { b.be().flash_attention(q[s], k[s], v[s], out[s], B, 1, L, L - 1, cfg); });
  });
}

// Causal prefill, 32 heads, hd 128, batch 1: FLOPs = 4 * h * S^2 * hd / 2.
void bench_attention_prefill(Bench& b, DType dt, std::size_t S, std::size_t nkv) {
  constexpr std::size_t kNh = 32, kHd = 128;
  const std::size_t es = ferrum::size_of(dt);
  const std::string shape = "S=" + std::to_string(S) + " h=32/" + std::to_string(nkv) + " hd=128 causal";
  const double flops = 4.0 * dbl(kNh) * dbl(S) * dbl(S) * dbl(kHd) / 2.0;
  Spec spec{"attention_prefill", dt, shape, false, dbl((2 * kNh + 2 * nkv) * S * kHd * es), flops};
  b.guarded(spec, [&] {
    const std::size_t sets = Bench::sets_for(spec.bytes);
    Rotated q = b.rotated(dt, kNh * S * kHd, sets), out = b.rotated(dt, kNh * S * kHd, sets, false);
    Rotated k = b.rotated(dt, nkv * S * kHd, sets), v = b.rotated(dt, nkv * S * kHd, sets);
    ferrum::AttnConfig cfg;
    cfg.num_heads = kNh;
    cfg.num_kv_heads = nkv;
    cfg.head_dim = kHd;
    cfg.causal = true;
    b.measure(spec, sets, [&](std::size_t s) { b.be().flash_attention(q[s], k[s], v[s], out[s], 1, S, S, 0, cfg); });
  });
}

// ── JSON ───────────────────────────────────────────────────────────────────

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void write_json(const std::string& path, const Bench& b, const std::string& device, const Options& opt) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path + " for writing");
  f << "{\n";
  f << "  \"tool\": \"ferrum_bench\",\n";
  f << "  \"impl\": \"ferrum\",\n";
  f << "  \"device\": " << json_str(device) << ",\n";
  f << "  \"copy_gbps\": " << json_num(b.copy_gbps()) << ",\n";
  f << "  \"copy_us\": " << json_num(b.copy_us()) << ",\n";
  f << "  \"copy_bytes\": " << kCopyBytes << ",\n";
  f << "  \"quick\": " << (opt.quick ? "true" : "false") << ",\n";
  f << "  \"graph_ops\": " << kGraphOps << ",\n";
  f << "  \"records\": [\n";
  const auto& recs = b.records();
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    f << "    {\"op\": " << json_str(r.op) << ", \"dtype\": " << json_str(r.dtype)
      << ", \"shape\": " << json_str(r.shape) << ", \"impl\": \"ferrum\", \"mode\": " << json_str(r.mode)
      << ", \"us\": " << json_num(r.us) << ", \"gbps\": " << json_num(r.gbps)
      << ", \"tflops\": " << json_num(r.tflops) << ", \"pct_of_copy\": " << json_num(r.pct)
      << ", \"copy_same_size_gbps\": " << json_num(r.copy_same_gbps)
      << ", \"bytes\": " << json_num(r.bytes) << ", \"flops\": " << json_num(r.flops)
      << ", \"sets\": " << r.sets << ", \"reps\": " << r.reps << ", \"graphs\": " << r.graphs;
    if (!r.note.empty()) f << ", \"note\": " << json_str(r.note);
    if (!r.error.empty()) f << ", \"error\": " << json_str(r.error);
    f << "}" << (i + 1 < recs.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  if (!f) throw std::runtime_error("error writing " + path);
}

// ── main ───────────────────────────────────────────────────────────────────

void usage(const char* argv0) {
  std::printf(
      "usage: %s [--json PATH] [--quick] [--filter SUBSTR[,SUBSTR...]] [--reps N] [--chain N] [--graph-api]\n"
      "          [--prefill-kernel auto|mma_sync] [--pause-ms N] [--settle-gbps R] [--attention-kv-before-wait]\n"
      "  --json PATH   write results as JSON\n"
      "  --quick       fewer repetitions\n"
      "  --filter S    run only cases whose \"op dtype shape mode\" contains S (comma: any of)\n"
      "  --reps N      timed repetitions per case (stream: launches; graph: replays)\n"
      "  --chain N     stream mode: N back-to-back launches per event pair (default 1)\n"
      "  --graph-api   time tiny ops through Backend::begin_graph_capture (one graph,\n"
      "                L2-warm) instead of raw stream capture over L2-cold sets\n"
      "  --prefill-kernel K  CudaBackendConfig::prefill_kernel: auto (default: wgmma\n"
      "                on sm_90a) or mma_sync\n"
      "  --pause-ms N  idle N ms before each case, the device synchronized first\n"
      "                (default 50: a case right after one that freed tens of GB\n"
      "                otherwise shares the memory with the driver zeroing it)\n"
      "  --settle-gbps R  idle longer after a case that allocated much: its bytes / R\n"
      "                (default 50 GB/s: 0.69 s after 34 GB; 0: none, else at least 1)\n"
      "  --attention-kv-before-wait  CudaBackendConfig::attention_kv_before_wait (the\n"
      "                decode attention requests its older K / V rows before its PDL wait)\n",
      argv0);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--json") {
      o.json_path = value();
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--graph-api") {
      o.graph_api = true;
    } else if (a == "--filter") {
      std::stringstream ss(value());
      std::string part;
      while (std::getline(ss, part, ','))
        if (!part.empty()) o.filters.push_back(part);
    } else if (a == "--reps") {
      o.reps = std::stoi(value());
      if (o.reps <= 0) throw std::runtime_error("--reps must be positive");
    } else if (a == "--chain") {
      o.chain = std::stoi(value());
      if (o.chain <= 0) throw std::runtime_error("--chain must be positive");
    } else if (a == "--pause-ms") {
      o.pause_ms = std::stoi(value());
      if (o.pause_ms < 0) throw std::runtime_error("--pause-ms must not be negative");
    } else if (a == "--settle-gbps") {
      o.settle_gbps = std::stod(value());
      if (!(o.settle_gbps == 0.0 || o.settle_gbps >= 1.0)) throw std::runtime_error("--settle-gbps must be 0 or at least 1");
    } else if (a == "--prefill-kernel") {
      const std::string k = value();
      if (k == "auto") {
        o.prefill_kernel = ferrum::PrefillKernel::Auto;
      } else if (k == "mma_sync") {
        o.prefill_kernel = ferrum::PrefillKernel::MmaSync;
      } else {
        throw std::runtime_error("--prefill-kernel takes auto or mma_sync, got " + k);
      }
    } else if (a == "--attention-kv-before-wait") {
      o.attention_kv_before_wait = true;
    } else if (a == "-h" || a == "--help") {
      usage(argv[0]);
      std::exit(0);
    } else {
      throw std::runtime_error("unknown argument: " + a);
    }
  }
  return o;
}

int run(int argc, char** argv) {
  Options opt = parse_args(argc, argv);
  if (ferrum::cuda_device_count() == 0) {
    std::printf("no GPU: nothing to benchmark\n");
    return 0;
  }
  // Decode at B = 64, L = 128k needs ~270 MB of split-K scratch.
  ferrum::CudaBackendConfig config;
  config.attention_workspace_bytes = std::size_t{1} << 30;
  config.prefill_kernel = opt.prefill_kernel;
  config.attention_kv_before_wait = opt.attention_kv_before_wait;
  ferrum::CudaBackend be(config);
  FB_CUDA(cudaSetDevice(be.device()));
  cudaDeviceProp prop{};
  FB_CUDA(cudaGetDeviceProperties(&prop, be.device()));
  const std::string device = prop.name;

  Bench b(be, opt);
  b.measure_copy();
  std::printf("device: %s\n", device.c_str());
  std::printf("device-to-device copy (1 GiB, median of %d): %.1f us, %.0f GB/s (read + write)\n", kCopyReps,
              b.copy_us(), b.copy_gbps());
  std::printf("rotation: sets = max(2, ceil(256 MiB / bytes_per_call)); graph mode: %d ops per graph\n\n",
              kGraphOps);
  Bench::print_header();

  const DType dtypes[] = {DType::F16, DType::BF16};

  // Large shapes, one launch per event pair.
  for (DType dt : dtypes) {
    for (std::size_t T : {std::size_t{32768}, std::size_t{4096}}) {
      bench_rms_norm(b, dt, T, kHidden, false);
      bench_fused_add_rms_norm(b, dt, T, kHidden, false);
    }
    bench_layer_norm(b, dt, 32768, kHidden, false);
    bench_gelu(b, dt, 32768, kHidden, false);
    bench_add_inplace(b, dt, 32768, kHidden, false);
    bench_add_bias(b, dt, 32768, kHidden, false);
    bench_silu_mul(b, dt, 8192, kIntermediate, false);
    bench_split_qkv(b, dt, 16384, 4096, 1024, false);
    bench_transpose(b, dt, 32, 16384, 128, false);
    // Each at the size of earlier logs and at 4x (the norms' 256 MiB per
    // side): at 64-134 MB per call the fixed ramp-up and tail (~5 us) still
    // cost 10-20 % of a copy.
    for (std::size_t T : {std::size_t{8192}, std::size_t{32768}}) {
      bench_embedding(b, dt, T, kVocab, kHidden, false);
      bench_qk_norm_rope(b, dt, T, 32, 128, false);
      bench_kv_append(b, dt, T, 8, 128, 2 * T, false);
    }
  }

  // Tiny shapes (decode), graph replay.
  for (DType dt : dtypes) {
    for (std::size_t T : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}, std::size_t{16}}) {
      bench_rms_norm(b, dt, T, kHidden, true);
      bench_fused_add_rms_norm(b, dt, T, kHidden, true);
      bench_add_inplace(b, dt, T, kHidden, true);
      bench_gelu(b, dt, T, kHidden, true);
      bench_silu_mul(b, dt, T, kIntermediate, true);
      bench_qk_norm_rope(b, dt, T, 32, 128, true);
      bench_kv_append(b, dt, T, 8, 128, 16384, true);
      bench_qkv_rope_append(b, dt, T, 32, 8, 128, 16384, true);
      bench_embedding(b, dt, T, kVocab, kHidden, true);
      bench_argmax(b, dt, T, kVocab, true);
    }
  }

  // GEMM.
  for (DType dt : dtypes) {
    bench_gemm(b, dt, 8192, 8192, 8192);
    for (std::size_t n : {std::size_t{8192}, std::size_t{28672}})
      for (std::size_t m : {std::size_t{1}, std::size_t{16}, std::size_t{64}}) bench_gemm(b, dt, m, n, 8192);
  }

  // Attention (f16, as the torch reference figures): decode B x L, prefill S.
  for (std::size_t B : {std::size_t{1}, std::size_t{16}, std::size_t{64}}) {
    for (std::size_t L : {std::size_t{1024}, std::size_t{4096}, std::size_t{8192}, std::size_t{32768},
                          std::size_t{131072}}) {
      if (L == 4096 && B != 1) continue;  // 4k: only for the 10 us bar at B = 1
      bench_attention_decode(b, DType::F16, B, L);
    }
  }
  for (std::size_t nkv : {std::size_t{32}, std::size_t{8}}) {
    for (std::size_t S : {std::size_t{1024}, std::size_t{4096}, std::size_t{16384}}) {
      bench_attention_prefill(b, DType::F16, S, nkv);
    }
  }

  std::size_t errors = 0;
  for (const auto& r : b.records()) errors += r.error.empty() ? 0 : 1;
  std::printf("\n%zu cases, %zu errors; copy %.0f GB/s\n", b.records().size(), errors, b.copy_gbps());
  if (!opt.json_path.empty()) {
    write_json(opt.json_path, b, device, opt);
    std::printf("wrote %s\n", opt.json_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferrum_bench: %s\n", e.what());
    return 1;
  }
}
