// A 16-byte read-only load that skips L1 (each byte is read once), shared by
// the read-ceiling kernels and the probes that stream weights the same way.
#pragma once

#include <cuda_runtime.h>

namespace ferrum::bench {

__device__ __forceinline__ uint4 load_once(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

}  // namespace ferrum::bench
