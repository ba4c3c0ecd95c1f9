// Sweeps qk_norm_rope's 16-byte launch shape (RopeVecShape: tokens per
// tile, rows per thread, block size) at the benchmark's large shapes
// (T x 32 heads x 128, with the norm), straight through the launcher. Used
// to pick RopeVecShape's defaults; not part of the library.
//
// Every configuration is timed two ways (bench/tuning_timer.hpp), buffers
// rotated through 1 GiB, beside cudaMemcpyAsync moving the same bytes. Its
// output is also compared bit for bit with the default shape's, on the
// timed shapes and on token counts that leave a partial last tile: a shape
// only moves rows between threads, so any difference is a bug.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/tuning_timer.hpp"
#include "kernels/rope.hpp"

using ferrum::bench::check;
using ferrum::bench::Times;
using ferrum::bench::time_both;
using ferrum::kernels::RopeArgs;
using ferrum::kernels::RopeVecShape;

namespace {

constexpr int kHeads = 32;
constexpr int kHeadDim = 128;
constexpr int kHalf = kHeadDim / 2;

std::vector<RopeVecShape> shapes_to_sweep() {
  std::vector<RopeVecShape> out;
  for (int tile : {1, 2, 4, 8, 16, 32}) {
    for (int rows : {1, 2}) {
      for (int block : {128, 256, 512}) out.push_back(RopeVecShape{tile, rows, block});
    }
  }
  return out;
}

// Host values for 2-byte elements: finite, of mixed sign and size (the same
// bits serve f16 and bf16 as inputs of a bitwise comparison).
std::vector<std::uint16_t> random_halves(std::size_t n, std::uint32_t seed, bool bf16) {
  std::vector<std::uint16_t> v(n);
  std::uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    const float f = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    if (bf16) {
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      x = static_cast<std::uint16_t>(bits >> 16);
    } else {
      const __half h = __float2half(f);
      std::memcpy(&x, &h, 2);
    }
  }
  return v;
}

struct Device {
  void* pool = nullptr;  // rotated sets of [input | output]
  std::size_t pool_bytes = std::size_t{1} << 30;
  void* weight = nullptr;
  float* cos = nullptr;
  float* sin = nullptr;
  std::uint32_t* error_flag = nullptr;
  int max_pos = 0;
};

RopeArgs make_args(const Device& d, ferrum::DType dtype, const void* in, void* out, int tokens,
                   const RopeVecShape& shape) {
  RopeArgs a;
  a.dtype = dtype;
  a.input = in;
  a.norm_w = d.weight;
  a.cos = d.cos;
  a.sin = d.sin;
  a.output = out;
  a.tokens = tokens;
  a.heads = kHeads;
  a.head_dim = kHeadDim;
  a.pos_offset = 0;
  a.max_pos = d.max_pos;
  a.eps = 1e-6f;
  a.error_flag = d.error_flag;
  a.vec_shape = shape;
  return a;
}

