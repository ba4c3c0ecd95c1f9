// CudaBackend: GPTQ INT4 weights (load_gptq, gemm_gptq).
//
// load_gptq repacks the checkpoint on the host (src/quant/gptq_repack.hpp)
// and uploads it once: weights, scales in f16 AND bf16 (the activation dtype
// is only known at gemm time; scales are 1/64 of the weight bytes at group
// size 128), zeros (omitted when every zero is the same, as in symmetric
// checkpoints), the act-order permutation and the row -> group table.
//
// gemm_gptq picks one of two paths, both allocation- and sync-free and
// capture-safe:
//   * fused (a fused layout and m <= kernels::gptq_fused_max_m, the measured
//     crossover by weight size, or CudaBackendConfig::gptq_fused_max_m):
//     the INT4 tensor-core kernels, kernels::kGptqMaxM rows per launch;
//     act-order first gathers the activation columns into a workspace.
//     Launches take the wgmma kernel where it applies (every launch under
//     GptqKernel::Wgmma; under Auto those kernels::gptq_wgmma_preferred gives
//     it: from 9 rows on most weights but deep narrow ones, every launch
//     above 16 rows), else the
//     streaming kernel up to 16 rows (kernels::kGptqStreamMaxM) through
//     shared-memory rings (Auto, StreamBulk) or registers (Stream), else the
//     fused kernel, with the same split-K workspace and gather.
//   * dequantize + cuBLAS (larger m, or a checkpoint outside the fused
//     layout: odd group sizes, uneven act-order groups): W is dequantized in
//     column chunks into a bounded scratch, each chunk followed by one
//     cublasGemmEx; rows come back in checkpoint order, so no gather.
//
// Workspaces (split-K partials and counters, the act-order gather, the
// dequantize scratch) are sized at load time. They are shared by every GPTQ
// weight of a device through shared ownership: all ops of a device run on
// its one stream, so one set serves them all, and per-weight copies would
// cost tens of MB per layer. A load that needs more than the current set
// makes a new, larger one (weights already loaded keep theirs, so pointers
// captured in a graph stay valid).
#include "ferrum/cuda_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/fail.hpp"
#include "cuda/buffer_ptr.hpp"
#include "cuda/cuda_runtime.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gptq_gemm.hpp"
#include "kernels/row_sq.hpp"
#include "quant/gptq_repack.hpp"

namespace ferrum {

using detail::check_cublas;
using detail::check_cuda;
using detail::ptr;

namespace {

static_assert(kernels::kGptqTileK == static_cast<int>(detail::kGptqTileK), "repack and kernel disagree on k padding");
static_assert(kernels::kGptqTileN == static_cast<int>(detail::kGptqTileN), "repack and kernel disagree on n padding");

// Bound of the dequantize scratch (the cuBLAS path works in column chunks).
constexpr std::size_t kScratchBytes = std::size_t{64} << 20;

// The device workspaces shared by the GPTQ weights of one device.
struct GptqWorkspace {
  int device = 0;
  float* partials = nullptr;  // [partial_floats] f32
  std::size_t partial_floats = 0;
  int* counters = nullptr;  // [counter_ints], zero between launches
  std::size_t counter_ints = 0;
  void* gather = nullptr;  // [kGptqMaxM, k] activations, act-order
  std::size_t gather_bytes = 0;
  void* scratch = nullptr;  // dequantized W chunk [k][cols]
  std::size_t scratch_bytes = 0;

