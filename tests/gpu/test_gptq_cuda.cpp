// CudaBackend's GPTQ path (load_gptq, gemm_gptq, gemm_quant) against
// CpuBackend, the oracle.
//
// Integer activations in [-4, 4] and power-of-two scales make every product
// and every partial sum exactly representable in f32 (|sum| <= 8k, on a grid
// of 2^-8), so whatever the summation order (mma, split-K, cuBLAS) both
// backends hold the same exact f32 sum and round it once into the output
// dtype: the results must be bitwise equal. Covered: group sizes 32, 64,
// 128, -1; symmetric / asymmetric zeros; V1 / V2; act-order; non-square and
// padded k / n; m in {1, 3, 16, 17, 33, 64, 65, 200, 300} (the streaming
// kernel up to 16 rows, every fused kernel configuration above, row chunking,
// and the dequantize + cuBLAS path: each m on the default backend, whose
// measured rule sends these small weights to dequantize + cuBLAS above
// m = 96 where the wgmma kernel runs (sm_90a) and above 32 elsewhere, and on
// one whose INT4 kernels take every m); split-K,
// also at every configuration boundary and with partly empty column blocks;
// general layouts (group size 8, uneven act-order groups); f16 and bf16.
// Also: bitwise determinism run to run on random (non-exact) data, graph
// capture and replay, workspaces shared across weights, and bad input.
// Every output a test reads back is poisoned (or holds a known value) and
// followed by a sentinel guard checked after each call (GuardedOutput).
// The streaming kernel forced for every m <= 16 (CudaBackendConfig::gptq_kernel
// = Stream) gets the same exact checks at m in {1, 2, 7, 8, 9, 15, 16} (its
// NT = 1 / 2 switch at 8 / 9) and its fallback to the fused kernel above 16;
// the fused kernel forced (Fused) keeps its small-m checks.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible. The checkpoints are
// packed here from the format definition (no library code).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferrum/cuda_backend.hpp"
#include "kernels/common/per_device.hpp"
#include "kernels/gptq_gemm.hpp"
#include "support/captured_launches.hpp"
#include "support/half_reference.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

// A checkpoint in the on-disk format, owning its arrays.
struct Checkpoint {
  std::size_t k = 0, n = 0, groups = 0;
  int group_size = 128;
  GptqZeroFormat format = GptqZeroFormat::V1;
  std::vector<std::uint8_t> q;     // [k][n]
  std::vector<std::uint8_t> zero;  // [groups][n], true zeros
  std::vector<float> scale;        // [groups][n]
  std::vector<std::int32_t> g_idx; // [k]
  std::vector<std::int32_t> qweight, qzeros;

  // Packs q / zero into the GPTQ words (low nibble first).
  void pack() {
    qweight.assign(k / 8 * n, 0);
    for (std::size_t r = 0; r < k; ++r) {
      for (std::size_t c = 0; c < n; ++c) {
        auto& word = reinterpret_cast<std::uint32_t&>(qweight[(r / 8) * n + c]);
        word |= static_cast<std::uint32_t>(q[r * n + c]) << (4 * (r % 8));
      }
    }
    const unsigned offset = format == GptqZeroFormat::V1 ? 1u : 0u;
    qzeros.assign(groups * (n / 8), 0);
    for (std::size_t g = 0; g < groups; ++g) {
      for (std::size_t c = 0; c < n; ++c) {
        auto& word = reinterpret_cast<std::uint32_t&>(qzeros[g * (n / 8) + c / 8]);
        word |= static_cast<std::uint32_t>(zero[g * n + c] - offset) << (4 * (c % 8));
      }
    }
  }

  GptqHostTensors tensors() const {
    GptqHostTensors t;
    t.qweight = qweight;
    t.qzeros = qzeros;
    t.scales = scale;
    t.g_idx = g_idx;
    t.group_size = group_size;
    t.k = k;
    t.n = n;
    t.zero_format = format;
    return t;
  }
};

struct WeightCase {
  std::size_t k, n;
  int group_size;
  bool symmetric;
  bool act_order;
  GptqZeroFormat format;
  bool exact = true;  // power-of-two scales (else uniform random)
  // >= 0 (with symmetric false): every zero this one value (0 .. 15 in V2,
  // 1 .. 16 in V1), so the load drops the zeros array and the kernels
  // subtract that value (GptqRepacked::uniform_zero); -1: random zeros.
  int uniform_zero = -1;
};

std::string describe(const WeightCase& c) {
  return cat("k=", c.k, " n=", c.n, " group=", c.group_size, c.symmetric ? " sym" : " asym",
             c.act_order ? " act-order" : "", c.format == GptqZeroFormat::V1 ? " v1" : " v2",
             c.uniform_zero >= 0 ? cat(" every zero ", c.uniform_zero) : std::string());
}

// SMs of device 0 (the backends' device), for the launch plans.
int device0_sms() {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  return sms;
}

// Auto's streaming launch of c at m rows with the bulk source: whether the
// bulk source takes c's groups, and the plan's splits (at the library's
// default ring and CTAs per SM).
struct BulkPlan {
  bool applies;
  int splits;
};
BulkPlan bulk_stream_plan(const WeightCase& c, std::size_t m, DType dt) {
  const int k_pad = static_cast<int>((c.k + 127) / 128 * 128), n_pad = static_cast<int>((c.n + 63) / 64 * 64);
  const int group_rows = c.group_size > 0 ? c.group_size : k_pad;
  return {kernels::gptq_bulk_source_applies(group_rows),
          kernels::gptq_stream_plan(dt, !c.symmetric, static_cast<int>(m), static_cast<int>(c.k), k_pad, n_pad,
                                    group_rows, device0_sms(), kernels::GptqKernelKind::StreamBulk, /*ring=*/0,
                                    /*ctas_per_sm=*/0)
              .splits};
}

Checkpoint make_checkpoint(const WeightCase& c, Rng& rng) {
  Checkpoint ck;
  ck.k = c.k;
  ck.n = c.n;
  ck.group_size = c.group_size;
  ck.format = c.format;
  const std::size_t rows = c.group_size == -1 ? c.k : static_cast<std::size_t>(c.group_size);
  ck.groups = c.k / rows;
  ck.q.resize(c.k * c.n);
  for (auto& v : ck.q) v = static_cast<std::uint8_t>(rng.below(16));
  ck.zero.resize(ck.groups * c.n);
  for (auto& v : ck.zero) {
    if (c.symmetric) {
      v = 8;
    } else if (c.uniform_zero >= 0) {
      v = static_cast<std::uint8_t>(c.uniform_zero);
    } else {
      v = static_cast<std::uint8_t>(c.format == GptqZeroFormat::V1 ? 1 + rng.below(16) : rng.below(16));
    }
  }
  ck.scale.resize(ck.groups * c.n);
  for (auto& v : ck.scale) {
    v = c.exact ? std::ldexp(1.0f, -3 - static_cast<int>(rng.below(6))) * (rng.below(2) == 0 ? 1.0f : -1.0f)
                : rng.uniform(0.001f, 0.02f);
  }
  ck.g_idx.resize(c.k);
  for (std::size_t r = 0; r < c.k; ++r) ck.g_idx[r] = static_cast<std::int32_t>(r / rows);
  if (c.act_order) std::shuffle(ck.g_idx.begin(), ck.g_idx.end(), rng.engine());
  ck.pack();
  return ck;
}

std::vector<float> integer_activations(Rng& rng, std::size_t count) {
  std::vector<float> a(count);
  for (auto& v : a) v = static_cast<float>(static_cast<int>(rng.below(9)) - 4);
  return a;
}

// out of gemm_gptq (or gemm_quant) on `be`, downloaded. out is poisoned and
// guarded: the weight's columns are padded to a multiple of 64, so a store
// bounded by the padded width instead of n would land past out's end, where
// no value read back shows it.
std::vector<float> run_gemm(Backend& be, const QuantWeight& w, const std::vector<float>& a, DType dtype, std::size_t m,
                            bool via_quant = false) {
  Buffer a_buf = be.upload(a, dtype);
  GuardedOutput out(be, dtype, m * w.n());
  if (via_quant) {
    be.gemm_quant(a_buf, w, out.view(), m);
  } else {
    be.gemm_gptq(a_buf, w, out.view(), m);
  }
  EXPECT_TRUE(out.check_guard(via_quant ? "gemm_quant" : "gemm_gptq", "out",
                           cat("m=", m, " k=", w.k(), " n=", w.n(), " ", to_string(dtype))));
  return out.values();
}

// The kernels one gemm_gptq call (zero activations, m rows) launches on `be`.
std::vector<CapturedLaunch> gptq_launches(Backend& be, const QuantWeight& w, DType dtype, std::size_t m) {
  Buffer a_buf = be.upload(std::vector<float>(m * w.k(), 0.0f), dtype);
  Buffer out = be.alloc(dtype, m * w.n());
  return captured_launches(dynamic_cast<CudaBackend&>(be), [&] { be.gemm_gptq(a_buf, w, out, m); });
}

::testing::AssertionResult same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (bad++ < 4) first += cat(" [", i, "] got ", got[i], " want ", want[i], ";");
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements differ:" << first;
}

class CudaGptq : public CudaTest {
 protected:
  // Loads `c` on three backends and compares every m in `ms`, f16 and bf16:
  // on the default backend (the measured rule sends small weights to
  // dequantize + cuBLAS above m = 96 with wgmma, else 32), on one whose INT4 kernels take every m
  // (CudaBackendConfig::gptq_fused_max_m; the launches Auto gives the wgmma
  // kernel, gptq_wgmma_preferred, on it where it runs) and on one that also forces the fused kernel, so
  // every path sees each m.
  void expect_exact(const WeightCase& c, std::initializer_list<std::size_t> ms, Rng& rng) {
    expect_exact(c, make_checkpoint(c, rng), ms, rng);
  }
  // The same on `ck`, c's checkpoint made by the caller (who uses it again).
  void expect_exact(const WeightCase& c, const Checkpoint& ck, std::initializer_list<std::size_t> ms, Rng& rng) {
    expect_exact_on({&cuda(), &fused_everywhere(), &fused_kernel_everywhere()}, c, ck, ms, rng);
  }
  // The same on `gpu` (a CudaBackend with its own config).
  void expect_exact_on(Backend& gpu, const WeightCase& c, std::initializer_list<std::size_t> ms, Rng& rng) {
    expect_exact_on({&gpu}, c, ms, rng);
  }
  void expect_exact_on(std::initializer_list<Backend*> gpus, const WeightCase& c, std::initializer_list<std::size_t> ms,
                       Rng& rng) {
    expect_exact_on(gpus, c, make_checkpoint(c, rng), ms, rng);
  }
  // The same on `ck`, c's checkpoint made by the caller (who uses it again).
  void expect_exact_on(std::initializer_list<Backend*> gpus, const WeightCase& c, const Checkpoint& ck,
                       std::initializer_list<std::size_t> ms, Rng& rng) {
    SCOPED_TRACE(describe(c));
    std::vector<std::unique_ptr<QuantWeight>> on_gpus;
    for (Backend* gpu : gpus) {
      on_gpus.push_back(gpu->load_gptq(ck.tensors()));
      ASSERT_EQ(on_gpus.back()->k(), c.k);
      ASSERT_EQ(on_gpus.back()->n(), c.n);
    }
    std::unique_ptr<QuantWeight> on_cpu = cpu().load_gptq(ck.tensors());
    for (std::size_t m : ms) {
      const std::vector<float> a = integer_activations(rng, m * c.k);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
        const std::vector<float> want = run_gemm(cpu(), *on_cpu, a, dt, m);
        std::size_t i = 0;
        for (Backend* gpu : gpus) {
          SCOPED_TRACE(cat("backend ", i));
          EXPECT_TRUE(same_floats(run_gemm(*gpu, *on_gpus[i++], a, dt, m), want));
        }
      }
    }
  }
  // A backend on the device whose fused kernels take every m up to 4096.
  CudaBackend& fused_everywhere() {
    CudaBackendConfig config;
    config.gptq_fused_max_m = 4096;
    return made_once(fused_everywhere_, config);
  }
  // The same with GptqKernel::Fused: the fused kernel for every launch.
  CudaBackend& fused_kernel_everywhere() {
    CudaBackendConfig config;
    config.gptq_fused_max_m = 4096;
    config.gptq_kernel = GptqKernel::Fused;
    return made_once(fused_kernel_everywhere_, config);
  }
  // A backend forcing the streaming kernel's bulk source wherever it runs (up
  // to 16 rows; the fused kernel above), the library's defaults otherwise.
  CudaBackend& stream_bulk() {
    CudaBackendConfig config;
    config.gptq_kernel = GptqKernel::StreamBulk;
    return made_once(stream_bulk_, config);
  }

 private:
  // The backend in `slot`, made with `config` on first use and kept for the test.
  static CudaBackend& made_once(std::unique_ptr<CudaBackend>& slot, const CudaBackendConfig& config) {
    if (slot == nullptr) slot = std::make_unique<CudaBackend>(config);
    return *slot;
  }
  std::unique_ptr<CudaBackend> fused_everywhere_;
  std::unique_ptr<CudaBackend> fused_kernel_everywhere_;
  std::unique_ptr<CudaBackend> stream_bulk_;
};

