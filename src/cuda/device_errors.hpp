// What synchronize(), download and read_bytes say about the bad device-side values kernels reported
// (kernels::DeviceErrorLog). Private to src/; host code only, so the CPU
// tests check the messages.
#pragma once

#include <string>

#include "kernels/decode_state.hpp"

namespace ferrum::detail {

// One clause per reported kind, "; "-separated: the op(s) that check it, the
// offending value, the limit it broke and what the kernel did instead.
// Empty when no slot holds a report.
std::string describe_device_errors(const kernels::DeviceErrorLog& log);

// Reads the host-mapped log (the kernels that wrote it have finished: the
// caller synchronized the stream), clears every slot and returns
// describe_device_errors of what it read.
std::string take_device_errors(kernels::DeviceErrorLog& log);

}  // namespace ferrum::detail
