// The decode's tail-free slices-per-block rule (kernels/attention.hpp,
// tail_free_slices_per_block, the default): a pure host function, checked
// here on every machine against the choices the H200 sweeps of sessions 31
// and 32 ask for (132 SMs, 2 blocks per SM at hd 128; 8 kv heads, so B
// sequences are 8 B rows). The GPU tests check that every choice gives the
// same bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "ferrum/cuda_backend.hpp"
#include "kernels/attention.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using kernels::attention_decode_slice_keys;
using kernels::attention_decode_splits;
using kernels::default_slices_per_block;
using kernels::kTailFreeBlockKeys;
using kernels::tail_free_slices_per_block;

constexpr long long kSms = 132, kSlots = 264, kKvHeads = 8;

// What the launcher takes (default_slices_per_block) for B sequences of a
// cache of `capacity` positions; old_rules: DecodeTuning::tail_free_slices
// false.
int choice(long long batch, long long capacity, bool old_rules = false) {
  return default_slices_per_block(batch * kKvHeads, attention_decode_splits(capacity),
                                  attention_decode_slice_keys(capacity), kSlots, kSms, !old_rules);
}

// Each row: what the H200 sweeps measured (µs, explicit slices per block;
// session 32's `gpu_suite.sh decodesweep`, the mean of two passes, and
// session 31's calls 4 and 5, one run each, marked s31): the rule's choice
// is the fastest or within 2.2 % of it. "90 %": the rule it replaced.
TEST(DecodePlan, TailFreeRuleMatchesTheH200Sweep) {
  EXPECT_EQ(choice(3, 8192), 2);     // 33.9, the fastest; 90 %: 1 (35.4)
  EXPECT_EQ(choice(6, 8192), 4);     // 59.5, the fastest; 90 %: 2 (61.3)
  EXPECT_EQ(choice(10, 8192), 8);    // 95.7; 1: 94.8; 90 %: 4 (111.5: 320 blocks, last wave 56)
  EXPECT_EQ(choice(12, 8192), 8);    // 112.4, the fastest; 90 %: 4 (118.6: 384 blocks, last wave 120)
  EXPECT_EQ(choice(14, 8192), 8);    // 128.6; 90 %: 4 (127.2, the fastest)
  EXPECT_EQ(choice(16, 8192), 8);    // s31 142.2, the fastest, as the 90 % rule
  EXPECT_EQ(choice(18, 8192), 1);    // 160.7, the fastest; 90 %: 8 (209.9); 16: 175.4
  EXPECT_EQ(choice(24, 8192), 4);    // 207.1; 1: 206.2; 90 %: 8 (223.2)
  EXPECT_EQ(choice(32, 8192), 8);    // s31 267.3; 90 %: 16 (263.1, the fastest)
  EXPECT_EQ(choice(12, 12288), 1);   // 159.3, the fastest; 90 %: 4 (195.5)
  EXPECT_EQ(choice(20, 12288), 4);   // 248.4; 2: 248.0; 90 %: 8 (302.5, unequal blocks of 8 and 4 slices)
  EXPECT_EQ(choice(16, 16384), 4);   // s31 262.8; 90 %: 8 (259.4, the fastest)
  EXPECT_EQ(choice(18, 16384), 1);   // 291.4, the fastest; 90 %: 8 (377.4)
  EXPECT_EQ(choice(10, 32768), 1);   // 317.5, the fastest; 90 %: 4 (389.2)
  EXPECT_EQ(choice(12, 32768), 2);   // 380.7; 1: 379.8; 90 %: 4 (404.1)
  EXPECT_EQ(choice(16, 32768), 2);   // 498.4; 90 %: 8 (497.8, the fastest)
  EXPECT_EQ(choice(30, 32768), 1);   // 918.0, the fastest; 90 %: 16 (949.6)
  EXPECT_EQ(choice(10, 131072), 1);  // 1206.0, the fastest; 90 %: 4 (1475.2)
  EXPECT_EQ(choice(16, 131072), 1);  // 1936.9; 90 %: 8 (1915.0, the fastest)
  EXPECT_EQ(choice(20, 131072), 1);  // 2425.0; 2: 2405.5; 90 %: 8 (2970.9)
  // A batch of one keeps a block per slice; small batches as measured.
  EXPECT_EQ(choice(1, 131072), 1);
  EXPECT_EQ(choice(1, 8192), 1);
  EXPECT_EQ(choice(2, 8192), 1);
  EXPECT_EQ(choice(4, 8192), 2);
  EXPECT_EQ(choice(8, 8192), 4);
}

