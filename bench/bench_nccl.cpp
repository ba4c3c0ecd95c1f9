// ferrum_bench_nccl: bus bandwidth of CudaBackend::all_reduce (Sum) and
// all_gather over NCCL, against raw ncclAllReduce / ncclAllGather calls on the
// same buffers, the same communicators and the same streams, in one run.
//
// One process drives two GPUs (Communicator::create_all({0, 1})); each
// iteration issues both ranks' calls between group_start / group_end. Sizes
// run from 1 KB to 256 MB (doubling); for all_gather the size is the gathered
// output, as in nccl-tests. Each sample times a batch of iterations with CUDA
// events on both streams (the slower rank counts); ours and raw samples
// alternate, and the table shows the median of each. Bus bandwidth as nccl-tests defines it:
//   all_reduce  busbw = algbw * 2 (n - 1) / n
//   all_gather  busbw = algbw * (n - 1) / n       (algbw = bytes / time)
//
//   ferrum_bench_nccl [--json FILE] [--max-bytes N]
//
// With fewer than two GPUs (or without NCCL) it says so and exits 0.
// NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless already set), a
// workplace safety rule on the H200 machines.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ferrum/ferrum.hpp"

namespace {

using namespace ferrum;

constexpr int kWorld = 2;
constexpr int kWarmup = 3;
constexpr int kSamples = 21;

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "bench_nccl: %s failed: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "bench_nccl: %s failed: %s\n", what, ncclGetErrorString(r));
    std::exit(1);
  }
}

struct Rank {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<CudaBackend> be;
  cudaEvent_t start = nullptr, stop = nullptr;
  ncclComm_t raw() const { return static_cast<ncclComm_t>(comm->native_handle()); }
};

// Seconds per iteration of one timed batch of launch(rank), issued on both
// ranks as one group per iteration (the slower rank counts).
double sample_op(std::array<Rank, kWorld>& ranks, int iters, const std::function<void(Rank&)>& launch,
                 bool timed = true) {
  for (Rank& r : ranks) {
    cuda_ok(cudaSetDevice(r.be->device()), "cudaSetDevice");
    if (timed) cuda_ok(cudaEventRecord(r.start, r.be->stream()), "cudaEventRecord");
  }
  for (int i = 0; i < iters; ++i) {
    Communicator::group_start();
    for (Rank& r : ranks) launch(r);
    Communicator::group_end();
  }
  for (Rank& r : ranks) {
    cuda_ok(cudaSetDevice(r.be->device()), "cudaSetDevice");
    if (timed) cuda_ok(cudaEventRecord(r.stop, r.be->stream()), "cudaEventRecord");
  }
  for (Rank& r : ranks) r.be->synchronize();  // polls, with the collective timeout
  if (!timed) return 0.0;
  double worst = 0.0;
  for (Rank& r : ranks) {
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, r.start, r.stop), "cudaEventElapsedTime");
    worst = std::max(worst, static_cast<double>(ms) * 1e-3 / iters);
  }
  return worst;
}

