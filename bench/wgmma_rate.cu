// How fast an SM issues wgmma.mma_async on its own, and with the GPTQ
// kernel's dequantization between (docs/design/gptq_small_m.md §13.12,
// §13.13). Session 45: wgmma alone runs at the tensor rate from two
// warpgroups per SM. Session 46: the dequantization's f16x2 arithmetic
// issues to the pipe the tensor cores use, so it costs tensor time whatever
// the warpgroups per SM.
//
//   ferrum_wgmma_rate [--steps N (a multiple of 4)] [--reps N]
//
// Each CTA is one warpgroup looping over k16 steps exactly as
// gptq_wgmma_kernel does: per step one wgmma.fence, W wgmma into W
// accumulator sets (only the timing counts), one commit group, then
// wgmma.wait_group 1. Variants:
//   rs n16 / n32 / n64: A from registers, B K-major in shared memory (the
//                     GPTQ kernel's wgmma_rs_m64nNk16, 4 per step);
//   ... +A:           the A registers rewritten every step (one write per
//                     word: the fence then orders real register writes);
//   ... +dq:          the GPTQ kernel's dequantization of 4 words per step
//                     into the A set (Int4Math<__half>, scale-before), the
//                     words made from the step count;
//   ... +dq+lds:      the same, the words read from shared memory one step
//                     ahead, as the kernel reads them;
//   ... +dq-s:        the dequantization without the scale multiply;
//   ... +dq32:        the dequantization in f32 (the same bits for a uniform
//                     scale, no f16x2 arithmetic) and one f16x2 pack per
//                     pair;
//   ... +lop3:        A straight from a shift and a lop3 per register, the
//                     magic f16 (1024 + q): no f16x2 arithmetic (§13.13);
//   ... +lop3 g:      the same with its per-group fold (n16, n32): a second
//                     accumulator set per 128-row group, drained and folded
//                     with 2 f32 FMA per accumulator every 8 steps;
//   ss n64 / ss n128: A and B from shared memory (4 / 2 per step: the same
//                     MACs per step as rs n64).
// The launch puts 1, 2 or 3 CTAs on every SM (dynamic shared memory sized
// so that no more fit) and reports, per SM, cycles per wgmma (clock64 from
// its first CTA's loop start to its last one's end, over their wgmma; the
// median over SMs) against the tensor work of one
// instruction (M x N x K / 2048 MAC per cycle, the H100/H200 dense f16 rate).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/cuda_check.hpp"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_ops.cuh"
#include "kernels/gptq_int4.cuh"

