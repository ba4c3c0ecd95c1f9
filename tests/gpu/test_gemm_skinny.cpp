// The skinny decode GEMM (kernels/gemm_skinny.cu, m <= 16) through
// CudaBackend::gemm, against CpuBackend (exact fp64 accumulation, one
// rounding): every element within the tolerance table at the gemm scale,
// poisoned outputs with guard regions on both backends.
//
// - MatchesCpu: m in {1, 2, 3, 5, 7, 8, 9, 12, 16} (m > 8: two groups of 8
//   rows of a) x n in {1, 3, 67, 1001} x k in {8,
//   64, 4104, 8192} (k % 256 != 0 leaves a partial last chunk), plus
//   n = 4099 and 8200 (grids of about two blocks per SM: one- and two-tile
//   tensor-core blocks), f16 and bf16.
// - Deterministic: two runs of the same call are bitwise identical.
// - TheSwitchReachesTheLaunch: gemm_skinny_max_m = 16 launches the skinny
//   kernel and 0 never (else every test here could be running cuBLAS), read
//   from a captured graph's kernel names.
// - FallsBack: views one element into their buffers (not 16-byte aligned)
//   and k % 8 != 0 must take cuBLAS and still be right.
// - GemmSkinnyApplicable (host only, runs without a GPU): the predicate the
//   backend dispatches on.
// - CudaGemmSiluMul: gemm_silu_mul (the skinny kernel with its SwiGLU
//   epilogue at m <= 2, gemm + the pairs kernel above) over m in {1, 2, 3,
//   8, 17}, odd im, k with a partial last chunk, unaligned views, an
//   unaligned act alone, k % 8 != 0 (cuBLAS), and the default and
//   cuBLAS-only dispatch: bitwise its two steps run by hand (gemm into
//   gate_up, then silu·mul of the pairs), that gemm against CpuBackend's,
//   and the silu·mul within the tolerance of fp64 on the same gate_up (why
//   not act against the CPU's act directly: see the test).
//
// The CUDA tests are skipped (GTEST_SKIP) when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/elementwise.hpp"   // launch_silu_mul_pairs: the unfused second step, for the bitwise check
#include "kernels/gemm_skinny.hpp"  // the dispatch predicate (header needs only ferrum/ and cudart)
#include "support/captured_launches.hpp"
#include "support/half_reference.hpp"
#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

constexpr std::size_t kSkinnyMs[] = {1, 2, 3, 5, 7, 8, 9, 12, 16};
constexpr std::size_t kSkinnyNs[] = {1, 3, 67, 1001};
constexpr std::size_t kSkinnyKs[] = {8, 64, 4104, 8192};
// Grids of about two blocks per SM on an H200: 4099 rows take the one-tile
// tensor-core blocks (257 of 16 rows), 8200 the two-tile ones (257 of 32).
constexpr std::size_t kLargeN = 4099;
constexpr std::size_t kTwoTileN = 8200;
constexpr std::size_t kLargeNK = 4104;

using SkinnyParam = std::tuple<DType, std::size_t>;  // (dtype, m)

std::vector<SkinnyParam> skinny_params() {
  std::vector<SkinnyParam> params;
  for (DType dt : kHalfDTypes) {
    for (std::size_t m : kSkinnyMs) params.emplace_back(dt, m);
  }
  return params;
}

std::string skinny_param_name(const ::testing::TestParamInfo<SkinnyParam>& info) {
  return cat(to_string(std::get<0>(info.param)), "_m", std::get<1>(info.param));
}

class CudaGemmSkinny : public CudaParamTest<SkinnyParam> {
 protected:
  // A backend that sends every m <= kSkinnyMaxM to the skinny kernel, whatever the
  // library's default crossover is.
  void SetUp() override {
    CudaParamTest<SkinnyParam>::SetUp();
    if (IsSkipped()) return;
    CudaBackendConfig config;
    config.gemm_skinny_max_m = kernels::kSkinnyMaxM;
    skinny_ = std::make_unique<CudaBackend>(config);
  }
  CudaBackend& skinny() { return *skinny_; }
  std::unique_ptr<CudaBackend> skinny_;

