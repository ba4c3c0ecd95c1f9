// Where the hardware puts the CTAs of a cluster launch shaped like the wgmma
// GPTQ kernel's (docs/design/gptq_small_m.md §13.13, the split count at 16
// column tiles): a grid of n_ctas x splits CTAs of 128 threads in clusters of
// 1 x splits, with shared memory sized so that at most two CTAs share an SM
// (the GPTQ kernel's occupancy, set there by its registers). Each CTA spins
// long enough that the whole grid is resident at once, and records its SM.
//
//   ferrum_cluster_placement [--n-ctas N,N,...] [--splits S,S,...] [--smem-kib K]
//
// Per (n_ctas, splits): the SMs that got 0, 1 and 2 CTAs, how many clusters
// put two of their own CTAs on one SM, and whether n_ctas clusters fit at one
// CTA per SM by cudaOccupancyMaxActiveClusters (asked with all the shared
// memory a CTA may opt into, as gptq_wgmma_splits' single_clusters are):
// where the query says they fit, no SM may get two. (Session 47: 16 clusters
// of 8 doubled CTAs up on 8 SMs, 16 of 6 on none, and six splits beat eight
// there by 6-14 %.)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "comma_items.hpp"
#include "cuda_check.hpp"

namespace {

constexpr int kThreads = 128;

// sm_of: [gridDim.y][gridDim.x] the SM of each CTA; spin_cycles: how long each
// CTA waits before it exits (so that none leaves before the last one lands).
__global__ void __launch_bounds__(kThreads) placement_kernel(int* sm_of, long long spin_cycles) {
  if (threadIdx.x == 0) {
    unsigned sm = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    sm_of[blockIdx.y * gridDim.x + blockIdx.x] = static_cast<int>(sm);
    const long long t0 = clock64();
    while (clock64() - t0 < spin_cycles) {
    }
  }
  __syncthreads();
}

// A launch of n_ctas x splits CTAs of kThreads threads in clusters of
// 1 x splits (the GPTQ wgmma kernel's shape) with smem bytes of dynamic
// shared memory: for cudaLaunchKernelEx and cudaOccupancyMaxActiveClusters.
// config points at attr, hence no copies.
struct ClusterLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(int n_ctas, int splits, int smem) {
    config.gridDim = dim3(static_cast<unsigned>(n_ctas), static_cast<unsigned>(splits), 1);
    config.blockDim = dim3(kThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<std::size_t>(smem);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = static_cast<unsigned>(splits);
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> n_ctas_list = {16, 24}, splits_list = {4, 5, 6, 7, 8};
  int smem_kib = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n-ctas" && i + 1 < argc) {
      n_ctas_list = comma_ints(argv[++i]);
    } else if (a == "--splits" && i + 1 < argc) {
      splits_list = comma_ints(argv[++i]);
    } else if (a == "--smem-kib" && i + 1 < argc) {
      smem_kib = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--n-ctas N,N,...] [--splits S,S,...] [--smem-kib K]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (!hopper_device("ferrum_cluster_placement", "thread-block clusters of this shape need compute capability 9",
                     false, prop)) {
    return 0;
  }
  const int smem = smem_kib * 1024;
  check(cudaFuncSetAttribute(placement_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem opt-in");
  check(cudaFuncSetAttribute(placement_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "cluster opt-in");
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, placement_kernel, kThreads, smem), "occupancy");
  std::printf("%s, %d SMs, %d KiB of shared memory per CTA: %d CTAs per SM at most\n", prop.name,
              prop.multiProcessorCount, smem_kib, per_sm);
  // The query at one CTA per SM, per cluster size.
  int optin = 0;
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), "smem opt-in limit");
  std::map<int, int> single;
  {
    int max_splits = 1;
    for (int s : splits_list) max_splits = std::max(max_splits, s);
    check(cudaFuncSetAttribute(placement_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin), "smem opt-in");
    std::printf("clusters at one CTA per SM (cudaOccupancyMaxActiveClusters, %d KiB):", optin / 1024);
    for (int s = 1; s <= max_splits; ++s) {
      const ClusterLaunch one(1, s, optin);  // one cluster's worth of grid
      check(cudaOccupancyMaxActiveClusters(&single[s], placement_kernel, &one.config), "cluster occupancy");
      std::printf(" %d:%d", s, single[s]);
    }
    std::printf("\n");
  }
  std::printf("%6s %6s %6s | %8s %8s %8s | %-30s | %s\n", "n_ctas", "splits", "CTAs", "SMs x0", "SMs x1", "SMs x2+",
              "clusters with 2 CTAs on one SM", "query: one per SM");
  int* sm_of = nullptr;
  const int max_grid = 4096;
  check(cudaMalloc(&sm_of, max_grid * sizeof(int)), "cudaMalloc");
  // 200 us at 2 GHz: every CTA of a one-wave launch lands before the first leaves.
  const long long spin = 400000;
  for (int n_ctas : n_ctas_list) {
    for (int splits : splits_list) {
      const int ctas = n_ctas * splits;
      if (splits < 1 || n_ctas < 1 || ctas > max_grid) continue;
      if (ctas > per_sm * prop.multiProcessorCount) {
        std::printf("%6d %6d %6d | more than one wave\n", n_ctas, splits, ctas);
        continue;
      }
      const ClusterLaunch launch(n_ctas, splits, smem);
      check(cudaMemset(sm_of, 0xFF, max_grid * sizeof(int)), "cudaMemset");
      check(cudaLaunchKernelEx(&launch.config, placement_kernel, sm_of, spin), "cudaLaunchKernelEx");
      check(cudaDeviceSynchronize(), "sync");
      std::vector<int> host(static_cast<std::size_t>(ctas));
      check(cudaMemcpy(host.data(), sm_of, host.size() * sizeof(int), cudaMemcpyDeviceToHost), "copy");
      std::map<int, int> per_sm_count;
      for (int sm : host) ++per_sm_count[sm];
      int x1 = 0, x2 = 0;
      for (const auto& [sm, count] : per_sm_count) (count == 1 ? x1 : x2) += 1;
      const int x0 = prop.multiProcessorCount - x1 - x2;
      // A cluster is the splits CTAs of one column (blockIdx.x).
      int doubled_clusters = 0;
      for (int x = 0; x < n_ctas; ++x) {
        std::set<int> sms;
        for (int y = 0; y < splits; ++y) sms.insert(host[static_cast<std::size_t>(y * n_ctas + x)]);
        if (static_cast<int>(sms.size()) < splits) ++doubled_clusters;
      }
      const bool fits_single = n_ctas <= single[splits];
      std::printf("%6d %6d %6d | %8d %8d %8d | %-30s | %s%s\n", n_ctas, splits, ctas, x0, x1, x2,
                  (std::to_string(doubled_clusters) + " of " + std::to_string(n_ctas)).c_str(),
                  fits_single ? "fits" : "no", fits_single && x2 > 0 ? "  MISMATCH: two CTAs on an SM" : "");
    }
  }
  check(cudaFree(sm_of), "cudaFree");
  return 0;
}
