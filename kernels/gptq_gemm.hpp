// Launchers for the GPTQ INT4 x f16/bf16 GEMM (kernels/gptq_gemm.cu,
// kernels/gptq_gemm_wgmma.cu).
// Raw pointers, sizes and a stream; the caller (CudaBackend) has validated.
// The weight layout is the repacked one of src/quant/gptq_repack.hpp.
//
//   launch_gptq_gemm     out[m, n] = a[m, k] · W, m <= kGptqMaxM per launch
//                        (mma.sync m16n8k16, fp32 accumulation, split over k
//                        with a deterministic fixed-order reduction).
//                        With GptqGemmArgs::kernel = Stream / StreamBulk and
//                        m <= kGptqStreamMaxM (CudaBackend asks for StreamBulk
//                        up to kGptqStreamAutoMaxM by default, except where
//                        gptq_wgmma_preferred gives a launch to the wgmma
//                        kernel): the streaming
//                        kernel (weights as the mma A operand, each warp its
//                        own stream of 4 KiB chunks, split over k across CTAs
//                        with the same fixed-order reduction), its chunks
//                        loaded into registers (Stream) or brought into
//                        shared-memory rings by bulk copies (StreamBulk).
//                        With GptqGemmArgs::kernel = Wgmma (CudaBackend's
//                        default for launches of 9 .. 64 rows where the
//                        build has sm_90a code, the device is 9.0 and it
//                        measured faster, gptq_wgmma_preferred): the
//                        warpgroup-MMA kernel (kernels/gptq_gemm_wgmma.cu),
//                        its splits summed in a cluster or the workspace.
//   launch_gptq_gather   a_perm[i, j] = a[i, perm[j]] (act-order).
//   launch_gptq_dequant  W[:, n0 .. n0 + cols) as f16 / bf16, rows in the
//                        checkpoint's order (for the cuBLAS path at large m).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <array>
#include <cstdint>
#include <iterator>

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

inline constexpr int kGptqMaxM = 64;     // rows of a per launch of the fused and wgmma kernels
inline constexpr int kGptqTileK = 128;   // must equal detail::kGptqTileK
inline constexpr int kGptqTileN = 64;    // must equal detail::kGptqTileN
// Columns per CTA of the wgmma kernel (its plan's block_n: 4 column blocks of
// kGptqTileN, one per warp).
inline constexpr int kGptqWgmmaBlockN = 4 * kGptqTileN;
inline constexpr int kGptqStreamMaxM = 16;  // rows the streaming kernel covers per launch

// Which kernel launch_gptq_gemm runs. The streaming kinds apply to
// m <= kGptqStreamMaxM; larger m falls back to the fused kernel.
//   Stream      the streaming kernel, weights straight into registers;
//   StreamBulk  the same kernel with the weights, activation rows and scale
//               (zero) rows landing in warp-private shared-memory rings by
//               bulk copy (sm_90+; the register source below sm_90 and for
//               groups of 16 rows).
//   Wgmma       the warpgroup-MMA kernel (wgmma with the dequantized weights
//               as its register A operand; sm_90a builds on 9.0 devices, any
//               m <= kGptqMaxM); elsewhere the fused kernel.
enum class GptqKernelKind { Fused, Stream, StreamBulk, Wgmma };

// Most chunk slots per warp of StreamBulk's ring (GptqGemmArgs::stream_ring).
inline constexpr int kGptqStreamMaxRing = 6;
// Largest GptqGemmArgs::stream_ctas_per_sm (the register file holds 16 of
// the streaming kernel's 128-thread CTAs at most).
inline constexpr int kGptqStreamMaxCtasPerSm = 16;

// Most splits StreamBulk and the wgmma kernel sum in a cluster
// (GptqGemmArgs::cluster_reduce): the portable cluster size.
inline constexpr int kGptqClusterMaxSplits = 8;
// Most CTAs per SM of a launch that sums its splits in clusters. On the
// H200 (session 12, ferrum_bench_gptq, f16 g128) clusters won on launches
// of 256 and 384 CTAs (4096 x 4096: 11.5 -> 10.7 us at m = 1; 4096 x 6144:
// 13.0 -> 12.5) and lost 19-23 % on 512 (8192 x 8192, 14336 x 4096).
inline constexpr int kGptqClusterMaxCtasPerSm = 3;
// Whether a launch that takes the bulk source with `splits` CTAs along k
// (`ctas` CTAs in all, on a device of `num_sms` multiprocessors) sums them in
// a cluster: asked for (GptqGemmArgs::cluster_reduce), more than one split,
// no more than kGptqClusterMaxSplits, and at most kGptqClusterMaxCtasPerSm
// CTAs per SM (else the workspace).
bool gptq_cluster_reduces(bool requested, int splits, long long ctas, int num_sms);