  DType dt() const { return std::get<0>(GetParam()); }
  std::size_t m() const { return std::get<1>(GetParam()); }

  // CUDA (with `lead`) against the CPU oracle.
  void expect_matches_cpu(Rng& rng, std::size_t n, std::size_t k, std::size_t lead = 0) {
    const GemmCase c = make_gemm_case(rng, dt(), m(), n, k);
    SCOPED_TRACE(describe(c));
    RunOptions o;
    o.lead = lead;
    SCOPED_TRACE(describe(o));
    expect_same_outputs(run(skinny(), c, o), run(cpu(), c), Match::Close, op_scale::gemm(k));
  }
};

TEST_P(CudaGemmSkinny, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  for (std::size_t n : kSkinnyNs) {
    for (std::size_t k : kSkinnyKs) expect_matches_cpu(rng, n, k);
  }
  expect_matches_cpu(rng, kLargeN, kLargeNK);
  expect_matches_cpu(rng, kTwoTileN, kLargeNK);
}

TEST_P(CudaGemmSkinny, Deterministic) {
  FERRUM_SEEDED_RNG(rng);
  const std::size_t shapes[][2] = {{kLargeN, kLargeNK}, {67, 8192}, {1001, 64}};
  for (const auto& [n, k] : shapes) {
    const GemmCase c = make_gemm_case(rng, dt(), m(), n, k);
    SCOPED_TRACE(describe(c));
    const OpResult first = run(skinny(), c);
    const OpResult second = run(skinny(), c);
    EXPECT_TRUE(first.guards_ok());
    EXPECT_TRUE(second.guards_ok());
    EXPECT_TRUE(bitwise_equal(second.at("out").bytes, first.at("out").bytes, size_of(dt())));
  }
}

// The switch reaches the launch: with gemm_skinny_max_m = 16 the call
// launches the skinny kernel, with 0 (cuBLAS only) never, or the tests above
// would be testing whichever kernel the default picks. Read from the kernel
// names of a graph captured on each backend's stream (the outputs cannot
// tell: the two may round alike).
TEST_P(CudaGemmSkinny, TheSwitchReachesTheLaunch) {
  CudaBackendConfig config;
  config.gemm_skinny_max_m = 0;
  CudaBackend cublas_only(config);
  constexpr std::size_t n = 16384, k = kLargeNK;
  for (CudaBackend* be : {&skinny(), &cublas_only}) {
    const Buffer a = be->alloc(dt(), m() * k);
    const Buffer b = be->alloc(dt(), n * k);
    Buffer out = be->alloc(dt(), m() * n);
    const std::vector<CapturedLaunch> launches = captured_launches(*be, [&] { be->gemm(a, b, out, m(), n, k); });
    if (be == &skinny()) {
      EXPECT_TRUE(launched(launches, "gemm_skinny_")) << "gemm_skinny_max_m = 16 launched: " << describe_launches(launches);
    } else {
      EXPECT_FALSE(launched(launches, "gemm_skinny_")) << "gemm_skinny_max_m = 0 launched: " << describe_launches(launches);
      EXPECT_FALSE(launches.empty()) << "gemm_skinny_max_m = 0 launched no kernel";
    }
  }
}

