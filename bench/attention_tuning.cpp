// Sweeps the attention launch knobs (kernels/attention.hpp) straight through
// the launcher, every variant in one binary: the tensor-core decode's
// DecodeTuning on the decode shapes issue 3 names (the A/B runs of
// docs/design/decode_attention.md), and the wgmma prefill's warpgroups per
// block (PrefillTuning) beside the mma.sync prefill. None of the knobs
// changes a result. Not part of the library.
//
//   ferrum_attention_tuning [decode|prefill|all]   f16, hd 128 (default all)
//   ferrum_attention_tuning decode B L             one decode shape (e.g. for ncu)
//   ferrum_attention_tuning decode-exp [B L]       the session-14 decode experiments
//   ferrum_attention_tuning timeline B L [GHz]    where a decode's time goes, per phase, and its schedule
//                                                 (a build with -DFERRUM_DECODE_TIMELINE=ON;
//                                                 GHz: the SM clock, 1.98 on the H200)
// Decode variants: the merge in the decode kernel (fused 1) and as a second
// kernel (fused 0); the L2 prefetch knobs stay at their defaults (measured
// in session 7). Session 13 also swept deeper cp.async rings (4-6 slots per
// key warp, one block per SM): slower at every shape, removed
// (docs/design/decode_attention.md §4.3).
//
// Method: CUDA events around R back-to-back launches (R so that a sample is
// >= ~200 us), inputs rotated over sets >= 256 MiB together (past the 50 MB
// L2), median of 15 samples; each decode variant also one launch per event
// pair, median of 31 ("call": as ferrum_bench times a case, with no PDL
// overlap to hide a launch's ramp and tail; session 62 on the H100: B = 64
// L = 1k 98.7 back to back, 99.1 per call, so the bench's 111 of sessions
// 60-61 was not the tail but its process history, decode_attention.md
// §4.21); decode counts K+V bytes, prefill causal FLOPs
// (4 * heads * S^2 * hd / 2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <vector>

#include "bench/cuda_check.hpp"
#include "bench/median.hpp"
#include "ferrum/cuda_backend.hpp"
#include "kernels/attention.hpp"

namespace {

using ferrum::kernels::AttentionArgs;
using ferrum::kernels::DecodeTuning;

void* device_zeros(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  check(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}

// Random f16 in +-[1/16, 1), as real inputs: the H200's tensor-core speed
// depends on the bits (the prefill ran 615 TFLOP/s on a constant 0x2c fill,
// 519 on random inputs, at S = 16k; power, presumably). One
// 64 MiB pattern, tiled from an offset that the seed picks (decode caches
// reach gigabytes).
void* device_random_f16(std::size_t bytes, std::uint32_t seed) {
  static const std::vector<std::uint16_t> pattern = [] {
    std::vector<std::uint16_t> h(std::size_t{1} << 25);
    std::uint32_t x = 2463534242u;
    for (auto& v : h) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      // sign | exponent 11..14 | mantissa
      v = static_cast<std::uint16_t>(((x >> 31) << 15) | ((11u + ((x >> 10) & 3u)) << 10) | (x & 0x3ffu));
    }
    return h;
  }();
  auto* p = static_cast<char*>(device_zeros(bytes));
  const std::size_t pattern_bytes = pattern.size() * 2;
  std::size_t from = (static_cast<std::size_t>(seed) * 7919u * 64u) % pattern_bytes;
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(bytes - done, pattern_bytes - from);
    check(cudaMemcpy(p + done, reinterpret_cast<const char*>(pattern.data()) + from, n, cudaMemcpyHostToDevice),
          "cudaMemcpy");
    done += n;
    from = 0;
  }
  return p;
}

struct Shape {
  int batch;
  long long kv;
};

constexpr double kRotateBytes = 256.0 * 1024 * 1024;

// Median µs per launch of `launch(r)` (r: the launch's index, for rotating
// inputs): two warm-up samples, then 15 of `reps` back-to-back launches.
double median_us(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, int reps,
                 const std::function<void(int)>& launch) {
  std::vector<double> samples;
  for (int sample = -2; sample < 15; ++sample) {
    check(cudaEventRecord(e0, stream), "cudaEventRecord");
    for (int r = 0; r < reps; ++r) launch(r);
    check(cudaEventRecord(e1, stream), "cudaEventRecord");
    check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (sample >= 0) samples.push_back(ms * 1000.0 / reps);
  }
  return median(std::move(samples));
}

