// What the standalone benchmark tools share around the CUDA runtime: a
// failed call ends the tool with the call's name and the error (or, in
// cleanup that must not throw or exit, says so on stderr), and a tool that
// needs Hopper says so and exits cleanly where there is none.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// For cleanup where ending the tool or throwing is wrong (destructors,
// noexcept paths): one warning line on stderr, and carry on.
inline void warn_if_failed(cudaError_t e, const char* what) noexcept {
  if (e != cudaSuccess) std::fprintf(stderr, "warning: %s: %s\n", what, cudaGetErrorString(e));
}

// The current device's properties where it is compute capability 9.x (9.0
// exactly when `exactly_90`: sm_90a code); otherwise false, after one line
// naming the tool and what it lacks (`needs`).
inline bool hopper_device(const char* tool, const char* needs, bool exactly_90, cudaDeviceProp& prop) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device\n", tool);
    return false;
  }
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  if (prop.major != 9 || (exactly_90 && prop.minor != 0)) {
    std::printf("%s: %s, found %d.%d\n", tool, needs, prop.major, prop.minor);
    return false;
  }
  return true;
}
