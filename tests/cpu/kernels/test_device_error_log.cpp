// The device error log (kernels/decode_state.hpp) and what synchronize()
// makes of it (src/cuda/device_errors.cpp), checked on the CPU: the kernels
// store pack_device_error(value, limit) into a kind's slot, and CudaBackend
// reads the slots back through take_device_errors. Here: the packing's round
// trip and saturation, one clause per reported kind naming the op, the value
// and the limit, and the log cleared once read. The kernels' side (which
// value each check reports) is the GPU tests' CudaDeviceCheck.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda/device_errors.hpp"
#include "kernels/decode_state.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using kernels::DeviceErrorLog;
using kernels::pack_device_error;
using kernels::unpack_device_error;

constexpr long long kInt32Min = std::numeric_limits<std::int32_t>::min();
constexpr long long kInt32Max = std::numeric_limits<std::int32_t>::max();

// The host unpacks what the device packed (both are this header's constexpr
// functions); a few at compile time, so the layout cannot drift unnoticed.
static_assert(kernels::device_error_reported(pack_device_error(0, 0)));
static_assert(!kernels::device_error_reported(0));
static_assert(unpack_device_error(pack_device_error(-7, 64)).value == -7);
static_assert(unpack_device_error(pack_device_error(-7, 64)).limit == 64);
static_assert(sizeof(DeviceErrorLog) == 8 * kernels::kNumDeviceErrorKinds);

TEST(DeviceErrorLog, PackingKeepsEveryThirtyTwoBitValueAndSaturatesBeyond) {
  const std::vector<long long> values = {0,         1,         -1,        64,          100000,     kInt32Max - 1,
                                         kInt32Max, kInt32Min, kInt32Min + 1, 1ll << 40, -(1ll << 40)};
  const std::vector<long long> limits = {1, 64, 128256, kInt32Max, 1ll << 40, 0, -5};
  for (long long value : values) {
    for (long long limit : limits) {
      SCOPED_TRACE(cat("value ", value, ", limit ", limit));
      const std::uint64_t slot = pack_device_error(value, limit);
      EXPECT_TRUE(kernels::device_error_reported(slot));
      const kernels::DeviceErrorReport r = unpack_device_error(slot);
      EXPECT_EQ(r.value, std::clamp(value, kInt32Min, kInt32Max));
      EXPECT_EQ(r.limit, std::clamp(limit, 0ll, kInt32Max));
    }
  }
}

TEST(DeviceErrorLog, AnEmptyLogSaysNothing) {
  DeviceErrorLog log{};
  EXPECT_EQ(detail::describe_device_errors(log), "");
  EXPECT_EQ(detail::take_device_errors(log), "");
}

// Each kind alone: its clause names its op(s), the value and the limit.
TEST(DeviceErrorLog, EachKindNamesItsOpValueAndLimit) {
  struct Want {
    kernels::DeviceErrorKind kind;
    long long value, limit;
    std::string clause;
  };
  const std::vector<Want> wants = {
      {kernels::kErrEmbeddingId, 128300, 128256, "embedding_lookup: token id 128300 outside [0, vocab = 128256)"},
      {kernels::kErrEmbeddingId, -1, 1001, "embedding_lookup: token id -1 outside [0, vocab = 1001)"},
      {kernels::kErrRopePosition, 4096, 4096,
       "qk_norm_rope / qkv_rope_append(_ragged): position 4096 outside the cos/sin tables' [0, max_pos = 4096)"},
      {kernels::kErrKvAppendPosition, 8195, 8192,
       "kv_cache_append_head_major / qkv_rope_append(_ragged): cache row 8195 outside [0, capacity = 8192)"},
      {kernels::kErrAttnKvLen, 0, 700,
       "flash_attention / flash_decode_ragged: device-side kv_len 0 (decode state or kv_lens) outside "
       "[1, kv_seq_stride = 700]"},
      {kernels::kErrDecodeLogPosition, 16, 16,
       "advance_decode_state: token_log slot 16 (the decode-state position + 1) outside [0, token_log size = 16)"},
      // Saturated: the value lay past the field, and the clause says so.
      {kernels::kErrEmbeddingId, 1ll << 40, 1001, "token id 2147483647 or more outside [0, vocab = 1001)"},
      {kernels::kErrRopePosition, -(1ll << 40), 64, "position -2147483648 or less outside"},
      {kernels::kErrDecodeLogPosition, -3, 1ll << 40, "slot -3 (the decode-state position + 1) outside [0, token_log "
                                                      "size = 2147483647 or more)"},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.clause);
    DeviceErrorLog log{};
    log.slots[w.kind] = pack_device_error(w.value, w.limit);
    const std::string got = detail::describe_device_errors(log);
    EXPECT_NE(got.find(w.clause), std::string::npos) << got;
    EXPECT_EQ(got.find("; "), std::string::npos) << "one kind, one clause: " << got;
  }
}

// Every kind reported at once (kinds never overwrite each other): one
// clause each, in kind order; take_device_errors clears every slot, so the
// next synchronize() reports nothing.
TEST(DeviceErrorLog, EveryKindAtOnceThenCleared) {
  DeviceErrorLog log{};
  for (int k = 0; k < kernels::kNumDeviceErrorKinds; ++k) log.slots[k] = pack_device_error(1000 + k, 10);
  const std::string got = detail::take_device_errors(log);
  const std::vector<std::string> in_order = {"token id 1000 ", "position 1001 ", "cache row 1002 ", "kv_len 1003 ",
                                             "token_log slot 1004 "};
  ASSERT_EQ(in_order.size(), static_cast<std::size_t>(kernels::kNumDeviceErrorKinds));
  std::size_t at = 0;
  for (const std::string& clause : in_order) {
    const std::size_t found = got.find(clause, at);
    ASSERT_NE(found, std::string::npos) << "'" << clause << "' missing or out of order in: " << got;
    at = found;
  }
  EXPECT_EQ(got.find("unknown"), std::string::npos) << got;
  for (std::uint64_t slot : log.slots) EXPECT_EQ(slot, 0u);
  EXPECT_EQ(detail::take_device_errors(log), "");
}

}  // namespace
}  // namespace ferrum::test