namespace {

using namespace ferrum::kernels;

enum class Op { RsN16, RsN32, RsN64, SsN64, SsN128 };
// What each step does to the A set it is about to use (RS variants):
// nothing; one register write per word; the GPTQ kernel's dequantization of
// 4 words from registers (Int4Math<__half>, scale-before); the same with the
// words read from shared memory one step ahead, as the kernel reads them.
// Two more isolate what the dequantization costs the tensor pipe (on sm_90
// f16x2 arithmetic issues to the pipe the tensor cores sit on): without the
// scale multiply (4 of its 8 f16x2 operations per word), and the whole
// dequantization in f32 (lop3 + f32 add and multiply, one f16x2 pack per
// pair: the same bits as Int4Math's with one scale for all eight weights, as
// here; no f16x2 arithmetic).
// The last two are docs/design/gptq_small_m.md §13.13's proposal: A straight
// from lop3 as the magic f16 (1024 + q) (a shift and a lop3 per register, no
// f16x2 arithmetic), and the same with its per-group fold: each 128-row
// group (8 steps) accumulates into its own set (scale-d 0 on the group's
// first wgmma), then waits for it and folds it into the main accumulators
// with the scale and the offset's row-sum term (2 f32 FMA per accumulator).
enum class Work { None, Or, Dequant, DequantLds, DequantUnscaled, DequantF32, Lop3, Lop3Fold };

constexpr int kThreads = 128;

// Each variant's N, and its wgmma per k16 step (the same MACs per step for
// every N-64 and N-128 variant; N = 16 and N = 32 issue as many as N = 64).
template <Op kOp>
constexpr int kOpN = kOp == Op::RsN16 ? 16 : kOp == Op::RsN32 ? 32 : kOp == Op::SsN128 ? 128 : 64;
template <Op kOp>
constexpr int kOpPerStep = kOp == Op::SsN128 ? 2 : 4;

// stamps: [gridDim.x][3] the CTA's SM and its loop's first and last clock64
// (one counter per SM, so the stamps of one SM's CTAs compare); sink: one
// float per CTA, so that the accumulators are not dropped.
// Shared memory a CTA uses: the A tile, the B tile, and 4 warps' weights of
// 4 k16 steps (2 KiB each, the GPTQ kernel's per-stage block), + alignment.
template <Op kOp>
constexpr int kSmemUsed = (64 + kOpN<kOp>) * 128 + 4 * 2048 + 1024;

template <Op kOp, Work kWork>
__global__ void __launch_bounds__(kThreads, 1) wgmma_rate_kernel(int steps, std::uint32_t scale_bits, long long* stamps,
                                                                float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kN = kOpN<kOp>, kPer = kOpPerStep<kOp>, kAcc = kN / 2;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  // A tile [64 rows][64 k] and B tile [kN rows][64 k], 128-byte swizzled
  // K-major blocks (8 KiB and kN x 128 B), zeros.
  for (int i = threadIdx.x; i < ((64 + kN) * 128 + 4 * 2048) / 16; i += kThreads) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();
  const std::uint32_t a_smem = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const std::uint32_t b_smem = a_smem + 64 * 128;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // This lane's weight words of step kk (zeros; the Dequant variant makes
  // its own from the trip count so that nothing is hoisted).
  const unsigned char* w_smem = smem + (64 + kN) * 128 + warp * 2048 + lane * 16;
  std::uint32_t sc[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) sc[t] = scale_bits;
  std::uint32_t lo = 0, hi = 0;
  gptq::Int4Math<__half>::biases(8, lo, hi);
  float acc[kPer][kAcc];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[j][i] = 0.0f;
  }
  std::uint32_t af[2][kPer][4];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) af[s][j][i] = 0u;
    }
  }
  // Lop3Fold's main accumulators, per-feature scales and per-row activation
  // sums (values from the launch's scale, only the timing counts).
  float main_acc[kPer][kWork == Work::Lop3Fold ? kAcc : 1] = {};
  float fold_scale[8], row_sum[4];
#pragma unroll
  for (int t = 0; t < 8; ++t) fold_scale[t] = __uint_as_float(scale_bits) * static_cast<float>(t + 1);