constexpr std::initializer_list<std::size_t> kAllM = {1, 3, 16, 17, 33, 64, 65, 200, 300};

// Every standard layout: group sizes 32 / 64 / 128 / whole k, symmetric or
// not, act-order, V1 / V2 zeros, on a non-square weight whose n = 200 is not
// a multiple of 64 (padded columns) and whose k = 384 is a multiple of 128.
template <class F>
void for_each_standard_layout(F&& check) {
  for (int gs : {32, 64, 128, -1}) {
    for (bool sym : {true, false}) {
      for (bool act : {false, true}) {
        if (gs == -1 && act) continue;
        for (GptqZeroFormat f : {GptqZeroFormat::V1, GptqZeroFormat::V2}) check(WeightCase{384, 200, gs, sym, act, f});
      }
    }
  }
}

TEST_F(CudaGptq, ExactOnEveryStandardLayout) {
  FERRUM_SEEDED_RNG(rng);
  for_each_standard_layout([&](const WeightCase& c) { expect_exact(c, kAllM, rng); });
}

TEST_F(CudaGptq, ExactWithPaddedKAndTinyShapes) {
  FERRUM_SEEDED_RNG(rng);
  expect_exact({96, 136, 32, false, true, GptqZeroFormat::V1}, {1, 17, 64, 300}, rng);  // k padded to 128
  expect_exact({64, 8, 64, false, false, GptqZeroFormat::V2}, {1, 3, 65}, rng);
  expect_exact({16, 8, -1, true, false, GptqZeroFormat::V1}, {2, 300}, rng);  // the op registry's shape
  expect_exact({4224, 72, -1, false, false, GptqZeroFormat::V2}, {1, 16}, rng);
  // k = 264: the last 16-row tile is half past k (dequantized, never stored).
  expect_exact({264, 200, -1, true, false, GptqZeroFormat::V1}, {3, 300}, rng);
}

// Long k with few columns: many splits over k, the last CTA reducing them.
TEST_F(CudaGptq, ExactWithSplitK) {
  FERRUM_SEEDED_RNG(rng);
  expect_exact({4096, 128, 128, false, true, GptqZeroFormat::V1}, {1, 16, 32, 64}, rng);
  expect_exact({2048, 1024, 32, true, false, GptqZeroFormat::V2}, {1, 5, 48}, rng);
}

// Split-K at m on both sides of every configuration boundary (16 / 32 / 64,
// and 48, where the m <= 64 configuration drops its top m16 tile): the
// partial tiles hold only the live rows and the last CTA sums them. n = 264
// pads to 5 column blocks, so the last CTA along n has fewer live blocks than
// its configuration covers; k = 4000 pads to 4096 (zero-filled tail stage).
TEST_F(CudaGptq, ExactWithSplitKAtConfigBoundaries) {
  FERRUM_SEEDED_RNG(rng);
  expect_exact({4000, 264, 32, false, true, GptqZeroFormat::V1},
               {1, 2, 8, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65}, rng);
  expect_exact({4096, 328, 128, true, false, GptqZeroFormat::V2}, {1, 16, 17, 33, 48, 64}, rng);
  expect_exact({4224, 200, -1, false, false, GptqZeroFormat::V2}, {3, 40, 64}, rng);  // one group over all of k
}

// Layouts outside the fused kernel run the dequantize + cuBLAS path at every m.
TEST_F(CudaGptq, ExactOnGeneralLayouts) {
  FERRUM_SEEDED_RNG(rng);
  expect_exact({128, 40, 8, false, false, GptqZeroFormat::V1}, {1, 17, 300}, rng);
  // Symmetric: no zeros array, the dequantization's one zero (8); k = 264
  // ends half way into a 16-row tile.
  expect_exact({264, 40, 8, true, false, GptqZeroFormat::V2}, {1, 17, 300}, rng);
  expect_exact({96, 64, 24, false, true, GptqZeroFormat::V2}, {3, 64}, rng);
  // Act-order with uneven groups.
  WeightCase c{256, 72, 64, false, false, GptqZeroFormat::V1};
  Checkpoint ck = make_checkpoint(c, rng);
  for (auto& g : ck.g_idx) g = static_cast<std::int32_t>(rng.below(4));
  ck.g_idx[0] = 3;
  std::unique_ptr<QuantWeight> on_gpu = cuda().load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> on_cpu = cpu().load_gptq(ck.tensors());
  for (std::size_t m : {1, 20}) {
    const std::vector<float> a = integer_activations(rng, m * c.k);
    for (DType dt : kHalfDTypes) {
      SCOPED_TRACE(cat("uneven act-order m=", m, " ", to_string(dt)));
      EXPECT_TRUE(same_floats(run_gemm(cuda(), *on_gpu, a, dt, m), run_gemm(cpu(), *on_cpu, a, dt, m)));
    }
  }
}

// Groups of 16 rows, the fused layout's smallest (a new scale row at every
// k16 step, eight per fused-kernel stage). The bulk source needs groups of
// 32 or more, so Auto runs the register source up to 8 rows and, on a
// weight of one column group (where the wgmma kernel is not preferred at
// 9..16 rows), the fused kernel at 9..16; above 16 the wgmma kernel where
// it runs (sm_90a; elsewhere the fused kernel up to the crossover, then
// dequantize + cuBLAS). Of expect_exact's other two backends, one takes the
// INT4 kernels Auto picks at every m, the other the fused kernel at every m.
// (Groups of 16 cannot take the bulk source, so a streaming launch here is
// the register source.)
TEST_F(CudaGptq, ExactWithGroupsOfSixteen) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase narrow{2048, 136, 16, false, true, GptqZeroFormat::V1};
  const Checkpoint ck = make_checkpoint(narrow, rng);
  expect_exact(narrow, ck, {1, 8, 9, 16, 17, 33, 64, 65}, rng);
  expect_exact({1024, 200, 16, true, false, GptqZeroFormat::V2}, {1, 9, 16, 48}, rng);
  std::unique_ptr<QuantWeight> w = cuda().load_gptq(ck.tensors());
  for (std::size_t m : {1, 8, 9, 16}) {
    const std::vector<CapturedLaunch> launches = gptq_launches(cuda(), *w, DType::F16, m);
    const char* want = m <= 8 ? "gptq_stream_kernel" : "gptq_fused_kernel";
    EXPECT_TRUE(launched(launches, want)) << "m=" << m << ": " << describe_launches(launches);
  }
}

// Asymmetric checkpoints whose zeros are all one value other than 8: the
// two ends of each format's range (0 in V2, 16 in V1) and 3. The load keeps
// no zeros array (GptqRepacked::uniform_zero), so every kernel subtracts
// that one value: the streaming kernel's two sources (groups of 128 and
// 16), the fused kernel, the wgmma kernel where it runs, and dequantize +
// cuBLAS on a fused and on a general layout.
TEST_F(CudaGptq, ExactWithOneZeroForEveryColumn) {
  FERRUM_SEEDED_RNG(rng);
  const std::pair<int, GptqZeroFormat> zeros[] = {
      {0, GptqZeroFormat::V2}, {16, GptqZeroFormat::V1}, {3, GptqZeroFormat::V1}};
  for (const auto& [zero, format] : zeros) {
    for (int group : {128, 16}) {
      WeightCase c{1024, 200, group, false, group == 16, format};
      c.uniform_zero = zero;
      expect_exact_on({&cuda(), &fused_everywhere(), &fused_kernel_everywhere(), &stream_bulk()}, c,
                      {1, 9, 17, 64, 300}, rng);
    }
    WeightCase general{128, 40, 8, false, false, format};
    general.uniform_zero = zero;
    expect_exact(general, {1, 17}, rng);
  }
}

// Dequantize + cuBLAS (gptq_fused_max_m = 0: at every m) over several
// column chunks: the scratch holds 64 MiB of dequantized weight, 4096
// columns at k = 8192, so n = 4136 is one whole chunk and a last one whose
// 64-column block holds 40 live columns (the dequantization covers the
// chunk's width and skips the blocks past n; cuBLAS multiplies the live
// columns). Act-order, zeros, groups of 128.
TEST_F(CudaGptq, DequantizeAndCublasOverSeveralColumnChunks) {
  FERRUM_SEEDED_RNG(rng);
  CudaBackendConfig config;
  config.gptq_fused_max_m = 0;
  CudaBackend dequantizing(config);
  const WeightCase c{8192, 4136, 128, false, true, GptqZeroFormat::V1};
  const Checkpoint ck = make_checkpoint(c, rng);
  expect_exact_on({&dequantizing}, c, ck, {1, 2, 3}, rng);
  // 64 MiB of scratch holds 4096 columns of k = 8192: two chunks, each a
  // dequantize launch and a cuBLAS GEMM.
  std::unique_ptr<QuantWeight> w = dequantizing.load_gptq(ck.tensors());
  const std::vector<CapturedLaunch> launches = gptq_launches(dequantizing, *w, DType::F16, 1);
  const auto chunks = std::count_if(launches.begin(), launches.end(), [](const CapturedLaunch& l) {
    return l.name.find("gptq_dequant_kernel") != std::string::npos;
  });
  EXPECT_EQ(chunks, 2) << describe_launches(launches);
  EXPECT_EQ(std::count_if(launches.begin(), launches.end(), [](const CapturedLaunch& l) { return l.name == "?"; }), 0)
      << "every node (cuBLAS's too) is named: " << describe_launches(launches);
}

// A GPTQ weight destroyed while the device's graph slot holds a graph that
// ran it: its memory (and its workspace, if no other weight shares it) is
// kept until the graph is dropped, so the replay still gives the eager bits.
TEST_F(CudaGptq, WeightDestroyedUnderAHeldGraphStaysValidForReplay) {
  FERRUM_SEEDED_RNG(rng);
  auto& gpu = dynamic_cast<CudaBackend&>(cuda());
  gpu.reset_graph();
  // Act-order (a gather workspace), k long enough for split-K partials.
  const WeightCase c{4096, 256, 128, false, true, GptqZeroFormat::V1};
  const Checkpoint ck = make_checkpoint(c, rng);
  for (std::size_t m : {1, 16}) {
    SCOPED_TRACE(cat("m=", m));
    std::unique_ptr<QuantWeight> w = cuda().load_gptq(ck.tensors());
    Buffer a = cuda().upload(integer_activations(rng, m * c.k), DType::F16);
    GuardedOutput out(cuda(), DType::F16, m * c.n);
    cuda().gemm_gptq(a, *w, out.view(), m);
    const std::vector<float> eager = out.values();
    EXPECT_TRUE(out.check_guard("gemm_gptq", "out", cat("m=", m, " eager")));
    out.poison();
    cuda().begin_graph_capture();
    cuda().gemm_gptq(a, *w, out.view(), m);
    cuda().end_graph_capture();
    w.reset();
    EXPECT_GT(gpu.graph_retained_allocations(), 0u) << "the weight's memory must outlive the graph";
    ASSERT_TRUE(cuda().replay_last_graph());
    cuda().synchronize();
    EXPECT_TRUE(same_floats(out.values(), eager));
    EXPECT_TRUE(out.check_guard("gemm_gptq", "out", cat("m=", m, " replayed")));
    gpu.reset_graph();
    EXPECT_EQ(gpu.graph_retained_allocations(), 0u);
  }
}

TEST_F(CudaGptq, GemmQuantRoutesToGptq) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{256, 64, 128, false, true, GptqZeroFormat::V2};
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> on_gpu = cuda().load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> on_cpu = cpu().load_gptq(ck.tensors());
  const std::vector<float> a = integer_activations(rng, 5 * c.k);
  EXPECT_TRUE(same_floats(run_gemm(cuda(), *on_gpu, a, DType::BF16, 5, true), run_gemm(cpu(), *on_cpu, a, DType::BF16, 5)));
}

// Random scales and activations: not exact, so check closeness to the CPU
// within the table's k-term GEMM tolerance (the GPU rounds each scale, and
// scaling before the MMA each weight, to the dtype; these errors have random
// signs, so their sum grows like sqrt(k)) and bitwise equality of `runs`
// runs on `gpu` (the split-K reduction has a fixed order).
void expect_deterministic_and_close(Backend& gpu, Backend& cpu, const std::vector<std::size_t>& ms, int runs,
                                    Rng& rng) {
  for (const WeightCase& c : {WeightCase{4096, 512, 128, false, true, GptqZeroFormat::V1, false},
                              WeightCase{2048, 2048, 32, true, false, GptqZeroFormat::V2, false}}) {
    SCOPED_TRACE(describe(c));
    const Checkpoint ck = make_checkpoint(c, rng);
    std::unique_ptr<QuantWeight> on_gpu = gpu.load_gptq(ck.tensors());
    std::unique_ptr<QuantWeight> on_cpu = cpu.load_gptq(ck.tensors());
    for (std::size_t m : ms) {
      const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
        const std::vector<float> first = run_gemm(gpu, *on_gpu, a, dt, m);
        for (int run = 2; run <= runs; ++run) {
          EXPECT_TRUE(same_floats(run_gemm(gpu, *on_gpu, a, dt, m), first)) << "run " << run << " differs";
        }
        EXPECT_TRUE(all_close(first, run_gemm(cpu, *on_cpu, a, dt, m), dt, op_scale::gemm(c.k)));
      }
    }
  }
}

