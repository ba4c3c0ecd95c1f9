// The GPTQ streaming kernel's phases inside a real decode step
// (diagnostics; built with -DFERRUM_GPTQ_TIMELINE=ON, which also makes the
// kernel record them: kernels/gptq_gemm.hpp, GptqTimelinePoint).
//
//   ferrum_gptq_timeline [--preset NAME] [--steps N] [--eager] [--no-chain]
//                        [--ctas-per-sm N] [--no-early-weights] [--row-sq-norms]
//                        [--csv PATH] [--print-last N]
//   ferrum_gptq_timeline --gemm KxN [--m M] [--ctas-per-sm N] [--csv PATH]
//
// --gemm KxN: one standalone gemm_gptq launch instead of a decode step (f16,
// symmetric, groups of 128, random words; m rows, default 1) on a
// CudaBackend with the library's defaults, as ferrum_bench_gptq runs it
// (--ctas-per-sm N sets gptq_stream_ctas_per_sm); only that launch is
// printed. Three weights are used in turn, so the launch read has its weight
// out of L2 where a weight is over a third of L2 (two others read since).
// Only streaming launches record stamps: from 9 rows on most weights Auto
// takes the wgmma kernel (kernels::gptq_wgmma_preferred), and the tool then
// reports no launch.
//
// --row-sq-norms decodes with DecoderOptions::gptq_row_sq_norms (the
// residual adds in o's and down's final store, as ferrum_engine
// --gptq-row-sq-norms).
// Decodes --steps (default 16) tokens of a random GPTQ model (default
// llama3-8b, f16, the engine's random weights) with the engine's Decoder,
// graph replay unless --eager, on a CudaBackend configured as ferrum_engine
// configures it for a GPTQ model decoding one sequence from a graph: the
// gemm_weights_before_wait promise, pdl_chain_release and
// gptq_stream_ctas_per_sm = 3 (--no-early-weights, --no-chain and
// --ctas-per-sm N change them). Before the last step the stamps are reset;
// after it the last kGptqTimelineLaunches streaming launches (the last
// layers' q|k|v, o, gate|up and down) are printed, one line per launch and
// point: over the launch's CTAs, the min / median / max of the point's
// %globaltimer in µs after the earliest WaitReturned of the launch (the
// moment the kernel before it completed), and the median of each CTA's
// clock64 time since its own previous point. "gap" is how long after the
// previous streaming launch's last Exit this launch's first WaitReturned
// came (the small op between them, plus the two completions). --print-last N
// prints only the last N of them (4: the last layer); --csv writes every
// CTA's stamps of all of them. After each launch's points, its CTAs grouped
// by how many of the launch's CTAs ran on their SM (%smid): whether the
// launch ends on the SMs that held more of its CTAs.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <ferrum/ferrum.hpp>

#include "decoder.hpp"
#include "kernels/gptq_gemm.hpp"
#include "median.hpp"
#include "model_config.hpp"
#include "weights.hpp"