// Rows per launch up to which CudaBackendConfig's GptqKernel::Auto takes
// StreamBulk (except where gptq_wgmma_preferred gives a launch to the wgmma
// kernel): on the H200 it measured at least as fast as the register
// source at every benchmark shape for m <= 8, and faster than the fused
// kernel at 6 of the 7 shapes at m = 16 (4096 x 4096: 14.4 against 13.7 us;
// docs/PERFORMANCE.md, session 9). Without bulk copies Auto keeps the
// register source's range (m <= 8, where it beat the fused kernel in
// session 5).
inline constexpr int kGptqStreamAutoMaxM = kGptqStreamMaxM;
inline constexpr int kGptqRegisterStreamAutoMaxM = 8;

// Whether the current device runs StreamBulk's bulk copies (sm_90+, and
// enough opt-in shared memory for its deepest ring); else StreamBulk
// launches run the register source.
bool gptq_bulk_copy_supported();
// The bulk source's ring slots hold the scale rows of groups of at least
// this many rows (4 per 128-row chunk); smaller groups run the register source.
inline constexpr int kGptqBulkMinGroupRows = 32;
// Whether StreamBulk launches on a weight with groups of `group_rows` rows
// (GptqDeviceWeight::group_rows) take the bulk source on the current device.
bool gptq_bulk_source_applies(int group_rows);

// The most rows one fused-kernel launch takes on the current device:
// kGptqMaxM where its shared memory holds every configuration (sm_90), 32 on
// an A100 (163 KiB per block: the 64-row configuration needs 180 / 190).
int gptq_fused_max_rows();

// Whether this build has the wgmma kernel's sm_90a code and the current
// device runs it (compute capability 9.0).
bool gptq_wgmma_supported();
// Whether a Wgmma launch on a weight with groups of `group_rows` rows takes
// the wgmma kernel on the current device (every fused layout does where
// gptq_wgmma_supported()); else it runs the fused kernel.
bool gptq_wgmma_applies(int group_rows);

// Whether Auto takes the wgmma kernel (where it applies) for a launch of
// `rows` rows on a k x n weight. Measured on the H200 (f16, g128), against
// the streaming kernel (bulk source) up to 16 rows and the fused kernel at
// 17 .. 32; each figure is the wgmma kernel's time over the other kernel's
// (docs/design/gptq_small_m.md section 13.15 has the tables):
//   * up to 8 rows never (session 46, the wgmma kernel at N = 16): 8192 x
//     28672, m = 8: 48.1 against 45.5 us; where the wgmma kernel wins below
//     9 rows, by at most 10 % (4096 x 14336, m = 8: 17.6 against 19.5);
//   * 9 .. 16 rows by column groups (kGptqWgmmaBlockN columns each). Below
//     16 groups the wgmma kernel's splits stop at the cluster limit (8), so
//     it streams each column group from at most 8 CTAs while the streaming
//     kernel spreads a narrow weight over every SM; deep narrow weights are
//     the streaming kernel's (session 48):
//       - 12 groups and more (n > 2816), except 16: 0.64 .. 0.99 on every
//         weight measured (n = 3072 .. 3840 at k = 4096, 8192 and 14336;
//         17, 20 and 24 groups; session 46's n >= 6144: 0.81 .. 0.91);
//       - 16 groups (3841 <= n <= 4096, 6 splits, session 47) where k <=
//         8192 or at 16 rows (14336 x 4096: 0.97 at 16 rows, 1.02 .. 1.09 at
//         9 .. 14);
//       - 8 .. 11 groups where k <= 4096 (0.92 .. 1.03 at k = 4096; at k =
//         8192 and 14336 0.94 .. 1.14: the streaming kernel's at 9 rows
//         everywhere, the wgmma kernel's by 3 .. 7 % at 12 .. 16 rows on
//         10 .. 11 groups at k = 14336, left to the streaming kernel);
//       - 4 .. 7 groups where k <= 3072 (0.88 .. 0.99 at k = 2048 .. 3072;
//         at k >= 4096 1.03 .. 1.34);
//       - 1 .. 3 groups never (4096 x 512: 1.03 .. 1.06; not measured at
//         k <= 3072).
//     Cells between the measured ones (5 .. 7 groups at k <= 3072, 9 .. 11
//     below k = 4096, k between the measured depths) follow the rule by
//     interpolation.
//     Without bulk copies (groups of 16 rows, or no sm_90) the streaming
//     side would run the fused kernel, which was not measured against the
//     wgmma kernel at 9 .. 16 rows;
//   * 17 .. 32 rows everywhere (session 48: 0.55 .. 0.94 of the fused
//     kernel's time on every weight measured, from 4096 x 256 and 8192 x 512
//     to 28672 x 4096; session 19's exception for long narrow weights was
//     made at 8 splits on 14336 x 4096 and no longer holds);
//   * above 32 rows everywhere (8192 x 28672, m = 64: 76.5 against 124.6).
inline bool gptq_wgmma_preferred(int rows, std::size_t k, std::size_t n) {
  constexpr int kMeasuredFullRows = 16;  // the one row count measured on 14336 x 4096
  if (rows < 9) return false;
  if (rows > kGptqStreamMaxM) return true;
  const std::size_t column_groups = (n + kGptqWgmmaBlockN - 1) / kGptqWgmmaBlockN;
  if (column_groups == 16) return k <= 8192 || rows == kMeasuredFullRows;
  if (column_groups >= 12) return true;
  if (column_groups >= 8) return k <= 4096;
  if (column_groups >= 4) return k <= 3072;
  return false;
}

