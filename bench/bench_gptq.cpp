// GPTQ INT4 GEMM benchmark: our INT4 kernels (kernels/gptq_gemm.hpp), our
// dequantize + cuBLAS path, and cuBLAS f16 on the same shape (a · Wᵀ with W
// [n, k] f16, as CudaBackend::gemm does).
//
//   ferrum_bench_gptq [--json PATH] [--iters N] [--warmup N] [--dtype f16|bf16]
//                     [--asym] [--act-order] [--crossover] [--quick]
//                     [--kernel auto|fused|stream|bulk|wgmma] [--ring N] [--splits N] [--no-cluster-reduce]
//                     [--ms M,M,...] [--shapes KxN,KxN,...]
//
// --kernel picks the kernel launch_gptq_gemm runs (GptqGemmArgs::kernel):
// auto = CudaBackendConfig's default rule (wgmma where it runs and measured
// faster, gptq_wgmma_preferred; else the streaming kernel, bulk source, for
// launches of m <= kGptqStreamAutoMaxM, and fused above); fused = the fused
// kernel; wgmma = the warpgroup-MMA kernel for every launch (sm_90a; fused
// elsewhere); stream = the register-streaming kernel for launches of m <= 16
// (larger m still run the fused kernel); bulk = the same streaming kernel
// with its weights brought into shared-memory rings by bulk copies (--ring:
// chunk slots per warp, 0 = the library's choice; --splits: CTAs along k of
// the streaming and wgmma kernels, 0 = the plan's; --no-cluster-reduce:
// GptqGemmArgs::cluster_reduce = false, their splits always summed through
// the workspace; by default launches that pass the launcher's gate sum them
// in a cluster, plan column "sxSc"; wgmma launches of 2..8 splits always).
// --ms replaces the list of m, --shapes
// the list of shapes. The "plan"
// column says which ran: "sxS" = streaming (one CTA per 64 columns, S
// splits along k), "wxS" = wgmma (one CTA per 256 columns, S splits), else
// "cCxS": the fused configuration C and its splits.
//
// Shapes [k x n]: 4096x4096, 4096x14336, 14336x4096, 8192x8192, 8192x28672,
// and the llama3-8b step's 4096x6144 (q|k|v) and 4096x28672 (gate|up);
// m in {1, 2, 4, 8, 16, 32, 48, 64, 128} (--crossover adds 256, 512, 1024, where
// the dequantize + cuBLAS path is also timed: the crossover sets
// kernels::gptq_fused_max_m, whose pick the "rule" column shows: F the INT4
// kernels, D dequantize + cuBLAS). Group size 128.
//
// "read_us" (once per shape) is the read ceiling of the INT4 weight + scale
// bytes (bench/read_ceiling.cu: a read-only stream, no math) and "max_x"
// the largest speedup over cuBLAS any kernel could show there (the row's
// cuBLAS time / read_us): the bar's feasibility at that size.
//
// Method: CUDA events around each launch, `warmup` untimed launches, median
// of `iters`. Several copies of every weight are rotated so that no launch
// finds its weights in L2 (50 MB): copies * bytes >= 256 MB. INT4 GB/s counts
// the packed weight bytes (k * n / 2) only; "+meta" adds scales (and zeros).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "ferrum/half.hpp"
#include "kernels/gptq_gemm.hpp"
#include "quant/gptq_repack.hpp"
#include "comma_items.hpp"
#include "cuda_check.hpp"
#include "option_value.hpp"
#include "read_ceiling.cuh"

namespace {

using ::check;  // the CUDA runtime's overload (cuda_check.hpp) beside cuBLAS's
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

struct Options {
  std::string json;
  int iters = 50;
  int warmup = 10;
  ferrum::DType dtype = ferrum::DType::F16;
  bool asym = false;
  bool act_order = false;
  bool crossover = false;
  bool quick = false;
  std::string kernel = "auto";  // auto | fused | stream | bulk | wgmma
  int ring = 0;                 // bulk: chunk slots per warp (0: the default)
  int splits = 0;               // stream / bulk / wgmma: CTAs along k (0: the plan's)
  bool cluster_reduce = true;   // bulk / wgmma: GptqGemmArgs::cluster_reduce
  std::vector<int> ms;          // --ms: the m values (empty: the default list)
  std::vector<std::pair<int, int>> shapes;  // --shapes: [k x n] (empty: the default list)
};

struct XorShift {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

void* dev_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)), "cudaMalloc");
  return p;
}