namespace {

using namespace ferrum;
using namespace ferrum::engine;
using kernels::GptqTimelineLaunch;
using kernels::GptqTimelinePoint;
using kernels::kGptqTimelineLaunches;
using kernels::kGptqTimelinePoints;

struct Options {
  std::string preset = "llama3-8b";
  std::size_t steps = 16;
  bool graph = true;
  bool chain = true;
  int ctas_per_sm = 3;
  bool early_weights = true;
  bool row_sq_norms = false;  // DecoderOptions::gptq_row_sq_norms
  std::string csv;
  int print_last = kGptqTimelineLaunches;
  std::size_t gemm_k = 0, gemm_n = 0;  // --gemm KxN: a standalone launch (0: a decode step)
  std::size_t m = 1;                   // --m: its rows
  bool ctas_per_sm_set = false;
  bool m_set = false;
  std::string decode_only;  // a decode-step option given (refused with --gemm)
};

const char* const kPointNames[kGptqTimelinePoints] = {"Entry",       "WaitReturned", "FirstChunk",  "FirstChunkDone",
                                                      "SecondChunk", "ChunksDone",   "WarpsSummed", "Exit"};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "ferrum_gptq_timeline: %s\n"
               "usage: ferrum_gptq_timeline [--preset NAME] [--steps N] [--eager] [--no-chain] [--ctas-per-sm N]\n"
               "                            [--no-early-weights] [--row-sq-norms] [--csv PATH] [--print-last N]\n"
               "       ferrum_gptq_timeline --gemm KxN [--m M] [--ctas-per-sm N] [--csv PATH]\n",
               what.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    auto number = [&](long lo, long hi) {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo || n > hi) {
        usage_error(arg + " takes " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" + v + "'");
      }
      return n;
    };
    // An option of the decode step only (refused with --gemm).
    auto decode_step_option = [&] { opt.decode_only = arg; };
    if (arg == "--preset") {
      decode_step_option();
      opt.preset = value();
    } else if (arg == "--steps") {
      decode_step_option();
      opt.steps = static_cast<std::size_t>(number(2, 4096));
    } else if (arg == "--eager") {
      decode_step_option();
      opt.graph = false;
    } else if (arg == "--no-chain") {
      decode_step_option();
      opt.chain = false;
    } else if (arg == "--ctas-per-sm") {
      opt.ctas_per_sm = static_cast<int>(number(0, kGptqStreamMaxCtasPerSm));
      opt.ctas_per_sm_set = true;
    } else if (arg == "--no-early-weights") {
      decode_step_option();
      opt.early_weights = false;
    } else if (arg == "--row-sq-norms") {
      decode_step_option();
      opt.row_sq_norms = true;
    } else if (arg == "--csv") {
      opt.csv = value();
    } else if (arg == "--print-last") {
      decode_step_option();
      opt.print_last = static_cast<int>(number(1, kGptqTimelineLaunches));
    } else if (arg == "--gemm") {
      const std::string v = value();
      const std::size_t x = v.find('x');
      auto dim = [&](const std::string& text) {
        char* end = nullptr;
        const long d = std::strtol(text.c_str(), &end, 10);
        return text.empty() || *end != '\0' ? 0 : d;
      };
      const long k = x == std::string::npos ? 0 : dim(v.substr(0, x));
      const long n = x == std::string::npos ? 0 : dim(v.substr(x + 1));
      if (k < 128 || n < 64 || k % 128 != 0 || n % 64 != 0) {
        usage_error("--gemm takes KxN with K a multiple of 128 and N of 64, got '" + v + "'");
      }
      opt.gemm_k = static_cast<std::size_t>(k);
      opt.gemm_n = static_cast<std::size_t>(n);
    } else if (arg == "--m") {
      opt.m = static_cast<std::size_t>(number(1, static_cast<long>(kernels::kGptqStreamMaxM)));
      opt.m_set = true;
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (opt.gemm_k != 0 && !opt.decode_only.empty()) usage_error(opt.decode_only + " is an option of the decode step, not of --gemm");
  if (opt.gemm_k == 0 && opt.m_set) usage_error("--m needs --gemm");
  return opt;
}

// The launch by its weight shape in a Llama step.
std::string launch_name(const GptqTimelineLaunch& l, const ModelConfig& c) {
  const std::size_t hd = c.head_dim, q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  const auto k = static_cast<std::size_t>(l.k), n = static_cast<std::size_t>(l.n);
  if (k == c.hidden_size && n == q + 2 * kv) return "q|k|v";
  if (k == q && n == c.hidden_size) return "o";
  if (k == c.hidden_size && n == 2 * c.intermediate_size) return l.silu_out ? "gate|up+silu" : "gate|up";
  if (k == c.intermediate_size && n == c.hidden_size) return "down";
  return "?";
}

// The streaming launches of one decode step of a random GPTQ model, and the
// model's config (for the launches' names).
std::vector<GptqTimelineLaunch> decode_step_launches(const Options& opt, ModelConfig& config) {
  config = preset_config(opt.preset);
  config.dtype = DType::F16;
  config.gptq = random_gptq_config(config);
  CudaBackendConfig bc;
  bc.gemm_weights_before_wait = opt.early_weights;
  bc.pdl_chain_release = opt.chain;
  bc.gptq_stream_ctas_per_sm = opt.ctas_per_sm;
  CudaBackend backend(bc);
  const ModelWeights weights = random_weights(backend, config, 1234);
  const DecodeMode mode = opt.graph ? DecodeMode::Graph : DecodeMode::Eager;
  Decoder decoder(backend, weights, opt.steps + 1, 1, mode, 1, {.gptq_row_sq_norms = opt.row_sq_norms});
  const std::int32_t prompt[] = {1};
  std::int32_t next = decoder.prefill_next(prompt);
  for (std::size_t step = 1; step + 1 < opt.steps; ++step) next = decoder.decode_next(next);
  backend.synchronize();
  kernels::gptq_timeline_reset();
  next = decoder.decode_next(next);  // the step read below
  backend.synchronize();
  std::printf("ferrum_gptq_timeline: %s GPTQ f16, %s, %zu steps; promise %s, chain %s, ctas_per_sm %d (token %d)\n",
              opt.preset.c_str(), opt.graph ? "graph" : "eager", opt.steps, opt.early_weights ? "on" : "off",
              opt.chain ? "on" : "off", opt.ctas_per_sm, next);
  return kernels::gptq_timeline_read();
}

// One standalone gemm_gptq launch (--gemm), its weight out of L2.
std::vector<GptqTimelineLaunch> gemm_launches(const Options& opt) {
  const std::size_t k = opt.gemm_k, n = opt.gemm_n, groups = k / 128;
  CudaBackendConfig bc;
  if (opt.ctas_per_sm_set) bc.gptq_stream_ctas_per_sm = opt.ctas_per_sm;
  CudaBackend backend(bc);
  std::mt19937 rng(1234);
  std::vector<std::int32_t> qweight(k / 8 * n);
  for (std::int32_t& w : qweight) w = static_cast<std::int32_t>(rng());
  const std::vector<std::int32_t> qzeros(groups * (n / 8), 0x77777777);  // v1: stored 7, zero 8
  std::uniform_real_distribution<float> scale(0.001f, 0.01f), act(-1.0f, 1.0f);
  std::vector<float> scales(groups * n);
  for (float& v : scales) v = scale(rng);
  const GptqHostTensors t{.qweight = qweight, .qzeros = qzeros, .scales = scales, .g_idx = {}, .k = k, .n = n};
  std::vector<std::unique_ptr<QuantWeight>> weights;
  for (int i = 0; i < 3; ++i) weights.push_back(backend.load_gptq(t));
  std::vector<float> a_host(opt.m * k);
  for (float& v : a_host) v = act(rng);
  const Buffer a = backend.upload(a_host, DType::F16);
  Buffer out = backend.alloc(DType::F16, opt.m * n);
  for (int i = 0; i < 30; ++i) backend.gemm_gptq(a, *weights[static_cast<std::size_t>(i % 3)], out, opt.m);
  backend.synchronize();
  kernels::gptq_timeline_reset();
  backend.gemm_gptq(a, *weights[0], out, opt.m);  // weights 1 and 2 were read after it
  backend.synchronize();
  // The warm-up launches' records stay (without stamps): only the newest.
  std::printf("ferrum_gptq_timeline: gemm_gptq %zu x %zu, m %zu, f16, g128, symmetric; library defaults%s\n", k, n,
              opt.m, opt.ctas_per_sm_set ? (", ctas_per_sm " + std::to_string(opt.ctas_per_sm)).c_str() : "");
  std::vector<GptqTimelineLaunch> launches = kernels::gptq_timeline_read();
  long long newest = -1;
  for (const GptqTimelineLaunch& l : launches) newest = std::max(newest, l.sequence);
  std::erase_if(launches, [&](const GptqTimelineLaunch& l) { return l.sequence != newest; });
  if (newest < 0) {
    std::printf("no streaming launch recorded (from 9 rows on most weights Auto takes the wgmma kernel)\n");
  }
  return launches;
}

// A launch's CTAs grouped by how many of them ran on their SM: per group
// the SMs, the median and latest of those SMs' last Exit, and the median
// CTA's WaitReturned -> Exit, all in µs (after the launch's first
// WaitReturned, wait0).
void print_by_sm_load(const GptqTimelineLaunch& l, unsigned long long wait0) {
  constexpr int kWait = static_cast<int>(GptqTimelinePoint::WaitReturned);
  constexpr int kExit = static_cast<int>(GptqTimelinePoint::Exit);
  if (static_cast<long long>(l.grid_x) * l.splits > kernels::kGptqTimelineCtas) {
    std::printf("  by SM load: only the first %d of %lld CTAs were recorded (the counts below are low)\n",
                kernels::kGptqTimelineCtas, static_cast<long long>(l.grid_x) * l.splits);
  }
  std::map<unsigned, std::vector<std::size_t>> by_sm;  // SM -> its CTAs
  for (std::size_t c = 0; c < l.ctas.size(); ++c) {
    if (l.ctas[c][kExit].global_ns != 0) by_sm[l.ctas[c][kExit].sm].push_back(c);
  }
  std::map<std::size_t, std::vector<unsigned>> by_load;  // CTAs on the SM -> SMs
  for (const auto& [sm, ctas] : by_sm) by_load[ctas.size()].push_back(sm);
  std::printf("  by SM load (%zu SMs): %-10s %5s %12s %12s %14s\n", by_sm.size(), "CTAs/SM", "SMs", "last Exit med",
              "last Exit max", "CTA span med");
  for (const auto& [load, sms] : by_load) {
    std::vector<double> last, span;
    for (unsigned sm : sms) {
      unsigned long long latest = 0;
      for (std::size_t c : by_sm[sm]) {
        latest = std::max(latest, l.ctas[c][kExit].global_ns);
        if (l.ctas[c][kWait].global_ns != 0) {
          span.push_back(static_cast<double>(l.ctas[c][kExit].global_ns - l.ctas[c][kWait].global_ns) / 1000.0);
        }
      }
      last.push_back((static_cast<double>(latest) - static_cast<double>(wait0)) / 1000.0);
    }
    std::printf("  %34zu %5zu %12.2f %12.2f %14.2f\n", load, sms.size(), median(last),
                *std::max_element(last.begin(), last.end()), median(span));
  }
}

int run(const Options& opt) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "ferrum_gptq_timeline: no GPU\n");
    return 1;
  }
  ModelConfig config{};
  const std::vector<GptqTimelineLaunch> launches =
      opt.gemm_k != 0 ? gemm_launches(opt) : decode_step_launches(opt, config);
  auto name_of = [&](const GptqTimelineLaunch& l) {
    return opt.gemm_k != 0 ? std::to_string(l.k) + "x" + std::to_string(l.n) : launch_name(l, config);
  };

  // Every clock64 column divides by this: without it, say so rather than
  // print 0 MHz and columns of inf.
  int clock_khz = 0;
  const cudaError_t clock_err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  if (clock_err != cudaSuccess || clock_khz <= 0) {
    std::fprintf(stderr, "ferrum_gptq_timeline: cudaDeviceGetAttribute(cudaDevAttrClockRate): %s\n",
                 clock_err != cudaSuccess ? cudaGetErrorString(clock_err) : "no clock rate reported");
    return 1;
  }
  const double cycles_per_us = clock_khz / 1000.0;
  std::printf("clock64 columns at the peak SM clock, %.0f MHz (each launch prints the clock it measured)\n",
              cycles_per_us);
  std::ofstream csv;
  if (!opt.csv.empty()) {
    csv.open(opt.csv);
    csv << "launch,name,cta,point,global_ns,clock,sm\n";
  }
  unsigned long long previous_exit = 0;
  int index = 0;
  const auto recorded = std::count_if(launches.begin(), launches.end(),
                                      [](const GptqTimelineLaunch& l) { return l.sequence >= 0 && !l.ctas.empty(); });
  const long long shown_from = static_cast<long long>(recorded) - opt.print_last;
  for (const GptqTimelineLaunch& l : launches) {
    if (l.sequence < 0 || l.ctas.empty()) continue;
    const std::string name = name_of(l);
    // The launches before the last --print-last: still in the CSV and the gaps.
    const bool shown = index >= shown_from;
    auto say = [&](const char* format, auto... args) {
      if (shown) std::printf(format, args...);
    };
    unsigned long long wait0 = ~0ull, last_exit = 0;
    for (const auto& cta : l.ctas) {
      const auto w = cta[static_cast<int>(GptqTimelinePoint::WaitReturned)].global_ns;
      if (w != 0) wait0 = std::min(wait0, w);
      last_exit = std::max(last_exit, cta[static_cast<int>(GptqTimelinePoint::Exit)].global_ns);
    }
    if (wait0 == ~0ull) {
      say("launch %lld %s: no CTA recorded (not run since the reset)\n", l.sequence, name.c_str());
      continue;
    }
    say("\nlaunch %lld %s: m %d, k %d, n %d, grid %d x %d, ring %d%s; span WaitReturned -> last Exit %.2f µs",
                l.sequence, name.c_str(), l.m, l.k, l.n, l.grid_x, l.splits, l.ring,
                l.cluster_reduce ? ", cluster reduce" : "", (last_exit - wait0) / 1000.0);
    if (previous_exit != 0) say("; gap after the previous launch's last Exit %.2f µs", (wait0 - static_cast<double>(previous_exit)) / 1000.0);
    // The SM clock this launch ran at: clock64 cycles per %globaltimer ns
    // over each CTA's Entry -> Exit, median.
    std::vector<double> mhz;
    for (const auto& cta : l.ctas) {
      const auto& e = cta[static_cast<int>(GptqTimelinePoint::Entry)];
      const auto& x = cta[static_cast<int>(GptqTimelinePoint::Exit)];
      if (e.global_ns != 0 && x.global_ns > e.global_ns + 2000) {
        mhz.push_back(1000.0 * static_cast<double>(x.clock - e.clock) / static_cast<double>(x.global_ns - e.global_ns));
      }
    }
    say("; SM clock %.0f MHz measured", median(mhz));
    say("\n  %-14s %9s %9s %9s   %s\n", "point", "min µs", "median", "max", "clock since previous point (median µs)");
    for (int p = 0; p < kGptqTimelinePoints; ++p) {
      std::vector<double> at, since;
      for (const auto& cta : l.ctas) {
        if (cta[p].global_ns == 0) continue;
        at.push_back((static_cast<double>(cta[p].global_ns) - static_cast<double>(wait0)) / 1000.0);
        if (p > 0 && cta[p - 1].clock != 0) since.push_back(static_cast<double>(cta[p].clock - cta[p - 1].clock) / cycles_per_us);
      }
      if (at.empty()) {
        say("  %-14s %9s\n", kPointNames[p], "-");
        continue;
      }
      say("  %-14s %9.2f %9.2f %9.2f   %s\n", kPointNames[p], *std::min_element(at.begin(), at.end()),
                  median(at), *std::max_element(at.begin(), at.end()),
                  since.empty() ? "" : std::to_string(median(since)).c_str());
    }
    if (shown) print_by_sm_load(l, wait0);
    if (csv.is_open()) {
      for (std::size_t c = 0; c < l.ctas.size(); ++c) {
        for (int p = 0; p < kGptqTimelinePoints; ++p) {
          csv << index << ',' << name << ',' << c << ',' << kPointNames[p] << ',' << l.ctas[c][p].global_ns << ','
              << l.ctas[c][p].clock << ',' << l.ctas[c][p].sm << '\n';
        }
      }
    }
    previous_exit = last_exit;
    ++index;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferrum_gptq_timeline: %s\n", e.what());
    return 1;
  }
}