// The kernel a launch of `rows` rows on a k x n weight asks for: `forced`
// when the caller names one, else (auto) the wgmma kernel where it applies
// (`wgmma_applies`: gptq_wgmma_applies to the weight) and
// gptq_wgmma_preferred; otherwise StreamBulk up to kGptqStreamAutoMaxM rows
// where bulk copies are supported, the register source up to
// kGptqRegisterStreamAutoMaxM where not (then the fused kernel up to
// kGptqStreamMaxM), and the fused kernel above kGptqStreamMaxM rows.
// CudaBackend (GptqKernel) and bench/bench_gptq.cpp (--kernel) both decide
// through this.
inline GptqKernelKind gptq_kernel_for(bool automatic, GptqKernelKind forced, int rows, std::size_t k, std::size_t n,
                                      bool bulk_supported, bool wgmma_applies) {
  if (!automatic) return forced;
  if (wgmma_applies && gptq_wgmma_preferred(rows, k, n)) return GptqKernelKind::Wgmma;
  if (rows > kGptqStreamMaxM) return GptqKernelKind::Fused;
  if (bulk_supported) return rows <= kGptqStreamAutoMaxM ? GptqKernelKind::StreamBulk : GptqKernelKind::Fused;
  return rows <= kGptqRegisterStreamAutoMaxM ? GptqKernelKind::Stream : GptqKernelKind::Fused;
}

// The largest m for which gemm_gptq runs the INT4 kernels on a fused-layout
// weight of k x n (in launches of kGptqMaxM rows); larger m dequantize the
// weight in column chunks and call cuBLAS. Measured on the H200 with
// bench_gptq --crossover, in steps by weight count (k * n), each the lowest
// crossover of the measured shapes it covers; act-order (a gather of the
// activations before each launch) takes the step below.
//   * wgmma: the launches above 16 rows run the wgmma kernel (session 17):
//     96 at 4096 x 4096, 128 at 4096 x 6144 and 58.7 M weights, 192 at
//     8192 x 8192, 256 at 4096 / 8192 x 28672 (8192 x 28672, m = 256: 332
//     against 457 us).
//   * otherwise the fused kernel (session 16): its m <= 32 configuration
//     beats dequantize + cuBLAS at every shape; above it each 64-row launch
//     costs about as much as a whole dequantize + cuBLAS on small weights
//     (4096 x 4096: 43 against 28 us at m = 64), while larger weights keep
//     it ahead up to m = 128-192.
// CudaBackendConfig::gptq_fused_max_m overrides it.
inline std::size_t gptq_fused_max_m(std::size_t k, std::size_t n, bool act_order, bool wgmma) {
  struct Step {
    double weights_below;
    std::size_t max_m;
  };
  static constexpr Step kFusedSteps[] = {{24e6, 32}, {48e6, 48}, {64e6, 96}, {100e6, 128}, {1e300, 192}};
  static constexpr Step kWgmmaSteps[] = {{24e6, 96}, {64e6, 128}, {100e6, 192}, {1e300, 256}};
  const Step* steps = wgmma ? kWgmmaSteps : kFusedSteps;
  const int last = wgmma ? static_cast<int>(std::size(kWgmmaSteps)) - 1 : static_cast<int>(std::size(kFusedSteps)) - 1;
  const double weights = static_cast<double>(k) * static_cast<double>(n);
  int i = 0;
  while (i < last && weights >= steps[i].weights_below) ++i;
  if (act_order && i > 0) --i;
  return steps[i].max_m;
}

