// GptqKernel::Auto's rule (kernels/gptq_gemm.hpp, gptq_kernel_for) and the
// cluster reduce's (gptq_cluster_reduces), shared by the launcher, CudaBackend
// and bench_gptq: pure host functions, so they are checked here
// on every machine; the GPU tests check that CudaBackend follows it
// (CudaGptqStream.AutoTakesTheBulkStreamingKernelUpToSixteenRows,
// CudaGptqWgmma.AutoTakesTheWgmmaKernelFromNineRowsOnWideWeights,
// CudaGptqWgmma.AutoTakesTheWgmmaKernelOnWeightsOfFourThousandColumns,
// CudaGptqWgmma.AutoTakesTheWgmmaKernelFromSeventeenRowsOnDeepNarrowWeights and
// CudaGptqWgmma.AutoTakesTheWgmmaKernelFromNineRowsOnShallowNarrowWeights).
#include <gtest/gtest.h>

#include "kernels/gptq_gemm.hpp"

namespace ferrum::test {
namespace {

using kernels::GptqKernelKind;
using kernels::gptq_kernel_for;

// On a deep narrow weight (8192 x 2048) Auto takes the bulk source up to 16 rows,
// then the wgmma kernel where it applies (sm_90a build, 9.0 device), else the
// fused kernel.
TEST(GptqKernelChoice, AutoTakesTheBulkSourceUpToSixteenRowsWhereBulkCopiesRun) {
  for (bool wgmma : {false, true}) {
    const GptqKernelKind large = wgmma ? GptqKernelKind::Wgmma : GptqKernelKind::Fused;
    for (int rows = 1; rows <= kernels::kGptqMaxM; ++rows) {
      SCOPED_TRACE(rows);
      EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::Fused, rows, 8192, 2048, true, wgmma),
                rows <= kernels::kGptqStreamMaxM ? GptqKernelKind::StreamBulk : large);
    }
  }
}

// On a wide weight (n >= 6144) the wgmma kernel, where it applies, takes
// over from the streaming kernel at 9 rows.
TEST(GptqKernelChoice, AutoTakesTheWgmmaKernelFromNineRowsOnWideWeights) {
  for (std::size_t n : {6144, 14336, 28672}) {
    for (int rows = 1; rows <= kernels::kGptqMaxM; ++rows) {
      SCOPED_TRACE(testing::Message() << rows << " rows, n = " << n);
      EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::Fused, rows, 4096, n, true, true),
                rows < 9 ? GptqKernelKind::StreamBulk : GptqKernelKind::Wgmma);
      EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::Fused, rows, 4096, n, true, false),
                rows <= kernels::kGptqStreamMaxM ? GptqKernelKind::StreamBulk : GptqKernelKind::Fused);
    }
  }
}

// Without bulk copies (below sm_90, or groups of 16 rows) Auto keeps the
// register source's range, then the fused kernel to 16 rows on a narrow
// weight (8192 x 2048); the wgmma kernel takes only what gptq_wgmma_preferred gives it.
TEST(GptqKernelChoice, AutoWithoutBulkCopiesTakesTheRegisterSourceUpToEightRows) {
  for (bool wgmma : {false, true}) {
    for (int rows = 1; rows <= kernels::kGptqMaxM; ++rows) {
      SCOPED_TRACE(testing::Message() << rows << " rows, wgmma " << wgmma);
      const GptqKernelKind want = rows <= kernels::kGptqRegisterStreamAutoMaxM ? GptqKernelKind::Stream
                                  : rows <= kernels::kGptqStreamMaxM ? GptqKernelKind::Fused
                                  : wgmma                            ? GptqKernelKind::Wgmma
                                                                     : GptqKernelKind::Fused;
      EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::StreamBulk, rows, 8192, 2048, false, wgmma), want);
      EXPECT_EQ(gptq_kernel_for(true, GptqKernelKind::StreamBulk, rows, 4096, 14336, false, wgmma),
                wgmma && rows >= 9 ? GptqKernelKind::Wgmma : want);
    }
  }
}