#pragma unroll
  for (int t = 0; t < 4; ++t) row_sum[t] = static_cast<float>(lane + t);
  const long long t0 = clock64();
  // Four k16 steps per trip (steps is a multiple of 4), so that the A set
  // and the k offset are compile-time, as in the GPTQ kernel's unrolled
  // stage.
  uint4 w_next = make_uint4(0u, 0u, 0u, 0u);
  if constexpr (kWork == Work::DequantLds) w_next = *reinterpret_cast<const uint4*>(w_smem);
  for (int trip = 0; trip < steps / 4; ++trip) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      std::uint32_t(&a)[kPer][4] = af[kk & 1];
      if constexpr (kWork == Work::Lop3 || kWork == Work::Lop3Fold) {
        const auto v = static_cast<std::uint32_t>(trip * 4 + kk) ^ static_cast<std::uint32_t>(lane);
        const std::uint32_t words[4] = {v, v * 3u, v * 5u, v * 7u};
        constexpr std::uint32_t kMagic = 0x64006400u;  // half2 (1024, 1024)
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          // b[i] = (1024 + q_i, 1024 + q_{i+4}): nibbles i and i + 4.
          a[j][0] = gptq::and_or(words[j], 0x000F000Fu, kMagic);
          a[j][1] = gptq::and_or(words[j] >> 8, 0x000F000Fu, kMagic);
          a[j][2] = gptq::and_or(words[j] >> 4, 0x000F000Fu, kMagic);
          a[j][3] = gptq::and_or(words[j] >> 12, 0x000F000Fu, kMagic);
        }
      } else if constexpr (kWork == Work::DequantUnscaled || kWork == Work::DequantF32) {
        const auto v = static_cast<std::uint32_t>(trip * 4 + kk) ^ static_cast<std::uint32_t>(lane);
        const std::uint32_t words[4] = {v, v * 3u, v * 5u, v * 7u};
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          std::uint32_t b[4];
          if constexpr (kWork == Work::DequantUnscaled) {
            gptq::Int4Math<__half>::dequant_unscaled(words[j], lo, hi, lo, hi, b);
          } else {
            // Nibble i + 4 h of the word is b[i]'s half h (i = 0..3, h = 0
            // low, 1 high): bits 4 i and 16 + 4 i.
            const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(sc[2 * j] & 0xFFFFu)));
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float q_lo = __uint_as_float(0x4B000000u | ((words[j] >> (4 * i)) & 0xFu)) - 8388616.0f;
              const float q_hi = __uint_as_float(0x4B000000u | ((words[j] >> (16 + 4 * i)) & 0xFu)) - 8388616.0f;
              const __half2 h = __floats2half2_rn(__fmul_rn(q_lo, scale), __fmul_rn(q_hi, scale));
              b[i] = *reinterpret_cast<const std::uint32_t*>(&h);
            }
          }
          a[j][0] = b[0];
          a[j][1] = b[2];
          a[j][2] = b[1];
          a[j][3] = b[3];
        }
      } else if constexpr (kWork == Work::Dequant || kWork == Work::DequantLds) {
        static_assert(kOp != Op::SsN64 && kOp != Op::SsN128, "dequantization feeds register A");
        uint4 w = w_next;
        if constexpr (kWork == Work::DequantLds) {
          w_next = *reinterpret_cast<const uint4*>(w_smem + ((kk + 1) & 3) * 512);
        } else {
          const auto v = static_cast<std::uint32_t>(trip * 4 + kk) ^ static_cast<std::uint32_t>(lane);
          w = make_uint4(v, v * 3u, v * 5u, v * 7u);
        }
        const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          std::uint32_t b[4];
          gptq::dequant_scaled<__half>(words[j], sc[2 * j], lo, hi, sc[2 * j + 1], lo, hi, b);
          a[j][0] = b[0];
          a[j][1] = b[2];
          a[j][2] = b[1];
          a[j][3] = b[3];
        }
      } else if constexpr (kWork == Work::Or) {
        // One register write per fragment word (the value stays zero: trip
        // >> 30 is 0), as a dequantization writes the set before its wgmma.
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[j][i] |= static_cast<std::uint32_t>(trip >> 30);
        }
      }
      wgmma_fence();
      const std::uint64_t desc_b = wgmma_desc_sw128(b_smem + kk * 32, 16, 1024);
      // Lop3Fold: a group's first step overwrites its accumulators.
      const int scale_d = kWork == Work::Lop3Fold && kk == 0 && (trip & 1) == 0 ? 0 : 1;
      if constexpr (kOp == Op::RsN16) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) wgmma_rs_m64n16k16<__half>(acc[j], a[j], desc_b, scale_d);
      } else if constexpr (kOp == Op::RsN32) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) wgmma_rs_m64n32k16<__half>(acc[j], a[j], desc_b, scale_d);
      } else if constexpr (kOp == Op::RsN64) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) wgmma_rs_m64n64k16<__half>(acc[j], a[j], desc_b, 1);
      } else if constexpr (kOp == Op::SsN64) {
        const std::uint64_t desc_a = wgmma_desc_sw128(a_smem + kk * 32, 16, 1024);
#pragma unroll
        for (int j = 0; j < kPer; ++j) wgmma_ss_m64n64k16<__half>(acc[j], desc_a, desc_b, 1);
      } else {
        const std::uint64_t desc_a = wgmma_desc_sw128(a_smem + kk * 32, 16, 1024);
#pragma unroll
        for (int j = 0; j < kPer; ++j) wgmma_ss_m64n128k16<__half>(acc[j], desc_a, desc_b, 1);
      }
      wgmma_commit();
      if constexpr (kWork == Work::Lop3Fold) {
        if (kk == 3 && (trip & 1) == 1) {
          // The group's last step: its accumulators done, then folded.
          wgmma_wait<0>();
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            wgmma_fence_operands(acc[j]);
#pragma unroll
            for (int i = 0; i < kAcc; ++i) {
              const float scale = fold_scale[(2 * j + ((i >> 1) & 1)) & 7];
              main_acc[j][i] = fmaf(scale, acc[j][i], fmaf(-scale * 1032.0f, row_sum[i & 3], main_acc[j][i]));
            }
          }
          continue;
        }
      }
      wgmma_wait<1>();
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < kPer; ++j) wgmma_fence_operands(acc[j]);
  const long long t1 = clock64();
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) sum += acc[j][i] + main_acc[j][i];
  }
  if (threadIdx.x == 0) {
    unsigned sm = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    stamps[3 * blockIdx.x] = sm;
    stamps[3 * blockIdx.x + 1] = t0;
    stamps[3 * blockIdx.x + 2] = t1;
    sink[blockIdx.x] = sum;
  }