TEST_F(CudaGptq, DeterministicRunToRunAndClose) {
  FERRUM_SEEDED_RNG(rng);
  expect_deterministic_and_close(cuda(), cpu(), {1, 16, 40, 64, 300}, 2, rng);
  // The INT4 kernels at m > 32 (where the wgmma kernel does not run, the
  // rule sends these small weights' m = 40 and 64 to dequantize + cuBLAS on
  // the default backend): wgmma where it runs, and the fused kernel's
  // configurations.
  expect_deterministic_and_close(fused_everywhere(), cpu(), {40, 48, 64}, 2, rng);
  expect_deterministic_and_close(fused_kernel_everywhere(), cpu(), {40, 48, 64}, 2, rng);
}

// The default backend follows kernels::gptq_fused_max_m: on random data the
// two paths differ in their last bits, so at the rule's m the default gives
// the INT4 kernels' bytes and one row past it dequantize + cuBLAS's.
TEST_F(CudaGptq, DefaultFollowsTheMeasuredCrossover) {
  FERRUM_SEEDED_RNG(rng);
  CudaBackendConfig dequant_config;
  dequant_config.gptq_fused_max_m = 0;
  CudaBackend dequant(dequant_config);
  const WeightCase c{4096, 512, 128, false, true, GptqZeroFormat::V1, false};
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> on_default = cuda().load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> on_fused = fused_everywhere().load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> on_dequant = dequant.load_gptq(ck.tensors());
  // The default runs the wgmma kernel above 16 rows where it applies (groups of 128 rows here).
  const std::size_t rule = kernels::gptq_fused_max_m(c.k, c.n, c.act_order, kernels::gptq_wgmma_applies(128));
  bool differs = false;
  for (std::size_t m : {rule, rule + 1}) {
    SCOPED_TRACE(cat("m=", m));
    const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
    const std::vector<float> got = run_gemm(cuda(), *on_default, a, DType::F16, m);
    const std::vector<float> fused = run_gemm(fused_everywhere(), *on_fused, a, DType::F16, m);
    const std::vector<float> deq = run_gemm(dequant, *on_dequant, a, DType::F16, m);
    EXPECT_TRUE(same_floats(got, m <= rule ? fused : deq));
    differs = differs || !same_floats(fused, deq);
  }
  EXPECT_TRUE(differs) << "the two paths gave the same bits: this test cannot tell them apart";
}

// One gemm_gptq (f16) captured in a graph and replayed twice into a
// NaN-poisoned, guarded output: each replay gives `want`.
void expect_graph_replays(Backend& be, const QuantWeight& w, const std::vector<float>& a, std::size_t m,
                          const std::vector<float>& want) {
  Buffer a_buf = be.upload(a, DType::F16);
  GuardedOutput out(be, DType::F16, want.size());
  be.begin_graph_capture();
  be.gemm_gptq(a_buf, w, out.view(), m);
  be.end_graph_capture();
  for (int replay = 0; replay < 2; ++replay) {
    if (replay > 0) out.poison();
    ASSERT_TRUE(be.replay_last_graph());
    EXPECT_TRUE(same_floats(out.values(), want)) << "replay " << replay;
    EXPECT_TRUE(out.check_guard("gemm_gptq", "out", cat("m=", m, " k=", w.k(), " n=", w.n(), " replay ", replay)));
  }
  be.reset_graph();
}

// The same for weight case `c` on `be`, with m = 12 integer activations,
// against the CPU reference `cpu`.
void expect_graph_replays_like_cpu(Backend& be, Backend& cpu, const WeightCase& c, Rng& rng) {
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> w = be.load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> on_cpu = cpu.load_gptq(ck.tensors());
  const std::size_t m = 12;
  const std::vector<float> a = integer_activations(rng, m * c.k);
  expect_graph_replays(be, *w, a, m, run_gemm(cpu, *on_cpu, a, DType::F16, m));
}

// gemm_gptq is capture-safe: recorded in a graph (fused path with act-order
// gather and split-K, and the cuBLAS path), replay gives the eager result.
// The fused kernel's 64-row configuration needs 180 / 190 KiB of shared
// memory: where a block may have that (sm_90: 227 KiB) launches take
// kGptqMaxM rows; below it (an A100's 163 KiB) 32, and gemm_gptq
// dequantizes + cuBLAS above them instead of failing at load.
TEST_F(CudaGptq, FusedRowsPerLaunchFollowTheDevicesSharedMemory) {
  (void)cuda();  // its device current
  int device = -1, optin = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), cudaSuccess);
  constexpr int kConfig2ZerosBytes = 194560;  // FusedShape<4, 4, true, 5>::kSmemBytes
  EXPECT_EQ(kernels::gptq_fused_max_rows(), optin >= kConfig2ZerosBytes ? kernels::kGptqMaxM : 32) << optin;
}

TEST_F(CudaGptq, GraphCaptureAndReplay) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{2048, 256, 128, false, true, GptqZeroFormat::V1};
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> w = cuda().load_gptq(ck.tensors());
  for (std::size_t m : {4, 300}) {
    SCOPED_TRACE(cat("m=", m));
    const std::vector<float> a = integer_activations(rng, m * c.k);
    expect_graph_replays(cuda(), *w, a, m, run_gemm(cuda(), *w, a, DType::F16, m));
  }
}

// A larger weight loaded later gets larger workspaces; the earlier one keeps working.
TEST_F(CudaGptq, WeightsOfDifferentSizesCoexist) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase small{256, 64, 64, false, true, GptqZeroFormat::V2};
  const WeightCase large{4096, 1024, 128, false, true, GptqZeroFormat::V1};
  const Checkpoint cs = make_checkpoint(small, rng), cl = make_checkpoint(large, rng);
  std::unique_ptr<QuantWeight> gs = cuda().load_gptq(cs.tensors());
  std::unique_ptr<QuantWeight> gl = cuda().load_gptq(cl.tensors());
  std::unique_ptr<QuantWeight> ps = cpu().load_gptq(cs.tensors());
  std::unique_ptr<QuantWeight> pl = cpu().load_gptq(cl.tensors());
  // 32 and 64: the wgmma kernel (sm_90a; else the fused kernel at 32 and
  // dequantize + cuBLAS at 64) with the act-order gather; 100: dequantize +
  // cuBLAS with act-order on either (the wgmma rule's 96 at these sizes).
  for (std::size_t m : {1, 32, 64, 100}) {
    const std::vector<float> as = integer_activations(rng, m * small.k), al = integer_activations(rng, m * large.k);
    EXPECT_TRUE(same_floats(run_gemm(cuda(), *gs, as, DType::F16, m), run_gemm(cpu(), *ps, as, DType::F16, m)));
    EXPECT_TRUE(same_floats(run_gemm(cuda(), *gl, al, DType::F16, m), run_gemm(cpu(), *pl, al, DType::F16, m)));
  }
  gl.reset();  // the small weight still holds its workspaces
  const std::vector<float> a = integer_activations(rng, 3 * small.k);
  EXPECT_TRUE(same_floats(run_gemm(cuda(), *gs, a, DType::BF16, 3), run_gemm(cpu(), *ps, a, DType::BF16, 3)));
}

// The kernels' shared-memory opt-in is per device (the fused and wgmma
// kernels made it on the first device only before 31253b3, so their
// launches on a second device failed). Each kernel runs on device 0 first,
// then must be exact on device 1 too: the fused kernel in its three
// configurations (m = 1, 17, 64), the bulk streaming kernel at its two
// tiles (m = 1, 16), the wgmma kernel at N = 16, 32, 64. Needs two GPUs
// (the NCCL machine).
TEST_F(CudaGptq, EveryKernelRunsOnASecondDevice) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{1024, 512, 128, false, true, GptqZeroFormat::V1};
  auto on_both_devices = [&](GptqKernel kernel, std::initializer_list<std::size_t> ms) {
    SCOPED_TRACE(cat("gptq_kernel ", static_cast<int>(kernel)));
    CudaBackendConfig config;
    config.gptq_kernel = kernel;
    config.gptq_fused_max_m = 4096;
    CudaBackend first(config);
    config.device = 1;
    CudaBackend second(config);
    expect_exact_on({&first, &second}, c, ms, rng);
  };
  on_both_devices(GptqKernel::Fused, {1, 17, 64});
  on_both_devices(GptqKernel::StreamBulk, {1, 16});
  if (kernels::gptq_wgmma_supported()) on_both_devices(GptqKernel::Wgmma, {1, 17, 64});
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // the next test starts where the others do
}

// What the launchers remember per device (kernels/common/per_device.hpp)
// is keyed by the device current at the call. Two identical GPUs give the
// same occupancy and placement answers, so the kernels' exactness above
// cannot show a table read for the wrong device; this shows that the key
// follows cudaSetDevice (the CPU test PerDevice.* covers the rest). Needs
// two GPUs.
TEST_F(CudaGptq, PerDeviceTablesFollowTheCurrentDevice) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  kernels::PerDevice<int> table;
  int makes = 0;
  auto make = [&](int device) {
    ++makes;
    return 1000 + device;
  };
  for (int round = 0; round < 2; ++round) {
    for (int d : {1, 0}) {
      ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
      EXPECT_EQ(table.current("test", make), 1000 + d);
    }
  }
  EXPECT_EQ(makes, 2);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(CudaGptq, BadInput) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{128, 64, 32, false, false, GptqZeroFormat::V1};
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> w = cuda().load_gptq(ck.tensors());
  Buffer a = cuda().upload(std::vector<float>(2 * c.k + 8, 0.0f), DType::F16);
  Buffer out = cuda().upload(std::vector<float>(2 * c.n + 8, 0.0f), DType::F16);
  // Not 16-byte aligned (element-aligned, so Buffer::wrap accepts it).
  Buffer a_off = Buffer::wrap(cuda(), static_cast<std::uint8_t*>(a.data()) + 2, DType::F16, 2 * c.k);
  expect_error(ErrorCode::Misaligned, "gemm_gptq", [&] { cuda().gemm_gptq(a_off, *w, out, 2); }, "'a'");
  Buffer out_off = Buffer::wrap(cuda(), static_cast<std::uint8_t*>(out.data()) + 8, DType::F16, 2 * c.n);
  expect_error(ErrorCode::Misaligned, "gemm_gptq", [&] { cuda().gemm_gptq(a, *w, out_off, 2); }, "'out'");
  // The residual and norm forms' row operands likewise (the kernels move
  // rows as 16-byte vectors).
  Buffer residual = cuda().upload(std::vector<float>(2 * c.n + 8, 0.0f), DType::F16);
  Buffer residual_off = Buffer::wrap(cuda(), static_cast<std::uint8_t*>(residual.data()) + 4, DType::F16, 2 * c.n);
  Buffer row_sq_n = cuda().alloc(DType::F32, 2 * ((c.n + 15) / 16));
  expect_error(ErrorCode::Misaligned, "gemm_gptq_add_residual",
               [&] { cuda().gemm_gptq_add_residual(a, *w, out, residual_off, row_sq_n, 2); }, "'residual'");
  Buffer row_sq_k = cuda().upload(std::vector<float>(2 * ((c.k + 15) / 16), 1.0f), DType::F32);
  Buffer norm_w = cuda().upload(std::vector<float>(c.k, 1.0f), DType::F16);
  Buffer normed = cuda().upload(std::vector<float>(2 * c.k + 8, 0.0f), DType::F16);
  Buffer normed_off = Buffer::wrap(cuda(), static_cast<std::uint8_t*>(normed.data()) + 2, DType::F16, 2 * c.k);
  expect_error(ErrorCode::Misaligned, "rms_norm_gemm_gptq",
               [&] { cuda().rms_norm_gemm_gptq(a, row_sq_k, norm_w, 1e-6f, *w, normed_off, out, 2); }, "'normed'");
  expect_error(ErrorCode::Misaligned, "rms_norm_gemm_gptq",
               [&] { cuda().rms_norm_gemm_gptq(a, row_sq_k, norm_w, 1e-6f, *w, normed, out_off, 2); }, "'out'");
  // Host memory (alloc_host): the streaming kernel bulk-copies its
  // activation rows, and one rule holds for every operand of every form:
  // device memory, named, also inside a capture (which the refusal ends).
  Buffer host_a = cuda().alloc_host(DType::F16, 2 * c.k + 8), host_out = cuda().alloc_host(DType::F16, 2 * c.n + 8);
  Buffer host_residual = cuda().alloc_host(DType::F16, 2 * c.n + 8);
  Buffer gate_up = cuda().alloc(DType::F16, 2 * c.n), host_act = cuda().alloc_host(DType::F16, c.n);
  Buffer host_row_sq_k = cuda().alloc_host(DType::F32, 2 * ((c.k + 15) / 16));
  for (const bool capture : {false, true}) {
    SCOPED_TRACE(capture ? "during a capture" : "eager");
    auto refused = [&](const char* op, const char* arg, const std::function<void()>& call) {
      SCOPED_TRACE(arg);
      if (capture) cuda().begin_graph_capture();
      expect_error(ErrorCode::InvalidArgument, op, call, cat("argument '", arg, "'"));
      EXPECT_FALSE(cuda().is_capturing()) << op << ": the refusal must end the capture";
    };
    refused("gemm_gptq", "a", [&] { cuda().gemm_gptq(host_a, *w, out, 2); });
    refused("gemm_gptq", "out", [&] { cuda().gemm_gptq(a, *w, host_out, 2); });
    refused("gemm_gptq_add_residual", "residual",
            [&] { cuda().gemm_gptq_add_residual(a, *w, out, host_residual, row_sq_n, 2); });
    refused("gemm_silu_mul_gptq", "act", [&] { cuda().gemm_silu_mul_gptq(a, *w, gate_up, host_act, 2); });
    refused("rms_norm_gemm_gptq", "x",
            [&] { cuda().rms_norm_gemm_gptq(host_a, row_sq_k, norm_w, 1e-6f, *w, normed, out, 2); });
    refused("rms_norm_gemm_gptq", "row_sq",
            [&] { cuda().rms_norm_gemm_gptq(a, host_row_sq_k, norm_w, 1e-6f, *w, normed, out, 2); });
  }
  // f32 activations; mixed dtypes; too few elements; m = 0.
  Buffer a32 = cuda().upload(std::vector<float>(2 * c.k, 0.0f), DType::F32);
  expect_error(ErrorCode::DTypeMismatch, "gemm_gptq", [&] { cuda().gemm_gptq(a32, *w, out, 2); }, "'a'");
  Buffer out_bf = cuda().upload(std::vector<float>(2 * c.n, 0.0f), DType::BF16);
  expect_error(ErrorCode::DTypeMismatch, "gemm_gptq", [&] { cuda().gemm_gptq(a, *w, out_bf, 2); }, "'out'");
  expect_error(ErrorCode::ShapeMismatch, "gemm_gptq", [&] { cuda().gemm_gptq(a, *w, out, 3); }, "'a'");
  expect_error(ErrorCode::InvalidArgument, "gemm_gptq", [&] { cuda().gemm_gptq(a, *w, out, 0); }, "'m'");
  // A weight of another backend instance, or of the CPU backend.
  auto other = make_backend(BackendKind::Cuda);
  std::unique_ptr<QuantWeight> foreign = other->load_gptq(ck.tensors());
  expect_error(ErrorCode::WrongBackend, "gemm_gptq", [&] { cuda().gemm_gptq(a, *foreign, out, 2); }, "'w'");
  std::unique_ptr<QuantWeight> cpu_weight = cpu().load_gptq(ck.tensors());
  expect_error(ErrorCode::WrongBackend, "gemm_gptq", [&] { cuda().gemm_gptq(a, *cpu_weight, out, 2); }, "'w'");
  // A bad checkpoint: validated before anything is uploaded.
  Checkpoint bad = ck;
  bad.scale[3] = NAN;
  expect_error(ErrorCode::InvalidArgument, "load_gptq", [&] { (void)cuda().load_gptq(bad.tensors()); }, "'scales'");
  GptqHostTensors t = ck.tensors();
  t.bits = 3;
  expect_error(ErrorCode::Unsupported, "load_gptq", [&] { (void)cuda().load_gptq(t); }, "'bits'");
  // The backend still works afterwards.
  EXPECT_NO_THROW({
    cuda().gemm_gptq(a, *w, out, 2);
    cuda().synchronize();
  });
}