// The median of `samples` launches timed one by one, an event pair around
// each (as ferrum_bench times a case): what a lone call costs, its ramp and
// its last wave's tail included, where median_us's back-to-back launches let
// PDL overlap one launch's tail with the next one's start.
double median_call_us(cudaStream_t stream, int samples, const std::function<void(int)>& launch) {
  std::vector<cudaEvent_t> start(static_cast<std::size_t>(samples)), stop(start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    check(cudaEventCreate(&start[i]), "cudaEventCreate");
    check(cudaEventCreate(&stop[i]), "cudaEventCreate");
  }
  launch(0);  // warm
  for (int i = 0; i < samples; ++i) {
    check(cudaEventRecord(start[static_cast<std::size_t>(i)], stream), "cudaEventRecord");
    launch(i + 1);
    check(cudaEventRecord(stop[static_cast<std::size_t>(i)], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<double> us(start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start[i], stop[i]), "cudaEventElapsedTime");
    us[i] = ms * 1000.0;
    check(cudaEventDestroy(start[i]), "cudaEventDestroy");
    check(cudaEventDestroy(stop[i]), "cudaEventDestroy");
  }
  return median(std::move(us));
}

// Causal prefill, batch 1, 32 heads, hd 128: the mma.sync kernel and the
// wgmma kernel with 0 (automatic), 1 and 2 warpgroups per block, and its
// warp-specialized experiment (PrefillTuning::wgmma_producer_warp).
void tune_prefill(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1) {
  constexpr int kHeads = 32, kHd = 128;
  std::printf("%-6s %-6s %-12s %10s %9s\n", "S", "kv_h", "kernel", "median_us", "TFLOP/s");
  for (int kv_heads : {32, 8}) {
    for (long long S : {1024LL, 2048LL, 4096LL, 16384LL}) {
      const std::size_t q_bytes = static_cast<std::size_t>(kHeads) * S * kHd * 2;
      const std::size_t kv_bytes = static_cast<std::size_t>(kv_heads) * S * kHd * 2;
      const double call_bytes = static_cast<double>(2 * q_bytes + 2 * kv_bytes);
      const int sets = std::max(2, static_cast<int>(std::ceil(kRotateBytes / call_bytes)));
      std::vector<void*> q(sets), k(sets), v(sets), out(sets);
      for (int s = 0; s < sets; ++s) {
        q[s] = device_random_f16(q_bytes, 1 + s);
        k[s] = device_random_f16(kv_bytes, 100 + s);
        v[s] = device_random_f16(kv_bytes, 200 + s);
        out[s] = device_zeros(q_bytes);
      }
      const double flops = 4.0 * kHeads * static_cast<double>(S) * static_cast<double>(S) * kHd / 2.0;
      // -1: mma.sync; 0, 1, 2: wgmma warpgroups; 3, 4: producer warp with 2 / 3 warpgroups
      for (int variant = -1; variant <= 4; ++variant) {
        AttentionArgs a;
        a.dtype = ferrum::DType::F16;
        a.batch = 1;
        a.num_heads = kHeads;
        a.num_kv_heads = kv_heads;
        a.q_len = static_cast<int>(S);
        a.head_dim = kHd;
        a.kv_stride = S;
        a.kv_len = static_cast<int>(S);
        a.causal = true;
        a.scale = 1.0f / std::sqrt(static_cast<float>(kHd));
        a.prefill_wgmma = variant >= 0;
        a.prefill_tuning.wgmma_warpgroups = variant < 0 ? 0 : variant <= 2 ? variant : variant - 1;
        a.prefill_tuning.wgmma_producer_warp = variant >= 3;
        const char* const names[] = {"mma_sync", "wgmma auto", "wgmma 1wg", "wgmma 2wg", "wgmma ws2", "wgmma ws3"};
        const char* name = names[variant + 1];
        const int reps = std::max(1, static_cast<int>(200e-6 * 400e12 / flops));
        try {
          const double us = median_us(stream, e0, e1, reps, [&](int r) {
            a.q = q[r % sets];
            a.k = k[r % sets];
            a.v = v[r % sets];
            a.out = out[r % sets];
            ferrum::kernels::launch_attention(a, stream);
          });
          std::printf("%-6lld %-6d %-12s %10.2f %9.1f\n", S, kv_heads, name, us, flops / us / 1e6);
        } catch (const std::exception& e) {
          std::printf("%-6lld %-6d %-12s  failed: %s\n", S, kv_heads, name, e.what());
        }
      }
      for (int s = 0; s < sets; ++s) {
        for (void* p : {q[s], k[s], v[s], out[s]}) check(cudaFree(p), "cudaFree");
      }
    }
  }
}

// The decode shapes of this tool: f16, 32 q heads over 8 kv heads, hd 128.
constexpr int kDecodeHeads = 32, kDecodeKvHeads = 8, kDecodeHeadDim = 128;

// Their arguments (the cache full); k and v are set per launch.
AttentionArgs decode_args(int batch, long long kv, const void* q, void* out, ferrum::kernels::DeviceErrorLog* error_log,
                          float* partials, std::size_t ws_floats) {
  AttentionArgs a;
  a.dtype = ferrum::DType::F16;
  a.q = q;
  a.out = out;
  a.batch = batch;
  a.num_heads = kDecodeHeads;
  a.num_kv_heads = kDecodeKvHeads;
  a.q_len = 1;
  a.head_dim = kDecodeHeadDim;
  a.kv_stride = kv;
  a.kv_len = static_cast<int>(kv);
  a.pos_offset = kv - 1;
  a.error_log = error_log;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kDecodeHeadDim));
  ferrum::kernels::set_decode_workspace(a, partials, ws_floats);
  return a;
}