// The slice rule: the smallest power-of-two multiple of 128 keys that cuts
// the capacity into at most 16 slices.
TEST(DecodePlan, SlicesDependOnTheCapacityAlone) {
  EXPECT_EQ(attention_decode_slice_keys(1), 128);
  EXPECT_EQ(attention_decode_slice_keys(2048), 128);
  EXPECT_EQ(attention_decode_slice_keys(2049), 256);
  EXPECT_EQ(attention_decode_slice_keys(4096), 256);
  EXPECT_EQ(attention_decode_slice_keys(4097), 512);
  EXPECT_EQ(attention_decode_slice_keys(131072), 8192);
  EXPECT_EQ(attention_decode_splits(4096), 16);
  EXPECT_EQ(attention_decode_splits(2049), 9);
  for (long long capacity = 1; capacity <= (1LL << 20); capacity = capacity * 3 / 2 + 1) {
    const long long keys = attention_decode_slice_keys(capacity);
    const int splits = attention_decode_splits(capacity);
    EXPECT_GE(splits, 1) << "capacity " << capacity;
    EXPECT_LE(splits, kernels::kAttnDecodeMaxSplits) << "capacity " << capacity;
    EXPECT_EQ(keys & (keys - 1), 0) << "capacity " << capacity << ": a power of two";
    EXPECT_TRUE(keys == kernels::kAttnDecodeMinSliceKeys || (keys / 2) * kernels::kAttnDecodeMaxSplits < capacity)
        << "capacity " << capacity << ": the smallest slice that fits";
  }
}

// Short caches (128-key slices: capacities up to 2048; at 4096 they were 32
// slices of 128 keys until session 35), session 32's second sweep (µs, mean
// of two passes). "Old": the rule it replaced (up to 1024 keys per block
// while the launch keeps half a block per slot).
TEST(DecodePlan, TailFreeRuleMatchesTheH200SweepOfShortCaches) {
  EXPECT_EQ(choice(1, 1024), 1);    // a block per slice at B = 1 (latency)
  EXPECT_EQ(choice(2, 1024), 1);    // 9.6, the fastest, as the old rule
  EXPECT_EQ(choice(8, 1024), 2);    // 16.8, the fastest, as the old rule
  EXPECT_EQ(choice(16, 1024), 4);   // 26.1, the fastest, as the old rule (8: 128 blocks on 132 SMs)
  EXPECT_EQ(choice(48, 1024), 4);   // 68.4, the fastest; old: 8 (74.8: 384 blocks, last wave 120)
  EXPECT_EQ(choice(64, 1024), 8);   // 80.3, the fastest, as the old rule
  EXPECT_EQ(choice(4, 2048), 2);    // 16.9, the fastest, as the old rule
  EXPECT_EQ(choice(24, 2048), 16);  // 68.3; 4: 66.8; old: 8 (75.4)
  EXPECT_EQ(choice(32, 2048), 16);  // 78.1, the fastest; old: 8 (83.6)
  EXPECT_EQ(choice(48, 2048), 8);   // 122.3, the fastest, as the old rule (16: 384 blocks, last wave 120)
  EXPECT_EQ(choice(64, 2048), 16);  // 151.5, the fastest; old: 8 (159.1)
}

// A 4096-position cache: 16 slices of 256 keys, session 35's slicegeom
// sweep of them (µs, mean of two passes; "128": the default launch of the
// 32 slices of 128 keys before, in the same call).
TEST(DecodePlan, TailFreeRuleMatchesTheH200SweepOf256KeySlices) {
  EXPECT_EQ(choice(1, 4096), 1);   // 11.3, the fastest; 128: 11.5
  EXPECT_EQ(choice(4, 4096), 2);   // 23.4, the fastest; 128: 25.0
  EXPECT_EQ(choice(8, 4096), 4);   // 40.9, the fastest; 128: 42.8
  EXPECT_EQ(choice(16, 4096), 8);  // 75.3, the fastest; 128: 77.5
  EXPECT_EQ(choice(32, 4096), 8);  // 146.3; 16: 143.7; 128: 153.5
  EXPECT_EQ(choice(64, 4096), 8);  // 278.9; 16: 275.4; 128: 289.2
}

// Capacities that are not a power-of-two count of slices (12288 positions:
// 12 slices of 1024 keys; 4224: 9 of 512): only a p dividing the slices is
// taken, so every block of a row holds the same number of slices.
TEST(DecodePlan, TailFreeRuleDividesTheSlices) {
  for (long long groups : {8LL, 80LL, 96LL, 112LL, 128LL, 200LL, 256LL}) {
    for (int splits = 9; splits <= 16; ++splits) {
      const int p = tail_free_slices_per_block(groups, splits, 1024, kSlots, kSms, kTailFreeBlockKeys);
      EXPECT_EQ(splits % p, 0) << "groups " << groups << " splits " << splits << ": p = " << p;
    }
  }
  EXPECT_EQ(attention_decode_splits(12288), 12);
  // 48 rows: 576 blocks (last wave 48 of 264), 288 at p = 2 (last 24), 144
  // at p = 4 (tail-free): 4, measured the fastest (86.5 µs; the 90 % rule's
  // 2: 104.0; 8, blocks of 8 and 4 slices: 132.4).
  EXPECT_EQ(choice(6, 12288), 4);
  EXPECT_EQ(attention_decode_splits(4224), 9);
  EXPECT_EQ(choice(12, 4224), 1);
}