// Output of one launch on `in`, from a poisoned buffer.
std::vector<std::uint16_t> run_once(const Device& d, ferrum::DType dtype, const void* in, void* out, int tokens,
                                    const RopeVecShape& shape, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(tokens) * kHeads * kHeadDim;
  check(cudaMemsetAsync(out, 0xff, n * 2, stream), "cudaMemsetAsync");  // NaN in both dtypes
  ferrum::kernels::launch_qk_norm_rope(make_args(d, dtype, in, out, tokens, shape), stream);
  std::vector<std::uint16_t> host(n);
  check(cudaMemcpyAsync(host.data(), out, n * 2, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return host;
}

}  // namespace

// ferrum_rope_tuning [f16,bf16] [chain]: dtypes (default both) and launches
// per chained sample (default 8). Exit status 1 if any shape's output
// differs from the default's.
int main(int argc, char** argv) {
  const std::string dtypes_arg = argc > 1 ? argv[1] : "f16,bf16";
  const int chain = argc > 2 ? std::max(1, std::atoi(argv[2])) : 8;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no GPU: nothing to tune\n");
    return 0;
  }
  Device d;
  d.max_pos = 32768;
  check(cudaMalloc(&d.pool, d.pool_bytes), "cudaMalloc");
  check(cudaMalloc(&d.weight, kHeadDim * 2), "cudaMalloc");
  check(cudaMalloc(&d.cos, static_cast<std::size_t>(d.max_pos) * kHalf * 4), "cudaMalloc");
  check(cudaMalloc(&d.sin, static_cast<std::size_t>(d.max_pos) * kHalf * 4), "cudaMalloc");
  check(cudaMalloc(&d.error_flag, 4), "cudaMalloc");
  check(cudaMemset(d.error_flag, 0, 4), "cudaMemset");
  {
    std::vector<float> c(static_cast<std::size_t>(d.max_pos) * kHalf), s(c.size());
    for (int p = 0; p < d.max_pos; ++p) {
      for (int i = 0; i < kHalf; ++i) {
        const double angle = p * std::pow(500000.0, -2.0 * i / kHeadDim);
        c[static_cast<std::size_t>(p) * kHalf + i] = static_cast<float>(std::cos(angle));
        s[static_cast<std::size_t>(p) * kHalf + i] = static_cast<float>(std::sin(angle));
      }
    }
    check(cudaMemcpy(d.cos, c.data(), c.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(d.sin, s.data(), s.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  const std::vector<RopeVecShape> shapes = shapes_to_sweep();
  int mismatches = 0;

  for (const ferrum::DType dtype : {ferrum::DType::F16, ferrum::DType::BF16}) {
    const bool bf16 = dtype == ferrum::DType::BF16;
    const char* dname = bf16 ? "bf16" : "f16";
    if (("," + dtypes_arg + ",").find(std::string(",") + dname + ",") == std::string::npos) continue;
    const auto w = random_halves(kHeadDim, 7u, bf16);
    check(cudaMemcpy(d.weight, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");

    // Bitwise agreement with the default shape, partial last tiles included.
    for (int tokens : {1, 3, 37, 255, 8191, 8192}) {
      const std::size_t n = static_cast<std::size_t>(tokens) * kHeads * kHeadDim;
      const auto x = random_halves(n, 1234u + static_cast<std::uint32_t>(tokens), bf16);
      auto* in = static_cast<char*>(d.pool);
      void* out = in + n * 2;
      check(cudaMemcpy(in, x.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
      const auto want = run_once(d, dtype, in, out, tokens, RopeVecShape{}, stream);
      for (const RopeVecShape& shape : shapes) {
        if (run_once(d, dtype, in, out, tokens, shape, stream) != want) {
          std::printf("MISMATCH %s tokens=%d tile=%d rows=%d block=%d\n", dname, tokens, shape.tile_tokens,
                      shape.rows_per_thread, shape.block_threads);
          ++mismatches;
        }
      }
    }
    std::uint32_t flag = 0;
    check(cudaMemcpy(&flag, d.error_flag, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (flag != 0) {
      std::printf("device error flag set: %u\n", flag);
      ++mismatches;
    }
    std::printf("%s: bitwise check over %zu shapes x 6 token counts: %d mismatches\n", dname, shapes.size(),
                mismatches);

    std::printf("\n%-5s %-6s %-5s %-5s %-6s %12s %9s %12s %9s\n", "dtype", "T", "tile", "rows", "block", "single_us",
                "GB/s", "chain_us", "GB/s");
    for (int tokens : {8192, 32768}) {
      const std::size_t tensor = static_cast<std::size_t>(tokens) * kHeads * kHeadDim * 2;
      const int sets = static_cast<int>(d.pool_bytes / (2 * tensor));
      // As ferrum_bench counts it: input + output, norm weight, the cos / sin rows used.
      const double bytes = 2.0 * tensor + kHeadDim * 2 + 2.0 * tokens * kHalf * 4;
      auto* base = static_cast<char*>(d.pool);
      const Times copy = time_both(sets, chain, stream, [&](int s) {
        check(cudaMemcpyAsync(base + 2 * s * tensor + tensor, base + 2 * s * tensor, tensor, cudaMemcpyDeviceToDevice,
                              stream),
              "cudaMemcpyAsync");
      });
      std::printf("%-5s %-6d %-17s %12.2f %9.0f %12.2f %9.0f\n", dname, tokens, "copy (same bytes)", copy.single_us,
                  2.0 * tensor / copy.single_us / 1e3, copy.chain_us, 2.0 * tensor / copy.chain_us / 1e3);
      for (const RopeVecShape& shape : shapes) {
        const Times t = time_both(sets, chain, stream, [&](int s) {
          char* set = base + 2 * s * tensor;
          ferrum::kernels::launch_qk_norm_rope(make_args(d, dtype, set, set + tensor, tokens, shape), stream);
        });
        std::printf("%-5s %-6d %-5d %-5d %-6d %12.2f %9.0f %12.2f %9.0f\n", dname, tokens, shape.tile_tokens,
                    shape.rows_per_thread, shape.block_threads, t.single_us, bytes / t.single_us / 1e3, t.chain_us,
                    bytes / t.chain_us / 1e3);
      }
    }
  }
  // 1 GiB copy, as ferrum_bench's reference.
  {
    auto* base = static_cast<char*>(d.pool);
    const std::size_t half = d.pool_bytes / 2;
    const Times t = time_both(1, 4, stream, [&](int) {
      check(cudaMemcpyAsync(base + half, base, half, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    });
    std::printf("\ncopy 1 GiB moved: %.2f us (%.0f GB/s)\n", t.single_us, 1.0 * d.pool_bytes / t.single_us / 1e3);
  }
  return mismatches == 0 ? 0 : 1;
}