// Random K and V caches of kv_bytes each (V with v_extra bytes more), as
// many sets as rotate a decode's reads past kRotateBytes.
void random_kv_sets(std::size_t kv_bytes, std::size_t v_extra, std::vector<void*>& k, std::vector<void*>& v) {
  const int sets = std::max(2, static_cast<int>(std::ceil(kRotateBytes / (2.0 * static_cast<double>(kv_bytes)))));
  k.resize(static_cast<std::size_t>(sets));
  v.resize(static_cast<std::size_t>(sets));
  for (int s = 0; s < sets; ++s) {
    k[static_cast<std::size_t>(s)] = device_random_f16(kv_bytes, 100 + s);
    v[static_cast<std::size_t>(s)] = device_random_f16(kv_bytes + v_extra, 200 + s);
  }
}

#if defined(FERRUM_DECODE_TIMELINE)
using ferrum::kernels::DecodeTimelineBlock;

// Whether `row`'s stamp at `point` is this launch's. Its block may enter
// (Entry, before griddepcontrol.wait) while the previous launch still runs,
// and that launch's block of the same index may stamp a point this block
// never reaches (another block merged the row) after the entry; clock64 is
// per SM, so such a stamp is meaningless here. KvLenKnown comes after the
// wait, once the previous launch has completed: every later point of this
// launch is stamped after it (by %globaltimer), and no point of an earlier
// launch is. (A block that finds no valid key returns before KvLenKnown:
// none of its later points count.)
bool this_launch(const DecodeTimelineBlock& row, int point) {
  constexpr int kKvLenKnown = static_cast<int>(ferrum::kernels::DecodeTimelinePoint::KvLenKnown);
  const unsigned long long entry = row.points[0].ns, known = row.points[kKvLenKnown].ns;
  const unsigned long long at = row.points[static_cast<std::size_t>(point)].ns;
  if (entry == 0 || at < entry) return false;
  return point <= kKvLenKnown || (known >= entry && at >= known);
}