// Host-memory weights (alloc_host) never take the skinny kernel (its
// optional bulk L2 prefetch, gemm_prefetch_before_wait, must not be pointed
// at them; that switch is per device, so it stays off here): the same call
// on device weights launches it (the control), on page-locked ones cuBLAS
// runs, with the bits of a cuBLAS-only backend's call on device weights.
TEST_P(CudaGemmSkinny, HostMemoryWeightsRunOnCublas) {
  constexpr std::size_t n = 1001, k = 4096;
  FERRUM_SEEDED_RNG(rng);
  const std::vector<float> a_host = uniform_values(rng, m() * k), b_host = uniform_values(rng, n * k);
  CudaBackend& be = skinny();
  const Buffer a = be.upload(a_host, dt()), b_device = be.upload(b_host, dt());
  Buffer b_pinned = be.alloc_host(dt(), n * k);
  be.copy_slice(b_device, 0, b_pinned, 0, n * k);
  GuardedOutput out(be, dt(), m() * n);
  const std::vector<CapturedLaunch> on_device =
      captured_launches(be, [&] { be.gemm(a, b_device, out.view(), m(), n, k); });
  EXPECT_TRUE(launched(on_device, "gemm_skinny_")) << describe_launches(on_device);
  const std::vector<CapturedLaunch> on_host =
      captured_launches(be, [&] { be.gemm(a, b_pinned, out.view(), m(), n, k); });
  EXPECT_FALSE(launched(on_host, "gemm_skinny_")) << describe_launches(on_host);
  EXPECT_FALSE(on_host.empty()) << "no kernel launched for host-memory weights";
  // captured_launches runs each call once uncaptured too: its guards first.
  EXPECT_TRUE(out.check_guard("gemm", "out", "device, then host-memory weights"));
  out.poison();  // the bits compared below are this call's
  be.gemm(a, b_pinned, out.view(), m(), n, k);
  EXPECT_TRUE(out.check_guard("gemm", "out", "host-memory weights"));
  CudaBackendConfig config;
  config.gemm_skinny_max_m = 0;
  CudaBackend cublas_only(config);
  const Buffer a2 = cublas_only.upload(a_host, dt()), b2 = cublas_only.upload(b_host, dt());
  Buffer expected = cublas_only.alloc(dt(), m() * n);
  cublas_only.gemm(a2, b2, expected, m(), n, k);
  auto raw = [](Backend& owner, const Buffer& buf) {
    std::vector<std::uint8_t> bytes(buf.nbytes());
    owner.read_bytes(buf, bytes.data(), bytes.size());
    return bytes;
  };
  EXPECT_TRUE(bitwise_equal(out.bytes(), raw(cublas_only, expected), size_of(dt())));
}

TEST_P(CudaGemmSkinny, FallsBack) {
  FERRUM_SEEDED_RNG(rng);
  // Unaligned views (lead 1: a, b and out start 2 bytes past a 16-byte boundary).
  for (std::size_t n : {std::size_t{67}, std::size_t{1001}}) {
    for (std::size_t k : {std::size_t{64}, std::size_t{4104}}) expect_matches_cpu(rng, n, k, 1);
  }
  // k % 8 != 0 with aligned views.
  for (std::size_t k : {std::size_t{769}, std::size_t{4100}}) expect_matches_cpu(rng, 67, k);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemmSkinny, ::testing::ValuesIn(skinny_params()), skinny_param_name);

// ── gemm_silu_mul ────────────────────────────────────────────────────────────

constexpr std::size_t kSiluMulMs[] = {1, 2, 3, 8, 17};

std::vector<SkinnyParam> silu_mul_params() {
  std::vector<SkinnyParam> params;
  for (DType dt : kHalfDTypes) {
    for (std::size_t m : kSiluMulMs) params.emplace_back(dt, m);
  }
  return params;
}

class CudaGemmSiluMul : public CudaGemmSkinny {
 protected:
  // gemm_silu_mul on `be`, and its two steps run by hand on the same
  // backend: gemm(a, w) into gate_up, then the pairs kernel. a, w and both
  // gate_up buffers start `lead` elements into their buffers, both acts
  // `act_lead`; every output is poisoned and guarded.
  struct TwoSteps {
    std::vector<float> act;                  // the op's, decoded
    std::vector<std::uint8_t> act_bytes;     // the op's, raw
    std::vector<float> gate_up;              // gemm(a, w) [m, 2 im], decoded
    std::vector<std::uint8_t> act_by_steps;  // launch_silu_mul_pairs of that gate_up, raw
  };
  TwoSteps run_both(CudaBackend& be, const GemmSiluMulCase& c, std::size_t lead, std::size_t act_lead) {
    const DeviceTensor a(be, c.a, lead), w(be, c.w, lead);
    GuardedOutput workspace(be, dt(), c.m * 2 * c.im, lead), act(be, dt(), c.m * c.im, act_lead);
    be.gemm_silu_mul(a.view(), w.view(), workspace.view(), act.view(), c.m, c.im, c.k);
    GuardedOutput gate_up(be, dt(), c.m * 2 * c.im, lead), act_by_steps(be, dt(), c.m * c.im, act_lead);
    be.gemm(a.view(), w.view(), gate_up.view(), c.m, 2 * c.im, c.k);
    kernels::launch_silu_mul_pairs("gemm_silu_mul", dt(), gate_up.view().data(), act_by_steps.view().data(),
                                   static_cast<long long>(c.m * c.im), be.stream());
    be.synchronize();
    for (GuardedOutput* out : {&workspace, &act, &gate_up, &act_by_steps}) EXPECT_TRUE(out->check_guard());
    return {act.values(), act.bytes(), gate_up.values(), act_by_steps.bytes()};
  }