  GptqWorkspace() = default;
  GptqWorkspace(const GptqWorkspace&) = delete;
  GptqWorkspace& operator=(const GptqWorkspace&) = delete;
  // Retired, not freed, while a graph of the device may point at it.
  ~GptqWorkspace() {
    for (void* p : {static_cast<void*>(partials), static_cast<void*>(counters), gather, scratch}) {
      detail::free_device_memory(p, device);
    }
  }
};

struct WorkspaceNeeds {
  std::size_t partial_floats = 0, counter_ints = 0, gather_bytes = 0, scratch_bytes = 0;
};

bool covers(const GptqWorkspace& ws, const WorkspaceNeeds& need) {
  return ws.partial_floats >= need.partial_floats && ws.counter_ints >= need.counter_ints &&
         ws.gather_bytes >= need.gather_bytes && ws.scratch_bytes >= need.scratch_bytes;
}

void* device_alloc(std::size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  return detail::device_malloc(bytes, device, "load_gptq", "GPTQ workspace");
}

// The current workspace of `device` if it covers `need`, else a new one
// covering both (setup time: allocates and synchronizes).
std::shared_ptr<GptqWorkspace> acquire_workspace(int device, const WorkspaceNeeds& need) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<GptqWorkspace>> current;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<GptqWorkspace> ws = current[device].lock();
  if (ws != nullptr && covers(*ws, need)) return ws;
  WorkspaceNeeds size = need;
  if (ws != nullptr) {
    size.partial_floats = std::max(size.partial_floats, ws->partial_floats);
    size.counter_ints = std::max(size.counter_ints, ws->counter_ints);
    size.gather_bytes = std::max(size.gather_bytes, ws->gather_bytes);
    size.scratch_bytes = std::max(size.scratch_bytes, ws->scratch_bytes);
  }
  auto fresh = std::make_shared<GptqWorkspace>();
  fresh->device = device;
  fresh->partials = static_cast<float*>(device_alloc(size.partial_floats * sizeof(float), device));
  fresh->partial_floats = size.partial_floats;
  fresh->counters = static_cast<int*>(device_alloc(size.counter_ints * sizeof(int), device));
  fresh->counter_ints = size.counter_ints;
  if (fresh->counters != nullptr) {
    check_cuda(cudaMemset(fresh->counters, 0, size.counter_ints * sizeof(int)), "load_gptq", "cudaMemset");
    // cudaMemset runs on the legacy stream, which the backends' non-blocking
    // stream does not wait for: the zeros must be there before a GEMM counts.
    check_cuda(cudaDeviceSynchronize(), "load_gptq", "cudaDeviceSynchronize");
  }
  fresh->gather = device_alloc(size.gather_bytes, device);
  fresh->gather_bytes = size.gather_bytes;
  fresh->scratch = device_alloc(size.scratch_bytes, device);
  fresh->scratch_bytes = size.scratch_bytes;
  current[device] = fresh;
  return fresh;
}

class CudaGptqWeight final : public QuantWeight {
 public:
  CudaGptqWeight(detail::BackendRef owner, const detail::GptqRepacked& r)
      : owner_(std::move(owner)), k_(r.k), n_(r.n) {
    view_.zero_value = r.zero_value;
    view_.k = static_cast<int>(r.k);
    view_.n = static_cast<int>(r.n);
    view_.k_pad = static_cast<int>(r.k_pad);
    view_.n_pad = static_cast<int>(r.n_pad);
    view_.group_rows = static_cast<int>(r.group_rows);
    act_order_ = r.act_order;
  }
  QuantKind kind() const noexcept override { return QuantKind::Gptq; }
  std::size_t k() const noexcept override { return k_; }
  std::size_t n() const noexcept override { return n_; }
  const Backend* backend() const noexcept override { return owner_.get(); }

  bool fused() const noexcept { return view_.group_rows > 0; }
  bool act_order() const noexcept { return act_order_; }
  std::size_t scratch_cols() const noexcept { return scratch_cols_; }
  const GptqWorkspace& workspace() const noexcept { return *workspace_; }
  const std::int32_t* perm() const { return ptr<std::int32_t>(perm_); }

  // The device view with the scales of `dtype`.
  kernels::GptqDeviceWeight view(DType dtype) const {
    kernels::GptqDeviceWeight v = view_;
    v.scales = dtype == DType::BF16 ? scales_bf16_.data() : scales_f16_.data();
    return v;
  }

