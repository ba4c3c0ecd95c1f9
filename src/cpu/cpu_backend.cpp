// CpuBackend: the reference implementation of every op. It is the oracle the
// GPU kernels are tested against, so it favours plain, literal semantics:
// values are decoded to f32, elementwise math is done in f32, reductions are
// accumulated in f64, and each output is rounded once (round to nearest
// even) into the buffer's dtype. Work is split over rows across threads;
// every output element is computed by one thread in a fixed order, so
// results do not depend on the thread count.
#include "ferrum/cpu_backend.hpp"

#include "quant/gptq_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <thread>
#include <vector>

#include "common/device_memory.hpp"
#include "common/fail.hpp"
#include "common/host_simd.hpp"
#include "common/parallel.hpp"
#include "ferrum/half.hpp"

namespace ferrum {

using detail::fail;

namespace {

// Below this many elements of work a task is not worth a thread of its own.
constexpr std::size_t kMinTaskElements = std::size_t{1} << 14;
// A product (gemm, attention) of fewer multiply-adds than this runs inline:
// starting threads would cost more than it saves.
constexpr double kMinParallelMacs = double{1 << 21};

constexpr std::size_t kHostAlignment = 64;

// ── Element access ──────────────────────────────────────────────────────────

const std::byte* bytes_of(const Buffer& b) { return static_cast<const std::byte*>(b.data()); }
std::byte* bytes_of(Buffer& b) { return static_cast<std::byte*>(b.data()); }

[[noreturn]] void not_floating_point(std::string_view what, DType dtype) {
  // Validation lets only f16 / bf16 / f32 reach the decoders; anything else is a bug here.
  fail(ErrorCode::Internal, "cpu backend: {} got dtype {}, which is not a floating-point type", what,
       to_string(dtype));
}

// dst[0 .. count) = src[offset .. offset + count) as f32.
void decode(const Buffer& src, std::size_t offset, std::size_t count, float* dst) {
  switch (src.dtype()) {
    case DType::F16: {
      detail::f16_to_f32_block(static_cast<const std::uint16_t*>(src.data()) + offset, count, dst);
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const std::uint16_t*>(src.data()) + offset;
      for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F32:
      std::memcpy(dst, static_cast<const float*>(src.data()) + offset, count * sizeof(float));
      return;
    case DType::I32:
    case DType::U8:
      break;
  }
  not_floating_point("decode", src.dtype());
}

// dst[offset .. offset + count) = src[0 .. count), rounded to dst's dtype.
void encode(const float* src, std::size_t count, Buffer& dst, std::size_t offset) {
  switch (dst.dtype()) {
    case DType::F16: {
      auto* d = static_cast<std::uint16_t*>(dst.data()) + offset;
      for (std::size_t i = 0; i < count; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<std::uint16_t*>(dst.data()) + offset;
      for (std::size_t i = 0; i < count; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F32:
      std::memcpy(static_cast<float*>(dst.data()) + offset, src, count * sizeof(float));
      return;
    case DType::I32:
    case DType::U8:
      break;
  }
  not_floating_point("encode", dst.dtype());
}

// f64 -> f32 rounding to odd: when inexact, the neighbour of the two around
// `value` whose last mantissa bit is 1. f32 keeps far more than two bits
// beyond f16 / bf16, so rounding this to nearest even gives the same result
// as rounding `value` itself once; a plain f64 -> f32 -> f16 chain would
// round twice and can miss at ties.
float round_to_odd_f32(double value) {
  const float nearest = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(nearest) == value) return nearest;
  if ((f32_to_bits(nearest) & 1u) != 0) return nearest;
  const float toward = value > static_cast<double>(nearest) ? std::numeric_limits<float>::infinity()
                                                            : -std::numeric_limits<float>::infinity();
  return std::nextafter(nearest, toward);
}

// dst[offset] = value (f64), rounded once into dst's dtype.
void store_f64(double value, Buffer& dst, std::size_t offset) {
  switch (dst.dtype()) {
    case DType::F16:
      static_cast<std::uint16_t*>(dst.data())[offset] = f32_to_f16(round_to_odd_f32(value));
      return;
    case DType::BF16:
      static_cast<std::uint16_t*>(dst.data())[offset] = f32_to_bf16(round_to_odd_f32(value));
      return;
    case DType::F32:
      static_cast<float*>(dst.data())[offset] = static_cast<float>(value);
      return;
    case DType::I32:
    case DType::U8:
      break;
  }
  not_floating_point("store_f64", dst.dtype());
}

std::vector<float> decode_all(const Buffer& src, std::size_t count) {
  std::vector<float> values(count);
  decode(src, 0, count, values.data());
  return values;
}

// The value `value` becomes once stored in a buffer of `dtype`.
float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::F16:
      return f16_to_f32(f32_to_f16(value));
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(value));
    case DType::F32:
      return value;
    case DType::I32:
    case DType::U8:
      break;
  }
  not_floating_point("round_to", dtype);
}

// Bit copy of `count` elements; src and dst have the same dtype.
void copy_elements(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                   std::size_t count) {
  const std::size_t elem = size_of(src.dtype());
  std::memcpy(bytes_of(dst) + dst_offset * elem, bytes_of(src) + src_offset * elem, count * elem);
}

// SwiGLU's silu(gate) * up in fp32 (silu_mul_rows).
float silu_mul(float gate, float up) { return (gate / (1.0f + std::exp(-gate))) * up; }

// ── Work splitting ──────────────────────────────────────────────────────────

// Groups `rows` rows of `row_elements` elements each into tasks of whole rows
// holding at least kMinTaskElements elements, so small ops run inline instead
// of paying for thread start-up, and scratch space is set up once per task.
struct RowTasks {
  RowTasks(std::size_t row_count, std::size_t row_elements)
      : rows(row_count),
        rows_per_task(std::max<std::size_t>(1, kMinTaskElements / std::max<std::size_t>(1, row_elements))) {}

  std::size_t count() const { return (rows + rows_per_task - 1) / rows_per_task; }
  std::size_t begin(std::size_t task) const { return task * rows_per_task; }
  std::size_t end(std::size_t task) const { return std::min(rows, begin(task) + rows_per_task); }