  // 1. act bitwise its two steps; 2. the GEMM step against CpuBackend's gemm
  // (gemm tolerance); 3. act against fp64 silu·mul of that same gate_up.
  void expect_composition(CudaBackend& be, const GemmSiluMulCase& c, std::size_t lead, std::size_t act_lead) {
    SCOPED_TRACE(cat(describe(c), " lead=", lead, " act_lead=", act_lead));
    const TwoSteps r = run_both(be, c, lead, act_lead);
    EXPECT_TRUE(bitwise_equal(r.act_bytes, r.act_by_steps, size_of(dt())));
    const OpResult cpu_gemm = run(cpu(), GemmCase{c.m, 2 * c.im, c.k, c.a, c.w});
    EXPECT_TRUE(all_close(r.gate_up, cpu_gemm.at("out").values, dt(), op_scale::gemm(c.k)));
    std::vector<double> want(c.m * c.im);
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double g = r.gate_up[2 * i], u = r.gate_up[2 * i + 1];
      want[i] = ref::silu_mul(g, u);
    }
    EXPECT_TRUE(all_close(r.act, want, dt(), op_scale::kUnit));
  }
};

// Against the CPU, step by step. The op is gemm then silu·mul of the
// rounded pairs, so it is checked as that composition:
//  1. act is bitwise the silu·mul of the GPU's own gate_up (the fused
//     epilogue and the unfused path alike);
//  2. that gate_up matches CpuBackend's gemm within the gemm tolerance;
//  3. act matches fp64 silu·mul of the same rounded gate and up, within the
//     tolerance table.
// act is not compared with CpuBackend's act directly: the GPU accumulates in
// fp32 and the CPU in fp64, so a gate or up may round one ulp apart, and
// silu(g)·u moves by |u·silu'(g)| ulps of g, more than the two ulps the
// table allows act (measured on the H200: up to 0.003 against 0.0014 at f16).
TEST_P(CudaGemmSiluMul, MatchesItsStepsAndFp64) {
  FERRUM_SEEDED_RNG(rng);
  struct Shape {
    std::size_t im, k, lead, act_lead;
  };
  // lead 1: unaligned views (gemm via cuBLAS + the element-wise pairs
  // kernel); k = 769: k % 8 != 0 (the same); act_lead 1 alone: the fused
  // epilogue's store (m <= 2) or the pairs kernel's element-wise path.
  const Shape shapes[] = {{1, 8, 0, 0},     {3, 64, 0, 0},    {501, 4104, 0, 0}, {2050, 4096, 0, 0},
                          {67, 8192, 0, 0}, {501, 4104, 1, 1}, {67, 769, 0, 0},  {502, 4104, 0, 1}};
  for (const Shape& sh : shapes) {
    expect_composition(skinny(), make_gemm_silu_mul_case(rng, dt(), m(), sh.im, sh.k), sh.lead, sh.act_lead);
  }
}