// Short caches whose slice count is not a power of two keep the older rule
// (the tail-free one would have few or no divisors: 9 slices only one per
// block); the older rules as tail_free_slices = false gives them.
TEST(DecodePlan, ShortCachesOfOtherSliceCountsKeepTheOlderRule) {
  EXPECT_EQ(attention_decode_splits(1152), 9);
  EXPECT_EQ(choice(64, 1152), 8);  // 512 rows: 8 slices per block keep 1024 blocks, as the older rule
  EXPECT_EQ(attention_decode_splits(3072), 12);  // of 256 keys
  for (long long batch : {1LL, 4LL, 16LL, 48LL, 64LL}) {
    EXPECT_EQ(choice(batch, 3072), choice(batch, 3072, true)) << "B = " << batch;
    EXPECT_EQ(choice(batch, 1152), choice(batch, 1152, true)) << "B = " << batch;
  }
  // The older rules where the sweeps measured them.
  EXPECT_EQ(choice(64, 1024, true), 8);
  EXPECT_EQ(choice(48, 1024, true), 8);
  EXPECT_EQ(choice(16, 2048, true), 8);  // session 35: 42.2 (the tail-free 8: 42.3)
  EXPECT_EQ(choice(10, 8192, true), 4);
  EXPECT_EQ(choice(18, 8192, true), 8);
  EXPECT_EQ(choice(64, 8192, true), 1);
  EXPECT_EQ(choice(64, 8192), 1);  // at least a block per slot at one slice per block: one, both rules
  EXPECT_EQ(choice(40, 8192), 1);
}

TEST(DecodePlan, TailFreeRuleStaysInRange) {
  for (long long groups : {1LL, 7LL, 96LL, 263LL}) {
    for (int splits : {1, 3, 16, 32}) {
      for (long long slots : {1LL, 132LL, 264LL, 1000LL}) {
        const int p = tail_free_slices_per_block(groups, splits, 512, slots, 132, kTailFreeBlockKeys);
        EXPECT_GE(p, 1);
        EXPECT_LE(p, splits);
        EXPECT_EQ(p & (p - 1), 0) << "a power of two";
      }
    }
  }
  EXPECT_EQ(tail_free_slices_per_block(0, 16, 512, 264, 132, kTailFreeBlockKeys), 1);
  EXPECT_EQ(tail_free_slices_per_block(8, 16, 512, 0, 132, kTailFreeBlockKeys), 1);
}

// attention_decode_workspace_bytes, the public size of the decode's split-K
// scratch (CudaBackendConfig::attention_workspace_bytes): the floats the
// launcher asks for (kernels::attention_workspace_floats; both go through
// kernels::attention_decode_workspace_floats) times 4, for caches of one
// slice, of the 16-slice bound and between; bad sizes named.
TEST(DecodePlan, WorkspaceBytesArePublicAndMatchTheLauncher) {
  struct Case {
    std::size_t batch, heads, head_dim, capacity, splits;
  };
  for (const Case c : {Case{1, 8, 64, 100, 1}, Case{1, 32, 128, 32768, 16}, Case{64, 32, 128, 1024, 8},
                       Case{3, 40, 256, 131072, 16}, Case{16, 32, 128, 3000, 12}}) {
    SCOPED_TRACE(cat("B ", c.batch, " heads ", c.heads, " hd ", c.head_dim, " capacity ", c.capacity));
    EXPECT_EQ(attention_decode_splits(static_cast<long long>(c.capacity)), static_cast<int>(c.splits));
    const std::size_t bytes = attention_decode_workspace_bytes(c.batch, c.heads, c.head_dim, c.capacity);
    EXPECT_EQ(bytes, 4 * c.batch * c.heads * c.splits * (c.head_dim + 1));
    EXPECT_EQ(bytes, 4 * kernels::attention_workspace_floats(static_cast<int>(c.batch), static_cast<int>(c.heads), 1,
                                                              static_cast<int>(c.head_dim),
                                                              static_cast<long long>(c.capacity)));
  }
  expect_error(ErrorCode::InvalidArgument, "attention_decode_workspace_bytes",
               [] { (void)attention_decode_workspace_bytes(0, 32, 128, 1024); }, "'batch' = 0");
  expect_error(ErrorCode::InvalidArgument, "attention_decode_workspace_bytes",
               [] { (void)attention_decode_workspace_bytes(1, 32, std::size_t{1} << 31, 1024); }, "'head_dim'");
  constexpr auto kIntMax = static_cast<std::size_t>(std::numeric_limits<int>::max());
  expect_error(ErrorCode::InvalidArgument, "attention_decode_workspace_bytes",
               [] { (void)attention_decode_workspace_bytes(kIntMax, kIntMax, kIntMax, 1 << 20); }, "2^64");
}

// The head sizes an Unsupported message lists come from the dispatch's own list.
TEST(AttentionHeadDims, TextListsTheBuiltSizesInOrder) {
  EXPECT_EQ(kernels::int_list_text(kernels::AttentionHeadDims{}), "64, 128, 256");
  EXPECT_EQ(kernels::int_list_text(kernels::IntList<7>{}), "7");
  EXPECT_EQ(kernels::int_list_text(kernels::IntList<>{}), "");
}

}  // namespace
}  // namespace ferrum::test