// Median of per-launch times (µs) of `launch`, rotating over `copies`.
double time_median(int copies, int warmup, int iters, const std::function<void(int)>& launch, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) launch(i % copies);
  std::vector<cudaEvent_t> ev(2 * static_cast<std::size_t>(iters));
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
    launch((warmup + i) % copies);
    check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check(cudaGetLastError(), "launch");
  std::vector<double> us(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    us[static_cast<std::size_t>(i)] = 1000.0 * ms;
  }
  for (auto& e : ev) check(cudaEventDestroy(e), "cudaEventDestroy");
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct Row {
  int k, n, m;
  double ours_us, dequant_us, cublas_us, read_us;
  int splits, config;
  double int4_gbs, meta_gbs, speedup;
  bool rule_fused;  // kernels::gptq_fused_max_m sends this m to the INT4 kernels
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return option_value(argc, argv, i); };
    if (a == "--json") {
      opt.json = value();
    } else if (a == "--iters") {
      opt.iters = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--warmup") {
      opt.warmup = std::max(0, std::atoi(value().c_str()));
    } else if (a == "--dtype") {
      opt.dtype = value() == "bf16" ? ferrum::DType::BF16 : ferrum::DType::F16;
    } else if (a == "--asym") {
      opt.asym = true;
    } else if (a == "--act-order") {
      opt.act_order = true;
    } else if (a == "--crossover") {
      opt.crossover = true;
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--splits") {
      opt.splits = std::atoi(value().c_str());
      if (opt.splits < 0 || opt.splits > 16) {
        std::fprintf(stderr, "--splits takes 0..16 (got %d)\n", opt.splits);
        return 2;
      }
    } else if (a == "--ring") {
      opt.ring = std::atoi(value().c_str());
      if (opt.ring < 0 || opt.ring > ferrum::kernels::kGptqStreamMaxRing) {
        std::fprintf(stderr, "--ring takes 0..%d (got %d)\n", ferrum::kernels::kGptqStreamMaxRing, opt.ring);
        return 2;
      }
    } else if (a == "--no-cluster-reduce") {
      opt.cluster_reduce = false;
    } else if (a == "--ms") {
      opt.ms = comma_ints(value());
    } else if (a == "--shapes") {
      for (const std::string& shape : comma_items(value())) {
        const std::size_t x = shape.find('x');
        if (x == std::string::npos) {
          std::fprintf(stderr, "--shapes takes KxN,KxN,... (got %s)\n", shape.c_str());
          return 2;
        }
        opt.shapes.emplace_back(std::atoi(shape.substr(0, x).c_str()), std::atoi(shape.substr(x + 1).c_str()));
      }
    } else if (a == "--kernel") {
      opt.kernel = value();
      if (opt.kernel != "auto" && opt.kernel != "fused" && opt.kernel != "stream" && opt.kernel != "bulk" &&
          opt.kernel != "wgmma") {
        std::fprintf(stderr, "--kernel must be auto, fused, stream, bulk or wgmma (got %s)\n", opt.kernel.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--iters N] [--warmup N] [--dtype f16|bf16] [--asym] [--act-order] "
                   "[--crossover] [--quick] [--kernel auto|fused|stream|bulk|wgmma] [--ring N] [--splits N] [--no-cluster-reduce] "
                   "[--ms M,M,...] "
                   "[--shapes KxN,...]\n",
                   argv[0]);
      return 2;
    }
  }

  int num_sms = 0;
  check(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t cublas = nullptr;
  check(cublasCreate(&cublas), "cublasCreate");
  check(cublasSetStream(cublas, stream), "cublasSetStream");
  void* cublas_ws = dev_alloc(std::size_t{32} << 20);
  check(cublasSetWorkspace(cublas, cublas_ws, std::size_t{32} << 20), "cublasSetWorkspace");

  // The five shapes, then the llama3-8b decode step's two others
  // (fused q|k|v and gate|up; o and down are 4096x4096 and 14336x4096).
  std::vector<std::pair<int, int>> shapes = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 8192},
                                             {8192, 28672}, {4096, 6144},  {4096, 28672}};
  std::vector<int> ms = {1, 2, 4, 8, 16, 32, 48, 64, 128};
  if (opt.crossover) ms.insert(ms.end(), {256, 512, 1024});
  if (opt.quick) {
    shapes = {{8192, 8192}};
    ms = {1, 16, 64};
  }
  if (!opt.ms.empty()) ms = opt.ms;
  if (!opt.shapes.empty()) shapes = opt.shapes;
  const int max_m = *std::max_element(ms.begin(), ms.end());
  const bool bf16 = opt.dtype == ferrum::DType::BF16;
  const cudaDataType_t ctype = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  constexpr std::size_t kRotateBytes = std::size_t{256} << 20;

  // The kernel a launch of `rows` rows runs: CudaBackend's rule
  // (gptq_kernel_for; every weight here has groups of 128 rows) for auto,
  // else the named one; the streaming kinds cover kGptqStreamMaxM rows (more
  // rows run the fused kernel), wgmma every m where it runs (else fused).
  const bool wgmma_applies = ferrum::kernels::gptq_wgmma_applies(128);  // every weight here has groups of 128 rows
  auto kind_of = [&](int rows, int k, int n) {
    using ferrum::kernels::GptqKernelKind;
    const GptqKernelKind forced = opt.kernel == "stream"  ? GptqKernelKind::Stream
                                  : opt.kernel == "bulk"  ? GptqKernelKind::StreamBulk
                                  : opt.kernel == "wgmma" ? GptqKernelKind::Wgmma
                                                          : GptqKernelKind::Fused;
    const GptqKernelKind kind = ferrum::kernels::gptq_kernel_for(
        opt.kernel == "auto", forced, rows, static_cast<std::size_t>(k), static_cast<std::size_t>(n),
        ferrum::kernels::gptq_bulk_source_applies(128), wgmma_applies);
    if (kind == GptqKernelKind::Wgmma) return wgmma_applies ? kind : GptqKernelKind::Fused;
    return rows <= ferrum::kernels::kGptqStreamMaxM ? kind : GptqKernelKind::Fused;
  };
  auto streams = [&](int rows, int k, int n) {
    const auto kind = kind_of(rows, k, n);
    return kind == ferrum::kernels::GptqKernelKind::Stream || kind == ferrum::kernels::GptqKernelKind::StreamBulk;
  };
  std::printf("device %s, %d SMs, dtype %s, group 128%s%s, kernel %s, ring %d%s\n", prop.name, num_sms,
              bf16 ? "bf16" : "f16", opt.asym ? ", asymmetric" : ", symmetric", opt.act_order ? ", act-order" : "",
              opt.kernel.c_str(), opt.ring, opt.cluster_reduce ? "" : ", no cluster reduce");
  std::printf("%6s %6s %5s | %10s %9s %9s %6s | %10s %4s | %10s %8s | %8s %6s\n", "k", "n", "m", "ours_us",
              "int4_GB/s", "+meta", "plan", "deq+cublas", "rule", "cublas_us", "speedup", "read_us", "max_x");

  std::vector<Row> rows;
  XorShift rng{0x9E3779B97F4A7C15ull};
  for (const auto& [k, n] : shapes) {
    // A random checkpoint, repacked once.
    ferrum::detail::GptqUnpacked w;
    w.k = static_cast<std::size_t>(k);
    w.n = static_cast<std::size_t>(n);
    w.group_size = 128;
    w.groups = w.k / 128;
    w.q.resize(w.k * w.n);
    for (std::size_t i = 0; i < w.q.size(); i += 16) {
      std::uint64_t r = rng.next();
      for (std::size_t j = 0; j < 16 && i + j < w.q.size(); ++j) w.q[i + j] = static_cast<std::uint8_t>((r >> (4 * j)) & 15);
    }
    w.zero.resize(w.groups * w.n);
    for (auto& z : w.zero) z = opt.asym ? static_cast<std::uint8_t>(1 + rng.next() % 15) : 8;
    w.scale.resize(w.groups * w.n);
    for (auto& s : w.scale) s = 0.001f + static_cast<float>(rng.next() % 1000) * 1e-5f;
    w.g_idx.resize(w.k);
    w.perm.resize(w.k);
    for (std::size_t r = 0; r < w.k; ++r) {
      w.g_idx[r] = static_cast<std::int32_t>(r / 128);
      w.perm[r] = static_cast<std::int32_t>(r);
    }
    if (opt.act_order) {  // rows of a group scattered: a reversed, interleaved order
      for (std::size_t r = 0; r < w.k; ++r) w.g_idx[r] = static_cast<std::int32_t>(r % w.groups);
      std::stable_sort(w.perm.begin(), w.perm.end(),
                       [&](std::int32_t x, std::int32_t y) { return w.g_idx[x] < w.g_idx[y]; });
    }
    const ferrum::detail::GptqRepacked r = ferrum::detail::repack_gptq(w, "bench_gptq");
    const std::vector<std::uint16_t> scales = ferrum::detail::gptq_scales_as(r, opt.dtype);

    const std::size_t q_bytes = r.qweight.size() * 4;
    const std::size_t meta_bytes = scales.size() * 2 + (r.uniform_zero ? 0 : r.zeros.size());
    const int copies = static_cast<int>(std::max<std::size_t>(3, (kRotateBytes + q_bytes - 1) / q_bytes));
    std::vector<ferrum::kernels::GptqDeviceWeight> views(static_cast<std::size_t>(copies));
    std::vector<void*> owned;
    void* d_row_group = dev_alloc(r.row_group.size() * 4);
    check(cudaMemcpy(d_row_group, r.row_group.data(), r.row_group.size() * 4, cudaMemcpyHostToDevice), "copy");
    void* d_perm = dev_alloc(r.perm.size() * 4);
    check(cudaMemcpy(d_perm, r.perm.data(), r.perm.size() * 4, cudaMemcpyHostToDevice), "copy");
    owned.push_back(d_row_group);
    owned.push_back(d_perm);
    for (auto& v : views) {
      void* q = dev_alloc(q_bytes);
      void* s = dev_alloc(scales.size() * 2);
      check(cudaMemcpy(q, r.qweight.data(), q_bytes, cudaMemcpyHostToDevice), "copy");
      check(cudaMemcpy(s, scales.data(), scales.size() * 2, cudaMemcpyHostToDevice), "copy");
      owned.push_back(q);
      owned.push_back(s);
      v.qweight = static_cast<const std::uint32_t*>(q);
      v.scales = s;
      if (!r.uniform_zero) {
        void* z = dev_alloc(r.zeros.size());
        check(cudaMemcpy(z, r.zeros.data(), r.zeros.size(), cudaMemcpyHostToDevice), "copy");
        owned.push_back(z);
        v.zeros = static_cast<const std::uint8_t*>(z);
      }
      v.zero_value = r.zero_value;
      v.row_group = static_cast<const std::int32_t*>(d_row_group);
      v.perm = r.act_order ? static_cast<const std::int32_t*>(d_perm) : nullptr;
      v.k = k;
      v.n = n;
      v.k_pad = static_cast<int>(r.k_pad);
      v.n_pad = static_cast<int>(r.n_pad);
      v.group_rows = static_cast<int>(r.group_rows);
    }
    // Workspaces, activations, output.
    float* d_partials = static_cast<float*>(
        dev_alloc(std::max<std::size_t>(
                      ferrum::kernels::gptq_partials_floats(static_cast<int>(r.k_pad), static_cast<int>(r.n_pad), num_sms),
                      // --splits: up to 16 splits of every column block's 16
                      // rows (streaming) or of 256 columns' 64 rows (wgmma)
                      std::size_t{16} * ((r.n_pad + 255) / 256 * 256) * ferrum::kernels::kGptqMaxM) *
                  sizeof(float)));
    const std::size_t counters = ferrum::kernels::gptq_counter_ints(static_cast<int>(r.n_pad));
    int* d_counters = static_cast<int*>(dev_alloc(counters * sizeof(int)));
    check(cudaMemset(d_counters, 0, counters * sizeof(int)), "cudaMemset");
    void* d_a = dev_alloc(static_cast<std::size_t>(max_m) * k * 2);
    void* d_gather = dev_alloc(static_cast<std::size_t>(ferrum::kernels::kGptqMaxM) * k * 2);
    void* d_out = dev_alloc(static_cast<std::size_t>(max_m) * n * 2);
    {
      std::vector<std::uint16_t> host(static_cast<std::size_t>(max_m) * k);
      for (auto& h : host) {
        const float v = static_cast<float>(static_cast<int>(rng.next() % 2001) - 1000) * 1e-3f;
        h = bf16 ? ferrum::f32_to_bf16(v) : ferrum::f32_to_f16(v);
      }
      check(cudaMemcpy(d_a, host.data(), host.size() * 2, cudaMemcpyHostToDevice), "copy");
    }
    // Dequantize scratch: 64 MiB of whole 64-column blocks, as the backend sizes it.
    const std::size_t scratch_cols =
        std::clamp<std::size_t>((std::size_t{64} << 20) / (static_cast<std::size_t>(k) * 128), 1, r.n_pad / 64) * 64;
    void* d_scratch = opt.crossover ? dev_alloc(static_cast<std::size_t>(k) * scratch_cols * 2) : nullptr;

    // cuBLAS f16 / bf16 weights [n, k], rotated the same way.
    const std::size_t w16_bytes = static_cast<std::size_t>(k) * n * 2;
    const int w16_copies = static_cast<int>(std::max<std::size_t>(2, (kRotateBytes + w16_bytes - 1) / w16_bytes));
    std::vector<void*> w16(static_cast<std::size_t>(w16_copies));
    {
      std::vector<std::uint16_t> block(std::size_t{16} << 20);
      for (auto& h : block) {
        const float v = static_cast<float>(static_cast<int>(rng.next() % 2001) - 1000) * 1e-5f;
        h = bf16 ? ferrum::f32_to_bf16(v) : ferrum::f32_to_f16(v);
      }
      for (auto& p : w16) {
        p = dev_alloc(w16_bytes);
        for (std::size_t off = 0; off < w16_bytes; off += block.size() * 2) {
          check(cudaMemcpy(static_cast<char*>(p) + off, block.data(), std::min(block.size() * 2, w16_bytes - off),
                           cudaMemcpyHostToDevice),
                "copy");
        }
      }
    }
    const float one = 1.0f, zero = 0.0f;

    // The read ceiling of the INT4 weight + scale bytes, rotated the same way.
    const std::size_t ceiling_bytes = (q_bytes + meta_bytes + 15) / 16 * 16;
    std::vector<void*> ceiling_bufs(static_cast<std::size_t>(copies));
    for (auto& p : ceiling_bufs) {
      p = dev_alloc(ceiling_bytes);
      check(cudaMemset(p, 0x5a, ceiling_bytes), "cudaMemset");
    }
    auto* d_sink = static_cast<std::uint32_t*>(
        dev_alloc(static_cast<std::size_t>(ferrum::bench::read_ceiling_blocks(num_sms)) * sizeof(std::uint32_t)));
    const double read_us = time_median(copies, opt.warmup, opt.iters, [&](int c) {
      ferrum::bench::launch_read_ceiling(ceiling_bufs[static_cast<std::size_t>(c)], ceiling_bytes, d_sink, num_sms,
                                         stream);
    }, stream);
    for (void* p : ceiling_bufs) check(cudaFree(p), "cudaFree");
    check(cudaFree(d_sink), "cudaFree");

    for (int m : ms) {
      // Ours: the fused kernel, kGptqMaxM rows per launch (as the backend runs it).
      auto fused = [&](int c) {
        for (int row0 = 0; row0 < m; row0 += ferrum::kernels::kGptqMaxM) {
          const int rows_now = std::min(ferrum::kernels::kGptqMaxM, m - row0);
          const void* a_rows = static_cast<const char*>(d_a) + static_cast<std::size_t>(row0) * k * 2;
          if (r.act_order) {
            ferrum::kernels::launch_gptq_gather(opt.dtype, a_rows, views[c].perm, d_gather, rows_now, k, stream);
            a_rows = d_gather;
          }
          ferrum::kernels::GptqGemmArgs args;
          args.dtype = opt.dtype;
          args.w = views[static_cast<std::size_t>(c)];
          args.a = a_rows;
          args.out = static_cast<char*>(d_out) + static_cast<std::size_t>(row0) * n * 2;
          args.m = rows_now;
          args.partials = d_partials;
          args.counters = d_counters;
          args.num_sms = num_sms;
          args.kernel = kind_of(rows_now, k, n);
          args.stream_ring = opt.ring;
          args.stream_splits = opt.splits;
          args.cluster_reduce = opt.cluster_reduce;
          ferrum::kernels::launch_gptq_gemm(args, stream);
        }
      };
      auto dequant_cublas = [&](int c) {
        for (std::size_t n0 = 0; n0 < static_cast<std::size_t>(n); n0 += scratch_cols) {
          const std::size_t cols = std::min(scratch_cols, static_cast<std::size_t>(n) - n0);
          ferrum::kernels::launch_gptq_dequant(opt.dtype, views[static_cast<std::size_t>(c)], static_cast<int>(n0),
                                               static_cast<int>(scratch_cols), d_scratch, stream);
          check(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols), m, k, &one, d_scratch, ctype,
                             static_cast<int>(scratch_cols), d_a, ctype, k, &zero,
                             static_cast<char*>(d_out) + n0 * 2, ctype, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx (dequant path)");
        }
      };
      auto dense = [&](int c) {
        check(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w16[static_cast<std::size_t>(c)], ctype, k,
                           d_a, ctype, k, &zero, d_out, ctype, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      };
      Row row{};
      row.k = k;
      row.n = n;
      row.m = m;
      const ferrum::kernels::GptqPlan plan =
          ferrum::kernels::gptq_plan(opt.dtype, std::min(m, ferrum::kernels::kGptqMaxM), static_cast<int>(r.k_pad),
                                     static_cast<int>(r.n_pad), num_sms);
      row.splits = plan.splits;
      row.config = plan.config;
      if (streams(m, k, n)) {  // the streaming kernel: "config" -1
        const ferrum::kernels::GptqPlan sp = ferrum::kernels::gptq_stream_plan(
            opt.dtype, !r.uniform_zero, m, k, static_cast<int>(r.k_pad), static_cast<int>(r.n_pad),
            static_cast<int>(r.group_rows), num_sms, kind_of(m, k, n), opt.ring, /*ctas_per_sm=*/0);
        row.splits = opt.splits > 0 ? std::min(opt.splits, static_cast<int>(r.k_pad) / 128) : sp.splits;
        row.config = -1;
      } else if (kind_of(std::min(m, ferrum::kernels::kGptqMaxM), k, n) == ferrum::kernels::GptqKernelKind::Wgmma) {  // "config" -2
        const ferrum::kernels::GptqPlan wp = ferrum::kernels::gptq_wgmma_plan(
            static_cast<int>(r.k_pad), static_cast<int>(r.n_pad), num_sms, opt.splits);
        row.splits = wp.splits;
        row.config = wp.config;
      }
      row.ours_us = time_median(copies, opt.warmup, opt.iters, fused, stream);
      row.dequant_us = opt.crossover ? time_median(copies, opt.warmup, opt.iters, dequant_cublas, stream) : 0.0;
      row.cublas_us = time_median(w16_copies, opt.warmup, opt.iters, dense, stream);
      row.int4_gbs = static_cast<double>(q_bytes) / (row.ours_us * 1e3);
      row.meta_gbs = static_cast<double>(q_bytes + meta_bytes) / (row.ours_us * 1e3);
      row.speedup = row.cublas_us / row.ours_us;
      row.read_us = read_us;
      const bool wgmma_runs = wgmma_applies && (opt.kernel == "auto" || opt.kernel == "wgmma");
      row.rule_fused = static_cast<std::size_t>(m) <= ferrum::kernels::gptq_fused_max_m(
                                                        static_cast<std::size_t>(k), static_cast<std::size_t>(n),
                                                        opt.act_order, wgmma_runs);
      rows.push_back(row);
      char deq[32] = "-";
      if (opt.crossover) std::snprintf(deq, sizeof(deq), "%.1f", row.dequant_us);
      char plan_text[16];
      if (row.config == -2) {
        std::snprintf(plan_text, sizeof(plan_text), "wx%d", row.splits);
      } else if (row.config < 0) {
        // "c": the splits summed in a cluster (the rule of launch_gptq_gemm's
        // bulk source, on a device where such a cluster fits).
        const bool clustered = kind_of(m, k, n) == ferrum::kernels::GptqKernelKind::StreamBulk && k % 8 == 0 &&
                               ferrum::kernels::gptq_bulk_source_applies(static_cast<int>(r.group_rows)) &&
                               ferrum::kernels::gptq_cluster_reduces(
                                   opt.cluster_reduce, row.splits,
                                   static_cast<long long>(r.n_pad / ferrum::kernels::kGptqTileN) * row.splits, num_sms);
        std::snprintf(plan_text, sizeof(plan_text), "sx%d%s", row.splits, clustered ? "c" : "");
      } else {
        std::snprintf(plan_text, sizeof(plan_text), "c%dx%d", row.config, row.splits);
      }
      std::printf("%6d %6d %5d | %10.1f %9.0f %9.0f %6s | %10s %4s | %10.1f %7.2fx | %8.1f %5.2fx\n", k, n, m,
                  row.ours_us, row.int4_gbs, row.meta_gbs, plan_text, deq, row.rule_fused ? "F" : "D", row.cublas_us,
                  row.speedup, row.read_us, row.cublas_us / row.read_us);
      std::fflush(stdout);
    }

    for (void* p : owned) check(cudaFree(p), "cudaFree");
    for (void* p : w16) check(cudaFree(p), "cudaFree");
    for (void* p : {static_cast<void*>(d_partials), static_cast<void*>(d_counters), d_a, d_gather, d_out, d_scratch}) {
      if (p != nullptr) check(cudaFree(p), "cudaFree");
    }
  }

  if (!opt.json.empty()) {
    std::ofstream out(opt.json);
    out << "{\"device\": \"" << prop.name << "\", \"num_sms\": " << num_sms << ", \"dtype\": \""
        << (bf16 ? "bf16" : "f16") << "\", \"group_size\": 128, \"symmetric\": " << (opt.asym ? "false" : "true")
        << ", \"act_order\": " << (opt.act_order ? "true" : "false") << ", \"kernel\": \"" << opt.kernel
        << "\", \"iters\": " << opt.iters
        << ", \"results\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& rw = rows[i];
      out << "  {\"k\": " << rw.k << ", \"n\": " << rw.n << ", \"m\": " << rw.m << ", \"ours_us\": " << rw.ours_us
          << ", \"int4_gbps\": " << rw.int4_gbs << ", \"int4_meta_gbps\": " << rw.meta_gbs
          << ", \"splits\": " << rw.splits << ", \"config\": " << rw.config
          << ", \"dequant_cublas_us\": " << rw.dequant_us << ", \"rule\": \"" << (rw.rule_fused ? "fused" : "dequant")
          << "\"" << ", \"cublas_fp16_us\": " << rw.cublas_us
          << ", \"speedup_vs_cublas\": " << rw.speedup << ", \"read_ceiling_us\": " << rw.read_us
          << ", \"max_speedup_vs_cublas\": " << rw.cublas_us / rw.read_us << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << "]}\n";
    std::printf("wrote %s\n", opt.json.c_str());
  }
  check(cublasDestroy(cublas), "cublasDestroy");
  check(cudaFree(cublas_ws), "cudaFree");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return 0;
}