// gemm_silu_mul_gptq: CudaBackend (gptq_fuse_silu_mul, on by default) runs
// silu·mul in the streaming kernel's epilogue where that kernel takes the
// launch with its bulk source, m <= 8 and one split, and gemm_gptq + the
// pairs kernel elsewhere; a backend with the switch off always runs the
// latter. act must be the same bits either way (gate_up within the GEMM
// tolerance of CpuBackend's, act within the dtype's of the fp64 SiLU·mul of
// that gate_up), and the fusing backend's
// gate_up keeps its poison exactly where the plan says the epilogue ran (the
// proof that it ran). Weights with and without zeros, groups of 128 / 32 /
// 64, k with a short last chunk (416), n not a multiple of 64 (400: the
// pairs past n), a 28672-column weight (llama3-8b's gate|up width, one split
// at k = 2048), an act-order weight and a k = 8192 weight of several splits
// (both never fused); m = 1 .. 16 (9 and 16: two row tiles, never fused).
// The backends here do not make gemm_weights_before_wait's promise, so the
// fused launch's early trigger runs in the engine's launch-switch test only.
class CudaGptqSiluMul : public CudaGptq {
 protected:
  void SetUp() override {
    CudaGptq::SetUp();
    if (IsSkipped()) return;
    CudaBackendConfig config;
    config.gptq_fuse_silu_mul = false;
    unfused_ = std::make_unique<CudaBackend>(config);
  }
  // Whether the fusing backend's launch takes the epilogue (the rule
  // kernels::launch_gptq_gemm_silu_mul applies to Auto's streaming launch).
  static bool epilogue_runs(const WeightCase& c, std::size_t m, DType dt) {
    if (m > static_cast<std::size_t>(kernels::kGptqSiluMulMaxM) || c.act_order) return false;
    const BulkPlan plan = bulk_stream_plan(c, m, dt);
    return plan.applies && plan.splits == 1;
  }
  std::unique_ptr<CudaBackend> unfused_;
};

TEST_F(CudaGptqSiluMul, EpilogueEqualsGemmThenPairs) {
  FERRUM_SEEDED_RNG(rng);
  EXPECT_TRUE(CudaBackendConfig{}.gptq_fuse_silu_mul) << "on by default";
  EXPECT_TRUE(static_cast<CudaBackend&>(cuda()).gptq_fuse_silu_mul());
  EXPECT_FALSE(unfused_->gptq_fuse_silu_mul());
  const WeightCase cases[] = {{1024, 400, 128, false, false, GptqZeroFormat::V1, false},
                              {416, 256, 32, true, false, GptqZeroFormat::V2, false},
                              {2048, 28672, 128, false, false, GptqZeroFormat::V1, false},
                              {1024, 192, 64, false, true, GptqZeroFormat::V1, false},
                              {8192, 512, 128, true, false, GptqZeroFormat::V1, false}};
  constexpr float kPoison = 1232.0f;  // 77 x 16: exact in f16 and bf16
  int fused_runs = 0;
  for (const WeightCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Checkpoint ck = make_checkpoint(c, rng);
    const std::unique_ptr<QuantWeight> w_fusing = cuda().load_gptq(ck.tensors());
    const std::unique_ptr<QuantWeight> w_unfused = unfused_->load_gptq(ck.tensors());
    const std::unique_ptr<QuantWeight> w_cpu = cpu().load_gptq(ck.tensors());
    const std::size_t im = c.n / 2;
    for (std::size_t m : {1, 2, 5, 8, 9, 16}) {
      const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
        // Every output poisoned and guarded (n = 400 pads to 448: a pair
        // store bounded by the padded width would land past act's end).
        const std::string where = cat("m=", m, " k=", c.k, " n=", c.n, " ", to_string(dt));
        const HostTensor gate_up_poison = make_tensor(dt, std::vector<float>(m * c.n, kPoison));
        Buffer a_ref = unfused_->upload(a, dt);
        GuardedOutput gate_up_ref(*unfused_, gate_up_poison), act_ref(*unfused_, dt, m * im);
        unfused_->gemm_silu_mul_gptq(a_ref, *w_unfused, gate_up_ref.view(), act_ref.view(), m);
        EXPECT_TRUE(gate_up_ref.check_guard("gemm_silu_mul_gptq (switch off)", "gate_up", where));
        EXPECT_TRUE(act_ref.check_guard("gemm_silu_mul_gptq (switch off)", "act", where));
        const std::vector<float> want_act = act_ref.values();
        const std::vector<float> want_gate_up = gate_up_ref.values();
        // The unfused path is gemm_gptq into gate_up: the same bits.
        EXPECT_TRUE(same_floats(want_gate_up, run_gemm(*unfused_, *w_unfused, a, dt, m)))
            << "switch off: gate_up is gemm_gptq's";

        Buffer a_dev = cuda().upload(a, dt);
        GuardedOutput gate_up(cuda(), gate_up_poison), act(cuda(), dt, m * im);
        cuda().gemm_silu_mul_gptq(a_dev, *w_fusing, gate_up.view(), act.view(), m);
        EXPECT_TRUE(gate_up.check_guard("gemm_silu_mul_gptq", "gate_up", where));
        EXPECT_TRUE(act.check_guard("gemm_silu_mul_gptq", "act", where));
        EXPECT_TRUE(same_floats(act.values(), want_act)) << "act";
        const bool fused = epilogue_runs(c, m, dt);
        fused_runs += fused ? 1 : 0;
        EXPECT_TRUE(same_floats(gate_up.values(), fused ? gate_up_poison.values : want_gate_up))
            << (fused ? "the epilogue must not write gate_up" : "the unfused path writes gate_up");

        // Against the references a stage at a time: the GEMM against
        // CpuBackend's (dequantize, then matmul; act-order rows permuted at
        // load) within its k-term tolerance, and act against the fp64 SiLU·mul
        // (ref::silu_mul, the reference of fused_silu_mul_split) of the GPU's
        // own (gate, up) pairs. (Two independently rounded pairs would differ
        // in act by up to their ulps times the other value, which no act
        // tolerance should absorb.)
        EXPECT_TRUE(all_close(want_gate_up, run_gemm(cpu(), *w_cpu, a, dt, m), dt, op_scale::gemm(c.k)))
            << "gate_up against the CPU's gemm_gptq";
        std::vector<double> act_fp64(m * im);
        for (std::size_t t = 0; t < m; ++t) {
          for (std::size_t j = 0; j < im; ++j) {
            act_fp64[t * im + j] = ref::silu_mul(want_gate_up[t * c.n + 2 * j], want_gate_up[t * c.n + 2 * j + 1]);
          }
        }
        EXPECT_TRUE(all_close(want_act, act_fp64, dt)) << "act against the fp64 SiLU·mul of gate_up";
      }
    }
  }
  // The premise: the epilogue ran. Without bulk copies (before sm_90) it
  // never does; on the H200 in 24 runs (3 weights x m = 1, 2, 5, 8 x 2
  // dtypes), and on any GPU with bulk copies in at least the 16 of the two
  // weights whose k allows one split only (k <= 1024: at most 8 chunks).
  if (kernels::gptq_bulk_copy_supported()) {
    EXPECT_GE(fused_runs, 16);
  } else {
    EXPECT_EQ(fused_runs, 0);
  }
  // Misaligned a / gate_up are refused under the op's name on both backends
  // (act needs no alignment).
  const Checkpoint ck = make_checkpoint(cases[0], rng);
  const std::size_t k = cases[0].k, n = cases[0].n;
  for (Backend* be : {&cuda(), static_cast<Backend*>(unfused_.get())}) {
    const std::unique_ptr<QuantWeight> w = be->load_gptq(ck.tensors());
    Buffer a = be->alloc(DType::F16, k + 8), gate_up = be->alloc(DType::F16, n + 8), act = be->alloc(DType::F16, n / 2 + 8);
    Buffer a_off = a.view(1, k), gate_up_off = gate_up.view(1, n), act_off = act.view(1, n / 2);
    expect_error(ErrorCode::Misaligned, "gemm_silu_mul_gptq", [&] { be->gemm_silu_mul_gptq(a_off, *w, gate_up, act, 1); },
                 "'a'");
    expect_error(ErrorCode::Misaligned, "gemm_silu_mul_gptq",
                 [&] { be->gemm_silu_mul_gptq(a, *w, gate_up_off, act, 1); }, "'gate_up'");
    EXPECT_NO_THROW({
      be->gemm_silu_mul_gptq(a, *w, gate_up, act_off, 1);
      be->synchronize();
    });
  }
}

// ── The streaming kernel (opt-in) ────────────────────────────────────────────

class CudaGptqStream : public CudaGptq {
 protected:
  // A second backend on the device with the streaming kernel forced (the
  // split-K workspace is the device's, sized at load for both kernels).
  void SetUp() override {
    CudaGptq::SetUp();
    if (IsSkipped()) return;
    CudaBackendConfig config;
    config.gptq_kernel = GptqKernel::Stream;
    stream_ = std::make_unique<CudaBackend>(config);
  }
  CudaBackend& stream() { return *stream_; }
  std::unique_ptr<CudaBackend> stream_;
};

constexpr std::initializer_list<std::size_t> kStreamM = {1, 2, 7, 8, 9, 15, 16, 17, 64};

// The config reaches the backend (else every other Stream test would silently
// run the fused kernel), and Auto is the default.
TEST_F(CudaGptqStream, ConfigSelectsTheKernel) {
  EXPECT_EQ(stream().gptq_kernel(), GptqKernel::Stream);
  EXPECT_EQ(CudaBackend().gptq_kernel(), GptqKernel::Auto);
  CudaBackendConfig fused;
  fused.gptq_kernel = GptqKernel::Fused;
  EXPECT_EQ(CudaBackend(fused).gptq_kernel(), GptqKernel::Fused);
}

