// The decode's tail-free slices-per-block rule (kernels/attention.hpp,
// tail_free_slices_per_block): a pure host function, checked here on every
// machine against the choices session 31's H200 sweep asks for (132 SMs, 2
// blocks per SM at hd 128; 8 kv heads, so B sequences are 8 B rows). The
// GPU tests check that every choice gives the same bits.
#include <gtest/gtest.h>

#include "kernels/attention.hpp"

namespace ferrum::test {
namespace {

using kernels::attention_decode_slice_keys;
using kernels::attention_decode_splits;
using kernels::tail_free_slices_per_block;

constexpr long long kSms = 132, kSlots = 264, kKvHeads = 8;

int choice(long long batch, long long capacity) {
  return tail_free_slices_per_block(batch * kKvHeads, attention_decode_splits(capacity),
                                    attention_decode_slice_keys(capacity), kSlots, kSms);
}

// Each row: what the sweep measured (calls 4 and 5 of session 31, µs, one
// run each, explicit slices per block): the rule's choice is the fastest or
// within 1.5 % of it. It differs from the 90 %-of-slots rule where that one
// leaves a thin last wave (B = 10, 12 at 8k; B = 12 at 32k), and also at
// B = 14 L = 8k, B = 16 L = 32k and L = 128k, where the two are within
// 1.3 % of each other.
TEST(DecodePlan, TailFreeRuleMatchesTheH200Sweep) {
  EXPECT_EQ(choice(10, 8192), 8);    // 95.0; the slot rule's 4: 111.0 (320 blocks, last wave 56)
  EXPECT_EQ(choice(12, 8192), 8);    // 112.9; 4: 118.6 (384 blocks, last wave 120)
  EXPECT_EQ(choice(14, 8192), 8);    // 126.7; 4: 126.4 (448 blocks, last wave 184)
  EXPECT_EQ(choice(16, 8192), 8);    // 142.2, as the slot rule; 16 (whole rows, 128 blocks): 156.9
  EXPECT_EQ(choice(16, 16384), 8);   // 259.4, as the slot rule; 4: 262.8
  EXPECT_EQ(choice(32, 8192), 16);   // 263.1, as the slot rule; 8: 267.3
  EXPECT_EQ(choice(12, 32768), 2);   // 380.0; the slot rule's 4: 404.6 (last wave 120); 8: 409.9
  EXPECT_EQ(choice(16, 32768), 4);   // 492.6; the slot rule's 8: 490.8 (all within 0.6 %)
  EXPECT_EQ(choice(16, 131072), 1);  // 8192-key slices: 1899.6; the slot rule's 8: 1875.1
  // Small batches keep the slot rule's choice.
  EXPECT_EQ(choice(1, 131072), 1);
  EXPECT_EQ(choice(2, 8192), 1);
  EXPECT_EQ(choice(4, 8192), 2);
  EXPECT_EQ(choice(8, 8192), 4);
}

// Capacities that are not a power-of-two count of slices (12288 positions:
// 12 slices of 1024 keys; 4224: 9 of 512): only a p dividing the slices is
// taken, so every block of a row holds the same number of slices.
TEST(DecodePlan, TailFreeRuleDividesTheSlices) {
  for (long long groups : {8LL, 80LL, 96LL, 112LL, 128LL, 200LL, 256LL}) {
    for (int splits = 9; splits <= 16; ++splits) {
      const int p = tail_free_slices_per_block(groups, splits, 1024, kSlots, kSms);
      EXPECT_EQ(splits % p, 0) << "groups " << groups << " splits " << splits << ": p = " << p;
    }
  }
  EXPECT_EQ(attention_decode_splits(12288), 12);
  // 96 rows: 1152 blocks (last wave 96 of 264), 576 at p = 2 (last 48),
  // 288 at p = 4 (last 24): none tail-free, p = 1 the cheapest. Not measured.
  EXPECT_EQ(choice(12, 12288), 1);
  EXPECT_EQ(attention_decode_splits(4224), 9);
  EXPECT_EQ(choice(12, 4224), 1);
}

TEST(DecodePlan, TailFreeRuleStaysInRange) {
  for (long long groups : {1LL, 7LL, 96LL, 263LL}) {
    for (int splits : {1, 3, 16, 32}) {
      for (long long slots : {1LL, 132LL, 264LL, 1000LL}) {
        const int p = tail_free_slices_per_block(groups, splits, 512, slots, 132);
        EXPECT_GE(p, 1);
        EXPECT_LE(p, splits);
        EXPECT_EQ(p & (p - 1), 0) << "a power of two";
      }
    }
  }
  EXPECT_EQ(tail_free_slices_per_block(0, 16, 512, 264, 132), 1);
  EXPECT_EQ(tail_free_slices_per_block(8, 16, 512, 0, 132), 1);
}

}  // namespace
}  // namespace ferrum::test