// A repacked weight on the device.
struct GptqDeviceWeight {
  const std::uint32_t* qweight = nullptr;  // [n_pad/64][k_pad/16][32][4] u32 (gptq_repack.hpp layout)
  const void* scales = nullptr;            // [scale_rows][n_pad] f16 or bf16 (the activation dtype), permuted columns
  const std::uint8_t* zeros = nullptr;     // [scale_rows][n_pad] true zeros, permuted columns; null: all zero_value
  const std::int32_t* perm = nullptr;      // [k] checkpoint row of repacked row j; null: identity
  const std::int32_t* row_group = nullptr; // [k] scale row of repacked row j
  int zero_value = 8;                      // the zero when `zeros` is null
  int k = 0, n = 0;                        // true sizes (multiples of 8)
  int k_pad = 0, n_pad = 0;                // k rounded up to 128, n to 64
  int group_rows = 0;                      // fused layout: rows per scale row; 0: general (no fused kernel)
};

// The fused kernel's launch plan for m rows: one of its configurations and
// the split count over k (deterministic: a function of the sizes and the
// device only). The workspace sizes below are maxima over every m <= kGptqMaxM.
struct GptqPlan {
  int config = 0;      // index of the kernel configuration
  int m_tile = 0;      // rows the configuration covers (16, 32 or 64)
  int block_n = 0;     // columns per CTA
  int n_ctas = 0;      // CTAs along n
  int splits = 1;      // CTAs along k
};
GptqPlan gptq_plan(DType dtype, int m, int k_pad, int n_pad, int num_sms);
// The streaming kernel's plan for m <= kGptqStreamMaxM rows (zeros: the
// weight has a zero array): config -1, one CTA per 64 columns (n_ctas)
// times `splits` along k.
// k, k_pad, group_rows: the weight's (GptqDeviceWeight); kind and ring:
// those of the launch (GptqGemmArgs::kernel, ::stream_ring). The launch
// runs exactly this plan.
// ctas_per_sm: GptqGemmArgs::stream_ctas_per_sm (0: every resident slot).
GptqPlan gptq_stream_plan(DType dtype, bool zeros, int m, int k, int k_pad, int n_pad, int group_rows, int num_sms,
                          GptqKernelKind kind, int ring, int ctas_per_sm);
// The wgmma kernel's plan (the same for every m <= kGptqMaxM): config -2,
// 256 columns per CTA (n_ctas) times `splits` along k, none empty; with
// `splits_override` > 0 (a benchmark's, 1 .. 16) that many, less any left
// empty.
// Its splits: the most (at most min(stages, kGptqClusterMaxSplits)) whose
// n_ctas clusters of that many CTAs the device holds at once,
// resident_clusters[s] being how many clusters of s CTAs it holds (index 1 ..
// kGptqClusterMaxSplits; 0 unused); at least 1. One more split than fits
// makes the launch two waves of clusters: 8192 x 8192 (32 column groups) at
// 8 splits took 47.4 us at m = 64 against 31.9 at 7, the most that fit on
// the H200 (30 clusters of 8, 32 of 7; docs/PERFORMANCE.md, session 19).
// Then fewer, down to 3/4 of that many, where their clusters fit with no two
// CTAs on one SM (single_clusters[s]: how many clusters of s CTAs the device
// holds at one CTA per SM): 16 column groups take 6 splits on the H200, not
// 8 (two CTAs on 8 SMs finish last; 6-14 % faster, session 47).
// Without the device's counts (no wgmma device), slots / s with two CTAs
// per SM and SMs / s with one (no GPC limits: e.g. 16 clusters of 8 fit
// one CTA per SM on 132 SMs, where the H200 holds 15). The plan is the same
// when the splits are summed through the workspace instead
// (CudaBackendConfig::gptq_cluster_reduce off), so both give the same bits.
// Clusters of s CTAs a device holds, per cluster size s = 1 .. kGptqClusterMaxSplits (index 0 unused).
using GptqClusterCounts = std::array<int, kGptqClusterMaxSplits + 1>;
int gptq_wgmma_splits(int n_ctas, int stages, const GptqClusterCounts& resident_clusters,
                      const GptqClusterCounts& single_clusters);
