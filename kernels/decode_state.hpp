// The device-side decode state that `_dyn` kernels read, and the log
// through which kernels report bad device-side values.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ferrum::kernels {

// Lives in device memory for the life of the process (graphs point at it).
struct DecodeState {
  std::int32_t token;   // the token fed to embedding_lookup
  std::int32_t pos;     // its position: RoPE position and KV append row
  std::int32_t kv_len;  // keys attention sees (pos + 1)
};

// The device-side checks a kernel reports; each has its own slot in the
// DeviceErrorLog.
enum DeviceErrorKind : int {
  kErrEmbeddingId = 0,    // a token id outside [0, vocab)
  kErrRopePosition,       // a position outside [0, max_pos) of the cos/sin tables
  kErrKvAppendPosition,   // a cache row written outside [0, capacity)
  kErrAttnKvLen,          // a device-side kv_len outside [1, kv_seq_stride]
  kErrDecodeLogPosition,  // advance_decode_state's slot pos + 1 outside [0, log_size)
  kNumDeviceErrorKinds,
};

// What kernels report bad device-side values into: host-mapped memory, read
// and cleared at synchronize(). Slot k is 0 until a kernel finds a value of
// kind k that breaks its limit; then it holds both, packed into one word so
// that one plain store writes them together (host-mapped memory has no
// portable atomics): of racing reports of one kind one is kept whole, and
// kinds never overwrite each other.
struct DeviceErrorLog {
  std::uint64_t slots[kNumDeviceErrorKinds];
};

// A slot's contents: the offending value and the limit it broke (their
// meaning is the kind's, above).
struct DeviceErrorReport {
  long long value = 0;
  long long limit = 0;
};

// Bit 63 marks a report; bits 32..62 hold the limit and bits 0..31 the
// value, each saturated to its field (every value checked on the device is
// a 32-bit id, position or length, or one such plus a row count; every limit
// is a size the host validated).
constexpr std::uint64_t kDeviceErrorReported = 1ull << 63;
constexpr long long kDeviceErrorLimitMax = (1ll << 31) - 1;

constexpr std::uint64_t pack_device_error(long long value, long long limit) {
  const long long v =
      value < -(1ll << 31) ? -(1ll << 31) : (value > kDeviceErrorLimitMax ? kDeviceErrorLimitMax : value);
  const long long l = limit < 0 ? 0 : (limit > kDeviceErrorLimitMax ? kDeviceErrorLimitMax : limit);
  return kDeviceErrorReported | (static_cast<std::uint64_t>(l) << 32) |
         static_cast<std::uint64_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
}

// Whether `slot` holds a report (false: 0, nothing reported).
constexpr bool device_error_reported(std::uint64_t slot) { return (slot & kDeviceErrorReported) != 0; }

constexpr DeviceErrorReport unpack_device_error(std::uint64_t slot) {
  return {static_cast<std::int32_t>(static_cast<std::uint32_t>(slot & 0xffffffffull)),
          static_cast<long long>((slot >> 32) & static_cast<std::uint64_t>(kDeviceErrorLimitMax))};
}

// Writes the decode state with one tiny kernel: the values travel as kernel
// arguments, so there is no host buffer to race with and nothing pageable.
void launch_set_decode_state(DecodeState* state,  // [1] DecodeState in device memory: every field overwritten
                             std::int32_t token, std::int32_t pos, std::int32_t kv_len, cudaStream_t stream);

// The decode step on the device (Backend::advance_decode_state):
// token_log[pos + 1] = *next_token, token = *next_token, pos += 1,
// kv_len += 1; with pos + 1 outside [0, log_size) nothing changes and
// kErrDecodeLogPosition is reported (value pos + 1, limit log_size). Launched with PDL (it waits for the
// argmax in front of it).
void launch_advance_decode_state(DecodeState* state,              // [1] DecodeState in device memory: read, advanced
                                 const std::int32_t* next_token,  // [1] i32 token id (device): the one just chosen
                                 std::int32_t* token_log,         // [log_size] i32 token ids: slot pos + 1 written
                                 long long log_size,
                                 DeviceErrorLog* error_log,       // [1] DeviceErrorLog (host-mapped; null: none)
                                 cudaStream_t stream);

// Whether the current device can run this build's kernels: cudaSuccess, or
// the runtime's answer for one of them (cudaFuncGetAttributes) -- e.g.
// cudaErrorNoKernelImageForDevice when CMAKE_CUDA_ARCHITECTURES does not
// cover the device (the default 90a runs on compute capability 9.0 only).
cudaError_t probe_kernel_image();

}  // namespace ferrum::kernels