  std::size_t rows;
  std::size_t rows_per_task;
};

// 1 / sqrt(mean(x²) + eps) of row x[0 .. dim), the sum of squares in f64.
float rms_scale(const float* x /*[dim]*/, std::size_t dim, float eps) {
  double sum_sq = 0.0;
  for (std::size_t d = 0; d < dim; ++d) sum_sq += static_cast<double>(x[d]) * static_cast<double>(x[d]);
  const double mean_sq = sum_sq / static_cast<double>(dim);
  return static_cast<float>(1.0 / std::sqrt(mean_sq + static_cast<double>(eps)));
}

// out_d = (x_d * r) * w_d in f32, with r = rms_scale(x); out may alias x.
void rms_normalize_row(const float* x /*[dim]*/, const float* w /*[dim]*/, std::size_t dim, float eps,
                       float* out /*[dim]*/) {
  const float r = rms_scale(x, dim, eps);
  for (std::size_t d = 0; d < dim; ++d) out[d] = (x[d] * r) * w[d];
}

// One RoPE row, as qk_norm_rope and qkv_rope_append compute it: x (with
// `weight`, RMS-normalized in place first; the normalized row feeds the
// rotation unrounded), then NeoX rotate-halves with the cos / sin rows.
void rope_row(float* x /*[head_dim]*/, const float* weight /*[head_dim] or null*/, const float* c /*[head_dim/2]*/,
              const float* s /*[head_dim/2]*/, std::size_t head_dim, float eps, float* rotated /*[head_dim]*/) {
  const std::size_t half = head_dim / 2;
  if (weight != nullptr) rms_normalize_row(x, weight, head_dim, eps, x);
  for (std::size_t i = 0; i < half; ++i) {
    rotated[i] = x[i] * c[i] - x[i + half] * s[i];
    rotated[i + half] = x[i + half] * c[i] + x[i] * s[i];
  }
}

}  // namespace

// ── Lifecycle ────────────────────────────────────────────────────────────────

namespace {
void free_host_bytes(void* ptr, int /*device*/) noexcept { std::free(ptr); }
}  // namespace

CpuBackend::CpuBackend(CpuBackendConfig config)
    : num_threads_(config.num_threads != 0 ? config.num_threads
                                           : std::max(1u, std::thread::hardware_concurrency())) {
  set_deallocator(free_host_bytes, -1);
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const { return fmt::format("cpu ({} threads)", num_threads_); }

bool CpuBackend::supports(Op op) const noexcept {
  switch (op) {
    case Op::RmsNorm:
    case Op::FusedAddRmsNorm:
    case Op::LayerNorm:
    case Op::Gelu:
    case Op::AddBias:
    case Op::AddInplace:
    case Op::Argmax:
    case Op::Gemm:
    case Op::EmbeddingLookup:
    case Op::SplitQkv:
    case Op::FusedSiluMulSplit:
    case Op::QkNormRope:
    case Op::KvCacheAppendHeadMajor:
    case Op::QkvRopeAppend:
    case Op::QkvRopeAppendRagged:
    case Op::TransposeHeadToToken:
    case Op::CopySlice:
    case Op::FlashAttention:
    case Op::FlashDecodeRagged:
    case Op::DeviceStateMode:
    case Op::AdvanceDecodeState:
    case Op::GemmSiluMul:
    case Op::AllReduce:  // world size 1: identities, in the base class
    case Op::AllGather:
    case Op::Broadcast:
    case Op::ReduceScatter:
    case Op::LoadGptq:
    case Op::GemmGptq:
    case Op::GemmSiluMulGptq:
    case Op::GemmQuant:
    case Op::RowSumSquares:
    case Op::GemmGptqAddResidual:
    case Op::RmsNormGemmGptq:
    case Op::RmsNormGemmSiluMulGptq:
      return true;
    case Op::MlaAttention:
    case Op::GraphCapture:
      return false;
  }
  return false;
}

// Runs body(i) for every i in [0, n) on up to num_threads_ threads
// (detail::parallel_for: contiguous ranges, the calling thread takes the
// first; the first failing range's exception is rethrown after all finish).
template <class F>
void CpuBackend::parallel_for(std::size_t n, F&& body) {
  detail::parallel_for(n, 1, 1, num_threads_, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) body(i);
  });
}

// ── Memory ───────────────────────────────────────────────────────────────────

// The host dereferences a wrapped pointer: device memory (which it cannot)
// is refused, named with its device; anything else is the caller's host
// memory, this backend's own kind (not Buffer::host_memory).
bool CpuBackend::check_wrapped(const void* ptr, std::size_t bytes) const {
  const int device = detail::device_owning_memory(ptr);
  if (device >= 0) {
    fail(ErrorCode::InvalidArgument,
         "Buffer::wrap: argument 'ptr' = {} ({} bytes) is memory of CUDA device {}, which CpuBackend's ops (run on "
         "the host) cannot read; wrap it with a CudaBackend on that device",
         ptr, bytes, device);
  }
  return false;
}