TEST(GptqKernelChoice, ANamedKernelIsTakenAsIs) {
  for (GptqKernelKind kind :
       {GptqKernelKind::Fused, GptqKernelKind::Stream, GptqKernelKind::StreamBulk, GptqKernelKind::Wgmma}) {
    for (bool bulk : {false, true}) {
      for (bool wgmma : {false, true}) {
        for (int rows : {1, 9, 16, 17, 64}) {
          EXPECT_EQ(gptq_kernel_for(false, kind, rows, 4096, 14336, bulk, wgmma), kind);
        }
      }
    }
  }
}

// The wgmma kernel's plan: 256 columns per CTA, splits along k from one
// wave of the device's slots, none of them empty; a pure function of the
// sizes on a machine without the kernel (two CTAs per SM assumed, and SMs /
// s clusters of s at one CTA per SM), at most kGptqClusterMaxSplits (a
// cluster sums them).
TEST(GptqKernelChoice, WgmmaPlanFillsOneWaveWithNoEmptySplit) {
  struct Case {
    int k_pad, n_pad, n_ctas, splits;
  };
  if (kernels::gptq_wgmma_supported()) GTEST_SKIP() << "the plan below assumes 2 CTAs per SM (no wgmma device)";
  for (const Case c : {Case{8192, 8192, 32, 8}, Case{8192, 28672, 112, 2}, Case{4096, 4096, 16, 8},
                       Case{14336, 4096, 16, 8}, Case{4096, 14336, 56, 4}, Case{128, 64, 1, 2}}) {
    SCOPED_TRACE(testing::Message() << c.k_pad << " x " << c.n_pad);
    const kernels::GptqPlan plan = kernels::gptq_wgmma_plan(c.k_pad, c.n_pad, 132);
    EXPECT_EQ(plan.block_n, 256);
    EXPECT_EQ(plan.n_ctas, c.n_ctas);
    EXPECT_EQ(plan.splits, c.splits);
    const int stages = c.k_pad / 64;
    const int per_split = (stages + plan.splits - 1) / plan.splits;
    EXPECT_LT((plan.splits - 1) * per_split, stages);  // the last split owns a stage
  }
}