// The launch's schedule from the blocks' %globaltimer stamps (ns): when they
// start against each other (waves), how full the SMs' block slots are kept,
// and how long the launch runs past its last block that does not merge a
// row (the merge tail).
void print_schedule(const std::vector<DecodeTimelineBlock>& rows) {
  struct Span {
    unsigned sm;
    double start, end;  // µs after the first block's entry
    bool merges;        // reached RowMerged
  };
  std::vector<Span> spans;
  unsigned long long t0 = ~0ull;
  for (const DecodeTimelineBlock& row : rows) {
    if (row.points[0].ns != 0) t0 = std::min(t0, row.points[0].ns);
  }
  constexpr int kRowMerged = static_cast<int>(ferrum::kernels::DecodeTimelinePoint::RowMerged);
  for (const DecodeTimelineBlock& row : rows) {
    const unsigned long long entry = row.points[0].ns;
    if (entry == 0) continue;
    // Only this launch's stamps (this_launch): the others are an earlier
    // launch's, at points this launch's block did not reach.
    unsigned long long end = entry;
    for (int point = 1; point < ferrum::kernels::kDecodeTimelinePoints; ++point) {
      if (this_launch(row, point)) end = std::max(end, row.points[static_cast<std::size_t>(point)].ns);
    }
    spans.push_back({row.sm, static_cast<double>(entry - t0) * 1e-3, static_cast<double>(end - t0) * 1e-3,
                     this_launch(row, kRowMerged)});
  }
  double launch_end = 0.0, streaming_end = 0.0, busy = 0.0, last_start = 0.0;
  unsigned max_sm = 0;
  std::vector<double> durations;
  for (const Span& b : spans) {
    launch_end = std::max(launch_end, b.end);
    if (!b.merges) streaming_end = std::max(streaming_end, b.end);
    last_start = std::max(last_start, b.start);
    busy += b.end - b.start;
    durations.push_back(b.end - b.start);
    max_sm = std::max(max_sm, b.sm);
  }
  if (launch_end <= 0.0) return;  // no block passed a second point
  // Per SM: blocks, the most resident at once (its slots), busy slot time.
  std::vector<std::vector<const Span*>> by_sm(max_sm + 1);
  for (const Span& b : spans) by_sm[b.sm].push_back(&b);
  int sms = 0, slots = 0;
  std::vector<double> sm_blocks;
  for (auto& on : by_sm) {
    if (on.empty()) continue;
    ++sms;
    sm_blocks.push_back(static_cast<double>(on.size()));
    std::vector<std::pair<double, int>> events;
    for (const Span* b : on) {
      events.emplace_back(b->start, 1);
      events.emplace_back(b->end, -1);
    }
    std::sort(events.begin(), events.end());  // an end before a start at the same time
    int now = 0, most = 0;
    for (const auto& e : events) most = std::max(most, now += e.second);
    slots = std::max(slots, most);
  }
  std::sort(durations.begin(), durations.end());
  std::sort(sm_blocks.begin(), sm_blocks.end());
  std::printf("  schedule (%%globaltimer): %zu blocks on %d SMs (blocks per SM %g..%g), up to %d at once per SM\n",
              spans.size(), sms, sm_blocks.front(), sm_blocks.back(), slots);
  std::printf("    launch %.2f us: last block start %.2f, last non-merging block end %.2f (merge tail %.2f)\n",
              launch_end, last_start, streaming_end, launch_end - streaming_end);
  std::printf("    block duration min %.2f median %.2f p90 %.2f max %.2f us; slots busy %.1f %% of %d x %d\n",
              durations.front(), durations[durations.size() / 2], durations[durations.size() * 9 / 10],
              durations.back(), 100.0 * busy / (launch_end * sms * slots), sms, slots);
  constexpr int kBins = 10;
  int starts[kBins] = {};
  for (const Span& b : spans) ++starts[std::min(kBins - 1, static_cast<int>(b.start / launch_end * kBins))];
  std::printf("    block starts per tenth of the launch:");
  for (int n : starts) std::printf(" %d", n);
  std::printf("\n");
}
#endif