// Median seconds per iteration of `ours` and of `raw`, their samples
// interleaved (ours, raw, raw, ours, ...) so clock and host drift hit both.
std::pair<double, double> time_pair(std::array<Rank, kWorld>& ranks, int iters,
                                    const std::function<void(Rank&)>& ours, const std::function<void(Rank&)>& raw) {
  sample_op(ranks, kWarmup, ours, false);
  sample_op(ranks, kWarmup, raw, false);
  std::vector<double> a, b;
  for (int s = 0; s < kSamples; ++s) {
    if (s % 2 == 0) {
      a.push_back(sample_op(ranks, iters, ours));
      b.push_back(sample_op(ranks, iters, raw));
    } else {
      b.push_back(sample_op(ranks, iters, raw));
      a.push_back(sample_op(ranks, iters, ours));
    }
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {a[a.size() / 2], b[b.size() / 2]};
}

struct Row {
  std::string op, dtype;
  std::size_t bytes = 0, count = 0;
  double ours_s = 0, raw_s = 0, ours_busbw = 0, raw_busbw = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::size_t max_bytes = std::size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc) {
      max_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--max-bytes N]\n", argv[0]);
      return 2;
    }
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // unless already set
  if (!Communicator::available()) {
    std::printf("bench_nccl: ferrum was built without NCCL; nothing to measure\n");
    return 0;
  }
  const int devices = cuda_device_count();
  if (devices < kWorld) {
    std::printf("bench_nccl: needs %d CUDA devices, found %d; nothing to measure\n", kWorld, devices);
    return 0;
  }

  std::array<Rank, kWorld> ranks;
  const std::array<int, kWorld> device_list = {0, 1};
  const auto comms = Communicator::create_all(device_list);
  for (int r = 0; r < kWorld; ++r) {
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    rank.comm = comms[static_cast<std::size_t>(r)];
    CudaBackendConfig config;
    config.device = r;
    config.communicator = rank.comm;
    rank.be = std::make_unique<CudaBackend>(config);
    cuda_ok(cudaSetDevice(r), "cudaSetDevice");
    cuda_ok(cudaEventCreate(&rank.start), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&rank.stop), "cudaEventCreate");
  }

  std::vector<Row> rows;
  const double n = kWorld;
  std::printf("%-10s %-5s %12s %12s %11s %11s %11s %11s %7s\n", "op", "dtype", "bytes", "count", "ours_us",
              "ours_busbw", "raw_us", "raw_busbw", "ratio");
  for (DType dt : {DType::F16, DType::BF16}) {
    const ncclDataType_t nt = dt == DType::F16 ? ncclFloat16 : ncclBfloat16;
    for (const char* op : {"all_reduce", "all_gather"}) {
      const bool reduce = std::strcmp(op, "all_reduce") == 0;
      for (std::size_t bytes = 1024; bytes <= max_bytes; bytes *= 2) {
        const std::size_t count = bytes / size_of(dt);  // all_reduce: buffer; all_gather: gathered output
        const std::size_t local = count / kWorld;
        std::array<Buffer, kWorld> a, b;
        for (std::size_t r = 0; r < kWorld; ++r) {
          a[r] = ranks[r].be->alloc(dt, reduce ? count : local);
          if (!reduce) b[r] = ranks[r].be->alloc(dt, count);
          ranks[r].be->write(a[r], std::vector<float>(reduce ? count : local, 1.0f));
        }
        auto index = [&](Rank& r) { return static_cast<std::size_t>(r.comm->rank()); };
        std::function<void(Rank&)> ours, raw;
        if (reduce) {
          ours = [&](Rank& r) { r.be->all_reduce(a[index(r)], count, ReduceOp::Sum); };
          raw = [&](Rank& r) {
            void* p = a[index(r)].data();
            nccl_ok(ncclAllReduce(p, p, count, nt, ncclSum, r.raw(), r.be->stream()), "ncclAllReduce");
          };
        } else {
          ours = [&](Rank& r) { r.be->all_gather(a[index(r)], b[index(r)], local); };
          raw = [&](Rank& r) {
            nccl_ok(ncclAllGather(a[index(r)].data(), b[index(r)].data(), local, nt, r.raw(), r.be->stream()),
                    "ncclAllGather");
          };
        }
        const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 5, 200));
        Row row;
        row.op = op;
        row.dtype = std::string(to_string(dt));
        row.bytes = bytes;
        row.count = count;
        std::tie(row.ours_s, row.raw_s) = time_pair(ranks, iters, ours, raw);
        const double factor = reduce ? 2.0 * (n - 1.0) / n : (n - 1.0) / n;
        row.ours_busbw = static_cast<double>(bytes) / row.ours_s / 1e9 * factor;
        row.raw_busbw = static_cast<double>(bytes) / row.raw_s / 1e9 * factor;
        std::printf("%-10s %-5s %12zu %12zu %11.2f %11.2f %11.2f %11.2f %7.3f\n", op, row.dtype.c_str(), bytes, count,
                    row.ours_s * 1e6, row.ours_busbw, row.raw_s * 1e6, row.raw_busbw, row.raw_s / row.ours_s);
        std::fflush(stdout);
        rows.push_back(row);
      }
    }
  }
  std::printf("busbw in GB/s (nccl-tests definition); ratio = raw time / our time (1.0 = no overhead)\n");

  if (!json_path.empty()) {
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "bench_nccl: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(f, "{\"world_size\": %d, \"results\": [\n", kWorld);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "  {\"op\": \"%s\", \"dtype\": \"%s\", \"bytes\": %zu, \"count\": %zu, \"ours_us\": %.3f, "
                   "\"ours_busbw_gbps\": %.3f, \"raw_us\": %.3f, \"raw_busbw_gbps\": %.3f}%s\n",
                   r.op.c_str(), r.dtype.c_str(), r.bytes, r.count, r.ours_s * 1e6, r.ours_busbw, r.raw_s * 1e6,
                   r.raw_busbw, i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  }
  for (Rank& r : ranks) {
    cuda_ok(cudaSetDevice(r.be->device()), "cudaSetDevice");
    cuda_ok(cudaEventDestroy(r.start), "cudaEventDestroy");
    cuda_ok(cudaEventDestroy(r.stop), "cudaEventDestroy");
  }
  return 0;
}
