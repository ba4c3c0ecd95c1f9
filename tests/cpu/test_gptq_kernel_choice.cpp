// GptqKernel::Auto's rule (kernels/gptq_gemm.hpp, gptq_kernel_for), shared
// by CudaBackend and bench_gptq: a pure host function, so it is checked here
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

}  // namespace
}  // namespace ferrum::test
