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
// (write-after-read), exactly as with an ordinary launch. The exceptions:
// the skinny GEMM's, behind the switches below: an L2 prefetch hint
// (gemm_prefetch_before_wait), and, on the caller's promise that no kernel
// ordered before the GEMM writes its weights, real loads of the first round
// of weights (gemm_weights_before_wait); the GPTQ streaming kernel's bulk
// source, which sets up its mbarriers and zeroes shared memory before its
// wait, and on the same promise requests its first ring fills' weights and
// scale rows there (bulk copies into shared memory); the GPTQ wgmma kernel, which zeroes the
// activation rows past m in its shared-memory ring before its wait; and, on
// the caller's promise that nothing in flight writes a decode's kv_len or its
// K / V rows below the newest (attention_kv_before_wait), the decode
// attention, which reads kv_len and requests each warp's first sub-tile of
// those rows before its wait (qkv_rope_append then releases it right after
// its own wait). None writes global memory before the wait.
//
// Early triggers (griddepcontrol.launch_dependents): without one the next
// kernel is scheduled as this one's blocks exit. A first version triggered at the top of every kernel;
// on the H200 the llama3-8b graph decode fell from 208 to 161 tok/s with it
// (likely: the trigger chains, so blocks of several later kernels sit
// resident and waiting while a memory-bound grid needs the SMs). A second,
// targeted version (b920e6f) measured 186 against 201 tok/s on another
// machine, in both PDL modes; its GEMM prefetch was inlined and raised the
// skinny kernels' registers (80 -> 102 at m = 1: fewer resident blocks),
// which alone fits a loss in both modes. Both ideas are now switches
// (CudaBackendConfig):
// - pdl_early_trigger (on by default since session 11: llama3-8b GPTQ graph
//   decode 406 -> 428 tok/s, f16 level): the norms, SiLU·mul and decode
//   attention (what precedes a weight-streaming GEMM in a decode step) call
//   pdl_trigger_dependents() right after their own pdl_begin(), so triggers
//   never run more than one kernel ahead (session 21 measured the norms and
//   SiLU·mul triggering once their loads had landed instead: 7 % slower,
//   removed);
// - pdl_chain_release (off): the GPTQ streaming kernel's bulk source
//   triggers right after its own wait, and the norms and SiLU·mul before
//   theirs (PdlTrigger::BeforeWait), so in a GEMM -> norm -> GEMM chain the
//   second GEMM may launch while the first still streams (two kernels ahead,
//   the GEMMs stop the chain: they trigger only after their wait);
// - gemm_prefetch_before_wait: the skinny GEMM asks L2 for its first round
//   of weights before its pdl_begin(): a prefetch hint, which returns
//   nothing, so nothing stale can be read;
// - gemm_weights_before_wait (a promise by the caller, see
//   CudaBackendConfig): the skinny SIMT GEMM (m <= 2) loads its first round
//   of weights into registers, and the GPTQ streaming kernel's bulk source
//   requests its first ring fills' weights and scale rows, before their
//   pdl_begin(). Under it, the GPTQ gate|up GEMM with the SiLU·mul epilogue
//   (gemm_silu_mul_gptq) also triggers right after its pdl_begin(), so the
//   down projection after it starts its weight stream during it.
//
// The GPTQ streaming and wgmma kernels are launched with PDL too (see the
// exceptions above). Kernels launched
// the ordinary way (prefill attention, the fused GPTQ kernel, cuBLAS, NCCL)
// are full dependencies as before, and pdl_begin() is a no-op when the launch did not
// ask for PDL or the device is older than sm_90.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <utility>

#include "kernels/common/check.hpp"
#include "kernels/common/per_device.hpp"