GptqPlan gptq_wgmma_plan(int k_pad, int n_pad, int num_sms, int splits_override = 0);
// f32 partial sums any of the kernels may need for any m <= kGptqMaxM and
// the plans' own splits (a benchmark that overrides splits sizes its own).
std::size_t gptq_partials_floats(int k_pad, int n_pad, int num_sms);
// Split-K arrival counters (ints, zero-initialized once; each launch leaves them 0).
std::size_t gptq_counter_ints(int n_pad);

// Backend::gemm_gptq_add_residual in the GEMM's final store (the streaming
// kernel; kernels/common/row_sq.cuh): residual = residual + T(a · w) and the
// new residual's row_sq; args.out is not written.
struct GptqResidualOut {
  void* residual = nullptr;  // [m, n] T, in / out; null: off
  float* row_sq = nullptr;   // [m, ceil(n / 16)] f32
};

// The most CTAs along k a streaming or wgmma launch splits into.
constexpr int kGptqMaxStreamSplits = 16;

struct GptqGemmArgs {
  DType dtype = DType::F16;
  GptqDeviceWeight w;
  const void* a = nullptr;  // [m, k] row-major, 16-byte aligned; act-order: already gathered (a_perm)
  void* out = nullptr;      // [m, n] row-major, 16-byte aligned
  int m = 0;                // 1 .. kGptqMaxM
  float* partials = nullptr;  // [gptq_partials_floats] f32 workspace
  int* counters = nullptr;    // [gptq_counter_ints] zeroed ints
  int num_sms = 0;
  // Stream / StreamBulk: the streaming kernel where m <= kGptqStreamMaxM;
  // Wgmma: the wgmma kernel where gptq_wgmma_applies.
  GptqKernelKind kernel = GptqKernelKind::Fused;
  // StreamBulk: chunk slots per warp, 1 .. kGptqStreamMaxRing; 0: the most
  // slots that keep 4 CTAs per SM (kernels/gptq_gemm.cu, stream_ring_for).
  int stream_ring = 0;
  // Streaming and wgmma kernels: CTAs along k, 1 .. kGptqMaxStreamSplits;
  // 0: the plan's (a benchmark's override; CudaBackend always passes 0).
  int stream_splits = 0;
  // Streaming kernel: the plan fills at most this many CTAs per SM (1 ..
  // kGptqStreamMaxCtasPerSm), fewer than its resident slots where that is
  // less, so the next kernel's CTAs, released early under PDL, find room to
  // start their weight copies during this one's tail; 0: every resident
  // slot (the measured default). Fewer splits sum in another order.
  // CudaBackendConfig::gptq_stream_ctas_per_sm.
  int stream_ctas_per_sm = 0;
  // StreamBulk with 2 .. kGptqClusterMaxSplits splits and at most
  // kGptqClusterMaxCtasPerSm CTAs per SM: the splits of a column block run
  // as one thread-block cluster and sum through distributed shared memory,
  // in split order (the same bits as the workspace's reduction, which every
  // other launch uses). Wgmma: every launch of 2 .. kGptqClusterMaxSplits
  // splits whose cluster fits the device. CudaBackendConfig::gptq_cluster_reduce
  // (on by default).
  bool cluster_reduce = true;
  // Off unless set; only launch_gptq_gemm_row_sq takes it.
  GptqResidualOut residual_out;
};
void launch_gptq_gemm(const GptqGemmArgs& args, cudaStream_t stream);
// launch_gptq_gemm with residual_out: true, launched, where the streaming
// kernel takes the launch; false, with nothing launched, otherwise (the
// caller composes the op from gemm_gptq and kernels/row_sq.hpp). The norm
// side (rms_norm_gemm_gptq) has no fused form: normalizing each chunk's
// activation rows in the kernel measured slower than the norm kernel, and
// its per-chunk branch slowed every launch (docs/design/gptq_small_m.md §13.7).
bool launch_gptq_gemm_row_sq(const GptqGemmArgs& args, cudaStream_t stream);
// The wgmma kernel alone (launch_gptq_gemm calls it for Wgmma): false, with
// nothing launched, where it does not apply (gptq_wgmma_applies); an m or
// splits override outside its range throws.
bool launch_gptq_wgmma(const GptqGemmArgs& args, cudaStream_t stream);
// SwiGLU in the epilogue (Backend::gemm_silu_mul_gptq): w's output columns
// are (gate_j, up_j) pairs (n = 2 * im), and args.out is act [m, n / 2]
// (element-aligned): act[r, j] = silu(gate) · up of the pair as rounded to
// the dtype, the bits of this GEMM into gate_up followed by
// launch_silu_mul_pairs. Where the streaming kernel takes the launch with
// its bulk source, one row tile (m <= kGptqSiluMulMaxM) and one split
// (every output column written by one CTA, so each pair is in one warp's
// registers); false, with nothing launched, elsewhere.
inline constexpr int kGptqSiluMulMaxM = 8;
bool launch_gptq_gemm_silu_mul(const GptqGemmArgs& args, cudaStream_t stream);