namespace {
// kHostAlignment-aligned host memory; `op` names the caller in errors.
void* aligned_host_bytes(std::size_t bytes, const char* op) {
  // std::aligned_alloc wants a size that is a multiple of the alignment.
  if (bytes > SIZE_MAX - (kHostAlignment - 1)) {
    fail(ErrorCode::OutOfMemory, "{}: {} bytes is more than host memory can hold", op, bytes);
  }
  const std::size_t rounded = std::max(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
  void* p = std::aligned_alloc(kHostAlignment, rounded);
  if (p == nullptr) {
    fail(ErrorCode::OutOfMemory, "{}: could not allocate {} bytes of host memory", op, rounded);
  }
  return p;
}
}  // namespace

void* CpuBackend::allocate_bytes(std::size_t bytes) { return aligned_host_bytes(bytes, "alloc"); }

void* CpuBackend::allocate_host_bytes(std::size_t bytes) { return aligned_host_bytes(bytes, "alloc_host"); }

// The three copies ignore `op`: a memcpy cannot fail.
void CpuBackend::do_write_bytes(const char* /*op*/, Buffer& dst, std::size_t dst_byte_offset, const void* host,
                                std::size_t bytes) {
  std::memcpy(bytes_of(dst) + dst_byte_offset, host, bytes);
}

void CpuBackend::do_read_bytes(const char* /*op*/, const Buffer& src, std::size_t src_byte_offset, void* host,
                               std::size_t bytes) {
  std::memcpy(host, bytes_of(src) + src_byte_offset, bytes);
}

void CpuBackend::do_copy_slice(const char* /*op*/, const Buffer& src, std::size_t src_offset, Buffer& dst,
                               std::size_t dst_offset, std::size_t len) {
  // memmove: src and dst may be views of one buffer (disjoint ranges:
  // Backend::copy_slice refuses overlapping ones, as the CUDA copy would be
  // undefined there).
  const std::size_t elem = size_of(src.dtype());
  std::memmove(bytes_of(dst) + dst_offset * elem, bytes_of(src) + src_offset * elem, len * elem);
}

void CpuBackend::do_set_decode_state(std::int32_t token, std::int32_t pos, std::int32_t kv_len) {
  state_token_ = token;
  state_pos_ = pos;
  state_kv_len_ = kv_len;
}

void CpuBackend::do_advance_decode_state(const Buffer& next_token, Buffer& token_log) {
  const std::int64_t at = static_cast<std::int64_t>(state_pos_) + 1;
  if (at < 0 || at >= static_cast<std::int64_t>(token_log.numel())) {
    fail(ErrorCode::CapacityExceeded,
         "advance_decode_state: decode-state position {} + 1 is outside token_log (numel = {})", state_pos_,
         token_log.numel());
  }
  const std::int32_t token = *static_cast<const std::int32_t*>(next_token.data());
  static_cast<std::int32_t*>(token_log.data())[at] = token;
  state_token_ = token;
  state_pos_ += 1;
  state_kv_len_ += 1;
}

// ── Norms ────────────────────────────────────────────────────────────────────

void CpuBackend::do_rms_norm(const Buffer& x /*[tokens, dim]*/, const Buffer& w /*[dim]*/, float eps,
                             Buffer& out /*[tokens, dim]*/, std::size_t tokens, std::size_t dim) {
  const std::vector<float> weight = decode_all(w, dim);
  const RowTasks tasks(tokens, dim);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> row(dim);
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      decode(x, t * dim, dim, row.data());
      rms_normalize_row(row.data(), weight.data(), dim, eps, row.data());
      encode(row.data(), dim, out, t * dim);
    }
  });
}

void CpuBackend::do_fused_add_rms_norm(Buffer& residual /*[tokens, dim], in/out*/,
                                       const Buffer& x /*[tokens, dim]*/, const Buffer& w /*[dim]*/,
                                       float eps, Buffer& out /*[tokens, dim]*/, std::size_t tokens,
                                       std::size_t dim) {
  const std::vector<float> weight = decode_all(w, dim);
  const DType dtype = residual.dtype();
  const RowTasks tasks(tokens, dim);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> sum(dim);
    std::vector<float> addend(dim);
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      decode(residual, t * dim, dim, sum.data());
      decode(x, t * dim, dim, addend.data());
      // The norm reads the sum as stored, i.e. rounded to the dtype.
      for (std::size_t d = 0; d < dim; ++d) sum[d] = round_to(dtype, sum[d] + addend[d]);
      encode(sum.data(), dim, residual, t * dim);
      rms_normalize_row(sum.data(), weight.data(), dim, eps, sum.data());
      encode(sum.data(), dim, out, t * dim);
    }
  });
}

void CpuBackend::do_layer_norm(const Buffer& x /*[tokens, dim]*/, const Buffer& gamma /*[dim]*/,
                               const Buffer& beta /*[dim]*/, float eps, Buffer& out /*[tokens, dim]*/,
                               std::size_t tokens, std::size_t dim) {
  const std::vector<float> scale = decode_all(gamma, dim);
  const std::vector<float> shift = decode_all(beta, dim);
  const RowTasks tasks(tokens, dim);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> row(dim);
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      decode(x, t * dim, dim, row.data());
      // Two passes (mean, then mean squared deviation): no cancellation.
      double sum = 0.0;
      for (std::size_t d = 0; d < dim; ++d) sum += row[d];
      const double mean = sum / static_cast<double>(dim);
      double sum_sq_dev = 0.0;
      for (std::size_t d = 0; d < dim; ++d) {
        const double dev = row[d] - mean;
        sum_sq_dev += dev * dev;
      }
      const double variance = sum_sq_dev / static_cast<double>(dim);  // biased, as torch
      const double rstd = 1.0 / std::sqrt(variance + static_cast<double>(eps));
      for (std::size_t d = 0; d < dim; ++d) {
        const float normalized = static_cast<float>((row[d] - mean) * rstd);
        row[d] = normalized * scale[d] + shift[d];
      }
      encode(row.data(), dim, out, t * dim);
    }
  });
}

// ── Elementwise ──────────────────────────────────────────────────────────────

void CpuBackend::do_gelu(const Buffer& x /*[len]*/, Buffer& out /*[len]*/, std::size_t len,
                         GeluApproximation approx) {
  const RowTasks blocks(len, 1);  // blocks of kMinTaskElements elements
  parallel_for(blocks.count(), [&](std::size_t block) {
    const std::size_t begin = blocks.begin(block);
    const std::size_t count = blocks.end(block) - begin;
    std::vector<float> values(count);
    decode(x, begin, count, values.data());
    for (float& v : values) {
      if (approx == GeluApproximation::Erf) {
        v = 0.5f * v * (1.0f + std::erf(v * 0.70710678f));
      } else {
        v = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
      }
    }
    encode(values.data(), count, out, begin);
  });
}

void CpuBackend::do_add_bias(Buffer& data /*[rows, cols], in/out*/, const Buffer& bias /*[cols]*/,
                             std::size_t rows, std::size_t cols) {
  const std::vector<float> bias_values = decode_all(bias, cols);
  const RowTasks tasks(rows, cols);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> row(cols);
    for (std::size_t r = tasks.begin(task); r < tasks.end(task); ++r) {
      decode(data, r * cols, cols, row.data());
      for (std::size_t c = 0; c < cols; ++c) row[c] += bias_values[c];
      encode(row.data(), cols, data, r * cols);
    }
  });
}

void CpuBackend::do_argmax(const Buffer& x /*[rows, cols]*/, Buffer& out /*[rows] i32*/, std::size_t rows,
                           std::size_t cols) {
  auto* ids = static_cast<std::int32_t*>(out.data());
  const RowTasks tasks(rows, cols);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> row(cols);  // one buffer per task, not per row
    for (std::size_t r = tasks.begin(task); r < tasks.end(task); ++r) {
      decode(x, r * cols, cols, row.data());
      // Strictly greater replaces: the first maximum wins. A NaN beats every
      // number and the first NaN wins among NaNs (torch.argmax).
      std::size_t best = 0;
      for (std::size_t c = 1; c < cols; ++c) {
        const bool best_nan = std::isnan(row[best]);
        if (!best_nan && (std::isnan(row[c]) || row[c] > row[best])) best = c;
      }
      ids[r] = static_cast<std::int32_t>(best);
    }
  });
}