namespace ferrum::kernels {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next PDL-launched kernel in the stream be scheduled now; it still
// waits in its own pdl_begin() until this grid has completed and its memory
// is visible. Behind the pdl_early_trigger and pdl_chain_release switches
// (see above), and in gemm_silu_mul_gptq's fused GPTQ launch behind
// gemm_weights_before_wait (which --no-pdl-trigger leaves alone).
__device__ __forceinline__ void pdl_trigger_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Where a small op between two GEMMs of a decode step (a norm, SiLU·mul)
// triggers the next kernel (see the switches above): not at all, right after
// its own wait (pdl_early_trigger), or before it (pdl_chain_release, which
// takes precedence), so that the GEMM after it can launch while the GEMM
// before it still runs.
enum class PdlTrigger : int { None, AfterWait, BeforeWait };

inline PdlTrigger small_op_trigger() {
  const LaunchSwitches s = launch_switches();
  if (s.pdl_chain_release) return PdlTrigger::BeforeWait;
  return s.pdl_early_trigger ? PdlTrigger::AfterWait : PdlTrigger::None;
}

// pdl_begin() with the trigger where `trigger` puts it.
__device__ __forceinline__ void pdl_begin_with_trigger(PdlTrigger trigger) {
  if (trigger == PdlTrigger::BeforeWait) pdl_trigger_dependents();
  pdl_begin();
  if (trigger == PdlTrigger::AfterWait) pdl_trigger_dependents();
}

// Whether a kernel's code was compiled for sm_90+ (its cluster, bulk-copy or
// other sm_90 path): a build without sm_90 (e.g. CMAKE_CUDA_ARCHITECTURES=80,
// run on an H200 through the PTX JIT) holds only the trapping stubs. Asked
// once per kernel (a template argument, so two kernels of one signature keep
// answers of their own) and device: the answer is the image the device
// loads from the build's architecture list (a build for 80 and 90a gives an
// A100 and an H200 of one process different ones). A failed query (no
// device, say) answers no for this call only: it is not remembered, and its
// error is not left behind for the next launch check to report under
// another op's name.
template <auto Kernel>
bool has_sm90_code() {
  static PerDeviceAnswers<bool, 1> known;
  const int device = try_current_device_index();
  if (device < 0) return false;
  return known
      .get(device, 0,
           [&]() -> std::optional<bool> {
             cudaFuncAttributes attr{};
             if (cudaFuncGetAttributes(&attr, Kernel) != cudaSuccess) {
               (void)cudaGetLastError();
               return std::nullopt;
             }
             return attr.ptxVersion >= 90;
           })
      .value_or(false);
}

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute where
// the device supports it, and clusters of `cluster` blocks when it holds more
// than one (sm_90; the grid a multiple of it in each dimension). A failed
// launch throws ferrum::Error naming `op`.
template <class... Params, class... Args>
void launch_pdl_clustered(const char* op, dim3 cluster, void (*kernel)(Params...), dim3 grid, dim3 block,
                          std::size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = cluster.y;
    attrs[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (pdl_available()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // consumed here: a later check_launch must not see it again
    throw_cuda_error(op, "kernel launch", err);
  }
}

// cudaOccupancyMaxActiveClusters for clusters of `cluster` blocks of
// `kernel` (`block` threads, `smem` dynamic bytes, its shared-memory opt-in
// done): how many such clusters the device can hold at once (0: none). On
// a failed query the error is consumed (not sticky) and returned.
template <class... Params>
cudaError_t max_active_clusters(int* clusters, void (*kernel)(Params...), dim3 cluster, dim3 block,
                                std::size_t smem) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster.x;
  attr.val.clusterDim.y = cluster.y;
  attr.val.clusterDim.z = cluster.z;
  cudaLaunchConfig_t config{};
  config.gridDim = cluster;  // one cluster's worth of grid
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.attrs = &attr;
  config.numAttrs = 1;
  *clusters = 0;
  const cudaError_t err = cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

// Opts `kernel` in to `smem` bytes of dynamic shared memory and returns how
// many blocks of `threads` threads with that much fit on one SM (at least
// 1). A failed call throws ferrum::Error naming `op`.
template <class... Params>
int opt_in_blocks_per_sm(const char* op, void (*kernel)(Params...), int threads, int smem) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaFuncSetAttribute", err);
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", err);
  return blocks > 1 ? blocks : 1;
}

// Whether a cluster of `cluster` blocks of `kernel` (its shared-memory
// opt-in done) can be resident at all (max_active_clusters > 0). A failed
// query throws naming `op`. (Callers remember the answer per device and
// launch shape in a PerDeviceAnswers<bool, ...>.)
template <class... Params>
bool cluster_resident(const char* op, void (*kernel)(Params...), dim3 cluster, dim3 block, std::size_t smem) {
  int clusters = 0;
  const cudaError_t err = max_active_clusters(&clusters, kernel, cluster, block, smem);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaOccupancyMaxActiveClusters", err);
  return clusters > 0;
}

template <class... Params, class... Args>
void launch_pdl(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                cudaStream_t stream, Args&&... args) {
  launch_pdl_clustered(op, dim3(1, 1, 1), kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// Zeroes a __device__ array (a diagnostics build's timeline) before the runs
// that stamp it. The memset runs on the legacy stream, which the backends'
// non-blocking stream does not wait for, so it is finished here, before the
// next launch can stamp.
template <class Symbol>
void zero_device_symbol(const char* op, const Symbol& symbol) {
  void* p = nullptr;
  cudaError_t err = cudaGetSymbolAddress(&p, symbol);
  if (err != cudaSuccess) throw_cuda_error(op, "cudaGetSymbolAddress", err);
  err = cudaMemset(p, 0, sizeof(Symbol));
  if (err != cudaSuccess) throw_cuda_error(op, "cudaMemset", err);
  err = cudaDeviceSynchronize();  // also reports an earlier launch's failure
  if (err != cudaSuccess) throw_cuda_error(op, "cudaDeviceSynchronize after cudaMemset", err);
}

}  // namespace ferrum::kernels