TEST_F(CudaGptqStream, ConfigOutsideTheEnumIsRefused) {
  for (int bad : {-1, 5, 7}) {
    CudaBackendConfig config;
    config.gptq_kernel = static_cast<GptqKernel>(bad);
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(config); }, "gptq_kernel");
  }
  for (int bad : {-1, 7, 64}) {
    CudaBackendConfig config;
    config.gptq_kernel = GptqKernel::StreamBulk;
    config.gptq_stream_ring = bad;
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(config); }, "gptq_stream_ring");
  }
  for (int bad : {-1, 17, 1000}) {
    CudaBackendConfig config;
    config.gptq_stream_ctas_per_sm = bad;
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(config); },
                 "gptq_stream_ctas_per_sm");
  }
  for (int bad : {-2, -100}) {
    CudaBackendConfig config;
    config.gptq_fused_max_m = bad;
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(config); }, "gptq_fused_max_m");
  }
  EXPECT_EQ(CudaBackend().gptq_fused_max_m(), -1);  // the library's rule
  CudaBackendConfig zero;
  zero.gptq_fused_max_m = 0;
  EXPECT_EQ(CudaBackend(zero).gptq_fused_max_m(), 0);
}

// Every standard layout: group sizes (scale rows changing inside a 128-row
// chunk at 32 / 64), zeros, act-order, V1 / V2; n = 200 pads to 256 (a
// partly live column block). m = 17 checks the fallback to the fused kernel
// (m = 64 on this small weight: to dequantize + cuBLAS, by the crossover rule).
TEST_F(CudaGptqStream, ExactOnEveryStandardLayout) {
  FERRUM_SEEDED_RNG(rng);
  for_each_standard_layout([&](const WeightCase& c) { expect_exact_on(stream(), c, kStreamM, rng); });
}

// k not a multiple of 128 (zero activations over the padded rows, whose
// q = 0 dequantizes to -z s), n not a multiple of 64, a single chunk, one
// group over all of k, k longer than the CTA's 4 warps x 128 rows.
TEST_F(CudaGptqStream, ExactWithPaddedAndOddShapes) {
  FERRUM_SEEDED_RNG(rng);
  const std::initializer_list<std::size_t> ms = {1, 2, 7, 8, 9, 15, 16};
  expect_exact_on(stream(), {96, 136, 32, false, true, GptqZeroFormat::V1}, ms, rng);
  expect_exact_on(stream(), {64, 8, 64, false, false, GptqZeroFormat::V2}, ms, rng);
  expect_exact_on(stream(), {16, 8, -1, true, false, GptqZeroFormat::V1}, ms, rng);
  expect_exact_on(stream(), {4224, 72, -1, false, false, GptqZeroFormat::V2}, ms, rng);
  expect_exact_on(stream(), {4000, 264, 32, false, true, GptqZeroFormat::V1}, ms, rng);
  expect_exact_on(stream(), {2176, 328, 128, true, false, GptqZeroFormat::V2}, ms, rng);
}

// The two ends of the split plan (kernels/gptq_gemm.cu, stream_plan_for):
// one narrow column block over k = 8192 takes the most splits (16, four
// chunks each, partials summed by the last CTA to arrive), and 600 column
// blocks over k = 1024 fill the GPU alone (one split: every warp loops over
// two chunks, with the next chunk's scale row and the L2 prefetch ahead).
TEST_F(CudaGptqStream, ExactAtTheEndsOfTheSplitPlan) {
  FERRUM_SEEDED_RNG(rng);
  expect_exact_on(stream(), {8192, 64, 128, true, false, GptqZeroFormat::V1}, {1, 8, 9, 16}, rng);
  expect_exact_on(stream(), {8192, 136, 64, false, true, GptqZeroFormat::V2}, {1, 16}, rng);
  expect_exact_on(stream(), {1024, 38400, 128, true, false, GptqZeroFormat::V1}, {1, 9}, rng);
}

// GptqKernel::Auto takes the streaming kernel for m <= 8, so the fused
// kernel's small-m launches are checked here through an explicit config.
TEST_F(CudaGptqStream, FusedConfigStaysExactAtSmallM) {
  FERRUM_SEEDED_RNG(rng);
  CudaBackendConfig config;
  config.gptq_kernel = GptqKernel::Fused;
  CudaBackend fused(config);
  for_each_standard_layout([&](const WeightCase& c) { expect_exact_on(fused, c, {1, 3, 8}, rng); });
  // The split-K cases of ExactWithSplitK / ExactWithSplitKAtConfigBoundaries at m <= 8.
  expect_exact_on(fused, {4000, 264, 32, false, true, GptqZeroFormat::V1}, {1, 2, 5, 8}, rng);
  expect_exact_on(fused, {2048, 1024, 32, true, false, GptqZeroFormat::V2}, {1, 5}, rng);
  expect_exact_on(fused, {4224, 200, -1, false, false, GptqZeroFormat::V2}, {3}, rng);  // one group over all of k
  expect_deterministic_and_close(fused, cpu(), {1, 8}, 2, rng);
}

// Which kernel GptqKernel::Auto ran, seen through the bits: on random data
// the streaming kernel (scale-after) and the fused kernel (scale-before)
// round differently, so Auto must equal StreamBulk bitwise for m <= 16 on
// this narrow weight (4096 x 512: 2 column groups, which keep the streaming
// kernel to 16 rows, gptq_wgmma_preferred) and
// Wgmma (where it runs, else Fused) for m = 17, and the two streaming-range
// kernels must differ somewhere (else this test could not tell them apart).
TEST_F(CudaGptqStream, AutoTakesTheBulkStreamingKernelUpToSixteenRows) {
  FERRUM_SEEDED_RNG(rng);
  CudaBackendConfig fused_config;
  fused_config.gptq_kernel = GptqKernel::Fused;
  CudaBackend fused(fused_config);
  Backend& bulk = stream_bulk();
  CudaBackendConfig large_config;
  large_config.gptq_kernel = kernels::gptq_wgmma_supported() ? GptqKernel::Wgmma : GptqKernel::Fused;
  CudaBackend large(large_config);
  Backend& automatic = cuda();
  const WeightCase c{4096, 512, 128, false, true, GptqZeroFormat::V1, false};
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> w_auto = automatic.load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> w_bulk = bulk.load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> w_fused = fused.load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> w_large = large.load_gptq(ck.tensors());
  bool kernels_differ = false;
  for (std::size_t m : {1, 8, 9, 16, 17}) {
    const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
    for (DType dt : kHalfDTypes) {
      SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
      const std::vector<float> got = run_gemm(automatic, *w_auto, a, dt, m);
      const std::vector<float> by_bulk = run_gemm(bulk, *w_bulk, a, dt, m);
      const std::vector<float> by_fused = run_gemm(fused, *w_fused, a, dt, m);
      EXPECT_TRUE(same_floats(got, m <= 16 ? by_bulk : run_gemm(large, *w_large, a, dt, m)));
      if (m <= 16 && !same_floats(by_bulk, by_fused)) kernels_differ = true;
    }
  }
  EXPECT_TRUE(kernels_differ) << "the two kernels gave the same bits everywhere: the test cannot see the dispatch";
}

// Random data: close to the CPU (the same bound as the fused kernel) and
// bitwise equal over four runs.
TEST_F(CudaGptqStream, DeterministicRunToRunAndClose) {
  FERRUM_SEEDED_RNG(rng);
  expect_deterministic_and_close(stream(), cpu(), {1, 8, 9, 16}, 4, rng);
}

// Capture-safe (act-order gather + streaming kernel in one graph).
TEST_F(CudaGptqStream, GraphCaptureAndReplay) {
  FERRUM_SEEDED_RNG(rng);
  expect_graph_replays_like_cpu(stream(), cpu(), {2048, 256, 128, false, true, GptqZeroFormat::V1}, rng);
}

// ── The streaming kernel's bulk source (GptqKernel::StreamBulk) ──────────────

class CudaGptqStreamBulk : public CudaGptqStream {
 protected:
  // A backend with the bulk source and `ring` chunk slots per warp (0: the
  // default), its splits summed in a cluster when `cluster_reduce` (by
  // default as CudaBackendConfig's default: what an engine runs).
  static std::unique_ptr<CudaBackend> bulk_backend(int ring = 0,
                                                   bool cluster_reduce = CudaBackendConfig{}.gptq_cluster_reduce) {
    CudaBackendConfig config;
    config.gptq_kernel = GptqKernel::StreamBulk;
    config.gptq_stream_ring = ring;
    config.gptq_cluster_reduce = cluster_reduce;
    return std::make_unique<CudaBackend>(config);
  }
};

TEST_F(CudaGptqStreamBulk, ConfigReachesTheBackend) {
  EXPECT_EQ(bulk_backend(3)->gptq_kernel(), GptqKernel::StreamBulk);
  EXPECT_EQ(bulk_backend(3)->gptq_stream_ring(), 3);
  EXPECT_EQ(CudaBackend().gptq_stream_ring(), 0);
  EXPECT_TRUE(bulk_backend(0, true)->gptq_cluster_reduce());
  EXPECT_TRUE(CudaBackend().gptq_cluster_reduce());  // the default
  EXPECT_EQ(CudaBackend().gptq_stream_ctas_per_sm(), 0);  // every resident slot
}

// CudaBackendConfig::gptq_stream_ctas_per_sm: the plan fills at most that
// many CTAs per SM (fewer splits where the default fills more), and the
// results stay exact against the CPU (power-of-two scales and integer
// activations: every order of the sums gives the same bits). The llama3-8b
// down (14336 x 4096: 64 column blocks) and q|k|v (4096 x 6144: 96) shapes,
// whose default plans fill about 4 CTAs per SM on the H200, capped at 1 and
// 2; a cap above the resident slots changes nothing.
TEST_F(CudaGptqStreamBulk, CtasPerSmCapsThePlan) {
  if (!kernels::gptq_bulk_copy_supported()) GTEST_SKIP() << "no bulk copies (sm_90+) on this device";
  FERRUM_SEEDED_RNG(rng);
  const int sms = device0_sms();
  for (const WeightCase& c : {WeightCase{14336, 4096, 128, true, false, GptqZeroFormat::V1},
                              WeightCase{4096, 6144, 128, false, false, GptqZeroFormat::V2}}) {
    SCOPED_TRACE(describe(c));
    const int k_pad = static_cast<int>((c.k + 127) / 128 * 128), n_pad = static_cast<int>((c.n + 63) / 64 * 64);
    const auto plan = [&](int cap) {
      return kernels::gptq_stream_plan(DType::F16, !c.symmetric, 1, static_cast<int>(c.k), k_pad, n_pad, 128, sms,
                                       kernels::GptqKernelKind::StreamBulk, 0, cap);
    };
    const kernels::GptqPlan full = plan(0);
    EXPECT_EQ(plan(kGptqStreamMaxCtasPerSm).splits, full.splits) << "a cap above the resident slots";
    for (int cap : {1, 2}) {
      SCOPED_TRACE(cat("cap ", cap));
      const kernels::GptqPlan capped = plan(cap);
      EXPECT_LE(capped.splits, full.splits);
      if (capped.n_ctas <= cap * sms) {
        EXPECT_LE(capped.n_ctas * capped.splits, cap * sms + capped.n_ctas / 2) << "the nearest CTA count to the cap";
      }
      CudaBackendConfig config;
      config.gptq_kernel = GptqKernel::StreamBulk;
      config.gptq_stream_ctas_per_sm = cap;
      CudaBackend be(config);
      EXPECT_EQ(be.gptq_stream_ctas_per_sm(), cap);
      expect_exact_on(be, c, {1, 4}, rng);
      // The cap reaches the launch: on random scales and activations the
      // capped plan's fewer splits sum in another order, so some of the
      // 16384 or more f16 outputs round differently from the default plan's (a few
      // per cent of them each, from fp32 sums of 4096 or 14336 terms). Exact
      // data above cannot show it: every order gives the same bits there.
      if (capped.splits != full.splits) {
        WeightCase noisy = c;
        noisy.exact = false;
        const Checkpoint ck = make_checkpoint(noisy, rng);
        auto uncapped = bulk_backend();
        const std::unique_ptr<QuantWeight> w_capped = be.load_gptq(ck.tensors());
        const std::unique_ptr<QuantWeight> w_full = uncapped->load_gptq(ck.tensors());
        const std::vector<float> a = uniform_values(rng, 4 * c.k, -1.0f, 1.0f);
        EXPECT_FALSE(same_floats(run_gemm(be, *w_capped, a, DType::F16, 4), run_gemm(*uncapped, *w_full, a, DType::F16, 4)))
            << "the capped backend ran the default plan";
      }
    }
  }
}