void CpuBackend::do_add_inplace(Buffer& residual /*[len], in/out*/, const Buffer& x /*[len]*/,
                                std::size_t len) {
  const RowTasks blocks(len, 1);  // blocks of kMinTaskElements elements
  parallel_for(blocks.count(), [&](std::size_t block) {
    const std::size_t begin = blocks.begin(block);
    const std::size_t count = blocks.end(block) - begin;
    std::vector<float> sum(count);
    std::vector<float> addend(count);
    decode(residual, begin, count, sum.data());
    decode(x, begin, count, addend.data());
    for (std::size_t i = 0; i < count; ++i) sum[i] += addend[i];
    encode(sum.data(), count, residual, begin);
  });
}

// ── GEMM ─────────────────────────────────────────────────────────────────────

void CpuBackend::do_gemm(const Buffer& a /*[m, k]*/, const Buffer& b /*[n, k]*/, Buffer& out /*[m, n]*/,
                         std::size_t m, std::size_t n, std::size_t k) {
  // b is a weight that can be vocab-sized, so each task decodes only the
  // block of its rows it needs.
  gemm_f32(decode_rows(a, m, k), m, n, k,
           [&](std::size_t j_begin, std::size_t rows, float* dst) { decode(b, j_begin * k, rows * k, dst); }, out);
}

// gemm into the workspace (one rounding per output, as gemm), then silu·mul
// of each rounded (gate, up) pair, as fused_silu_mul_split does for halves.
void CpuBackend::do_gemm_silu_mul(const Buffer& a /*[m, k]*/, const Buffer& w /*[2*im, k] (gate, up) rows*/,
                                  Buffer& gate_up /*[m, 2*im] workspace*/, Buffer& act /*[m, im]*/, std::size_t m,
                                  std::size_t im, std::size_t k) {
  do_gemm(a, w, gate_up, m, 2 * im, k);
  silu_mul_rows(gate_up, act, m, im, /*interleaved=*/true);
}

void CpuBackend::silu_mul_rows(const Buffer& gate_up /*[tokens, 2*im]*/, Buffer& out /*[tokens, im]*/,
                               std::size_t tokens, std::size_t im, bool interleaved) {
  const std::size_t gate_stride = interleaved ? 2 : 1;
  const std::size_t up_offset = interleaved ? 1 : im;
  const RowTasks tasks(tokens, 2 * im);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> row(2 * im);
    std::vector<float> result(im);
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      decode(gate_up, t * 2 * im, 2 * im, row.data());
      for (std::size_t j = 0; j < im; ++j) {
        result[j] = silu_mul(row[gate_stride * j], row[gate_stride * j + up_offset]);
      }
      encode(result.data(), im, out, t * im);
    }
  });
}

std::vector<float> CpuBackend::decode_rows(const Buffer& a /*[m, k]*/, std::size_t m, std::size_t k) {
  std::vector<float> values(m * k);
  const RowTasks tasks(m, k);
  parallel_for(tasks.count(), [&](std::size_t task) {
    const std::size_t begin = tasks.begin(task);
    decode(a, begin * k, (tasks.end(task) - begin) * k, values.data() + begin * k);
  });
  return values;
}

template <class DecodeB>
void CpuBackend::gemm_f32(const std::vector<float>& a_values /*[m, k]*/, std::size_t m, std::size_t n, std::size_t k,
                          DecodeB&& decode_b /*(first row, rows, float* [rows, k])*/, Buffer& out /*[m, n]*/) {
  // A task is kBlockM rows of a by kBlockN rows of b. The b block (kBlockN * k
  // f32) stays in cache while the a rows stream past it, kRowsAtOnce at a time.
  constexpr std::size_t kRowsAtOnce = 4;
  constexpr std::size_t kBlockM = 64;
  constexpr std::size_t kBlockN = 32;
  const std::size_t blocks_m = (m + kBlockM - 1) / kBlockM;
  const std::size_t blocks_n = (n + kBlockN - 1) / kBlockN;
  auto run_block = [&](std::size_t block) {
    const std::size_t i_begin = (block % blocks_m) * kBlockM;
    const std::size_t i_end = std::min(m, i_begin + kBlockM);
    const std::size_t j_begin = (block / blocks_m) * kBlockN;
    const std::size_t j_end = std::min(n, j_begin + kBlockN);
    std::vector<float> b_block((j_end - j_begin) * k);
    decode_b(j_begin, j_end - j_begin, b_block.data());
    double sums[kRowsAtOnce];
    for (std::size_t i = i_begin; i < i_end; i += kRowsAtOnce) {
      const std::size_t rows = std::min(kRowsAtOnce, i_end - i);
      for (std::size_t j = j_begin; j < j_end; ++j) {
        const float* b_row = b_block.data() + (j - j_begin) * k;
        if (rows == kRowsAtOnce) {
          detail::dot_rows<kRowsAtOnce>(a_values.data() + i * k, k, b_row, k, sums);
        } else {
          for (std::size_t r = 0; r < rows; ++r) detail::dot_rows<1>(a_values.data() + (i + r) * k, k, b_row, k, &sums[r]);
        }
        for (std::size_t r = 0; r < rows; ++r) store_f64(sums[r], out, (i + r) * n + j);
      }
    }
  };
  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (macs < kMinParallelMacs) {
    for (std::size_t block = 0; block < blocks_m * blocks_n; ++block) run_block(block);
  } else {
    parallel_for(blocks_m * blocks_n, run_block);
  }
}

// ── GPTQ (the reference: dequantize once at load, then a plain GEMM) ────────

namespace {

class CpuGptqWeight final : public QuantWeight {
 public:
  CpuGptqWeight(detail::BackendRef owner, std::size_t k, std::size_t n, std::vector<float> w_t)
      : owner_(std::move(owner)), k_(k), n_(n), w_t_(std::move(w_t)) {}
  QuantKind kind() const noexcept override { return QuantKind::Gptq; }
  std::size_t k() const noexcept override { return k_; }
  std::size_t n() const noexcept override { return n_; }
  const Backend* backend() const noexcept override { return owner_.get(); }
  const std::vector<float>& transposed() const noexcept { return w_t_; }  // [n, k]