#else
  (void)steps;
  (void)stamps;
  (void)sink;
  (void)scale_bits;
  __trap();  // wgmma exists only in sm_90a code: a build without it reports the launch's error
#endif
}

struct Result {
  double cycles_per_wgmma;  // per SM: the span of its CTAs' loops / their wgmma (median over SMs)
  double us;                // the launch, event-timed (median of reps)
  int fit;                  // CTAs per SM the occupancy query allows (the row is measured only where = asked)
};

template <Op kOp, Work kWork>
Result run(int ctas_per_sm, int num_sms, int smem_per_sm, int reserve, int max_smem, int steps, int reps) {
  constexpr int kPer = kOpPerStep<kOp>;
  auto kernel = wgmma_rate_kernel<kOp, kWork>;
  // Shared memory that lets exactly ctas_per_sm CTAs share an SM (each CTA's
  // share less the runtime's per-block reserve and a 16-byte margin), at
  // least the tiles and their alignment slack, at most what a block may ask.
  const int smem = std::min(std::max(kSmemUsed<kOp>, smem_per_sm / ctas_per_sm - reserve - 16), max_smem);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "cudaFuncSetAttribute");
  int fit = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, smem), "occupancy");
  if (fit != ctas_per_sm) return {0.0, 0.0, fit};
  const int grid = num_sms * ctas_per_sm;
  long long* stamps = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&stamps, 3 * grid * sizeof(long long)), "cudaMalloc");
  check(cudaMalloc(&sink, grid * sizeof(float)), "cudaMalloc");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  constexpr std::uint32_t kOne = 0x3C003C00u;  // half2 (1, 1): finite dequantized values
  kernel<<<grid, kThreads, smem>>>(steps, kOne, stamps, sink);  // warm-up
  check(cudaGetLastError(), "launch");
  std::vector<float> times;
  std::vector<long long> st(3 * static_cast<std::size_t>(grid));
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(e0), "record");
    kernel<<<grid, kThreads, smem>>>(steps, kOne, stamps, sink);
    check(cudaGetLastError(), "launch");
    check(cudaEventRecord(e1), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    times.push_back(ms * 1000.0f);
  }
  check(cudaMemcpy(st.data(), stamps, st.size() * sizeof(long long), cudaMemcpyDeviceToHost), "copy");
  std::sort(times.begin(), times.end());
  // Per SM (last launch): from its first CTA's loop start to its last one's
  // end, over the wgmma its CTAs issued.
  std::vector<long long> first(static_cast<std::size_t>(num_sms), -1), last(static_cast<std::size_t>(num_sms), -1);
  std::vector<int> count(static_cast<std::size_t>(num_sms), 0);
  for (int b = 0; b < grid; ++b) {
    const auto sm = static_cast<std::size_t>(st[3 * b]);
    if (sm >= first.size()) continue;
    first[sm] = first[sm] < 0 ? st[3 * b + 1] : std::min(first[sm], st[3 * b + 1]);
    last[sm] = std::max(last[sm], st[3 * b + 2]);
    ++count[sm];
  }
  std::vector<double> per_sm;
  for (std::size_t sm = 0; sm < first.size(); ++sm) {
    if (count[sm] > 0) {
      per_sm.push_back(static_cast<double>(last[sm] - first[sm]) / (static_cast<double>(count[sm]) * steps * kPer));
    }
  }
  if (per_sm.empty()) {
    std::fprintf(stderr, "ferrum_wgmma_rate: no CTA reported a valid SM\n");
    std::exit(1);
  }
  std::sort(per_sm.begin(), per_sm.end());
  check(cudaFree(stamps), "cudaFree");
  check(cudaFree(sink), "cudaFree");
  check(cudaEventDestroy(e0), "cudaEventDestroy");
  check(cudaEventDestroy(e1), "cudaEventDestroy");
  return {per_sm[per_sm.size() / 2], times[times.size() / 2], fit};
}

