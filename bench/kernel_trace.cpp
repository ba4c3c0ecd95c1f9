// libferrum_kernel_trace.so: a CUPTI activity tracer to preload into any
// program (ferrum_engine, a benchmark) to see every kernel's start and end on
// the GPU's clock, including the kernels of a replayed CUDA graph and the
// overlap that programmatic dependent launch gives them. ncu times each kernel
// alone and serialised; this shows where a decode step's time goes as it runs.
//
//   export FERRUM_KERNEL_TRACE=trace.csv LD_PRELOAD=$B/bench/libferrum_kernel_trace.so
//   $B/apps/engine/ferrum_engine --random llama3-8b --quant gptq --eager --steps 16
//   python3 bench/kernel_trace_summary.py trace.csv
// ($B: the build directory; scripts/gpu_suite.sh trace does this.)
//
// FERRUM_KERNEL_TRACE names the CSV written at exit (default
// kernel_trace.csv); it is read once, when the library loads. Columns: start
// and end in ns, graph id and node id (0 outside graphs), correlation id, grid,
// block, cluster, dynamic shared memory, stream id (whether a graph's branches
// show as streams of their own is not checked yet), kernel name as CUPTI
// gives it (C++ names mangled; the summaries demangle them with c++filt). A
// process killed
// before it exits normally writes nothing.
//
// CONCURRENT_KERNEL records do not serialise kernels (the KERNEL kind would).
// CUPTI adds work per launch: an eager llama3-8b GPTQ step ran ~1 % slower
// traced, a graph replay ~25 % slower (CUPTI instruments every graph node),
// so read graph traces for order and overlap, eager ones for time.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  std::uint64_t start, end;
  std::uint32_t graph_id;
  std::uint64_t graph_node_id;
  std::uint32_t correlation_id;
  std::int32_t grid[3], block[3];
  std::uint32_t cluster[3];
  std::int32_t dynamic_smem;
  std::uint32_t stream_id;
  std::string name;
};

constexpr std::size_t kBufferBytes = std::size_t{8} << 20;

std::mutex g_mutex;
std::vector<KernelRecord>* g_records = nullptr;  // leaked on purpose: written from CUPTI's thread at exit
std::string* g_path = nullptr;
bool g_enabled = false;
std::size_t g_incomplete = 0;  // records without a complete start / end

void report(const char* what, CUptiResult r) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "ferrum_kernel_trace: %s failed: %s\n", what, text ? text : "?");
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    // A forced flush may hand over records of kernels still running, without
    // timestamps: counted, not written.
    if (k->start == 0 || k->end < k->start) {
      ++g_incomplete;
      continue;
    }
    g_records->push_back(KernelRecord{k->start,
                                      k->end,
                                      k->graphId,
                                      k->graphNodeId,
                                      k->correlationId,
                                      {k->gridX, k->gridY, k->gridZ},
                                      {k->blockX, k->blockY, k->blockZ},
                                      {k->clusterX, k->clusterY, k->clusterZ},
                                      k->dynamicSharedMemory,
                                      k->streamId,
                                      k->name ? k->name : "?"});
  }
  std::size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "ferrum_kernel_trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

void write_csv() {
  // A process that ran no kernel (e.g. `timeout` when LD_PRELOAD is set on
  // it too) writes nothing, so it cannot overwrite its child's trace.
  if (g_records->empty()) return;
  std::FILE* f = std::fopen(g_path->c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "ferrum_kernel_trace: cannot write %s\n", g_path->c_str());
    return;
  }
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node_id,correlation_id,grid,block,cluster,dyn_smem,stream_id,name\n");
  for (const KernelRecord& r : *g_records) {
    std::string name = r.name;
    for (char& c : name)
      if (c == '"') c = '\'';
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,%ux%ux%u,%d,%u,\"%s\"\n",
                 static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end), r.graph_id,
                 static_cast<unsigned long long>(r.graph_node_id), r.correlation_id, r.grid[0], r.grid[1], r.grid[2],
                 r.block[0], r.block[1], r.block[2], r.cluster[0], r.cluster[1], r.cluster[2], r.dynamic_smem,
                 r.stream_id, name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "ferrum_kernel_trace: %zu kernels -> %s", g_records->size(), g_path->c_str());
  if (g_incomplete) std::fprintf(stderr, " (%zu records without timestamps left out)", g_incomplete);
  std::fprintf(stderr, "\n");
}

// At exit (registered in trace_start, so it runs after every exit handler
// registered later, before the libraries are unloaded): flush every buffer,
// including the ones still being filled, then write the CSV once.
void trace_finish() {
  static bool done = false;
  if (!g_enabled || done) return;
  done = true;
  const CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (r != CUPTI_SUCCESS) report("cuptiActivityFlushAll", r);
  std::lock_guard<std::mutex> lock(g_mutex);
  write_csv();
}

__attribute__((constructor)) void trace_start() {
  const char* path = std::getenv("FERRUM_KERNEL_TRACE");
  g_path = new std::string(path && *path ? path : "kernel_trace.csv");
  g_records = new std::vector<KernelRecord>();
  g_records->reserve(1 << 16);
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) return report("cuptiActivityRegisterCallbacks", r);
  r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) return report("cuptiActivityEnable(CONCURRENT_KERNEL)", r);
  g_enabled = true;
  std::atexit(trace_finish);
}

// Also at unload, for a process that leaves without running its exit
// handlers' list to the end (trace_finish runs once either way).
__attribute__((destructor)) void trace_unload() { trace_finish(); }

}  // namespace