// a_perm[i, j] = a[i, perm[j]] for i < m, j < k. a and a_perm: [m, k] row-major.
void launch_gptq_gather(DType dtype, const void* a /*[m, k] f16 / bf16*/,
                        const std::int32_t* perm /*[k] i32: a's column for a_perm's column j*/,
                        void* a_perm /*[m, k] f16 / bf16*/, int m, int k, cudaStream_t stream);

// scratch[perm[j], c] = W[j, n0 + c] for j < k, c < min(cols, n - n0): the
// dequantized weight in the checkpoint's row order, [k][cols] row-major
// (16-byte aligned), dtype f16 or bf16 (scales must be of that dtype).
// n0 and cols are multiples of 64.
void launch_gptq_dequant(DType dtype, const GptqDeviceWeight& w, int n0, int cols,
                         void* scratch /*[w.k, cols] dtype, row-major, 16-byte aligned*/, cudaStream_t stream);

// FERRUM_GPTQ_TIMELINE (CMake option, diagnostics only): thread 0 of every
// CTA of the streaming kernel (CTA = blockIdx.y * gridDim.x + blockIdx.x, the
// first kGptqTimelineCtas) stores %globaltimer and clock64() at each point,
// into slot (launch count mod kGptqTimelineLaunches) of a device array; the
// launcher records each launch's shape and plan for its slot when it is
// enqueued (or captured: every replay of a graph rewrites the slots its
// launches took at capture). So after a decode step the last
// kGptqTimelineLaunches streaming launches can be read, each CTA's phases
// beside the others' (bench/gptq_timeline.cpp, ferrum_gptq_timeline). A
// stamp of 0: the CTA did not pass the point since the last reset (e.g.
// FirstChunk in a CTA without chunks). Without the option nothing is
// recorded and these functions do not exist.
enum class GptqTimelinePoint : int {
  Entry = 0,         // the kernel's first statement (stored after the wait)
  WaitReturned = 1,  // past griddepcontrol.wait: the previous kernel has completed
  FirstChunk = 2,      // warp 0's first chunk (weights, scale rows, activations) landed (bulk source)
  FirstChunkDone = 3,  // warp 0 done with its first chunk (bulk source)
  SecondChunk = 4,     // warp 0's second chunk landed (bulk source; 0 in a warp with one chunk)
  ChunksDone = 5,      // warp 0 done with its chunks
  WarpsSummed = 6,     // the CTA's sums in its tile (summed by every thread)
  Exit = 7,            // the CTA's last statement (its outputs or partials stored, reductions done)
};
inline constexpr int kGptqTimelinePoints = 8;
inline constexpr int kGptqTimelineLaunches = 16;
inline constexpr int kGptqTimelineCtas = 1024;
}  // namespace ferrum::kernels

#if defined(FERRUM_GPTQ_TIMELINE)
#include <vector>

namespace ferrum::kernels {
struct GptqTimelineStamp {
  unsigned long long global_ns;  // %globaltimer
  unsigned long long clock;      // clock64() of the CTA's SM
  unsigned sm;                   // %smid: the SM the CTA ran on
};
struct GptqTimelineLaunch {
  long long sequence = -1;  // launches counted since the process started; -1: the slot was never used
  int m = 0, k = 0, n = 0;
  int grid_x = 0, splits = 0, ring = 0;
  bool cluster_reduce = false, silu_out = false;
  std::vector<std::array<GptqTimelineStamp, kGptqTimelinePoints>> ctas;  // [min(grid, kGptqTimelineCtas)]
};
// Zeroes every stamp (the launches' records stay).
void gptq_timeline_reset();
// The kGptqTimelineLaunches slots, oldest launch first (unused slots last).
std::vector<GptqTimelineLaunch> gptq_timeline_read();
}  // namespace ferrum::kernels
#endif