template <Op kOp, Work kWork>
void row(const char* name, const cudaDeviceProp& prop, int steps, int reps) {
  constexpr int kN = kOpN<kOp>;
  const double tensor = 64.0 * kN * 16 / 2048.0;
  std::printf("%-14s %6.0f", name, tensor);
  for (int cps = 1; cps <= 3; ++cps) {
    const Result r = run<kOp, kWork>(cps, prop.multiProcessorCount, static_cast<int>(prop.sharedMemPerMultiprocessor),
                                       static_cast<int>(prop.reservedSharedMemPerBlock),
                                       static_cast<int>(prop.sharedMemPerBlockOptin), steps, reps);
    if (r.fit != cps) {
      // Fewer fit: this tool's registers (RS n32 170, RS n64 234 and 186
      // with the rewrite; three CTAs need at most 168).
      std::printf(" | %8s %8d fit %8s", "-", r.fit, "");
    } else {
      std::printf(" | %8.1f %7.0f%% %6.1f us", r.cycles_per_wgmma, 100.0 * tensor / r.cycles_per_wgmma, r.us);
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 8192, reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--steps" || a == "--reps") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v <= 0 || (a == "--steps" && v % 4 != 0)) {
        std::fprintf(stderr, "%s takes a positive count (--steps: a multiple of 4)\n", a.c_str());
        return 2;
      }
      (a == "--steps" ? steps : reps) = v;
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (!hopper_device("ferrum_wgmma_rate", "needs a compute capability 9.0 device (sm_90a)", true, prop)) return 0;
  std::printf("%s, %d SMs, %d steps per CTA; cycles per wgmma per SM (clock64 span, median SM) and the tensor share\n",
              prop.name, prop.multiProcessorCount, steps);
  std::printf("%-14s %6s | %27s | %27s | %27s\n", "variant", "tensor", "1 CTA / SM (cycles, %, launch)",
              "2 CTAs / SM", "3 CTAs / SM");
  row<Op::RsN16, Work::None>("rs n16", prop, steps, reps);
  row<Op::RsN16, Work::Dequant>("rs n16 +dq", prop, steps, reps);
  row<Op::RsN16, Work::DequantLds>("rs n16 +dq+lds", prop, steps, reps);
  row<Op::RsN16, Work::Lop3>("rs n16 +lop3", prop, steps, reps);
  row<Op::RsN16, Work::Lop3Fold>("rs n16 +lop3 g", prop, steps, reps);
  row<Op::RsN32, Work::None>("rs n32", prop, steps, reps);
  row<Op::RsN32, Work::Or>("rs n32 +A", prop, steps, reps);
  row<Op::RsN32, Work::Dequant>("rs n32 +dq", prop, steps, reps);
  row<Op::RsN32, Work::DequantLds>("rs n32 +dq+lds", prop, steps, reps);
  row<Op::RsN32, Work::DequantUnscaled>("rs n32 +dq-s", prop, steps, reps);
  row<Op::RsN32, Work::DequantF32>("rs n32 +dq32", prop, steps, reps);
  row<Op::RsN32, Work::Lop3>("rs n32 +lop3", prop, steps, reps);
  row<Op::RsN32, Work::Lop3Fold>("rs n32 +lop3 g", prop, steps, reps);
  row<Op::RsN64, Work::None>("rs n64", prop, steps, reps);
  row<Op::RsN64, Work::Or>("rs n64 +A", prop, steps, reps);
  row<Op::RsN64, Work::Dequant>("rs n64 +dq", prop, steps, reps);
  row<Op::RsN64, Work::DequantLds>("rs n64 +dq+lds", prop, steps, reps);
  row<Op::RsN64, Work::DequantUnscaled>("rs n64 +dq-s", prop, steps, reps);
  row<Op::RsN64, Work::DequantF32>("rs n64 +dq32", prop, steps, reps);
  row<Op::RsN64, Work::Lop3>("rs n64 +lop3", prop, steps, reps);
  row<Op::SsN64, Work::None>("ss n64", prop, steps, reps);
  row<Op::SsN128, Work::None>("ss n128", prop, steps, reps);
  return 0;
}
