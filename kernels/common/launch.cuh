// Programmatic dependent launch (PDL, sm_90 and later).
//
// A decode step is a chain of short kernels; between two of them the GPU
// normally drains the first grid completely before it starts scheduling the
// second. A kernel launched through launch_pdl may be scheduled while the
// previous kernel in the stream is still finishing, and waits on the device
// (griddepcontrol.wait) for that kernel to complete and its memory to be
// visible. So the launch latency and block start-up overlap the previous
// kernel's tail, also inside captured CUDA graphs (the edge is captured as a
// programmatic dependency).
//
// The contract, for every kernel launched through launch_pdl: its first
// statement is pdl_begin(), before any global read or write. Then nothing it
// reads can be stale and nothing it writes can be read by the previous kernel
// (write-after-read), exactly as with an ordinary launch.
//
// No kernel triggers its dependents early (griddepcontrol.launch_dependents):
// the next kernel is scheduled as this one's blocks exit. A first version
// triggered at the top of every kernel; on the H200 the llama3-8b graph decode
// fell from 208 to 161 tok/s with it. The likely cause: the trigger chains
// (each waiting kernel triggers the next), so blocks of several later kernels
// sit resident and waiting, and a memory-bound kernel's blocks then land
// unevenly over the SMs. Where to trigger early (after a kernel's main loop)
// is to be measured per kernel before it comes back. A second, targeted
// version (b920e6f: only norms, SiLU·mul and decode attention triggered,
// and the skinny GEMM prefetched its first weight round into L2 before its
// wait) measured 186 tok/s against 201 without it, in both PDL modes, so
// the GEMM prefetch is the suspect; reverted before an A/B of its own.
//
// Kernels launched the ordinary way (attention, GPTQ, cuBLAS, NCCL) are full
// dependencies as before, and pdl_begin() is a no-op when the launch did not
// ask for PDL or the device is older than sm_90.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/common/check.hpp"

namespace ferrum::kernels {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute where
// the device supports it. A failed launch throws ferrum::Error naming `op`.
template <class... Params, class... Args>
void launch_pdl(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = pdl_available() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // consumed here: a later check_launch must not see it again
    throw_cuda_error(op, "kernel launch", err);
  }
}

}  // namespace ferrum::kernels
