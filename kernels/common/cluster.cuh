// Thread-block cluster barriers (sm_90) beyond cooperative_groups'
// cluster.sync(), which always arrives with release semantics.
#pragma once

namespace ferrum::kernels {

// The barrier that ends a cluster's distributed shared-memory reads: no block
// exits, or overwrites what the others read, before every block passed it.
// Callers guarantee that each of their remote reads has completed before the
// call (its value feeds an instruction issued before it; a warp issues in
// order), so the arrive is relaxed. cluster.sync()'s release arrive would also
// wait until this thread's earlier global stores are acknowledged: 1-2.6 us
// at the end of every clustered GPTQ launch in session 26's timeline
// (docs/design/gptq_small_m.md §13.6). Stores made before it still reach the
// next kernel through the launch boundary. Every thread of every block of the
// cluster calls it (.aligned). sm_90+ only, as every cluster launch.
__device__ __forceinline__ void cluster_sync_after_reads() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();
#else
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

}  // namespace ferrum::kernels