  void upload(Backend& be, int device, const detail::GptqRepacked& r, int num_sms) {
    // A failure inside alloc or write_bytes (device memory running out) is
    // reported as load_gptq's, naming the tensor it was uploading.
    auto put = [&](const char* tensor, Buffer& dst, DType dtype, const void* src, std::size_t count) {
      try {
        dst = be.alloc(dtype, count);
        be.write_bytes(dst, src, count * size_of(dtype));
      } catch (const Error& e) {
        detail::fail(e.code(), "load_gptq: uploading the repacked '{}' ({} {} values): {}", tensor, count,
                     to_string(dtype), e.what());
      }
    };
    put("qweight", qweight_, DType::I32, r.qweight.data(), r.qweight.size());
    const std::vector<std::uint16_t> f16 = detail::gptq_scales_as(r, DType::F16);
    const std::vector<std::uint16_t> bf16 = detail::gptq_scales_as(r, DType::BF16);
    put("scales (f16)", scales_f16_, DType::F16, f16.data(), f16.size());
    put("scales (bf16)", scales_bf16_, DType::BF16, bf16.data(), bf16.size());
    if (!r.uniform_zero) put("zeros", zeros_, DType::U8, r.zeros.data(), r.zeros.size());
    put("row_group", row_group_, DType::I32, r.row_group.data(), r.row_group.size());
    if (r.act_order) put("perm", perm_, DType::I32, r.perm.data(), r.perm.size());
    view_.qweight = ptr<std::uint32_t>(qweight_);
    view_.zeros = zeros_.is_null() ? nullptr : ptr<std::uint8_t>(zeros_);
    view_.row_group = ptr<std::int32_t>(row_group_);
    view_.perm = perm_.is_null() ? nullptr : ptr<std::int32_t>(perm_);

    // Dequantize scratch: whole 64-column blocks, at most kScratchBytes (at least one block).
    const std::size_t per_block = r.k * kernels::kGptqTileN * 2;
    const std::size_t blocks = std::clamp<std::size_t>(kScratchBytes / per_block, 1, r.n_pad / kernels::kGptqTileN);
    scratch_cols_ = blocks * kernels::kGptqTileN;

    WorkspaceNeeds need;
    need.scratch_bytes = r.k * scratch_cols_ * 2;
    if (fused()) {
      need.partial_floats =
          kernels::gptq_partials_floats(static_cast<int>(r.k_pad), static_cast<int>(r.n_pad), num_sms);
      need.counter_ints = kernels::gptq_counter_ints(static_cast<int>(r.n_pad));
      if (r.act_order) need.gather_bytes = static_cast<std::size_t>(kernels::kGptqMaxM) * r.k * 2;
    }
    workspace_ = acquire_workspace(device, need);
  }

 private:
  detail::BackendRef owner_;
  std::size_t k_, n_;
  bool act_order_ = false;
  std::size_t scratch_cols_ = 0;
  kernels::GptqDeviceWeight view_;
  Buffer qweight_, scales_f16_, scales_bf16_, zeros_, row_group_, perm_;
  std::shared_ptr<GptqWorkspace> workspace_;
};

}  // namespace