 private:
  detail::BackendRef owner_;
  std::size_t k_, n_;
  std::vector<float> w_t_;
};

}  // namespace

std::unique_ptr<QuantWeight> CpuBackend::do_load_gptq(const GptqHostTensors& tensors) {
  const detail::GptqUnpacked w = detail::unpack_gptq(tensors, "load_gptq", num_threads_);
  return std::make_unique<CpuGptqWeight>(backend_ref(), w.k, w.n, detail::dequantize_gptq_transposed(w));
}

namespace {

// w as made by a CpuBackend's load_gptq; else InvalidArgument naming `op`.
const CpuGptqWeight& checked_cpu_gptq_weight(const char* op, const QuantWeight& w) {
  const auto* weight = dynamic_cast<const CpuGptqWeight*>(&w);
  if (weight == nullptr) fail(ErrorCode::InvalidArgument, "{}: argument 'w' was not made by this backend's load_gptq", op);
  return *weight;
}

}  // namespace

void CpuBackend::do_gemm_gptq(const Buffer& a /*[m, k]*/, const QuantWeight& w, Buffer& out /*[m, n]*/,
                              std::size_t m, const char* op) {
  const CpuGptqWeight& weight = checked_cpu_gptq_weight(op, w);
  const std::size_t k = weight.k();
  const float* w_t = weight.transposed().data();
  gemm_f32(decode_rows(a, m, k), m, weight.n(), k,
           [&](std::size_t j_begin, std::size_t rows, float* dst) {
             std::memcpy(dst, w_t + j_begin * k, rows * k * sizeof(float));
           },
           out);
}

// gemm_gptq into the workspace (one rounding per output), then silu·mul of
// each rounded (gate, up) column pair, as do_gemm_silu_mul.
void CpuBackend::do_gemm_silu_mul_gptq(const Buffer& a /*[m, k]*/, const QuantWeight& w,
                                       Buffer& gate_up /*[m, 2*im] workspace*/, Buffer& act /*[m, im]*/,
                                       std::size_t m) {
  do_gemm_gptq(a, w, gate_up, m, "gemm_silu_mul_gptq");
  silu_mul_rows(gate_up, act, m, w.n() / 2, /*interleaved=*/true);
}

// ── The row_sq ops ───────────────────────────────────────────────────────────

namespace {

// row_sq of one decoded row (values as stored): each group of kRowSqColumns
// columns summed in f64, then rounded to f32.
void row_sq_of(const float* row /*[cols]*/, std::size_t cols, float* sq /*[row_sq_groups(cols)]*/) {
  for (std::size_t g = 0; g * kRowSqColumns < cols; ++g) {
    double sum = 0.0;
    for (std::size_t c = g * kRowSqColumns; c < std::min(cols, (g + 1) * kRowSqColumns); ++c) {
      sum += static_cast<double>(row[c]) * static_cast<double>(row[c]);
    }
    sq[g] = static_cast<float>(sum);
  }
}

}  // namespace

void CpuBackend::do_row_sum_squares(const Buffer& x /*[rows, cols]*/, Buffer& row_sq /*[rows, groups] f32*/,
                                    std::size_t rows, std::size_t cols) {
  float* const sq = static_cast<float*>(row_sq.data());
  const std::size_t groups = row_sq_groups(cols);
  const RowTasks tasks(rows, cols);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> row(cols);
    for (std::size_t r = tasks.begin(task); r < tasks.end(task); ++r) {
      decode(x, r * cols, cols, row.data());
      row_sq_of(row.data(), cols, sq + r * groups);
    }
  });
}

void CpuBackend::do_gemm_gptq_add_residual(const Buffer& a /*[m, k]*/, const QuantWeight& w, Buffer& out /*[m, n]*/,
                                           Buffer& residual /*[m, n]*/, Buffer& row_sq /*[m, groups] f32*/,
                                           std::size_t m) {
  do_gemm_gptq(a, w, out, m, "gemm_gptq_add_residual");
  const std::size_t n = w.n(), groups = row_sq_groups(n);
  const DType dtype = residual.dtype();
  float* const sq = static_cast<float*>(row_sq.data());
  std::vector<float> sum(n), addend(n);
  for (std::size_t r = 0; r < m; ++r) {
    decode(residual, r * n, n, sum.data());
    decode(out, r * n, n, addend.data());
    // As fused_add_rms_norm: the sum rounded to the dtype, as stored.
    for (std::size_t c = 0; c < n; ++c) sum[c] = round_to(dtype, sum[c] + addend[c]);
    encode(sum.data(), n, residual, r * n);
    row_sq_of(sum.data(), n, sq + r * groups);
  }
}

void CpuBackend::rms_norm_from_row_sq(const Buffer& x /*[rows, cols]*/, const Buffer& row_sq /*[rows, groups] f32*/,
                                      const Buffer& norm_w /*[cols]*/, float eps, Buffer& normed /*[rows, cols]*/,
                                      std::size_t rows, std::size_t cols) {
  const std::vector<float> weight = decode_all(norm_w, cols);
  const float* const sq = static_cast<const float*>(row_sq.data());
  const std::size_t groups = row_sq_groups(cols);
  std::vector<float> row(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    double sum_sq = 0.0;
    for (std::size_t g = 0; g < groups; ++g) sum_sq += static_cast<double>(sq[r * groups + g]);
    // rms_scale's formula, on the given sum.
    const float scale =
        static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(cols) + static_cast<double>(eps)));
    decode(x, r * cols, cols, row.data());
    for (std::size_t c = 0; c < cols; ++c) row[c] = (row[c] * scale) * weight[c];
    encode(row.data(), cols, normed, r * cols);
  }
}

void CpuBackend::do_rms_norm_gemm_gptq(const Buffer& x /*[m, k]*/, const Buffer& row_sq, const Buffer& norm_w,
                                       float eps, const QuantWeight& w, Buffer& normed /*[m, k]*/,
                                       Buffer& out /*[m, n]*/, std::size_t m) {
  (void)checked_cpu_gptq_weight("rms_norm_gemm_gptq", w);  // before normed is written
  rms_norm_from_row_sq(x, row_sq, norm_w, eps, normed, m, w.k());
  do_gemm_gptq(normed, w, out, m, "rms_norm_gemm_gptq");
}