// On a wgmma device the splits come from how many clusters of each size it
// holds at once (cudaOccupancyMaxActiveClusters): the most whose clusters
// all fit in one wave, or down to 3/4 of that many where those fit with no
// two CTAs on one SM. The counts below are the H200's: for this kernel at
// two CTAs per SM (session 19, where 8192 x 8192 at 8 splits, 32 clusters of
// 8 with 30 resident, measured 47.4 us at m = 64 against 31.9 at 7), and
// at one CTA per SM (session 47, where 16 column groups at 6 splits beat 8
// by 6-14 %).
TEST(GptqKernelChoice, WgmmaSplitsAreTheMostOfOneWaveOrFewerWhereTheyFitOneCtaPerSm) {
  const kernels::GptqClusterCounts h200 = {0, 264, 132, 79, 62, 47, 39, 32, 30};
  const kernels::GptqClusterCounts h200_single = {0, 132, 66, 39, 30, 22, 17, 15, 15};
  struct Case {
    int n_ctas, stages, splits;
  };
  for (const Case c : {Case{32, 128, 7}, Case{112, 128, 2}, Case{56, 64, 4}, Case{16, 224, 6}, Case{24, 64, 8},
                       Case{16, 64, 6}, Case{14, 64, 8}, Case{40, 64, 5}, Case{132, 64, 2}, Case{133, 64, 1},
                       Case{300, 64, 1}, Case{16, 3, 3}, Case{1, 1, 1}}) {
    SCOPED_TRACE(testing::Message() << c.n_ctas << " column groups, " << c.stages << " stages");
    EXPECT_EQ(kernels::gptq_wgmma_splits(c.n_ctas, c.stages, h200, h200_single), c.splits);
  }
  // Fewer splits only down to 3/4 of the most, and only where they fit one
  // CTA per SM: with every size fitting so, the most stays.
  const kernels::GptqClusterCounts roomy = {0, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000};
  EXPECT_EQ(kernels::gptq_wgmma_splits(16, 64, h200, roomy), 8);
  const kernels::GptqClusterCounts only_four = {0, 1000, 1000, 1000, 1000, 0, 0, 0, 0};
  EXPECT_EQ(kernels::gptq_wgmma_splits(16, 64, h200, only_four), 8);  // 4 < 3/4 of 8
  const kernels::GptqClusterCounts only_six = {0, 1000, 1000, 1000, 1000, 1000, 1000, 0, 0};
  EXPECT_EQ(kernels::gptq_wgmma_splits(16, 64, h200, only_six), 6);
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
// tests run both sides of it), for the fused kernel (session 16) and the
// wgmma kernel (session 17): at the shapes measured on the H200, then
// monotone in the weight count, never below 32 (the fused kernel's m <= 32
// configuration won at every shape), one step lower with act-order, and the
// wgmma kernel's never below the fused kernel's.
TEST(GptqKernelChoice, FusedKernelsUpToTheMeasuredCrossover) {
  using kernels::gptq_fused_max_m;
  EXPECT_EQ(gptq_fused_max_m(4096, 4096, false, false), 32u);
  EXPECT_EQ(gptq_fused_max_m(4096, 6144, false, false), 48u);
  EXPECT_EQ(gptq_fused_max_m(14336, 4096, false, false), 96u);
  EXPECT_EQ(gptq_fused_max_m(4096, 14336, false, false), 96u);
  EXPECT_EQ(gptq_fused_max_m(8192, 8192, false, false), 128u);
  EXPECT_EQ(gptq_fused_max_m(4096, 28672, false, false), 192u);
  EXPECT_EQ(gptq_fused_max_m(8192, 28672, false, false), 192u);
  EXPECT_EQ(gptq_fused_max_m(8192, 8192, true, false), 96u);
  EXPECT_EQ(gptq_fused_max_m(4096, 4096, true, false), 32u);
  EXPECT_EQ(gptq_fused_max_m(8, 8, false, false), 32u);
  EXPECT_EQ(gptq_fused_max_m(4096, 4096, false, true), 96u);
  EXPECT_EQ(gptq_fused_max_m(4096, 6144, false, true), 128u);
  EXPECT_EQ(gptq_fused_max_m(14336, 4096, false, true), 128u);
  EXPECT_EQ(gptq_fused_max_m(4096, 14336, false, true), 128u);
  EXPECT_EQ(gptq_fused_max_m(8192, 8192, false, true), 192u);
  EXPECT_EQ(gptq_fused_max_m(4096, 28672, false, true), 256u);
  EXPECT_EQ(gptq_fused_max_m(8192, 28672, false, true), 256u);
  EXPECT_EQ(gptq_fused_max_m(8192, 8192, true, true), 128u);
  EXPECT_EQ(gptq_fused_max_m(4096, 4096, true, true), 96u);
  for (bool wgmma : {false, true}) {
    std::size_t last = 0;
    for (std::size_t k = 128; k <= 65536; k *= 2) {
      for (std::size_t n = 64; n <= 65536; n *= 2) {
        const std::size_t m = gptq_fused_max_m(k, n, false, wgmma);
        EXPECT_GE(m, 32u);
        EXPECT_LE(gptq_fused_max_m(k, n, true, wgmma), m);
        if (wgmma) EXPECT_GE(m, gptq_fused_max_m(k, n, false, false));
        if (n == k) {
          EXPECT_GE(m, last) << k;  // square weights of growing size
          last = m;
        }
      }
    }
  }
}

// Where Auto prefers the wgmma kernel (sessions 46, 47 and 48): never up to
// 8 rows; at 9 .. 16 rows by column groups of kGptqWgmmaBlockN columns (12
// and more except 16; 16 where k <= 8192 or at 16 rows; 8 .. 11 where k <=
// 4096; 4 .. 7 where k <= 3072; never below 4); above 16 rows everywhere.
TEST(GptqKernelChoice, WgmmaPreferredWhereItMeasuredFaster) {
  using kernels::gptq_wgmma_preferred;
  struct Shape {
    std::size_t k, n;
    bool from_nine;  // the wgmma kernel at 9 .. 15 rows
    bool at_sixteen;
  };
  for (const Shape& s : {Shape{8192, 28672, true, true}, Shape{4096, 28672, true, true},
                         Shape{4096, 14336, true, true}, Shape{14336, 4096, false, true},
                         Shape{8192, 8192, true, true}, Shape{4096, 4096, true, true}, Shape{8192, 4096, true, true},
                         Shape{4096, 6144, true, true}, Shape{14336, 3840, true, true}, Shape{14336, 4352, true, true},
                         Shape{8192, 5120, true, true}, Shape{14336, 3072, true, true}, Shape{8192, 2816, false, false},
                         Shape{4096, 2048, true, true}, Shape{8192, 2048, false, false}, Shape{3072, 1024, true, true},
                         Shape{2048, 1024, true, true}, Shape{4096, 1024, false, false},
                         Shape{14336, 1024, false, false}, Shape{1024, 512, false, false}}) {
    SCOPED_TRACE(testing::Message() << s.k << " x " << s.n);
    for (int rows : {1, 4, 8}) EXPECT_FALSE(gptq_wgmma_preferred(rows, s.k, s.n));
    for (int rows : {9, 12, 15}) EXPECT_EQ(gptq_wgmma_preferred(rows, s.k, s.n), s.from_nine);
    EXPECT_EQ(gptq_wgmma_preferred(16, s.k, s.n), s.at_sixteen);
    for (int rows : {17, 32, 33, 48, 64}) EXPECT_TRUE(gptq_wgmma_preferred(rows, s.k, s.n));
  }
  // The edges of the column groups (256 columns each) and of k.
  EXPECT_TRUE(gptq_wgmma_preferred(9, 14336, 2817));   // 12 groups
  EXPECT_FALSE(gptq_wgmma_preferred(9, 14336, 2816));  // 11
  EXPECT_TRUE(gptq_wgmma_preferred(16, 14336, 3841));  // 16 groups: at 16 rows
  EXPECT_FALSE(gptq_wgmma_preferred(15, 14336, 4096));
  EXPECT_TRUE(gptq_wgmma_preferred(9, 14336, 4097));  // 17
  EXPECT_FALSE(gptq_wgmma_preferred(9, 14336, 3841)) << "16 groups at k > 8192 below 16 rows";
  EXPECT_TRUE(gptq_wgmma_preferred(9, 8192, 4096));
  EXPECT_FALSE(gptq_wgmma_preferred(9, 8200, 4096));
  EXPECT_TRUE(gptq_wgmma_preferred(16, 8200, 4096));
  EXPECT_TRUE(gptq_wgmma_preferred(9, 4096, 1793));   // 8 groups
  EXPECT_TRUE(gptq_wgmma_preferred(9, 4096, 2816));   // 11
  EXPECT_FALSE(gptq_wgmma_preferred(9, 4104, 2816));
  EXPECT_FALSE(gptq_wgmma_preferred(9, 4104, 1793));  // k past 4096
  EXPECT_FALSE(gptq_wgmma_preferred(9, 4096, 1792));  // 7 groups
  EXPECT_TRUE(gptq_wgmma_preferred(9, 3072, 1792));
  EXPECT_TRUE(gptq_wgmma_preferred(9, 3072, 769));   // 4 groups
  EXPECT_FALSE(gptq_wgmma_preferred(9, 3080, 769));  // k past 3072
  EXPECT_FALSE(gptq_wgmma_preferred(9, 3072, 768));  // 3 groups
  EXPECT_FALSE(gptq_wgmma_preferred(16, 1024, 256));
  EXPECT_TRUE(gptq_wgmma_preferred(17, 1024, 256));
  EXPECT_TRUE(gptq_wgmma_preferred(17, 65536, 64));
  EXPECT_FALSE(gptq_wgmma_preferred(8, 4096, 28672));
}

}  // namespace
}  // namespace ferrum::test