namespace {

// The launcher's kernel kind for a named (non-Auto) GptqKernel.
kernels::GptqKernelKind forced_kernel_kind(GptqKernel kernel) {
  switch (kernel) {
    case GptqKernel::Fused:
      return kernels::GptqKernelKind::Fused;
    case GptqKernel::Stream:
      return kernels::GptqKernelKind::Stream;
    case GptqKernel::StreamBulk:
      return kernels::GptqKernelKind::StreamBulk;
    case GptqKernel::Wgmma:
      return kernels::GptqKernelKind::Wgmma;
    case GptqKernel::Auto:
      break;  // the launch rule's, not a forced kind
  }
  detail::fail(ErrorCode::InvalidArgument, "gemm_gptq: gptq_kernel = {} is not a forced kernel kind",
               static_cast<int>(kernel));
}

// The backend's GPTQ switches, as gemm_gptq reads them.
struct GptqSwitches {
  GptqKernel kernel;
  int stream_ring;
  int stream_ctas_per_sm;  // CudaBackendConfig::gptq_stream_ctas_per_sm (0: every resident slot)
  bool cluster_reduce;
  int fused_max_m;  // CudaBackendConfig::gptq_fused_max_m (-1: the library's rule)
  int num_sms;
};

GptqSwitches switches_of(const CudaBackend& be, int num_sms) {
  return {be.gptq_kernel(),          be.gptq_stream_ring(), be.gptq_stream_ctas_per_sm(),
          be.gptq_cluster_reduce(), be.gptq_fused_max_m(), num_sms};
}

// Whether an m-row gemm_gptq on `weight` runs the INT4 kernels (else
// dequantize + cuBLAS). wgmma_applies: the wgmma kernel can run this weight.
bool int4_kernels_run(const CudaGptqWeight& weight, const kernels::GptqDeviceWeight& view, std::size_t m,
                      const GptqSwitches& sw, bool& wgmma_applies) {
  // Every launch runs the wgmma kernel under Wgmma, and under Auto those
  // gptq_wgmma_preferred gives it (every launch above 16 rows), where it
  // applies; the crossover to dequantize + cuBLAS was measured for each
  // kernel.
  wgmma_applies = weight.fused() && kernels::gptq_wgmma_applies(view.group_rows);
  const bool wgmma_runs = wgmma_applies && (sw.kernel == GptqKernel::Auto || sw.kernel == GptqKernel::Wgmma);
  std::size_t fused_max_m = sw.fused_max_m >= 0
                                ? static_cast<std::size_t>(sw.fused_max_m)
                                : kernels::gptq_fused_max_m(weight.k(), weight.n(), weight.act_order(), wgmma_runs);
  // Launches of kGptqMaxM rows need the fused kernel's 64-row configuration
  // where wgmma does not run them; a device without the shared memory for it
  // (an A100) dequantizes + cuBLAS above the rows it does take.
  if (!wgmma_runs && weight.fused()) {
    const auto fused_rows = static_cast<std::size_t>(kernels::gptq_fused_max_rows());
    if (fused_rows < static_cast<std::size_t>(kernels::kGptqMaxM)) fused_max_m = std::min(fused_max_m, fused_rows);
  }
  return weight.fused() && m <= fused_max_m;
}

// The INT4 kernels' launch of `rows` rows of a (already gathered where the
// weight is act-order) into out.
kernels::GptqGemmArgs int4_args(DType dtype, const kernels::GptqDeviceWeight& view, const GptqWorkspace& ws,
                                const void* a_rows, void* out_rows, int rows, const GptqSwitches& sw,
                                bool wgmma_applies) {
  kernels::GptqGemmArgs args;
  args.dtype = dtype;
  args.w = view;
  args.a = a_rows;
  args.out = out_rows;
  args.m = rows;
  args.partials = ws.partials;
  args.counters = ws.counters;
  args.num_sms = sw.num_sms;
  // Auto: the wgmma kernel where it applies and measured faster (gptq_wgmma_preferred), else
  // the streaming kernel (bulk source) up to kGptqStreamAutoMaxM rows; where this weight cannot
  // take the bulk source, the register source's range; the fused kernel above.
  const bool automatic = sw.kernel == GptqKernel::Auto;
  const kernels::GptqKernelKind forced = automatic ? kernels::GptqKernelKind::Fused /*unread*/ : forced_kernel_kind(sw.kernel);
  args.kernel = kernels::gptq_kernel_for(automatic, forced, rows,
                                         static_cast<std::size_t>(view.k), static_cast<std::size_t>(view.n),
                                         kernels::gptq_bulk_source_applies(view.group_rows), wgmma_applies);
  args.stream_ring = sw.stream_ring;
  args.stream_ctas_per_sm = sw.stream_ctas_per_sm;
  args.cluster_reduce = sw.cluster_reduce;
  return args;
}

// A one-launch INT4 form (silu·mul, row_sq): where the weight's INT4
// kernels take m rows, the launch's arguments for a [m, k] and out, handed
// to `launch` (kernels::launch_gptq_gemm_silu_mul or launch_gptq_gemm_row_sq,
// after it sets its own fields), which says whether it took the launch.
template <class Launch>
bool int4_launch_taken(cudaStream_t stream, const GptqSwitches& sw, const CudaGptqWeight& weight, DType dtype,
                       const void* a, void* out, std::size_t m, Launch&& launch) {
  const kernels::GptqDeviceWeight view = weight.view(dtype);
  bool wgmma_applies = false;
  if (!int4_kernels_run(weight, view, m, sw, wgmma_applies)) return false;
  kernels::GptqGemmArgs args = int4_args(dtype, view, weight.workspace(), a, out, static_cast<int>(m), sw, wgmma_applies);
  return launch(args, stream);
}

// The checks every GPTQ GEMM op makes first, naming `op`: w made by a
// CudaBackend's load_gptq, the row operands `rows` 16-byte aligned (the
// kernels move rows as 16-byte vectors; k and n are multiples of 8), and
// `rows` and the op's other operands `others` (act, row_sq: element-wise
// access, any alignment) in device memory: the streaming kernel bulk-copies
// its activation rows, which host memory cannot serve, and one rule for
// every operand and kernel keeps a call's validity from hanging on which
// kernel m picks. A capture in progress is ended before the throw.
const CudaGptqWeight& checked_gptq_operands(detail::CudaRuntime& rt, const char* op, const QuantWeight& w,
                                            std::initializer_list<detail::NamedBuffer> rows,
                                            std::initializer_list<detail::NamedBuffer> others = {}) {
  const auto* weight = dynamic_cast<const CudaGptqWeight*>(&w);
  if (weight == nullptr) {
    detail::abandon_capture(rt);
    detail::fail(ErrorCode::InvalidArgument, "{}: argument 'w' was not made by this backend's load_gptq", op);
  }
  if (const std::string misaligned = detail::misaligned_16(rows); !misaligned.empty()) {
    detail::abandon_capture(rt);
    detail::fail(ErrorCode::Misaligned, "{}: {}", op, misaligned);
  }
  for (const std::initializer_list<detail::NamedBuffer> operands : {rows, others}) {
    if (const std::string host = detail::host_memory_argument(operands); !host.empty()) {
      detail::abandon_capture(rt);
      detail::fail(ErrorCode::InvalidArgument, "{}: {}", op, host);
    }
  }
  return *weight;
}

}  // namespace

