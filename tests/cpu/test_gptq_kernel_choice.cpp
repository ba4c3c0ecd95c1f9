// GptqKernel::Auto's rule (kernels/gptq_gemm.hpp, gptq_kernel_for) and the
// cluster reduce's (gptq_cluster_reduces), shared by the launcher, CudaBackend
// and bench_gptq: pure host functions, so they are checked here
// on every machine; the GPU tests check that CudaBackend follows it
// (CudaGptqStream.AutoTakesTheBulkStreamingKernelUpToSixteenRows).
#include <gtest/gtest.h>

#include "kernels/gptq_gemm.hpp"

namespace ferrum::test {
namespace {

using kernels::GptqKernelKind;
using kernels::gptq_kernel_for;

TEST(GptqKernelChoice, AutoTakesTheBulkSourceUpToSixteenRowsWhereBulkCopiesRun) {
  for (int rows = 1; rows <= kernels::kGptqMaxM; ++rows) {
    SCOPED_TRACE(rows);
    EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::Fused, rows, true),
              rows <= kernels::kGptqStreamMaxM ? GptqKernelKind::StreamBulk : GptqKernelKind::Fused);
  }
}

// Without bulk copies (below sm_90) Auto keeps the register source's range.
TEST(GptqKernelChoice, AutoWithoutBulkCopiesTakesTheRegisterSourceUpToEightRows) {
  for (int rows = 1; rows <= kernels::kGptqMaxM; ++rows) {
    SCOPED_TRACE(rows);
    EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::StreamBulk, rows, false),
              rows <= 8 ? GptqKernelKind::Stream : GptqKernelKind::Fused);
  }
}

TEST(GptqKernelChoice, ANamedKernelIsTakenAsIs) {
  for (GptqKernelKind kind : {GptqKernelKind::Fused, GptqKernelKind::Stream, GptqKernelKind::StreamBulk}) {
    for (bool bulk : {false, true}) {
      for (int rows : {1, 9, 16, 17, 64}) EXPECT_EQ(gptq_kernel_for(false, kind, rows, bulk), kind);
    }
  }
}

// The cluster reduce (CudaBackendConfig::gptq_cluster_reduce) takes the
// bulk source's launches of 2 .. kGptqClusterMaxSplits splits and at most
// kGptqClusterMaxCtasPerSm CTAs per SM, only when asked for; one split needs
// no reduction, more than a portable cluster or a launch past one wave
// keeps the workspace. The GPU test
// CudaGptqStreamBulk.ClusterReduceGivesTheWorkspaceReductionsBits runs it.
TEST(GptqKernelChoice, ClusterReduceTakesTwoToEightSplitsOfOneWaveWhenAskedFor) {
  constexpr int kSms = 132;
  for (int splits = 1; splits <= 16; ++splits) {
    SCOPED_TRACE(splits);
    const long long ctas = 64LL * splits;  // a 4096-column weight
    EXPECT_FALSE(kernels::gptq_cluster_reduces(false, splits, ctas, kSms));
    const bool fits = 64LL * splits <= 3LL * kSms;
    EXPECT_EQ(kernels::gptq_cluster_reduces(true, splits, ctas, kSms),
              splits >= 2 && splits <= kernels::kGptqClusterMaxSplits && fits);
  }
  // The measured boundary on the H200's 132 SMs: 384 CTAs (4096 x 6144 in
  // 4 splits) cluster, 512 (8192 x 8192 in 4) do not.
  EXPECT_TRUE(kernels::gptq_cluster_reduces(true, 4, 96 * 4, kSms));
  EXPECT_FALSE(kernels::gptq_cluster_reduces(true, 4, 128 * 4, kSms));
  EXPECT_EQ(kernels::kGptqClusterMaxSplits, 8);  // the portable cluster size
}

// The crossover to dequantize + cuBLAS (CudaBackend::gemm_gptq; its GPU
// tests run both sides of it): at the shapes measured on the H200, then
// monotone in the weight count, never below the m <= 32 configuration (which
// won at every shape), one step lower with act-order.
TEST(GptqKernelChoice, FusedKernelsUpToTheMeasuredCrossover) {
  using kernels::gptq_fused_max_m;
  EXPECT_EQ(gptq_fused_max_m(4096, 4096, false), 32u);
  EXPECT_EQ(gptq_fused_max_m(4096, 6144, false), 48u);
  EXPECT_EQ(gptq_fused_max_m(14336, 4096, false), 96u);
  EXPECT_EQ(gptq_fused_max_m(4096, 14336, false), 96u);
  EXPECT_EQ(gptq_fused_max_m(8192, 8192, false), 128u);
  EXPECT_EQ(gptq_fused_max_m(4096, 28672, false), 192u);
  EXPECT_EQ(gptq_fused_max_m(8192, 28672, false), 192u);
  EXPECT_EQ(gptq_fused_max_m(8192, 8192, true), 96u);
  EXPECT_EQ(gptq_fused_max_m(4096, 4096, true), 32u);
  EXPECT_EQ(gptq_fused_max_m(8, 8, false), 32u);
  std::size_t last = 0;
  for (std::size_t k = 128; k <= 65536; k *= 2) {
    for (std::size_t n = 64; n <= 65536; n *= 2) {
      const std::size_t m = gptq_fused_max_m(k, n, false);
      EXPECT_GE(m, 32u);
      EXPECT_LE(gptq_fused_max_m(k, n, true), m);
      if (n == k) {
        EXPECT_GE(m, last) << k;  // square weights of growing size
        last = m;
      }
    }
  }
}

}  // namespace
}  // namespace ferrum::test
