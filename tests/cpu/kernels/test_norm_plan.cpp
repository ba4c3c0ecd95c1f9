// The norm launch plan (kernels/norm.hpp, norm_launch_plan): a pure host
// function, so it is checked here on every machine. Near 2^31 columns its
// int arithmetic once looped forever (next_pow2 doubling past INT_MAX) or
// wrapped to a plan covering 1024 elements of a longer row; near 2^31 rows
// it asked for a negative grid. The GPU tests check the kernels it picks.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include "kernels/norm.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using kernels::NormArgs;
using kernels::NormKind;
using kernels::NormLaunchPlan;

// Never dereferenced: the plan reads only their alignment.
void* fake_pointer(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

NormArgs args_for(NormKind kind, DType dtype, int rows, int dim, bool aligned) {
  NormArgs a;
  a.kind = kind;
  a.dtype = dtype;
  const std::uintptr_t base = aligned ? 0x10000 : 0x10002;
  a.x = fake_pointer(base);
  a.residual = fake_pointer(base);
  a.weight = fake_pointer(base);
  a.bias = fake_pointer(base);
  a.out = fake_pointer(base);
  a.rows = rows;
  a.dim = dim;
  a.eps = 1e-6f;
  a.num_sms = 132;
  return a;
}

// Every plan covers its rows and its row's columns within the grid's and the
// block's limits, and holds at most 8 vectors per thread in registers.
TEST(NormPlan, EverySizeHasABoundedPlanThatCoversTheRow) {
  for (NormKind kind : {NormKind::Rms, NormKind::AddRms, NormKind::Layer}) {
    for (DType dtype : {DType::F16, DType::BF16}) {
      for (bool aligned : {true, false}) {
        for (int rows : {1, 7, 83, 4096, 32768, INT_MAX}) {
          for (int dim : {1, 8, 769, 4096, 5120, 65536, 65544, 1 << 20, 1000003, kernels::kNormMaxDim}) {
            SCOPED_TRACE(cat("kind ", static_cast<int>(kind), " ", to_string(dtype), aligned ? " aligned" : "",
                             " rows ", rows, " dim ", dim));
            const NormLaunchPlan p = kernels::norm_launch_plan(args_for(kind, dtype, rows, dim, aligned));
            EXPECT_EQ(p.wide, aligned && dim % 8 == 0);
            EXPECT_GE(p.blocks, 1);
            EXPECT_GE(p.threads, 32);
            EXPECT_LE(p.threads, 1024);
            EXPECT_GE(p.group, 1);
            EXPECT_EQ(p.group & (p.group - 1), 0) << "a power of two: norm_rows_kernel shifts by it";
            EXPECT_EQ(p.threads % p.group, 0);
            const long long rows_per_block = p.threads / p.group;
            EXPECT_GE(static_cast<long long>(p.blocks) * rows_per_block, rows);
            if (!p.row_loop) {
              EXPECT_LE(p.vectors_per_thread, 8);
              EXPECT_GE(p.vectors_per_thread * p.group * (p.wide ? 8 : 1), dim);
            } else {
              EXPECT_EQ(p.blocks, rows);  // a block per row, looping over it
            }
          }
        }
      }
    }
  }
}

// Past kernels::kNormMaxDim: a named Unsupported, not a plan.
TEST(NormPlan, RowsPastTheLimitAreNamed) {
  for (int dim : {kernels::kNormMaxDim + 1, INT_MAX - 2, INT_MAX}) {
    SCOPED_TRACE(dim);
    expect_error(ErrorCode::Unsupported, "rms_norm",
                 [&] { (void)kernels::norm_launch_plan(args_for(NormKind::Rms, DType::F16, 1, dim, false)); }, "dim");
  }
}

}  // namespace
}  // namespace ferrum::test