GptqKernel CudaBackend::checked_gptq_kernel(GptqKernel requested) {
  switch (requested) {
    case GptqKernel::Auto:
    case GptqKernel::Fused:
    case GptqKernel::Stream:
    case GptqKernel::StreamBulk:
    case GptqKernel::Wgmma:
      return requested;
  }
  detail::fail(ErrorCode::InvalidArgument,
               "CudaBackend: CudaBackendConfig::gptq_kernel = {} is not Auto (0), Fused (1), Stream (2), StreamBulk (3) "
               "or Wgmma (4)",
               static_cast<int>(requested));
}

std::unique_ptr<QuantWeight> CudaBackend::do_load_gptq(const GptqHostTensors& tensors) {
  detail::activate_device(device_);
  const detail::GptqRepacked repacked = detail::repack_gptq(tensors, "load_gptq");
  auto weight = std::make_unique<CudaGptqWeight>(backend_ref(), repacked);
  weight->upload(*this, device_, repacked, rt_->num_sms);
  // The uploads read pageable host memory that goes away with `repacked`.
  check_cuda(cudaStreamSynchronize(rt_->stream), "load_gptq", "cudaStreamSynchronize");
  return weight;
}

namespace {

// gemm_gptq on a weight and operands checked_gptq_operands passed, on the
// current device: the INT4 kernels where int4_kernels_run says so, else
// dequantize + cuBLAS. `op` names a cuBLAS failure.
void run_gemm_gptq(detail::CudaRuntime& rt, const GptqSwitches& sw, const CudaGptqWeight& weight,
                   const Buffer& a /*[m, k]*/, Buffer& out /*[m, n]*/, std::size_t m, const char* op) {
  const DType dtype = a.dtype();
  const kernels::GptqDeviceWeight view = weight.view(dtype);
  const GptqWorkspace& ws = weight.workspace();
  const std::size_t k = weight.k(), n = weight.n();
  const auto* a_bytes = ptr<std::uint8_t>(a);
  auto* out_bytes = ptr<std::uint8_t>(out);

  bool wgmma_applies = false;
  if (int4_kernels_run(weight, view, m, sw, wgmma_applies)) {
    const std::size_t step = static_cast<std::size_t>(kernels::kGptqMaxM);
    for (std::size_t row0 = 0; row0 < m; row0 += step) {
      const int rows = static_cast<int>(std::min(step, m - row0));
      const void* a_rows = a_bytes + row0 * k * 2;
      if (weight.act_order()) {
        kernels::launch_gptq_gather(dtype, a_rows, weight.perm(), ws.gather, rows, static_cast<int>(k), rt.stream);
        a_rows = ws.gather;
      }
      kernels::launch_gptq_gemm(int4_args(dtype, view, ws, a_rows, out_bytes + row0 * n * 2, rows, sw, wgmma_applies),
                                rt.stream);
    }
    return;
  }

  // Dequantize + cuBLAS, one column chunk at a time. Row-major out[m, n] =
  // a[m, k] · W[k, n] is column-major outᵀ[n, m] = Wᵀ · aᵀ, where the chunk
  // W[:, n0 .. n0 + cols) (row-major [k][cols]) is column-major [cols x k].
  const cudaDataType_t type = dtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  const std::size_t chunk = weight.scratch_cols();
  for (std::size_t n0 = 0; n0 < n; n0 += chunk) {
    const std::size_t cols = std::min(chunk, n - n0);
    kernels::launch_gptq_dequant(dtype, view, static_cast<int>(n0), static_cast<int>(chunk), ws.scratch, rt.stream);
    check_cublas(cublasGemmEx(rt.cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(m),
                              static_cast<int>(k), rt.one_zero, ws.scratch, type, static_cast<int>(chunk), a_bytes,
                              type, static_cast<int>(k), rt.one_zero + 1, out_bytes + n0 * 2, type,
                              static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 op, "cublasGemmEx");
  }
}

}  // namespace

void CudaBackend::do_gemm_gptq(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m, const char* op) {
  const CudaGptqWeight& weight = checked_gptq_operands(*rt_, op, w, {{"a", &a}, {"out", &out}});
  detail::activate_device(device_);
  run_gemm_gptq(*rt_, switches_of(*this, rt_->num_sms), weight, a, out, m, op);
}

namespace {

// silu·mul in the streaming kernel's epilogue where it takes the launch
// with one split (kernels::launch_gptq_gemm_silu_mul decides; `fuse`:
// CudaBackendConfig::gptq_fuse_silu_mul), else gemm_gptq into the workspace
// and the pairs kernel: the same bits. `op` names a failure.
void run_gemm_silu_mul_gptq(detail::CudaRuntime& rt, const GptqSwitches& sw, const CudaGptqWeight& weight, bool fuse,
                            const Buffer& a /*[m, k]*/, Buffer& gate_up /*[m, n]*/, Buffer& act /*[m, n / 2]*/,
                            std::size_t m, const char* op) {
  const DType dtype = a.dtype();
  if (fuse && !weight.act_order() && m <= static_cast<std::size_t>(kernels::kGptqSiluMulMaxM) &&
      int4_launch_taken(rt.stream, sw, weight, dtype, ptr(a), ptr(act), m, kernels::launch_gptq_gemm_silu_mul)) {
    return;
  }
  run_gemm_gptq(rt, sw, weight, a, gate_up, m, op);
  kernels::launch_silu_mul_pairs(op, dtype, ptr(gate_up), ptr(act), static_cast<long long>(m * (weight.n() / 2)),
                                 rt.stream);
}

}  // namespace

// The refusals are the same whichever path runs (one check, under this op's name).
void CudaBackend::do_gemm_silu_mul_gptq(const Buffer& a, const QuantWeight& w, Buffer& gate_up, Buffer& act,
                                        std::size_t m) {
  const CudaGptqWeight& weight =
      checked_gptq_operands(*rt_, "gemm_silu_mul_gptq", w, {{"a", &a}, {"gate_up", &gate_up}}, {{"act", &act}});
  detail::activate_device(device_);  // the plan's queries ask the current device
  run_gemm_silu_mul_gptq(*rt_, switches_of(*this, rt_->num_sms), weight, gptq_fuse_silu_mul_, a, gate_up, act, m,
                         "gemm_silu_mul_gptq");
}

// ── The row_sq ops (Backend::gemm_gptq_add_residual and beside it) ─────────

void CudaBackend::do_row_sum_squares(const Buffer& x, Buffer& row_sq, std::size_t rows, std::size_t cols) {
  detail::activate_device(device_);
  kernels::launch_row_sum_squares(x.dtype(), ptr(x), ptr<float>(row_sq), static_cast<int>(rows),
                                  static_cast<int>(cols), rt_->stream);
}

// One streaming launch with the residual epilogue where it takes it
// (kernels::launch_gptq_gemm_row_sq), else gemm_gptq and the add-and-sum
// kernel: the same bits. Not under act-order (the launch reads a as given;
// gemm_gptq gathers it first) nor past one streaming launch's rows.
void CudaBackend::do_gemm_gptq_add_residual(const Buffer& a, const QuantWeight& w, Buffer& out, Buffer& residual,
                                           Buffer& row_sq, std::size_t m) {
  const char* const op = "gemm_gptq_add_residual";
  const CudaGptqWeight& weight =
      checked_gptq_operands(*rt_, op, w, {{"a", &a}, {"out", &out}, {"residual", &residual}}, {{"row_sq", &row_sq}});
  // Before any launch: where the streaming kernel does not take it, the
  // add-and-sum kernel after the GEMM would refuse it, the GEMM already run.
  if (w.n() > static_cast<std::size_t>(kernels::kRowSqMaxCols)) {
    abandon_capture();
    detail::fail(ErrorCode::Unsupported, "{}: argument 'w.n()' = {} exceeds the CUDA kernel's limit {}", op, w.n(),
                 kernels::kRowSqMaxCols);
  }
  detail::activate_device(device_);
  const DType dtype = a.dtype();
  const GptqSwitches sw = switches_of(*this, rt_->num_sms);
  if (gptq_fuse_residual_add_ && !weight.act_order() && m <= static_cast<std::size_t>(kernels::kGptqStreamMaxM) &&
      int4_launch_taken(rt_->stream, sw, weight, dtype, ptr(a), ptr(out), m,
                        [&](kernels::GptqGemmArgs& args, cudaStream_t stream) {
                          args.residual_out = {.residual = ptr(residual), .row_sq = ptr<float>(row_sq)};
                          return kernels::launch_gptq_gemm_row_sq(args, stream);
                        })) {
    return;
  }
  run_gemm_gptq(*rt_, sw, weight, a, out, m, op);
  kernels::launch_add_residual_row_sq(dtype, ptr(out), ptr(residual), ptr<float>(row_sq), static_cast<int>(m),
                                      static_cast<int>(w.n()), rt_->stream);
}

namespace {

// The first half of rms_norm_gemm_gptq and its SiLU·mul form: w and the
// operands checked (gemm_out: the GEMM's output, named as the op names it;
// others: row_sq, and act in the SiLU·mul form), then normed = rms_norm(x)
// with the sums of squares from row_sq.
const CudaGptqWeight& norm_from_row_sq(detail::CudaRuntime& rt, int device, const char* op, const Buffer& x,
                                       const Buffer& row_sq, const Buffer& norm_w, float eps, const QuantWeight& w,
                                       Buffer& normed, detail::NamedBuffer gemm_out,
                                       std::initializer_list<detail::NamedBuffer> others, std::size_t m) {
  const CudaGptqWeight& weight =
      checked_gptq_operands(rt, op, w, {{"x", &x}, {"norm_w", &norm_w}, {"normed", &normed}, gemm_out}, others);
  detail::activate_device(device);
  kernels::launch_rms_norm_from_row_sq(op, x.dtype(), ptr(x), ptr<float>(row_sq), ptr(norm_w), eps, ptr(normed),
                                       static_cast<int>(m), static_cast<int>(w.k()), rt.stream);
  return weight;
}

}  // namespace

// The norm kernel, then gemm_gptq.
void CudaBackend::do_rms_norm_gemm_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                                       const QuantWeight& w, Buffer& normed, Buffer& out, std::size_t m) {
  const char* const op = "rms_norm_gemm_gptq";
  const CudaGptqWeight& weight =
      norm_from_row_sq(*rt_, device_, op, x, row_sq, norm_w, eps, w, normed, {"out", &out}, {{"row_sq", &row_sq}}, m);
  run_gemm_gptq(*rt_, switches_of(*this, rt_->num_sms), weight, normed, out, m, op);
}

// The norm kernel, then gemm_silu_mul_gptq's own path (which may fuse the
// SiLU·mul).
void CudaBackend::do_rms_norm_gemm_silu_mul_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w,
                                                float eps, const QuantWeight& w, Buffer& normed, Buffer& gate_up,
                                                Buffer& act, std::size_t m) {
  const char* const op = "rms_norm_gemm_silu_mul_gptq";
  const CudaGptqWeight& weight =
      norm_from_row_sq(*rt_, device_, op, x, row_sq, norm_w, eps, w, normed, {"gate_up", &gate_up},
                       {{"row_sq", &row_sq}, {"act", &act}}, m);
  run_gemm_silu_mul_gptq(*rt_, switches_of(*this, rt_->num_sms), weight, gptq_fuse_silu_mul_, normed, gate_up, act,
                         m, op);
}

}  // namespace ferrum