// The default plan of llama3-8b's down projection (14336 x 4096 at m = 1):
// 64 column blocks x 8 splits, 512 CTAs, past kGptqClusterMaxCtasPerSm per
// SM on 132 SMs, so the splits sum through the workspace although the
// cluster reduce is asked for (the default). Exact against the CPU at the
// default plan (CtasPerSmCapsThePlan checks the capped plans), and no
// launch goes out in clusters where gptq_cluster_reduces says so.
TEST_F(CudaGptqStreamBulk, SplitsPastTheClusterCapSumThroughTheWorkspace) {
  if (!kernels::gptq_bulk_copy_supported()) GTEST_SKIP() << "no bulk copies (sm_90+) on this device";
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{14336, 4096, 128, true, false, GptqZeroFormat::V1};
  auto bulk = bulk_backend();
  ASSERT_TRUE(bulk->gptq_cluster_reduce());
  const Checkpoint ck = make_checkpoint(c, rng);
  expect_exact_on({bulk.get()}, c, ck, {1, 4}, rng);
  std::unique_ptr<QuantWeight> w = bulk->load_gptq(ck.tensors());
  for (std::size_t m : {1, 4}) {
    SCOPED_TRACE(cat("m=", m));
    const BulkPlan plan = bulk_stream_plan(c, m, DType::F16);
    ASSERT_TRUE(plan.applies);
    const long long ctas = static_cast<long long>(c.n / kernels::kGptqTileN) * plan.splits;
    const bool clustered = kernels::gptq_cluster_reduces(true, plan.splits, ctas, device0_sms());
    if (device0_sms() == 132) {
      EXPECT_FALSE(clustered) << plan.splits << " splits, " << ctas << " CTAs: the workspace path on 132 SMs";
    }
    const std::vector<CapturedLaunch> launches = gptq_launches(*bulk, *w, DType::F16, m);
    EXPECT_EQ(any_clustered(launches), clustered) << describe_launches(launches);
  }
}

// CudaBackendConfig::gptq_cluster_reduce: the splits of a column block summed
// through distributed shared memory give the workspace reduction's bits (the
// same partial sums added in the same order). Shapes whose plan has 2, 3, 4
// and 8 splits (8: the largest cluster), k padded, groups of 32 / 64 / 128 /
// per channel, zeros and act-order, f16 and bf16, m = 1, 9 (rows 9..15 dead),
// 16; random scales and activations, so a misplaced partial shows. Then
// against the CPU on power-of-two scales, and replayed from a graph.
TEST_F(CudaGptqStreamBulk, ClusterReduceGivesTheWorkspaceReductionsBits) {
  if (!kernels::gptq_bulk_copy_supported()) GTEST_SKIP() << "no bulk copies (sm_90+) on this device";
  FERRUM_SEEDED_RNG(rng);
  auto workspace = bulk_backend(0, false);
  auto cluster = bulk_backend(0, true);
  const std::initializer_list<std::size_t> ms = {1, 9, 16};
  for (const WeightCase& c : {WeightCase{2048, 1024, 128, true, false, GptqZeroFormat::V1, false},
                              WeightCase{3008, 1024, 32, false, false, GptqZeroFormat::V2, false},
                              WeightCase{4096, 4096, 64, false, true, GptqZeroFormat::V1, false},
                              WeightCase{8192, 64, -1, true, false, GptqZeroFormat::V2, false}}) {
    SCOPED_TRACE(describe(c));
    const Checkpoint ck = make_checkpoint(c, rng);
    const int k_pad = static_cast<int>((c.k + 127) / 128 * 128), n_pad = static_cast<int>(c.n);
    const int group_rows = c.group_size > 0 ? c.group_size : k_pad;
    std::unique_ptr<QuantWeight> w_workspace = workspace->load_gptq(ck.tensors());
    std::unique_ptr<QuantWeight> w_cluster = cluster->load_gptq(ck.tensors());
    for (std::size_t m : ms) {
      const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
        // The premise: a plan the cluster reduce takes.
        const int splits = kernels::gptq_stream_plan(dt, !c.symmetric, static_cast<int>(m), static_cast<int>(c.k),
                                                     k_pad, n_pad, group_rows, device0_sms(),
                                                     kernels::GptqKernelKind::StreamBulk, /*ring=*/0, /*ctas_per_sm=*/0)
                               .splits;
        ASSERT_GE(splits, 2);
        ASSERT_LE(splits, kernels::kGptqClusterMaxSplits);
        // ... and one the launcher clusters (at most kGptqClusterMaxCtasPerSm
        // CTAs per SM): else both runs would take the workspace.
        ASSERT_TRUE(kernels::gptq_cluster_reduces(true, splits, static_cast<long long>(n_pad / kernels::kGptqTileN) * splits,
                                                  device0_sms()));
        // ... and at the launch: the cluster backend's kernel goes out in
        // clusters, the workspace backend's never (else the two bit-equal
        // results below would compare a path with itself).
        const std::vector<CapturedLaunch> clustered = gptq_launches(*cluster, *w_cluster, dt, m);
        const std::vector<CapturedLaunch> unclustered = gptq_launches(*workspace, *w_workspace, dt, m);
        EXPECT_TRUE(any_clustered(clustered)) << "cluster reduce launched: " << describe_launches(clustered);
        EXPECT_FALSE(any_clustered(unclustered)) << "workspace reduce launched: " << describe_launches(unclustered);
        EXPECT_TRUE(
            same_floats(run_gemm(*cluster, *w_cluster, a, dt, m), run_gemm(*workspace, *w_workspace, a, dt, m)));
      }
    }
  }
  const WeightCase exact{4096, 4096, 128, false, false, GptqZeroFormat::V1};
  expect_exact_on(*cluster, exact, ms, rng);
  expect_graph_replays_like_cpu(*cluster, cpu(), exact, rng);
}

// The same layouts and odd shapes as the register source, against the CPU.
TEST_F(CudaGptqStreamBulk, ExactOnEveryStandardLayout) {
  FERRUM_SEEDED_RNG(rng);
  auto bulk = bulk_backend();
  for_each_standard_layout([&](const WeightCase& c) { expect_exact_on(*bulk, c, kStreamM, rng); });
}

TEST_F(CudaGptqStreamBulk, ExactWithPaddedOddAndLongShapes) {
  FERRUM_SEEDED_RNG(rng);
  auto bulk = bulk_backend();
  const std::initializer_list<std::size_t> ms = {1, 2, 7, 8, 9, 15, 16};
  expect_exact_on(*bulk, {96, 136, 32, false, true, GptqZeroFormat::V1}, ms, rng);
  expect_exact_on(*bulk, {16, 8, -1, true, false, GptqZeroFormat::V1}, ms, rng);
  expect_exact_on(*bulk, {4224, 72, -1, false, false, GptqZeroFormat::V2}, ms, rng);
  expect_exact_on(*bulk, {4000, 264, 32, false, true, GptqZeroFormat::V1}, ms, rng);
  // k = 264: the last chunk's activation rows are 8 columns, the smallest
  // bulk copy (16 bytes).
  expect_exact_on(*bulk, {264, 200, -1, false, false, GptqZeroFormat::V1}, ms, rng);
  // Groups of 256 rows: every chunk copies one scale (zero) row, the same
  // one for two chunks in turn; groups of 16 rows (8 per chunk, more than a
  // slot holds) take the register source.
  expect_exact_on(*bulk, {1024, 200, 256, false, false, GptqZeroFormat::V2}, ms, rng);
  expect_exact_on(*bulk, {256, 136, 16, true, true, GptqZeroFormat::V1}, ms, rng);
  // The ends of the split plan: the most splits of one narrow column block
  // (8: the bulk source gives every warp at least two chunks); one split
  // where every warp loops over 16 chunks (its default ring of 1 or 2 slots
  // wraps 8 or 16 times, so every slot's barrier changes phase).
  expect_exact_on(*bulk, {8192, 64, 128, true, false, GptqZeroFormat::V1}, {1, 9, 16}, rng);
  expect_exact_on(*bulk, {8192, 25344, 128, false, false, GptqZeroFormat::V2}, {1, 9}, rng);
}

// Every ring size gives the register source's bits: the same chunks in the
// same order through the same math, only the way the bytes arrive differs.
// The bits are equal only under the same split plan (the splits are summed
// in order), so both shapes have 660 column blocks: one split for every
// source and ring (at most 5 CTAs per SM on 132 SMs). Random scales and
// activations (any misplaced byte changes the result), f16 and bf16,
// m = 1, 9 (rows 9..15 dead) and 16; k = 2112 (17 chunks: 4 or 5 per warp, so rings of 1..4
// wrap; groups of 64 change inside a chunk; the last chunk half past k)
// and k = 1024 with act-order and zeros.
TEST_F(CudaGptqStreamBulk, EveryRingSizeGivesTheRegisterSourcesBits) {
  FERRUM_SEEDED_RNG(rng);
  for (const WeightCase& c : {WeightCase{2112, 42240, 64, true, false, GptqZeroFormat::V2, false},
                              WeightCase{1024, 42240, 128, false, true, GptqZeroFormat::V1, false}}) {
    SCOPED_TRACE(describe(c));
    const Checkpoint ck = make_checkpoint(c, rng);
    // The premise: one split in every plan compared here.
    for (std::size_t m : {1, 9, 16}) {
      for (DType dt : kHalfDTypes) {
        const int k_pad = static_cast<int>((c.k + 127) / 128 * 128), n_pad = static_cast<int>(c.n);
        ASSERT_EQ(kernels::gptq_stream_plan(dt, !c.symmetric, static_cast<int>(m), static_cast<int>(c.k), k_pad,
                                            n_pad, c.group_size, device0_sms(), kernels::GptqKernelKind::Stream,
                                            /*ring=*/0, /*ctas_per_sm=*/0)
                      .splits,
                  1);
        for (int ring = 1; ring <= kernels::kGptqStreamMaxRing; ++ring) {
          ASSERT_EQ(kernels::gptq_stream_plan(dt, !c.symmetric, static_cast<int>(m), static_cast<int>(c.k), k_pad,
                                              n_pad, c.group_size, device0_sms(), kernels::GptqKernelKind::StreamBulk, ring,
                                              /*ctas_per_sm=*/0)
                        .splits,
                    1)
              << "m=" << m << " ring=" << ring;
        }
      }
    }
    std::unique_ptr<QuantWeight> w_registers = stream().load_gptq(ck.tensors());
    struct Run {
      std::size_t m;
      DType dt;
      std::vector<float> a, want;
    };
    std::vector<Run> runs;
    for (std::size_t m : {1, 9, 16}) {
      const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
      for (DType dt : kHalfDTypes) runs.push_back({m, dt, a, run_gemm(stream(), *w_registers, a, dt, m)});
    }
    std::size_t one_slot_bytes = 0;
    for (int ring = 1; ring <= kernels::kGptqStreamMaxRing; ++ring) {
      auto bulk = bulk_backend(ring);
      std::unique_ptr<QuantWeight> w_bulk = bulk->load_gptq(ck.tensors());
      if (kernels::gptq_bulk_copy_supported()) {
        // The premise at the launch: each ring size is the one launched
        // (else equal bits could compare one ring with itself). The bulk
        // source's dynamic shared memory is `ring` chunk slots per warp.
        const std::vector<CapturedLaunch> launches = gptq_launches(*bulk, *w_bulk, DType::F16, 1);
        const std::size_t bytes = max_shared_bytes(launches);
        if (ring == 1) {
          one_slot_bytes = bytes;
          EXPECT_GT(bytes, 0u) << describe_launches(launches);
        } else {
          EXPECT_EQ(bytes, static_cast<std::size_t>(ring) * one_slot_bytes)
              << "ring " << ring << ": " << describe_launches(launches);
        }
      }
      for (const Run& r : runs) {
        SCOPED_TRACE(cat("m=", r.m, " ", to_string(r.dt), " ring=", ring));
        EXPECT_TRUE(same_floats(run_gemm(*bulk, *w_bulk, r.a, r.dt, r.m), r.want));
      }
    }
  }
}

TEST_F(CudaGptqStreamBulk, DeterministicRunToRunAndClose) {
  FERRUM_SEEDED_RNG(rng);
  auto bulk = bulk_backend();
  expect_deterministic_and_close(*bulk, cpu(), {1, 8, 9, 16}, 4, rng);
}

// Launched with PDL, the kernel's prologue overlaps the previous kernel: a
// chain y = (x · W1) · W2 on the stream with no host sync between the two
// GEMMs (the second reads what the first wrote; 8 splits of a 64-column
// weight, summed through the split-K workspace or in a cluster) must equal
// the two GEMMs run with a download in between, eagerly and replayed from a
// graph.
TEST_F(CudaGptqStreamBulk, BackToBackLaunchesSeeEachOthersWrites) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c1{8192, 64, 128, false, false, GptqZeroFormat::V1, false};
  const WeightCase c2{64, 8192, 32, true, false, GptqZeroFormat::V2, false};
  const Checkpoint ck1 = make_checkpoint(c1, rng), ck2 = make_checkpoint(c2, rng);
  for (const bool cluster_reduce : {false, true}) {
    SCOPED_TRACE(cluster_reduce ? "cluster reduce" : "workspace reduce");
    auto bulk = bulk_backend(0, cluster_reduce);
    std::unique_ptr<QuantWeight> w1 = bulk->load_gptq(ck1.tensors());
    std::unique_ptr<QuantWeight> w2 = bulk->load_gptq(ck2.tensors());
    for (std::size_t m : {1, 9}) {
      SCOPED_TRACE(cat("m=", m));
      const std::vector<float> a = uniform_values(rng, m * c1.k, -1.0f, 1.0f);
      // Apart: each GEMM's input uploaded from the host.
      const std::vector<float> mid = run_gemm(*bulk, *w1, a, DType::F16, m);
      const std::vector<float> want = run_gemm(*bulk, *w2, mid, DType::F16, m);
      Buffer a_buf = bulk->upload(a, DType::F16);
      GuardedOutput mid_buf(*bulk, DType::F16, m * c1.n), out(*bulk, DType::F16, m * c2.n);
      auto expect_guards = [&](const char* when) {
        EXPECT_TRUE(mid_buf.check_guard("gemm_gptq", "out", cat("first of the chain, m=", m, " ", when)));
        EXPECT_TRUE(out.check_guard("gemm_gptq", "out", cat("second of the chain, m=", m, " ", when)));
      };
      bulk->gemm_gptq(a_buf, *w1, mid_buf.view(), m);
      bulk->gemm_gptq(mid_buf.view(), *w2, out.view(), m);
      EXPECT_TRUE(same_floats(out.values(), want)) << "eager chain";
      expect_guards("eager");
      mid_buf.poison();
      out.poison();
      bulk->begin_graph_capture();
      bulk->gemm_gptq(a_buf, *w1, mid_buf.view(), m);
      bulk->gemm_gptq(mid_buf.view(), *w2, out.view(), m);
      bulk->end_graph_capture();
      for (int replay = 0; replay < 3; ++replay) {
        mid_buf.poison();  // each replay's values are its own
        out.poison();
        ASSERT_TRUE(bulk->replay_last_graph());
        EXPECT_TRUE(same_floats(out.values(), want)) << "graph replay " << replay;
        expect_guards(cat("graph replay ", replay).c_str());
      }
      bulk->reset_graph();
    }
  }
}