// The same under the library's default dispatch (CudaBackendConfig{}) and
// with the skinny kernel off (gemm_skinny_max_m = 0: cuBLAS + the pairs
// kernel at every m).
TEST_P(CudaGemmSiluMul, DefaultAndCublasOnlyDispatch) {
  FERRUM_SEEDED_RNG(rng);
  CudaBackendConfig cublas_only;
  cublas_only.gemm_skinny_max_m = 0;
  CudaBackend defaults, no_skinny(cublas_only);
  for (CudaBackend* be : {&defaults, &no_skinny}) {
    SCOPED_TRACE(be == &defaults ? "default config" : "gemm_skinny_max_m = 0");
    expect_composition(*be, make_gemm_silu_mul_case(rng, dt(), m(), 2050, 4096), 0, 0);
    expect_composition(*be, make_gemm_silu_mul_case(rng, dt(), m(), 67, 8192), 0, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemmSiluMul, ::testing::ValuesIn(silu_mul_params()), skinny_param_name);

// The views the tests above hand to the backend are what the predicate sees:
// lead 0 is applicable, lead 1 is not (so FallsBack really tests cuBLAS).
class CudaGemmSkinnyViews : public CudaTest {};
TEST_F(CudaGemmSkinnyViews, LeadDecidesThePath) {
  FERRUM_SEEDED_RNG(rng);
  for (std::size_t lead : {std::size_t{0}, std::size_t{1}}) {
    const DeviceTensor a(cuda(), random_uniform(rng, DType::F16, 4 * 64), lead);
    const DeviceTensor b(cuda(), random_uniform(rng, DType::F16, 67 * 64), lead);
    EXPECT_EQ(kernels::gemm_skinny_applicable(DType::F16, a.view().data(), b.view().data(), 4, 67, 64), lead == 0)
        << "lead=" << lead;
  }
}

TEST_F(CudaGemmSkinnyViews, ConfigOutsideItsRangeIsRefused) {
  for (int bad : {-2, kernels::kSkinnyMaxM + 1}) {
    CudaBackendConfig config;
    config.gemm_skinny_max_m = bad;
    expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(config); }, "gemm_skinny_max_m");
  }
}

// The default policy (gemm_skinny_max_m = -1) reaches the launch on the
// device: on the shapes of its table, the default backend launches the
// skinny kernel exactly where gemm_skinny_default says (read from a captured
// graph's kernel names), so its cuBLAS branches (n >= 2k below 16k at
// m = 3..8, the large m <= 2 weights, m > 8) run cuBLAS.
TEST_F(CudaGemmSkinnyViews, TheDefaultPolicyReachesTheLaunch) {
  struct Shape {
    DType dt;
    std::size_t m, n, k;
  };
  // (16400 x 1024 at m = 8: n >= 16 k, the lm_head's side of the rule, at a
  // small weight.)
  const Shape shapes[] = {{DType::F16, 1, 8192, 8192},   {DType::BF16, 1, 8192, 8192},  {DType::F16, 2, 16384, 8192},
                          {DType::F16, 4, 4096, 4096},   {DType::BF16, 4, 14336, 4096}, {DType::F16, 8, 16400, 1024},
                          {DType::F16, 16, 4096, 4096}};
  auto& be = dynamic_cast<CudaBackend&>(cuda());  // CudaBackendConfig's defaults
  for (const Shape& s : shapes) {
    SCOPED_TRACE(cat(to_string(s.dt), " m=", s.m, " n=", s.n, " k=", s.k));
    const Buffer a = be.alloc(s.dt, s.m * s.k), b = be.alloc(s.dt, s.n * s.k);
    Buffer out = be.alloc(s.dt, s.m * s.n);
    const std::vector<CapturedLaunch> launches = captured_launches(be, [&] { be.gemm(a, b, out, s.m, s.n, s.k); });
    const bool skinny = kernels::gemm_skinny_default(s.dt, static_cast<long long>(s.m), static_cast<long long>(s.n),
                                                     static_cast<long long>(s.k));
    EXPECT_EQ(launched(launches, "gemm_skinny_"), skinny) << describe_launches(launches);
    EXPECT_FALSE(launches.empty());
  }
}

// ── Host only: the dispatch predicate and the default policy ────────────────────────────────────────

