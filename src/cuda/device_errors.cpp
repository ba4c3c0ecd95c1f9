#include "cuda/device_errors.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdint>

namespace ferrum::detail {

namespace {

// A value or limit as the log holds it: saturated at its field's ends, so
// at an end "or more" / "or less" (the real value lay there or past it).
std::string field_text(long long value) {
  if (value >= kernels::kDeviceErrorLimitMax) return fmt::format("{} or more", value);
  if (value <= -(1ll << 31)) return fmt::format("{} or less", value);
  return fmt::format("{}", value);
}

std::string describe(kernels::DeviceErrorKind kind, const kernels::DeviceErrorReport& r) {
  const std::string v = field_text(r.value);
  const std::string limit = field_text(r.limit);
  switch (kind) {
    case kernels::kErrEmbeddingId:
      return fmt::format("embedding_lookup: token id {} outside [0, vocab = {}) (zero row written)", v, limit);
    case kernels::kErrRopePosition:
      return fmt::format(
          "qk_norm_rope / qkv_rope_append(_ragged): position {} outside the cos/sin tables' [0, max_pos = {}) "
          "(row not written)",
          v, limit);
    case kernels::kErrKvAppendPosition:
      return fmt::format(
          "kv_cache_append_head_major / qkv_rope_append(_ragged): cache row {} outside [0, capacity = {}) (the "
          "decode-state position and its new tokens, or a positions[b]: nothing written to the caches)",
          v, limit);
    case kernels::kErrAttnKvLen:
      return fmt::format(
          "flash_attention / flash_decode_ragged: device-side kv_len {} (decode state or kv_lens) outside "
          "[1, kv_seq_stride = {}] (zeros written)",
          v, limit);
    case kernels::kErrDecodeLogPosition:
      return fmt::format(
          "advance_decode_state: token_log slot {} (the decode-state position + 1) outside [0, token_log size = "
          "{}) (state and log unchanged)",
          v, limit);
    case kernels::kNumDeviceErrorKinds: break;
  }
  return fmt::format("unknown device error kind {}: value {}, limit {}", static_cast<int>(kind), v, limit);
}

}  // namespace

std::string describe_device_errors(const kernels::DeviceErrorLog& log) {
  std::string what;
  for (int k = 0; k < kernels::kNumDeviceErrorKinds; ++k) {
    if (!kernels::device_error_reported(log.slots[k])) continue;
    if (!what.empty()) what += "; ";
    what += describe(static_cast<kernels::DeviceErrorKind>(k), kernels::unpack_device_error(log.slots[k]));
  }
  return what;
}

std::string take_device_errors(kernels::DeviceErrorLog& log) {
  // A reported slot is exchanged, not read then cleared: a kernel of another
  // thread's backend on this device (they share the log) may store between
  // the two. An empty one is only read (every synchronize() passes here).
  kernels::DeviceErrorLog read{};
  for (int k = 0; k < kernels::kNumDeviceErrorKinds; ++k) {
    std::atomic_ref<std::uint64_t> slot(log.slots[k]);
    if (slot.load(std::memory_order_acquire) != 0) read.slots[k] = slot.exchange(0, std::memory_order_acq_rel);
  }
  return describe_device_errors(read);
}

}  // namespace ferrum::detail