void CpuBackend::do_rms_norm_gemm_silu_mul_gptq(const Buffer& x /*[m, k]*/, const Buffer& row_sq,
                                                const Buffer& norm_w, float eps, const QuantWeight& w,
                                                Buffer& normed /*[m, k]*/, Buffer& gate_up /*[m, 2*im]*/,
                                                Buffer& act /*[m, im]*/, std::size_t m) {
  (void)checked_cpu_gptq_weight("rms_norm_gemm_silu_mul_gptq", w);  // before normed is written
  rms_norm_from_row_sq(x, row_sq, norm_w, eps, normed, m, w.k());
  do_gemm_gptq(normed, w, gate_up, m, "rms_norm_gemm_silu_mul_gptq");
  silu_mul_rows(gate_up, act, m, w.n() / 2, /*interleaved=*/true);
}

// ── Embedding and reshaping ──────────────────────────────────────────────────

void CpuBackend::do_embedding_lookup(const Buffer& table /*[vocab, dim]*/, const Buffer& ids /*[tokens] i32*/,
                                     Buffer& out /*[tokens, dim]*/, std::size_t tokens, std::size_t dim,
                                     std::size_t vocab, bool use_decode_state) {
  // Check every id before writing anything, so a bad id leaves out untouched.
  std::vector<std::size_t> rows(tokens);
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::int64_t id = use_decode_state ? state_token_ : static_cast<const std::int32_t*>(ids.data())[t];
    if (id < 0 || static_cast<std::uint64_t>(id) >= vocab) {
      if (use_decode_state) {
        fail(ErrorCode::InvalidArgument,
             "embedding_lookup: token id {} (decode-state token) is outside the vocabulary [0, {})", id, vocab);
      }
      fail(ErrorCode::InvalidArgument, "embedding_lookup: token id {} (ids[{}]) is outside the vocabulary [0, {})",
           id, t, vocab);
    }
    rows[t] = static_cast<std::size_t>(id);
  }
  const RowTasks tasks(tokens, dim);
  parallel_for(tasks.count(), [&](std::size_t task) {
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      copy_elements(table, rows[t] * dim, out, t * dim, dim);
    }
  });
}

void CpuBackend::do_split_qkv(const Buffer& qkv /*[tokens, q_dim + 2*kv_dim]*/, Buffer& q /*[tokens, q_dim]*/,
                              Buffer& k /*[tokens, kv_dim]*/, Buffer& v /*[tokens, kv_dim]*/,
                              std::size_t tokens, std::size_t q_dim, std::size_t kv_dim) {
  const std::size_t row = q_dim + 2 * kv_dim;
  const RowTasks tasks(tokens, row);
  parallel_for(tasks.count(), [&](std::size_t task) {
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      copy_elements(qkv, t * row, q, t * q_dim, q_dim);
      copy_elements(qkv, t * row + q_dim, k, t * kv_dim, kv_dim);
      copy_elements(qkv, t * row + q_dim + kv_dim, v, t * kv_dim, kv_dim);
    }
  });
}

void CpuBackend::do_fused_silu_mul_split(const Buffer& gate_up /*[tokens, 2*im] as [gate | up]*/,
                                         Buffer& out /*[tokens, im]*/, std::size_t tokens, std::size_t im) {
  silu_mul_rows(gate_up, out, tokens, im, /*interleaved=*/false);
}

void CpuBackend::do_qk_norm_rope(const Buffer& input /*[tokens, heads, head_dim]*/,
                                 const Buffer* norm_w /*[head_dim]; null in RopeOnly mode*/,
                                 const Buffer& cos /*[max_pos, head_dim/2] f32*/,
                                 const Buffer& sin /*[max_pos, head_dim/2] f32*/,
                                 Buffer& output /*[heads, tokens, head_dim]*/, std::size_t tokens,
                                 std::size_t heads, std::size_t head_dim, std::size_t pos_offset,
                                 std::size_t max_pos, float eps, RopeMode mode, bool use_decode_state) {
  if (use_decode_state && (state_pos_ < 0 || static_cast<std::size_t>(state_pos_) >= max_pos)) {
    fail(ErrorCode::CapacityExceeded,
         "qk_norm_rope: decode-state position {} is outside the {} positions of the cos/sin tables", state_pos_,
         max_pos);
  }
  const std::size_t first_pos = use_decode_state ? static_cast<std::size_t>(state_pos_) : pos_offset;
  const bool normalize = mode == RopeMode::NormAndRope;
  const std::vector<float> weight = normalize ? decode_all(*norm_w, head_dim) : std::vector<float>{};
  const auto* cos_table = static_cast<const float*>(cos.data());
  const auto* sin_table = static_cast<const float*>(sin.data());
  const std::size_t half = head_dim / 2;

  const RowTasks tasks(tokens, heads * head_dim);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> x(head_dim);
    std::vector<float> rotated(head_dim);
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      const float* c = cos_table + (first_pos + t) * half;
      const float* s = sin_table + (first_pos + t) * half;
      for (std::size_t h = 0; h < heads; ++h) {
        decode(input, (t * heads + h) * head_dim, head_dim, x.data());
        rope_row(x.data(), normalize ? weight.data() : nullptr, c, s, head_dim, eps, rotated.data());
        encode(rotated.data(), head_dim, output, (h * tokens + t) * head_dim);
      }
    }
  });
}

namespace {

// Throws CapacityExceeded unless position `pos` (named `name`, with
// `[index]` when index >= 0) has a row in both the rope tables and the
// caches of cfg.
void check_append_position(const char* op, const char* name, long long index, long long pos,
                           const QkvRopeAppendConfig& cfg) {
  const std::size_t limit = std::min(cfg.capacity, cfg.max_pos);
  if (pos < 0 || static_cast<std::size_t>(pos) >= limit) {
    fail(ErrorCode::CapacityExceeded, "{}: {}{} = {} is outside [0, {}) (cfg.capacity = {}, cfg.max_pos = {})", op,
         name, index >= 0 ? fmt::format("[{}]", index) : std::string(), pos, limit, cfg.capacity, cfg.max_pos);
  }
}

}  // namespace