TEST(GemmSkinnyApplicable, Rules) {
  const auto* aligned = reinterpret_cast<const void*>(std::uintptr_t{0x10000});
  const auto* aligned_too = reinterpret_cast<const void*>(std::uintptr_t{0x20010});
  const auto* off2 = reinterpret_cast<const void*>(std::uintptr_t{0x10002});
  const auto* off8 = reinterpret_cast<const void*>(std::uintptr_t{0x10008});
  using kernels::gemm_skinny_applicable;
  EXPECT_TRUE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 1, 1, 8));
  EXPECT_TRUE(gemm_skinny_applicable(DType::BF16, aligned, aligned_too, 8, 1001, 8192));
  EXPECT_TRUE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, kernels::kSkinnyMaxM, 128256, 4096));
  // m outside [1, 16]
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 0, 67, 64));
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 17, 67, 64));
  EXPECT_TRUE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 16, 67, 64));
  // k % 8 != 0
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 1, 67, 4100));
  EXPECT_FALSE(gemm_skinny_applicable(DType::BF16, aligned, aligned_too, 1, 67, 769));
  // a or b not 16-byte aligned
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, off2, aligned_too, 1, 67, 64));
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, off2, 1, 67, 64));
  EXPECT_FALSE(gemm_skinny_applicable(DType::BF16, off8, aligned_too, 1, 67, 64));
  // dtypes other than f16 / bf16
  EXPECT_FALSE(gemm_skinny_applicable(DType::F32, aligned, aligned_too, 1, 67, 64));
  // empty or past 32-bit sizes
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 1, 0, 64));
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 1, 67, 0));
  EXPECT_FALSE(gemm_skinny_applicable(DType::F16, aligned, aligned_too, 1, 1LL << 31, 64));
}

}  // namespace
}  // namespace ferrum::test

namespace ferrum::test {
namespace {

// The measured default (kernels/gemm_skinny.hpp): skinny for m <= 2 except
// at k >= 8192 with n >= 16384 (f16) or n >= 8192 (bf16), where cuBLAS's GEMV
// measured faster; for m = 3..8 except where n / k lies in [2, 16).
TEST(GemmSkinnyDefault, FollowsTheMeasuredTable) {
  using kernels::gemm_skinny_default;
  for (DType dt : {DType::F16, DType::BF16}) {
    for (long long m : {1LL, 2LL}) {
      EXPECT_TRUE(gemm_skinny_default(dt, m, 14336, 4096));
      EXPECT_TRUE(gemm_skinny_default(dt, m, 128256, 4096));
      EXPECT_TRUE(gemm_skinny_default(dt, m, 4096, 14336));
      EXPECT_FALSE(gemm_skinny_default(dt, m, 28672, 8192));
    }
    for (long long m : {3LL, 4LL, 8LL}) {
      EXPECT_TRUE(gemm_skinny_default(dt, m, 4096, 4096));
      EXPECT_TRUE(gemm_skinny_default(dt, m, 4096, 14336));
      EXPECT_TRUE(gemm_skinny_default(dt, m, 128256, 4096));
      EXPECT_TRUE(gemm_skinny_default(dt, m, 8192, 8192));
      EXPECT_FALSE(gemm_skinny_default(dt, m, 14336, 4096));
    }
    EXPECT_FALSE(gemm_skinny_default(dt, 0, 4096, 4096));
    EXPECT_FALSE(gemm_skinny_default(dt, 9, 4096, 4096));
    EXPECT_FALSE(gemm_skinny_default(dt, 16, 4096, 4096));
  }
  // 8192 x 8192 at m <= 2: f16 keeps the skinny kernel (1.07x cuBLAS), bf16 takes cuBLAS.
  for (long long m : {1LL, 2LL}) {
    EXPECT_TRUE(gemm_skinny_default(DType::F16, m, 8192, 8192));
    EXPECT_FALSE(gemm_skinny_default(DType::BF16, m, 8192, 8192));
  }
}

}  // namespace
}  // namespace ferrum::test
