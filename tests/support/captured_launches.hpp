// Which kernels an op launches, read from a graph the test captures on the
// backend's stream (a caller's own capture: the ops record into it, and
// nothing runs). For tests whose premise is the launch itself: a switch
// that picks a kernel, or a cluster shape, where two paths give the same
// bits and the outputs cannot tell them apart. A failed CUDA call is a test
// failure; an op that throws still ends the capture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <cuda.h>  // the driver's types; its functions come through cudaGetDriverEntryPointByVersion
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "ferrum/cuda_backend.hpp"
#include "ferrum/error.hpp"

namespace ferrum::test {

struct CapturedLaunch {
  std::string name;      // the kernel's (mangled) name; "?" where it could not be read
  unsigned cluster = 1;  // blocks per cluster (x * y * z; 1: not clustered)
  std::size_t shared_bytes = 0;  // dynamic shared memory per block
};

// A kernel node's name and dynamic shared memory, read through the driver
// API. The runtime's cudaGraphKernelNodeGetParams fails on the nodes of
// kernels the runtime did not register (cuBLAS's), and compute-sanitizer
// reports that failure as an API error; the driver's call reads every
// kernel node. Its entry points are looked up by version (once), so the
// test binary does not link libcuda (it must start on machines without a
// GPU); every driver the CUDA 13 runtime runs on has them, and where one
// is missing the nodes stay "?" and the tests that read names fail.
struct KernelNodeReader {
  using GetParamsFn = PFN_cuGraphKernelNodeGetParams_v12000;  // CUDA_KERNEL_NODE_PARAMS_v2
  using FuncNameFn = PFN_cuFuncGetName_v12030;
  using KernelNameFn = PFN_cuKernelGetName_v12030;
  GetParamsFn get_params = nullptr;
  FuncNameFn func_name = nullptr;
  KernelNameFn kernel_name = nullptr;

  static void* entry(const char* symbol, unsigned version) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return fn;
  }

  KernelNodeReader()
      : get_params(reinterpret_cast<GetParamsFn>(entry("cuGraphKernelNodeGetParams", 12000))),
        func_name(reinterpret_cast<FuncNameFn>(entry("cuFuncGetName", 12030))),
        kernel_name(reinterpret_cast<KernelNameFn>(entry("cuKernelGetName", 12030))) {}

  // Leaves `launch` as it is where the node cannot be read.
  void read(cudaGraphNode_t node, CapturedLaunch& launch) const {
    if (get_params == nullptr || func_name == nullptr || kernel_name == nullptr) return;
    CUDA_KERNEL_NODE_PARAMS_v2 params{};
    if (get_params(node, &params) != CUDA_SUCCESS) return;
    launch.shared_bytes = params.sharedMemBytes;
    const char* text = nullptr;
    const CUresult named = params.func != nullptr ? func_name(&text, params.func)
                           : params.kern != nullptr ? kernel_name(&text, params.kern)
                                                    : CUDA_ERROR_INVALID_VALUE;
    if (named == CUDA_SUCCESS && text != nullptr) launch.name = text;
  }
};

// The kernel nodes `op` records on be.stream(), in the graph's node order.
// `op` runs once uncaptured first: first-call setup (module loading,
// cuBLAS's own) then never happens inside the capture.
template <class Op>
std::vector<CapturedLaunch> captured_launches(CudaBackend& be, Op&& op) {
  std::vector<CapturedLaunch> launches;
  try {
    op();
    be.synchronize();  // setup work (uploads, fills) and the uncaptured run are done before the capture
  } catch (const Error& e) {
    ADD_FAILURE() << "the op, uncaptured: " << e.what();
    return launches;
  }
  if (cudaStreamBeginCapture(be.stream(), cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamBeginCapture failed";
    return launches;
  }
  std::string thrown;
  try {
    op();
  } catch (const Error& e) {
    thrown = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(be.stream(), &graph);
  if (!thrown.empty() || ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    (void)cudaGetLastError();
    ADD_FAILURE() << "the op under capture: " << (thrown.empty() ? "cudaStreamEndCapture failed" : thrown);
    return launches;
  }
  std::size_t count = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(count);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &count), cudaSuccess);
  static const KernelNodeReader reader;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) continue;
    CapturedLaunch launch{"?", 1};
    reader.read(node, launch);
    cudaLaunchAttributeValue value{};
    if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &value) == cudaSuccess) {
      launch.cluster = std::max(1u, value.clusterDim.x) * std::max(1u, value.clusterDim.y) *
                       std::max(1u, value.clusterDim.z);
    }
    (void)cudaGetLastError();  // a node whose name or attribute could not be read leaves no error behind
    launches.push_back(std::move(launch));
  }
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  return launches;
}

// Whether some launch's name contains `part`.
inline bool launched(const std::vector<CapturedLaunch>& launches, const std::string& part) {
  return std::any_of(launches.begin(), launches.end(),
                     [&](const CapturedLaunch& l) { return l.name.find(part) != std::string::npos; });
}

// Whether some launch goes out in clusters of more than one block.
inline bool any_clustered(const std::vector<CapturedLaunch>& launches) {
  return std::any_of(launches.begin(), launches.end(), [](const CapturedLaunch& l) { return l.cluster > 1; });
}

// The most dynamic shared memory any of the launches asks for.
inline std::size_t max_shared_bytes(const std::vector<CapturedLaunch>& launches) {
  std::size_t most = 0;
  for (const CapturedLaunch& l : launches) most = std::max(most, l.shared_bytes);
  return most;
}

// The launches for a failure message: "name [cluster N] [smem B], ...".
inline std::string describe_launches(const std::vector<CapturedLaunch>& launches) {
  std::string all;
  for (const CapturedLaunch& l : launches) {
    if (!all.empty()) all += ", ";
    all += l.name;
    if (l.cluster > 1) all += " [cluster " + std::to_string(l.cluster) + "]";
    if (l.shared_bytes > 0) all += " [smem " + std::to_string(l.shared_bytes) + "]";
  }
  return all.empty() ? "(no kernel)" : all;
}

}  // namespace ferrum::test