// The arithmetic of do_qk_norm_rope and the copies of
// do_kv_cache_append_head_major, row for row: the same bits as split_qkv,
// qk_norm_rope on q and on k and the append.
void CpuBackend::do_qkv_rope_append(const Buffer& qkv /*[tokens, (heads + 2 kv_heads) * head_dim]*/,
                                    const Buffer* q_norm /*[head_dim]*/, const Buffer* k_norm /*[head_dim]*/,
                                    const Buffer& cos /*[max_pos, head_dim/2] f32*/,
                                    const Buffer& sin /*[max_pos, head_dim/2] f32*/,
                                    Buffer& q_out /*[heads, tokens, head_dim]*/,
                                    Buffer& k_cache /*[kv_heads, capacity, head_dim]*/,
                                    Buffer& v_cache /*[kv_heads, capacity, head_dim]*/, std::size_t tokens,
                                    std::size_t pos_offset, const QkvRopeAppendConfig& cfg, bool use_decode_state) {
  if (use_decode_state) check_append_position("qkv_rope_append", "decode-state position", -1, state_pos_, cfg);
  const std::size_t first = use_decode_state ? static_cast<std::size_t>(state_pos_) : pos_offset;
  const std::size_t heads = cfg.heads, kv = cfg.kv_heads, hd = cfg.head_dim, half = hd / 2;
  const std::size_t row = (heads + 2 * kv) * hd;
  const bool normalize = cfg.mode == RopeMode::NormAndRope;
  const std::vector<float> wq = normalize ? decode_all(*q_norm, hd) : std::vector<float>{};
  const std::vector<float> wk = normalize ? decode_all(*k_norm, hd) : std::vector<float>{};
  const auto* cos_table = static_cast<const float*>(cos.data());
  const auto* sin_table = static_cast<const float*>(sin.data());

  const RowTasks tasks(tokens, row);
  parallel_for(tasks.count(), [&](std::size_t task) {
    std::vector<float> x(hd);
    std::vector<float> rotated(hd);
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      const std::size_t pos = first + t;
      const float* c = cos_table + pos * half;
      const float* s = sin_table + pos * half;
      for (std::size_t h = 0; h < heads + kv; ++h) {  // q heads, then k heads
        const bool is_q = h < heads;
        decode(qkv, t * row + h * hd, hd, x.data());
        rope_row(x.data(), normalize ? (is_q ? wq : wk).data() : nullptr, c, s, hd, cfg.eps, rotated.data());
        if (is_q) {
          encode(rotated.data(), hd, q_out, (h * tokens + t) * hd);
        } else {
          encode(rotated.data(), hd, k_cache, ((h - heads) * cfg.capacity + pos) * hd);
        }
      }
      for (std::size_t h = 0; h < kv; ++h) {
        copy_elements(qkv, t * row + (heads + kv + h) * hd, v_cache, (h * cfg.capacity + pos) * hd, hd);
      }
    }
  });
}

// Each sequence is one single-token qkv_rope_append at its own position;
// every position is checked before anything is written.
void CpuBackend::do_qkv_rope_append_ragged(const Buffer& qkv /*[batch, (heads + 2 kv_heads) * head_dim]*/,
                                           const Buffer* q_norm /*[head_dim]*/, const Buffer* k_norm /*[head_dim]*/,
                                           const Buffer& cos /*[max_pos, head_dim/2] f32*/,
                                           const Buffer& sin /*[max_pos, head_dim/2] f32*/,
                                           Buffer& q_out /*[batch, heads, head_dim]*/,
                                           Buffer& k_cache /*[batch, kv_heads, capacity, head_dim]*/,
                                           Buffer& v_cache /*[batch, kv_heads, capacity, head_dim]*/,
                                           const Buffer& positions /*[batch] i32*/, std::size_t batch,
                                           const QkvRopeAppendConfig& cfg) {
  const auto* pos = static_cast<const std::int32_t*>(positions.data());
  for (std::size_t b = 0; b < batch; ++b) {
    check_append_position("qkv_rope_append_ragged", "positions", static_cast<long long>(b), pos[b], cfg);
  }
  const std::size_t row = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, q_row = cfg.heads * cfg.head_dim;
  const std::size_t seq = cfg.kv_heads * cfg.capacity * cfg.head_dim;
  for (std::size_t b = 0; b < batch; ++b) {
    Buffer q_b = q_out.view(b * q_row, q_row), k_b = k_cache.view(b * seq, seq), v_b = v_cache.view(b * seq, seq);
    do_qkv_rope_append(qkv.view(b * row, row), q_norm, k_norm, cos, sin, q_b, k_b, v_b, 1,
                       static_cast<std::size_t>(pos[b]), cfg, false);
  }
}

void CpuBackend::do_kv_cache_append_head_major(Buffer& cache_k /*[nkv, capacity, hd]*/,
                                               Buffer& cache_v /*[nkv, capacity, hd]*/, std::size_t cache_len,
                                               std::size_t capacity, const Buffer& new_k /*[nkv, new_tokens, hd]*/,
                                               const Buffer& new_v /*[nkv, new_tokens, hd]*/,
                                               std::size_t new_tokens, std::size_t nkv, std::size_t hd,
                                               bool use_decode_state) {
  const std::int64_t base = use_decode_state ? state_pos_ : static_cast<std::int64_t>(cache_len);
  if (base < 0 || new_tokens > capacity || static_cast<std::size_t>(base) > capacity - new_tokens) {
    if (use_decode_state) {
      fail(ErrorCode::CapacityExceeded,
           "kv_cache_append_head_major: decode-state position {} + new_tokens {} exceeds capacity {}", base,
           new_tokens, capacity);
    }
    fail(ErrorCode::CapacityExceeded, "kv_cache_append_head_major: cache_len {} + new_tokens {} exceeds capacity {}",
         base, new_tokens, capacity);
  }
  const auto first = static_cast<std::size_t>(base);
  // Per kv head, the new positions are one contiguous run in the cache.
  auto append_head = [&](std::size_t h) {
    copy_elements(new_k, h * new_tokens * hd, cache_k, (h * capacity + first) * hd, new_tokens * hd);
    copy_elements(new_v, h * new_tokens * hd, cache_v, (h * capacity + first) * hd, new_tokens * hd);
  };
  if (nkv * new_tokens * hd < 2 * kMinTaskElements) {  // a decode step's few rows: no threads
    for (std::size_t h = 0; h < nkv; ++h) append_head(h);
  } else {
    parallel_for(nkv, append_head);
  }
}

void CpuBackend::do_transpose_head_to_token(const Buffer& src /*[heads, tokens, dim]*/,
                                            Buffer& dst /*[tokens, heads, dim]*/, std::size_t tokens,
                                            std::size_t heads, std::size_t dim) {
  const RowTasks tasks(tokens, heads * dim);
  parallel_for(tasks.count(), [&](std::size_t task) {
    for (std::size_t t = tasks.begin(task); t < tasks.end(task); ++t) {
      for (std::size_t h = 0; h < heads; ++h) {
        copy_elements(src, (h * tokens + t) * dim, dst, (t * heads + h) * dim, dim);
      }
    }
  });
}