TEST_F(CudaGptqStreamBulk, GraphCaptureAndReplay) {
  FERRUM_SEEDED_RNG(rng);
  auto bulk = bulk_backend();
  expect_graph_replays_like_cpu(*bulk, cpu(), {2048, 256, 128, false, true, GptqZeroFormat::V1}, rng);
}

// ── The warpgroup-MMA kernel (GptqKernel::Wgmma, sm_90a) ─────────────────────

class CudaGptqWgmma : public CudaGptq {
 protected:
  // A backend with the wgmma kernel forced for every launch (m <= 16 too)
  // and the INT4 path for every m (launches of 64 rows past 64).
  void SetUp() override {
    CudaGptq::SetUp();
    if (IsSkipped()) return;
    if (!kernels::gptq_wgmma_supported()) GTEST_SKIP() << "no sm_90a code in this build, or not a 9.0 device";
    CudaBackendConfig config;
    config.gptq_kernel = GptqKernel::Wgmma;
    config.gptq_fused_max_m = 4096;
    wgmma_ = std::make_unique<CudaBackend>(config);
  }
  CudaBackend& wgmma() { return *wgmma_; }
  std::unique_ptr<CudaBackend> wgmma_;
};

// N = 16 up to m = 16, 32 up to 32, then 64; rows >= m zero in shared
// memory; 65 and 130 are launches of 64 rows plus a tail.
constexpr std::initializer_list<std::size_t> kWgmmaM = {1, 16, 17, 31, 32, 33, 63, 64, 65, 130};

// Every standard layout (scale rows changing inside a 64-row stage at group
// 32; n = 200 pads to 256: the CTA's last column block holds 8 live columns).
TEST_F(CudaGptqWgmma, ExactOnEveryStandardLayout) {
  FERRUM_SEEDED_RNG(rng);
  for_each_standard_layout([&](const WeightCase& c) { expect_exact_on(wgmma(), c, kWgmmaM, rng); });
}

// Splits along k (4096 / 4000 rows: many; k = 4000 ends inside a stage, its
// columns past k zero-filled), groups of 16 (four scale rows per stage),
// one group over all of k, k = 264 (the last stage mostly past k), many
// column groups (38400 columns: 150 CTAs of one split, summed through the
// workspace), n = 8 (one live warp), splits that start inside a 128-row
// group and cross into the next (k = 2304: 36 stages, 5 per split; the
// kernel's scale-row cursor starts mid-group), groups of 256 rows (4
// stages per scale row) at N = 16 and 64.
TEST_F(CudaGptqWgmma, ExactWithSplitsAndOddShapes) {
  FERRUM_SEEDED_RNG(rng);
  expect_exact_on(wgmma(), {2304, 264, 128, false, true, GptqZeroFormat::V1}, {13, 17, 64}, rng);
  expect_exact_on(wgmma(), {4000, 264, 32, false, true, GptqZeroFormat::V1}, {17, 33, 48, 64}, rng);
  expect_exact_on(wgmma(), {4096, 328, 128, true, false, GptqZeroFormat::V2}, {20, 64}, rng);
  expect_exact_on(wgmma(), {2048, 136, 16, false, false, GptqZeroFormat::V1}, {24, 64}, rng);
  expect_exact_on(wgmma(), {4224, 200, -1, false, false, GptqZeroFormat::V2}, {13, 40}, rng);
  expect_exact_on(wgmma(), {4096, 264, 256, false, true, GptqZeroFormat::V1}, {13, 40}, rng);
  expect_exact_on(wgmma(), {264, 200, -1, true, false, GptqZeroFormat::V1}, {3, 64}, rng);
  expect_exact_on(wgmma(), {1024, 38400, 128, true, false, GptqZeroFormat::V1}, {17, 64}, rng);
  expect_exact_on(wgmma(), {64, 8, 64, false, false, GptqZeroFormat::V2}, {33}, rng);
}

// Random data: close to the CPU and bitwise equal over three runs.
TEST_F(CudaGptqWgmma, DeterministicRunToRunAndClose) {
  FERRUM_SEEDED_RNG(rng);
  expect_deterministic_and_close(wgmma(), cpu(), {12, 17, 32, 40, 64}, 3, rng);
}

// Capture-safe (act-order gather + wgmma kernel in one graph).
TEST_F(CudaGptqWgmma, GraphCaptureAndReplay) {
  FERRUM_SEEDED_RNG(rng);
  expect_graph_replays_like_cpu(wgmma(), cpu(), {2048, 256, 128, false, true, GptqZeroFormat::V1}, rng);
}

// Back-to-back launches on one weight and the shared workspace (PDL lets
// each start before the previous finishes; its wait must hold the
// workspace): every result equals its own single run.
TEST_F(CudaGptqWgmma, BackToBackLaunchesKeepTheirResults) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{4096, 512, 128, false, true, GptqZeroFormat::V1};
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> w = wgmma().load_gptq(ck.tensors());
  const std::size_t m = 48;
  std::vector<std::vector<float>> inputs, want;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(uniform_values(rng, m * c.k, -1.0f, 1.0f));
    want.push_back(run_gemm(wgmma(), *w, inputs.back(), DType::BF16, m));
  }
  std::vector<Buffer> a;
  std::vector<std::unique_ptr<GuardedOutput>> out;
  for (int i = 0; i < 4; ++i) {
    a.push_back(wgmma().upload(inputs[static_cast<std::size_t>(i)], DType::BF16));
    out.push_back(std::make_unique<GuardedOutput>(wgmma(), DType::BF16, m * c.n));
  }
  for (std::size_t i = 0; i < 4; ++i) wgmma().gemm_gptq(a[i], *w, out[i]->view(), m);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(cat("launch ", i));
    const GuardedOutput& o = *out[static_cast<std::size_t>(i)];
    EXPECT_TRUE(same_floats(o.values(), want[static_cast<std::size_t>(i)]));
    EXPECT_TRUE(o.check_guard("gemm_gptq", "out", cat("back-to-back launch ", i, ", m=", m)));
  }
}

// The config reaches the backend.
TEST_F(CudaGptqWgmma, ConfigSelectsTheKernel) { EXPECT_EQ(wgmma().gptq_kernel(), GptqKernel::Wgmma); }

// The workspace reduction (gptq_cluster_reduce = false) gives the cluster
// sum's bits on random data, at N = 16 (m = 9, 16), 32 and 64, at plans of
// 3, 2 and 8 splits on the H200
// (k = 1024 over 64 / 90 column groups; 8192 x 512 over 2; the H200 holds
// 79 clusters of 3, 62 of 4, 132 of 2 and 30 of 8: gptq_wgmma_splits).
TEST_F(CudaGptqWgmma, WorkspaceReductionGivesTheClusterSumsBits) {
  FERRUM_SEEDED_RNG(rng);
  CudaBackendConfig config;
  config.gptq_kernel = GptqKernel::Wgmma;
  config.gptq_fused_max_m = 4096;
  config.gptq_cluster_reduce = false;
  CudaBackend workspace(config);
  for (const WeightCase& c : {WeightCase{1024, 16384, 128, false, true, GptqZeroFormat::V1, false},
                              WeightCase{1024, 23040, 64, true, false, GptqZeroFormat::V2, false},
                              WeightCase{8192, 512, 128, true, true, GptqZeroFormat::V1, false}}) {
    SCOPED_TRACE(describe(c));
    const Checkpoint ck = make_checkpoint(c, rng);
    std::unique_ptr<QuantWeight> w_cluster = wgmma().load_gptq(ck.tensors());
    std::unique_ptr<QuantWeight> w_workspace = workspace.load_gptq(ck.tensors());
    for (std::size_t m : {9, 16, 20, 64}) {
      const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
        EXPECT_TRUE(same_floats(run_gemm(workspace, *w_workspace, a, dt, m), run_gemm(wgmma(), *w_cluster, a, dt, m)));
      }
    }
  }
}

// Auto (the default backend) against `below` (a backend forcing the kernel
// Auto should take under `first_wgmma_m` rows) and the wgmma-forced one, seen
// through the bits on random data: Auto's output equals `below`'s for m <
// first_wgmma_m and the wgmma kernel's from there. On each side the two
// kernels must differ somewhere, else that side's comparison could not tell
// them apart; `below_runs_above` false leaves `below` out from first_wgmma_m
// on (and that side's check with it).
void expect_auto_takes_wgmma_from(Backend& automatic, Backend& below, Backend& wgmma, const WeightCase& c,
                                  std::initializer_list<std::size_t> ms, std::size_t first_wgmma_m,
                                  std::initializer_list<DType> dtypes, bool below_runs_above, Rng& rng) {
  const Checkpoint ck = make_checkpoint(c, rng);
  std::unique_ptr<QuantWeight> w_auto = automatic.load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> w_below = below.load_gptq(ck.tensors());
  std::unique_ptr<QuantWeight> w_wgmma = wgmma.load_gptq(ck.tensors());
  bool differ_below = false, differ_from = false;
  for (std::size_t m : ms) {
    const std::vector<float> a = uniform_values(rng, m * c.k, -1.0f, 1.0f);
    for (DType dt : dtypes) {
      SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
      const std::vector<float> by_auto = run_gemm(automatic, *w_auto, a, dt, m);
      const std::vector<float> by_wgmma = run_gemm(wgmma, *w_wgmma, a, dt, m);
      if (m >= first_wgmma_m) {
        EXPECT_TRUE(same_floats(by_auto, by_wgmma));
      }
      if (m >= first_wgmma_m && !below_runs_above) continue;
      const std::vector<float> by_below = run_gemm(below, *w_below, a, dt, m);
      if (m < first_wgmma_m) {
        EXPECT_TRUE(same_floats(by_auto, by_below));
      }
      bool& differ = m < first_wgmma_m ? differ_below : differ_from;
      differ = differ || !same_floats(by_below, by_wgmma);
    }
  }
  EXPECT_TRUE(differ_below) << "the two kernels gave the same bits below " << first_wgmma_m << " rows";
  if (below_runs_above) {
    EXPECT_TRUE(differ_from) << "the two kernels gave the same bits from " << first_wgmma_m << " rows";
  }
}

// Auto runs the streaming kernel up to 16 rows on a deep narrow weight
// (8192 x 512: 2 column groups) and the wgmma kernel from 17 rows on every
// weight (gptq_wgmma_preferred, session 48: the fused kernel's exception for
// such weights at 17 .. 32 rows measured 1.3x slower and was dropped). The
// StreamBulk backend runs the fused kernel at 17 and 32 rows, whose bits
// must differ from the wgmma kernel's there.
TEST_F(CudaGptqWgmma, AutoTakesTheWgmmaKernelFromSeventeenRowsOnDeepNarrowWeights) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{8192, 512, 128, true, false, GptqZeroFormat::V1, false};
  expect_auto_takes_wgmma_from(cuda(), stream_bulk(), wgmma(), c, {9, 16, 17, 32}, 17, {DType::F16}, true, rng);
}

// At 9 .. 16 rows Auto takes the wgmma kernel on narrower weights where k is
// short (gptq_wgmma_preferred, session 48): 4 .. 7 column groups where k <=
// 3072, 8 .. 11 where k <= 4096, and 12 or more (but 16) on any k.
TEST_F(CudaGptqWgmma, AutoTakesTheWgmmaKernelFromNineRowsOnShallowNarrowWeights) {
  FERRUM_SEEDED_RNG(rng);
  for (const WeightCase& c : {WeightCase{2048, 1024, 128, true, false, GptqZeroFormat::V1, false},
                              WeightCase{4096, 2048, 128, true, false, GptqZeroFormat::V1, false},
                              WeightCase{8192, 3072, 128, true, false, GptqZeroFormat::V1, false}}) {
    SCOPED_TRACE(describe(c));
    expect_auto_takes_wgmma_from(cuda(), stream_bulk(), wgmma(), c, {5, 8, 9, 16}, 9, {DType::F16}, true, rng);
  }
}