// Medians etc. over the blocks of the last of 8 back-to-back default
// launches, in µs after each block's entry (clock64 at `ghz`), per
// kernels::DecodeTimelinePoint; then the last launch's schedule.
int run_timeline(int batch, long long kv, double ghz) {
#if defined(FERRUM_DECODE_TIMELINE)
  constexpr int kHeads = kDecodeHeads, kKvHeads = kDecodeKvHeads, kHd = kDecodeHeadDim;
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  using ferrum::kernels::DeviceErrorLog;
  auto* error_log = static_cast<DeviceErrorLog*>(device_zeros(sizeof(DeviceErrorLog)));
  std::vector<void*> k, v;
  random_kv_sets(static_cast<std::size_t>(batch) * kKvHeads * kv * kHd * 2, 0, k, v);
  const int sets = static_cast<int>(k.size());
  const std::size_t q_bytes = static_cast<std::size_t>(batch) * kHeads * kHd * 2;
  const std::size_t ws = ferrum::kernels::attention_workspace_floats(batch, kHeads, 1, kHd, kv);
  AttentionArgs a = decode_args(batch, kv, device_random_f16(q_bytes, 1), device_zeros(q_bytes), error_log,
                                static_cast<float*>(device_zeros(std::max<std::size_t>(ws, 1) * 4)), ws);
  int r = 0;
  auto launch = [&] {
    a.k = k[r % sets];
    a.v = v[r % sets];
    ++r;
    ferrum::kernels::launch_attention(a, stream);
  };
  for (int i = 0; i < 40; ++i) launch();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const char* const names[] = {"entry", "kv_len known", "Q + tile 0 landed", "slice computed", "warps published",
                               "slice stored", "arrived", "row merged"};
  for (int rep = 0; rep < 2; ++rep) {
    ferrum::kernels::decode_timeline_reset();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (int i = 0; i < 8; ++i) launch();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto rows = ferrum::kernels::decode_timeline_read();
    std::printf("B %d L %lld, last of 8 launches (us after the block's entry at %.2f GHz):\n", batch, kv, ghz);
    for (int point = 1; point < ferrum::kernels::kDecodeTimelinePoints; ++point) {
      std::vector<double> t;
      for (const auto& row : rows) {
        if (!this_launch(row, point)) continue;
        const unsigned long long entry = row.points[0].clock, at = row.points[static_cast<std::size_t>(point)].clock;
        if (at > entry) t.push_back(static_cast<double>(at - entry) / (ghz * 1e3));
      }
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      std::printf("  %-18s blocks %5zu  min %7.2f  median %7.2f  p90 %7.2f  max %7.2f\n", names[point], t.size(),
                  t.front(), t[t.size() / 2], t[t.size() * 9 / 10], t.back());
    }
    print_schedule(rows);
  }
  return 0;
#else
  (void)batch;
  (void)kv;
  (void)ghz;
  std::printf("built without FERRUM_DECODE_TIMELINE (cmake -DFERRUM_DECODE_TIMELINE=ON)\n");
  return 2;
#endif
}
}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no GPU: nothing to tune\n");
    return 0;
  }
  // A backend with the default config, so that the launchers run under the
  // library's launch switches (CudaBackendConfig: PDL with the early
  // trigger), as in ferrum_bench and the engine. Until session 38 this tool
  // launched without one: PDL without the early trigger.
  std::optional<ferrum::CudaBackend> backend;
  try {
    backend.emplace();
  } catch (const std::exception& e) {
    std::printf("CudaBackend: %s\n", e.what());
    return 1;
  }
  const char* what = argc > 1 ? argv[1] : "all";
  if (argc >= 4 && argc <= 5 && std::strcmp(what, "timeline") == 0) {
    const int batch = std::atoi(argv[2]);
    const long long kv = std::atoll(argv[3]);
    const double ghz = argc == 5 ? std::atof(argv[4]) : 1.98;
    if (batch < 1 || batch > 4096 || kv < 1 || kv > (1LL << 20) || !(ghz > 0.0)) {
      std::printf("usage: %s timeline B L [GHz]\n", argv[0]);
      return 2;
    }
    return run_timeline(batch, kv, ghz);
  }
  // B L: 1 <= B <= 4096, 1 <= L <= 2^20, and only with "decode".
  auto positive = [](const char* text, long long most) {
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    return end != text && *end == '\0' && v >= 1 && v <= most ? v : 0LL;
  };
  const long long only_batch = argc == 4 ? positive(argv[2], 4096) : 0;
  const long long only_len = argc == 4 ? positive(argv[3], 1LL << 20) : 0;
  const bool experiments = std::strcmp(what, "decode-exp") == 0;
  if (experiments) what = "decode";
  const bool known = std::strcmp(what, "decode") == 0 || std::strcmp(what, "prefill") == 0 ||
                     std::strcmp(what, "all") == 0;
  if (!known || (argc != 1 && argc != 2 && argc != 4) ||
      (argc == 4 && (std::strcmp(what, "decode") != 0 || only_batch == 0 || only_len == 0))) {
    std::printf("usage: %s [decode|decode-exp|prefill|all]\n       %s decode[-exp] B L   (1 <= B <= 4096, 1 <= L <= 1048576)\n",
                argv[0], argv[0]);
    return 2;
  }
  constexpr int kHeads = kDecodeHeads, kKvHeads = kDecodeKvHeads, kHd = kDecodeHeadDim;
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  if (std::strcmp(what, "decode") != 0) tune_prefill(stream, e0, e1);
  if (std::strcmp(what, "prefill") == 0) return 0;
  using ferrum::kernels::DeviceErrorLog;
  auto* error_log = static_cast<DeviceErrorLog*>(device_zeros(sizeof(DeviceErrorLog)));

  // Decode variants: the merge in the kernel (fused 1) or as a second
  // kernel (fused 0); with "decode-exp" the library's defaults against
  // DecodeTuning's slices per block, the combine kernel, the late
  // next-slice prologue, the ring drained at slice boundaries ("drain"),
  // the cluster merge (one slice per block), V placed 36 KiB past an
  // allocation start ("v+36k": K and V at different offsets from their
  // 2 MiB-aligned bases), and the partials stored plainly, neither kept in
  // L2 nor dropped from it once merged ("l2plain": DecodeTuning::
  // partials_in_l2 off), or kept at every footprint ("l2all": its floor 0),
  // and K's sets in one allocation and V's in another ("packed": as
  // ferrum_bench lays them out, not one allocation per set).
  struct Variant {
    const char* name;
    DecodeTuning tuning;
    std::size_t v_skew;
    bool packed = false;
  };
  std::vector<Variant> variants;
  {
    DecodeTuning t;
    t.fused_max_groups_per_sm = 1e9;  // fused 1 means fused at every size
    variants.push_back({"fused1", t, 0});
    if (experiments) {
      DecodeTuning d;  // the library's defaults
      variants = {{"default", d, 0}};
      const char* const names[] = {"spb1", "spb2", "spb4", "spb8", "spb16"};  // slices per block 1 .. 16
      for (int i = 0; i < 5; ++i) {
        DecodeTuning x = d;
        x.slices_per_block = 1 << i;
        variants.push_back({names[i], x, 0});
      }
      DecodeTuning x = d;
      x.tail_free_slices = false;  // the slices-per-block rules the default replaced
      variants.push_back({"oldrules", x, 0});
      x = d;
      x.fused_merge = false;
      variants.push_back({"combine", x, 0});
      x = d;
      x.overlap_boundary = false;
      variants.push_back({"nooverlap", x, 0});
      x = d;
      x.stream_across_slices = false;  // the next slice requested after the ring drained
      variants.push_back({"drain", x, 0});
      x = d;
      x.slot_merge = false;  // the four-barrier merge at a slice's end (the rule before session 35)
      variants.push_back({"stagemerge", x, 0});
      x = d;
      x.cluster_merge = true;
      x.slices_per_block = 1;
      variants.push_back({"cluster", x, 0});
      variants.push_back({"v+36k", d, 36 * 1024});
      x = d;
      x.partials_in_l2 = false;
      variants.push_back({"l2plain", x, 0});
      x = d;
      x.partials_in_l2_min_bytes = 0.0;
      variants.push_back({"l2all", x, 0});
      x = d;
      x.sole_block_per_sm = false;  // one-wave launches at the kernel's own shared memory
      variants.push_back({"shared", x, 0});
      variants.push_back({"packed", d, 0, true});
    } else {
      t.fused_merge = false;
      variants.push_back({"fused0", t, 0});
    }
  }
  // median_us: launches back to back (PDL overlaps them); call: one by one
  // (median_call_us), as ferrum_bench times the decode cases.
  std::printf("%-5s %-7s %-9s %10s %9s   %s\n", "B", "L", "variant", "median_us", "GB/s", "launch, call_us");
  std::vector<Shape> shapes = {{1, 1024},   {1, 4096},  {1, 8192},   {1, 32768}, {1, 131072}, {16, 1024},
                               {16, 8192},  {16, 32768}, {64, 1024}, {64, 8192}, {64, 32768}};
  if (experiments) {
    shapes = {{1, 1024}, {1, 4096}, {1, 32768}, {1, 131072}, {16, 1024}, {16, 8192}, {16, 32768}, {16, 131072},
              {64, 1024}, {64, 8192}, {64, 32768}};
  }
  if (only_batch > 0) shapes = {{static_cast<int>(only_batch), only_len}};
  constexpr std::size_t kMaxSkew = 64 * 1024;
  for (const Shape& sh : shapes) {
    const std::size_t kv_bytes = static_cast<std::size_t>(sh.batch) * kKvHeads * sh.kv * kHd * 2;
    const double call_bytes = 2.0 * static_cast<double>(kv_bytes);
    std::vector<void*> k, v;
    random_kv_sets(kv_bytes, kMaxSkew, k, v);
    const int sets = static_cast<int>(k.size());
    const std::size_t q_bytes = static_cast<std::size_t>(sh.batch) * kHeads * kHd * 2;
    void* q = device_random_f16(q_bytes, 1);
    void* out = device_zeros(q_bytes);
    // The packed layout: set s of K at k_packed + s * kv_bytes, of V likewise.
    char* k_packed = nullptr;
    char* v_packed = nullptr;
    if (experiments) {
      k_packed = static_cast<char*>(device_random_f16(kv_bytes * static_cast<std::size_t>(sets), 300));
      v_packed = static_cast<char*>(device_random_f16(kv_bytes * static_cast<std::size_t>(sets), 400));
    }
    const std::size_t ws = ferrum::kernels::attention_workspace_floats(sh.batch, kHeads, 1, kHd, sh.kv);
    auto* partials = static_cast<float*>(device_zeros(std::max<std::size_t>(ws, 1) * sizeof(float)));

    for (const Variant& var : variants) {
      AttentionArgs a = decode_args(sh.batch, sh.kv, q, out, error_log, partials, ws);
      a.decode_tuning = var.tuning;
      const int reps = std::max(1, static_cast<int>(200e-6 * 4e12 / std::max(call_bytes, 4e6)));
      double us = 0.0, call_us = 0.0;
      try {
        const auto launch = [&](int r) {
          const auto set = static_cast<std::size_t>(r % sets);
          a.k = var.packed ? k_packed + set * kv_bytes : k[set];
          a.v = (var.packed ? v_packed + set * kv_bytes : static_cast<char*>(v[set])) + var.v_skew;
          ferrum::kernels::launch_attention(a, stream);
        };
        us = median_us(stream, e0, e1, reps, launch);
        call_us = median_call_us(stream, 31, launch);
      } catch (const std::exception& e) {
        std::printf("%-5d %-7lld %-9s  failed: %s\n", sh.batch, sh.kv, var.name, e.what());
        continue;
      }
      // The launch the variant took (a knob that does not apply leaves the default's).
      a.k = k[0];
      a.v = v[0];
      const auto plan = ferrum::kernels::decode_launch_plan(a);
      std::printf("%-5d %-7lld %-9s %10.2f %9.0f   spb %d%s%s smem %d   call %.2f\n", sh.batch, sh.kv, var.name, us,
                  call_bytes / us / 1e3, plan ? plan->slices_per_block : 0, plan && plan->fused ? " fused" : "",
                  plan && plan->cluster ? " cluster" : "", plan ? plan->smem_bytes : 0, call_us);
    }
    for (int s = 0; s < sets; ++s) {
      check(cudaFree(k[s]), "cudaFree");
      check(cudaFree(v[s]), "cudaFree");
    }
    check(cudaFree(q), "cudaFree");
    check(cudaFree(out), "cudaFree");
    check(cudaFree(partials), "cudaFree");
    if (k_packed != nullptr) check(cudaFree(k_packed), "cudaFree");
    if (v_packed != nullptr) check(cudaFree(v_packed), "cudaFree");
  }
  return 0;
}