// ── Attention ────────────────────────────────────────────────────────────────

void CpuBackend::do_flash_attention(const Buffer& q /*[batch, num_heads, q_len, head_dim]*/,
                                    const Buffer& k /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                                    const Buffer& v /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                                    Buffer& out /*[batch, num_heads, q_len, head_dim]*/, std::size_t batch,
                                    std::size_t q_len, std::size_t kv_len, std::size_t pos_offset,
                                    const AttnConfig& cfg, bool use_decode_state) {
  const std::size_t stride = cfg.kv_seq_stride > 0 ? cfg.kv_seq_stride : kv_len;
  if (use_decode_state) {
    if (state_kv_len_ < 1 || static_cast<std::size_t>(state_kv_len_) > stride) {
      fail(ErrorCode::CapacityExceeded,
           "flash_attention: decode-state kv_len {} is outside [1, {}] (cfg.kv_seq_stride, or kv_len when 0)",
           state_kv_len_, stride);
    }
    kv_len = static_cast<std::size_t>(state_kv_len_);
    pos_offset = kv_len - 1;  // the single query is the newest position
  }
  const std::size_t num_heads = cfg.num_heads;
  const std::size_t hd = cfg.head_dim;
  const std::size_t group = num_heads / cfg.num_kv_heads;
  const double scale = cfg.scale > 0.0f ? static_cast<double>(cfg.scale) : 1.0 / std::sqrt(static_cast<double>(hd));

  // Keys query i may see: j < kv_len, and under the causal mask j <= pos_offset + i.
  auto visible_keys = [&](std::size_t i) {
    return cfg.causal ? std::min(kv_len, pos_offset + i + 1) : kv_len;
  };

  // Tasks are blocks of queries of one (batch, head), so the K and V rows a
  // block reads are decoded once for the whole block.
  constexpr std::size_t kQueryBlock = 16;
  const std::size_t blocks_per_head = (q_len + kQueryBlock - 1) / kQueryBlock;
  auto run_block = [&](std::size_t task) {
    const std::size_t bh = task / blocks_per_head;  // b * num_heads + h
    const std::size_t b = bh / num_heads;
    const std::size_t h = bh % num_heads;
    const std::size_t kv_head = h / group;
    const std::size_t i_begin = (task % blocks_per_head) * kQueryBlock;
    const std::size_t i_end = std::min(q_len, i_begin + kQueryBlock);

    const std::size_t keys = visible_keys(i_end - 1);  // the most any query of the block sees
    const std::size_t kv_base = (b * cfg.num_kv_heads + kv_head) * stride * hd;
    std::vector<float> key_values(keys * hd);
    std::vector<float> value_values(keys * hd);
    decode(k, kv_base, keys * hd, key_values.data());
    decode(v, kv_base, keys * hd, value_values.data());

    std::vector<float> query(hd);
    std::vector<double> probs(keys);
    std::vector<double> acc(hd);
    for (std::size_t i = i_begin; i < i_end; ++i) {
      const std::size_t row = bh * q_len + i;
      decode(q, row * hd, hd, query.data());
      const std::size_t seen = visible_keys(i);
      if (seen == 0) {  // validation rules this out; a fully masked row is defined as 0
        for (std::size_t d = 0; d < hd; ++d) store_f64(0.0, out, row * hd + d);
        continue;
      }
      double max_score = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < seen; ++j) {
        const float* key = key_values.data() + j * hd;
        double dot = 0.0;
        for (std::size_t d = 0; d < hd; ++d) dot += static_cast<double>(query[d]) * static_cast<double>(key[d]);
        probs[j] = scale * dot;
        max_score = std::max(max_score, probs[j]);
      }
      double total = 0.0;
      for (std::size_t j = 0; j < seen; ++j) {
        probs[j] = std::exp(probs[j] - max_score);
        total += probs[j];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::size_t j = 0; j < seen; ++j) {
        const double p = probs[j] / total;
        const float* value = value_values.data() + j * hd;
        for (std::size_t d = 0; d < hd; ++d) acc[d] += p * static_cast<double>(value[d]);
      }
      for (std::size_t d = 0; d < hd; ++d) store_f64(acc[d], out, row * hd + d);
    }
  };
  const std::size_t num_blocks = batch * num_heads * blocks_per_head;
  // q·k and p·v: about 2 * head_dim multiply-adds per (query, key) pair.
  const double macs = 2.0 * static_cast<double>(batch * num_heads * q_len) * static_cast<double>(kv_len) *
                      static_cast<double>(hd);
  if (macs < kMinParallelMacs) {
    for (std::size_t block = 0; block < num_blocks; ++block) run_block(block);
  } else {
    parallel_for(num_blocks, run_block);
  }
}

// Each sequence is one single-query decode over its own kv_lens[b] keys.
void CpuBackend::do_flash_decode_ragged(const Buffer& q /*[batch, num_heads, head_dim]*/,
                                        const Buffer& k /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                                        const Buffer& v /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                                        Buffer& out /*[batch, num_heads, head_dim]*/,
                                        const Buffer& kv_lens /*[batch] i32*/, std::size_t batch,
                                        const AttnConfig& cfg) {
  const auto* lens = static_cast<const std::int32_t*>(kv_lens.data());
  const std::size_t capacity = cfg.kv_seq_stride;
  for (std::size_t b = 0; b < batch; ++b) {
    if (lens[b] < 1 || static_cast<std::size_t>(lens[b]) > capacity) {
      fail(ErrorCode::CapacityExceeded, "flash_decode_ragged: kv_lens[{}] = {} is outside [1, {}] (cfg.kv_seq_stride)",
           b, lens[b], capacity);
    }
  }
  const std::size_t q_row = cfg.num_heads * cfg.head_dim;
  const std::size_t kv_seq = cfg.num_kv_heads * capacity * cfg.head_dim;
  for (std::size_t b = 0; b < batch; ++b) {
    const auto len = static_cast<std::size_t>(lens[b]);
    Buffer out_b = out.view(b * q_row, q_row);
    do_flash_attention(q.view(b * q_row, q_row), k.view(b * kv_seq, kv_seq), v.view(b * kv_seq, kv_seq), out_b, 1, 1,
                       len, len - 1, cfg, false);
  }
}

}  // namespace ferrum