// On a weight of n >= 6144 Auto runs the streaming kernel up to 8 rows and
// the wgmma kernel from 9 (gptq_wgmma_preferred).
TEST_F(CudaGptqWgmma, AutoTakesTheWgmmaKernelFromNineRowsOnWideWeights) {
  FERRUM_SEEDED_RNG(rng);
  const WeightCase c{1024, 6144, 128, true, false, GptqZeroFormat::V1, false};
  expect_auto_takes_wgmma_from(cuda(), stream_bulk(), wgmma(), c, {5, 8, 9, 12, 16}, 9, {DType::F16, DType::BF16}, true, rng);
}

// On a weight of n = 4096 (16 column groups) Auto takes the wgmma kernel
// from 9 rows where k <= 8192, from 16 where k is longer, and at 17 .. 32
// rows on either (gptq_wgmma_preferred, session 47).
TEST_F(CudaGptqWgmma, AutoTakesTheWgmmaKernelOnWeightsOfFourThousandColumns) {
  FERRUM_SEEDED_RNG(rng);
  {
    SCOPED_TRACE("k = 1024");
    const WeightCase c{1024, 4096, 128, true, false, GptqZeroFormat::V1, false};
    expect_auto_takes_wgmma_from(cuda(), stream_bulk(), wgmma(), c, {5, 8, 9, 16, 17, 32}, 9, {DType::F16}, false, rng);
  }
  {
    SCOPED_TRACE("k = 8320");
    const WeightCase c{8320, 4096, 128, true, false, GptqZeroFormat::V1, false};
    expect_auto_takes_wgmma_from(cuda(), stream_bulk(), wgmma(), c, {9, 15, 16, 17, 32}, 16, {DType::F16}, false, rng);
  }
}

// ── The row_sq ops: the residual add and the norm around the projections ────

// gemm_gptq_add_residual, then rms_norm_gemm_gptq and its SiLU·mul form on
// the residual it left, on the default backend (the residual add fused where
// the streaming kernel takes the launch) and on one with
// CudaBackendConfig::gptq_fuse_residual_add off (gemm_gptq and the
// add-and-sum kernel): the same bits; both against CpuBackend within the
// dtype's tolerance (the GEMMs sum in another order there). The norm forms
// always run the norm kernel into `normed`, then the GEMM.
class CudaGptqRowSq : public CudaGptq {
 protected:
  void SetUp() override {
    CudaGptq::SetUp();
    if (IsSkipped()) return;
    CudaBackendConfig config;
    config.gptq_fuse_residual_add = false;
    composed_ = std::make_unique<CudaBackend>(config);
  }
  // Which path the default backend's gemm_gptq_add_residual must take at m
  // rows (kernels::launch_gptq_gemm_row_sq's rule for Auto's streaming
  // launch): fused at m = 1, composed past the streaming kernel (m > 16) or
  // under act-order; between, either (Auto's kernel choice decides).
  enum class Path { Fused, Composed, Either };
  static Path residual_path(const WeightCase& c, std::size_t m) {
    if (c.act_order || m > static_cast<std::size_t>(kernels::kGptqStreamMaxM)) return Path::Composed;
    return m == 1 ? Path::Fused : Path::Either;
  }
  // The workspace `v` still holds `poison` (NaN: every element NaN) exactly when the path was fused.
  static void expect_path(Path p, const std::vector<float>& v, float poison, const char* what) {
    const bool untouched = std::all_of(v.begin(), v.end(), [&](float x) {
      return std::isnan(poison) ? std::isnan(x) : x == poison;
    });
    if (p == Path::Fused) {
      EXPECT_TRUE(untouched) << what << ": the fused form must not write its workspace";
    }
    if (p == Path::Composed) {
      EXPECT_FALSE(untouched) << what << ": the composition writes its workspace";
    }
  }
  std::unique_ptr<CudaBackend> composed_;
};

TEST_F(CudaGptqRowSq, FusedEqualsComposedAndMatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  EXPECT_TRUE(CudaBackendConfig{}.gptq_fuse_residual_add) << "on by default";
  EXPECT_FALSE(composed_->gptq_fuse_residual_add());
  constexpr float kEps = 1e-5f;
  constexpr float kPoison = 1232.0f;  // exact in f16 and bf16
  // (producer [k, n], consumer [n, n2]): n % 16 == 8 (a half group), the o
  // shape (clusters), groups of 32 with zeros, act-order (composed on every
  // backend), a long k (more splits).
  struct Pair {
    WeightCase out, in;
  };
  const Pair pairs[] = {
      {{1024, 392, 128, true, false, GptqZeroFormat::V1, false}, {392, 256, -1, true, false, GptqZeroFormat::V1, false}},
      {{4096, 4096, 128, true, false, GptqZeroFormat::V1, false}, {4096, 1024, 128, true, false, GptqZeroFormat::V1, false}},
      {{416, 256, 32, false, false, GptqZeroFormat::V2, false}, {256, 512, 32, false, false, GptqZeroFormat::V2, false}},
      {{1024, 192, 64, false, true, GptqZeroFormat::V1, false}, {192, 128, 64, false, true, GptqZeroFormat::V1, false}},
      {{14336, 512, 128, true, false, GptqZeroFormat::V1, false}, {512, 384, 128, true, false, GptqZeroFormat::V1, false}},
      // Groups of 16: the streaming kernel's register source (the bulk
      // source needs 32) carries the residual epilogue, at k = 1024 and at
      // k = 416 (padded to 512: fewer splits, the last stage three quarters
      // past k).
      {{1024, 400, 16, false, false, GptqZeroFormat::V2, false}, {400, 256, 16, true, false, GptqZeroFormat::V1, false}},
      {{416, 400, 16, true, false, GptqZeroFormat::V1, false}, {400, 512, 16, false, false, GptqZeroFormat::V2, false}}};
  for (const Pair& pair : pairs) {
    SCOPED_TRACE(cat(describe(pair.out), " then ", describe(pair.in)));
    const Checkpoint ck_out = make_checkpoint(pair.out, rng), ck_in = make_checkpoint(pair.in, rng);
    Backend* const backends[] = {&cuda(), composed_.get(), &cpu()};
    const char* const backend_names[] = {"default", "gptq_fuse_residual_add off", "CPU"};
    std::unique_ptr<QuantWeight> w_out[3], w_in[3];
    for (int b = 0; b < 3; ++b) {
      w_out[b] = backends[b]->load_gptq(ck_out.tensors());
      w_in[b] = backends[b]->load_gptq(ck_in.tensors());
    }
    const std::size_t k = pair.out.k, n = pair.out.n, n2 = pair.in.n;
    for (std::size_t m : {1, 2, 5, 8, 9, 16, 17}) {
      const std::vector<float> a = uniform_values(rng, m * k, -1.0f, 1.0f);
      const std::vector<float> residual = normal_values(rng, m * n, 0.0f, 1.0f);
      const std::vector<float> norm_w = uniform_values(rng, n, 0.5f, 1.5f);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat("m=", m, " ", to_string(dt)));
        struct Result {
          std::vector<float> out, residual, row_sq, normed, y, act, normed2;
        } got[3];
        for (int b = 0; b < 3; ++b) {
          Backend& be = *backends[b];
          // Every output poisoned and guarded: n = 392 has a half row_sq
          // group and pads to 448 columns, so a store bounded by the padded
          // width would land past an output's end, where no value read back
          // shows it.
          const std::string where = cat("m=", m, " ", to_string(dt), " on the ", backend_names[b], " backend");
          using Named = std::pair<const GuardedOutput*, const char*>;
          auto expect_guards = [&](const char* op, std::initializer_list<Named> outputs) {
            for (const auto& [output, name] : outputs) EXPECT_TRUE(output->check_guard(op, name, where));
          };
          Buffer a_buf = be.upload(a, dt), norm_buf = be.upload(norm_w, dt);
          GuardedOutput out(be, dt, m * n), res(be, make_tensor(dt, residual)),
              row_sq(be, DType::F32, m * row_sq_groups(n));
          be.gemm_gptq_add_residual(a_buf, *w_out[b], out.view(), res.view(), row_sq.view(), m);
          expect_guards("gemm_gptq_add_residual", {{&out, "out"}, {&res, "residual"}, {&row_sq, "row_sq"}});
          got[b].residual = res.values();
          got[b].row_sq = row_sq.values();
          // The CPU's consumers read the default backend's residual and
          // row_sq: a reference for the same input (its own residual differs
          // within the producer's tolerance, and SiLU·mul multiplies a gate's
          // difference by the up value).
          if (b == 2) {
            be.write(res.view(), got[0].residual);
            be.write(row_sq.view(), got[0].row_sq);
          }
          GuardedOutput normed(be, make_tensor(dt, std::vector<float>(m * n, kPoison))), y(be, dt, m * n2);
          be.rms_norm_gemm_gptq(res.view(), row_sq.view(), norm_buf, kEps, *w_in[b], normed.view(), y.view(), m);
          expect_guards("rms_norm_gemm_gptq", {{&normed, "normed"}, {&y, "out"}});
          GuardedOutput normed2(be, make_tensor(dt, std::vector<float>(m * n, kPoison)));
          GuardedOutput gate_up(be, make_tensor(dt, std::vector<float>(m * n2, kPoison))), act(be, dt, m * n2 / 2);
          be.rms_norm_gemm_silu_mul_gptq(res.view(), row_sq.view(), norm_buf, kEps, *w_in[b], normed2.view(),
                                         gate_up.view(), act.view(), m);
          expect_guards("rms_norm_gemm_silu_mul_gptq",
                        {{&normed2, "normed"}, {&gate_up, "gate_up"}, {&act, "act"}});
          got[b].out = out.values();
          got[b].normed = normed.values();
          got[b].y = y.values();
          got[b].act = act.values();
          got[b].normed2 = normed2.values();
        }
        // Fused (or not) against composed: bitwise (out is a workspace).
        EXPECT_TRUE(same_floats(got[0].residual, got[1].residual)) << "residual";
        EXPECT_TRUE(same_floats(got[0].row_sq, got[1].row_sq)) << "row_sq";
        EXPECT_TRUE(same_floats(got[0].y, got[1].y)) << "rms_norm_gemm_gptq";
        EXPECT_TRUE(same_floats(got[0].act, got[1].act)) << "rms_norm_gemm_silu_mul_gptq";
        // The fused residual add never writes its workspace out: the proof
        // it ran where the rule says it does. The norm forms write normed.
        expect_path(residual_path(pair.out, m), got[0].out, NAN, "gemm_gptq_add_residual");
        expect_path(Path::Composed, got[0].normed, kPoison, "rms_norm_gemm_gptq");
        expect_path(Path::Composed, got[0].normed2, kPoison, "rms_norm_gemm_silu_mul_gptq");
        expect_path(Path::Composed, got[1].out, NAN, "gptq_fuse_residual_add off");
        // Against the CPU (each GEMM within its k-term tolerance; the CPU's
        // consumers read the default backend's residual and row_sq).
        EXPECT_TRUE(all_close(got[0].residual, got[2].residual, dt, op_scale::gemm(k))) << "residual";
        EXPECT_TRUE(all_close(got[0].y, got[2].y, dt, op_scale::gemm(n))) << "rms_norm_gemm_gptq";
        EXPECT_TRUE(all_close(got[0].act, got[2].act, dt, op_scale::gemm(n))) << "rms_norm_gemm_silu_mul_gptq";
        // row_sq: the squares of the residual this backend stored, per 16 columns.
        std::vector<double> sq_ref(m * row_sq_groups(n), 0.0);
        for (std::size_t r = 0; r < m; ++r) {
          for (std::size_t c = 0; c < n; ++c) {
            const double v = got[0].residual[r * n + c];
            sq_ref[r * row_sq_groups(n) + c / kRowSqColumns] += v * v;
          }
        }
        EXPECT_TRUE(all_close(got[0].row_sq, sq_ref, DType::F32)) << "row_sq";
      }
    }
  }
}

TEST_F(CudaGptqRowSq, RowSumSquaresMatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  for (std::size_t cols : {std::size_t{8}, std::size_t{769}, std::size_t{4096}, std::size_t{5120}}) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{7}, std::size_t{83}}) {
      const std::vector<float> x = normal_values(rng, rows * cols, 0.0f, 2.0f);
      for (DType dt : kHalfDTypes) {
        SCOPED_TRACE(cat(rows, " x ", cols, " ", to_string(dt)));
        std::vector<float> got[2];
        Backend* const backends[] = {&cuda(), &cpu()};
        for (int b = 0; b < 2; ++b) {
          Buffer x_buf = backends[b]->upload(x, dt);
          GuardedOutput row_sq(*backends[b], DType::F32, rows * row_sq_groups(cols));
          backends[b]->row_sum_squares(x_buf, row_sq.view(), rows, cols);
          EXPECT_TRUE(row_sq.check_guard("row_sum_squares", "row_sq", b == 0 ? "CUDA" : "CPU"));
          got[b] = row_sq.values();
        }
        EXPECT_TRUE(all_close(got[0], got[1], DType::F32));
      }
    }
  }
}

}  // namespace
}  // namespace ferrum::test
