// The validating layer of every public op (see backend.hpp): checks, then
// the backend's do_* implementation. Both backends share these checks.
#include "ferrum/backend.hpp"

#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <limits>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/fail.hpp"
#include "common/host_simd.hpp"
#include "common/op_check.hpp"
#include "quant/gptq_format.hpp"
#include "ferrum/half.hpp"

namespace ferrum {

using detail::OpCheck;

std::string_view to_string(Op op) noexcept {
  switch (op) {
    case Op::RmsNorm: return "rms_norm";
    case Op::FusedAddRmsNorm: return "fused_add_rms_norm";
    case Op::LayerNorm: return "layer_norm";
    case Op::Gelu: return "gelu";
    case Op::AddBias: return "add_bias";
    case Op::AddInplace: return "add_inplace";
    case Op::Argmax: return "argmax";
    case Op::Gemm: return "gemm";
    case Op::EmbeddingLookup: return "embedding_lookup";
    case Op::SplitQkv: return "split_qkv";
    case Op::FusedSiluMulSplit: return "fused_silu_mul_split";
    case Op::QkNormRope: return "qk_norm_rope";
    case Op::KvCacheAppendHeadMajor: return "kv_cache_append_head_major";
    case Op::QkvRopeAppend: return "qkv_rope_append";
    case Op::TransposeHeadToToken: return "transpose_head_to_token";
    case Op::CopySlice: return "copy_slice";
    case Op::FlashAttention: return "flash_attention";
    case Op::FlashDecodeRagged: return "flash_decode_ragged";
    case Op::LoadGptq: return "load_gptq";
    case Op::GemmGptq: return "gemm_gptq";
    case Op::GemmQuant: return "gemm_quant";
    case Op::AllReduce: return "all_reduce";
    case Op::AllGather: return "all_gather";
    case Op::Broadcast: return "broadcast";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::MlaAttention: return "mla_attention";
    case Op::GraphCapture: return "graph_capture";
    case Op::DeviceStateMode: return "device_state_mode";
    case Op::GemmSiluMul: return "gemm_silu_mul";
    case Op::QkvRopeAppendRagged: return "qkv_rope_append_ragged";
    case Op::AdvanceDecodeState: return "advance_decode_state";
    case Op::GemmSiluMulGptq: return "gemm_silu_mul_gptq";
    case Op::RowSumSquares: return "row_sum_squares";
    case Op::GemmGptqAddResidual: return "gemm_gptq_add_residual";
    case Op::RmsNormGemmGptq: return "rms_norm_gemm_gptq";
    case Op::RmsNormGemmSiluMulGptq: return "rms_norm_gemm_silu_mul_gptq";
  }
  return "unknown_op";
}

namespace {

// "[begin, end)" for `count` elements from `begin`, as the messages write a
// range; where the end would pass 2^64, "[begin, begin + count)" (the sum
// would wrap and name a value nobody passed).
std::string range_text(std::size_t begin, std::size_t count) {
  if (count > std::numeric_limits<std::size_t>::max() - begin) return fmt::format("[{}, {} + {})", begin, begin, count);
  return fmt::format("[{}, {})", begin, begin + count);
}

// `n` value-initialized elements of host staging for `op` (write, download):
// host memory running out is OutOfMemory naming the op and the size, not a
// std::bad_alloc past the API.
template <class T>
std::vector<T> host_staging(const char* op, std::size_t n) {
  try {
    return std::vector<T>(n);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  detail::fail(ErrorCode::OutOfMemory, "{}: host staging of {} elements of {} bytes could not be allocated", op, n,
               sizeof(T));
}

void refuse_during_capture(const OpCheck& check) {
  if (check.backend().is_capturing()) {
    check.fail(ErrorCode::GraphCapture,
               "{}: allocates, synchronizes or records host values, so it is not allowed while a graph is being captured",
               check.op());
  }
}

void encode_from_f32(const char* op, DType dtype, std::span<const float> src, void* dst) {
  switch (dtype) {
    case DType::F16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < src.size(); ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < src.size(); ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F32:
      std::memcpy(dst, src.data(), src.size_bytes());
      return;
    case DType::I32: {
      auto* d = static_cast<std::int32_t*>(dst);
      for (std::size_t i = 0; i < src.size(); ++i) {
        // -2^31 is exact in f32 and fits (-2147483649.0f rounds to it, so a
        // strict > refused INT_MIN); NaN fails both tests.
        if (!(src[i] >= -2147483648.0f && src[i] < 2147483648.0f)) {
          detail::fail(ErrorCode::InvalidArgument, "{}: value {} at index {} does not fit an i32", op, src[i], i);
        }
        d[i] = static_cast<std::int32_t>(src[i]);
      }
      return;
    }
    case DType::U8: {
      auto* d = static_cast<std::uint8_t*>(dst);
      for (std::size_t i = 0; i < src.size(); ++i) {
        if (!(src[i] > -1.0f && src[i] < 256.0f)) {
          detail::fail(ErrorCode::InvalidArgument, "{}: value {} at index {} does not fit a u8", op, src[i], i);
        }
        d[i] = static_cast<std::uint8_t>(src[i]);
      }
      return;
    }
  }
}

void decode_to_f32(DType dtype, const void* src, std::size_t count, float* dst) {
  switch (dtype) {
    case DType::F16:
      detail::f16_to_f32_block(static_cast<const std::uint16_t*>(src), count, dst);
      return;
    case DType::BF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::I32: {
      const auto* s = static_cast<const std::int32_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::U8: {
      const auto* s = static_cast<const std::uint8_t*>(src);
      for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
  }
}

// Elements [offset, offset + elems) of a buffer as bytes in memory; views of
// one allocation may share bytes, which the ops' overlap checks compare.
struct ByteSpan {
  std::uintptr_t begin, end;
  bool overlaps(const ByteSpan& o) const noexcept { return begin < o.end && o.begin < end; }
};
// Two copies' ranges of one length: the same range is nothing to copy
// (every copy's rule; a partial overlap is refused by the caller).
bool same_range(const ByteSpan& a, const ByteSpan& b) noexcept { return a.begin == b.begin; }
// Bytes [byte_offset, byte_offset + bytes) of a buffer.
ByteSpan bytes_of(const Buffer& b, std::size_t byte_offset, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(b.data()) + byte_offset;
  return {begin, begin + bytes};
}
ByteSpan byte_span(const Buffer& b, std::size_t offset, std::size_t elems) {
  const std::size_t elem = size_of(b.dtype());
  return bytes_of(b, offset * elem, elems * elem);
}

// How src[src_offset .. +len) and dst[dst_offset .. +len) (one dtype) lie
// in memory: views of one allocation may share bytes. A device-to-device
// cudaMemcpy is undefined on overlapping ranges, so element copies refuse
// a partial overlap on every backend; the same range is already in place.
// Returns whether the copy has anything to do: false for the same range;
// throws InvalidArgument naming `dst_name` and `src_name` for a partial overlap.
bool copy_needed(const OpCheck& check, const Buffer& src, std::size_t src_offset, std::string_view src_name,
                 const Buffer& dst, std::size_t dst_offset, std::string_view dst_name, std::size_t len) {
  const ByteSpan s = byte_span(src, src_offset, len), d = byte_span(dst, dst_offset, len);
  if (same_range(s, d)) return false;
  if (s.overlaps(d)) {
    check.fail(ErrorCode::InvalidArgument,
               "{}: '{}' {} overlaps '{}' {} in memory (views of one buffer) without being the same "
               "range; copy through a second buffer",
               check.op(), dst_name, range_text(dst_offset, len), src_name, range_text(src_offset, len));
  }
  return true;
}

// write_bytes / read_bytes, as copy_needed: the host range and the
// buffer's (host memory, or host memory a buffer wraps) may be the same
// (nothing to do) but must not otherwise share bytes, since memcpy and
// cudaMemcpy are undefined on overlap. Device addresses never fall in a
// host range (unified addressing), so a host-device copy is never refused.
// Returns whether there is anything to copy.
bool host_copy_needed(const OpCheck& check, const void* host, std::string_view buf_name, const Buffer& buf,
                      std::size_t byte_offset, std::size_t bytes) {
  if (bytes == 0) return false;
  const auto h = reinterpret_cast<std::uintptr_t>(host);
  const ByteSpan host_span{h, h + bytes}, buf_span = bytes_of(buf, byte_offset, bytes);
  if (same_range(host_span, buf_span)) return false;
  if (host_span.overlaps(buf_span)) {
    check.fail(ErrorCode::InvalidArgument,
               "{}: argument 'host' [{:#x}, {:#x}) overlaps '{}' [{:#x}, {:#x}) in memory without being the same "
               "range; copy through a separate host buffer",
               check.op(), host_span.begin, host_span.end, buf_name, buf_span.begin, buf_span.end);
  }
  return true;
}

// An operand of an op under the overlap rule: its name (as the op's messages
// spell it), its buffer (null: an optional operand not passed, skipped) and
// the elements [0, elems) the op touches.
struct Extent {
  Extent(std::string_view n, const Buffer& b, std::size_t e) noexcept : name(n), buffer(&b), elems(e) {}
  Extent(std::string_view n, const Buffer* b, std::size_t e) noexcept : name(n), buffer(b), elems(e) {}
  std::string_view name;
  const Buffer* buffer;
  std::size_t elems;
};

// `out` shares no byte with `other`.
void check_apart(const OpCheck& check, const Extent& out, const Extent& other) {
  if (out.buffer == nullptr || other.buffer == nullptr) return;
  const ByteSpan o = byte_span(*out.buffer, 0, out.elems), x = byte_span(*other.buffer, 0, other.elems);
  if (!o.overlaps(x)) return;
  check.fail(ErrorCode::InvalidArgument,
             "{}: '{}' [{:#x}, {:#x}) overlaps '{}' [{:#x}, {:#x}) in memory (views of one buffer); use separate "
             "buffers",
             check.op(), out.name, o.begin, o.end, other.name, x.begin, x.end);
}

// The overlap rule (backend.hpp, "Outputs and inputs"): every output shares
// no byte with an input or with another output; inputs may share memory. A
// kernel reads its inputs in every block while others store (and declares
// them __restrict__), so an overlap would read half-written values. In the
// outputs' order, each against the inputs, then against the outputs before
// it; the message names the later output first.
void check_outputs_apart(const OpCheck& check, std::initializer_list<Extent> outputs,
                         std::initializer_list<Extent> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (const Extent& in : inputs) check_apart(check, *o, in);
    for (auto earlier = outputs.begin(); earlier != o; ++earlier) check_apart(check, *o, *earlier);
  }
}

}  // namespace

// ── Buffers ────────────────────────────────────────────────────────────────

Backend::Backend() : owner_(std::make_shared<detail::BufferOwner>(this)) {}

// Buffers still alive keep owner_ (and free through it); from now on they
// report no backend, so no op takes them and no message calls into this one.
Backend::~Backend() { owner_->alive.store(false, std::memory_order_release); }

void Backend::set_deallocator(void (*free)(void* ptr, int device) noexcept, int device) noexcept {
  owner_->free = free;
  owner_->device = device;
}

Buffer Backend::checked_alloc(const char* op, DType dtype, std::size_t numel, bool host) {
  OpCheck check(*this, op);
  refuse_during_capture(check);
  if (size_of(dtype) == 0) {
    check.fail(ErrorCode::InvalidArgument, "{}: argument 'dtype' = {} is not a DType", op, static_cast<int>(dtype));
  }
  if (numel == 0) check.fail(ErrorCode::InvalidArgument, "{}: argument 'numel' = 0, must be at least 1", op);
  const std::size_t bytes = check.product("argument 'numel' x the dtype's bytes", {numel, size_of(dtype)});
  void* p = host ? allocate_host_bytes(bytes) : allocate_bytes(bytes);
  return make_buffer(p, dtype, numel, /*host_memory=*/host);
}

Buffer Backend::alloc(DType dtype, std::size_t numel) { return checked_alloc("alloc", dtype, numel, false); }

Buffer Backend::alloc_host(DType dtype, std::size_t numel) {
  return checked_alloc("alloc_host", dtype, numel, true);
}

Buffer Backend::upload(std::span<const float> host, DType dtype) {
  if (host.empty()) {
    OpCheck check(*this, "upload");
    check.fail(ErrorCode::InvalidArgument, "upload: argument 'host' is empty, must hold at least 1 value");
  }
  Buffer b = checked_alloc("upload", dtype, host.size(), false);
  checked_write("upload", b, host, 0);
  return b;
}

void Backend::write(Buffer& dst, std::span<const float> host, std::size_t dst_offset) {
  checked_write("write", dst, host, dst_offset);
}

void Backend::checked_write(const char* op, Buffer& dst, std::span<const float> host, std::size_t dst_offset) {
  OpCheck check(*this, op);
  refuse_during_capture(check);
  check.buffer("dst", dst);
  if (dst_offset > dst.numel() || host.size() > dst.numel() - dst_offset) {
    check.fail(ErrorCode::ShapeMismatch, "{}: {} values at offset {} run past 'dst' ({} elements)", op, host.size(),
               dst_offset, dst.numel());
  }
  if (host.empty()) return;
  std::vector<std::uint8_t> staged = host_staging<std::uint8_t>(op, host.size() * size_of(dst.dtype()));
  encode_from_f32(op, dst.dtype(), host, staged.data());
  check.run([&] { do_write_bytes(op, dst, dst_offset * size_of(dst.dtype()), staged.data(), staged.size()); });
}

void Backend::write_bytes(Buffer& dst, const void* host, std::size_t bytes, std::size_t dst_byte_offset) {
  OpCheck check(*this, "write_bytes");
  refuse_during_capture(check);
  check.buffer("dst", dst);
  if (host == nullptr && bytes > 0) check.fail(ErrorCode::NullBuffer, "write_bytes: argument 'host' is null");
  if (dst_byte_offset > dst.nbytes() || bytes > dst.nbytes() - dst_byte_offset) {
    check.fail(ErrorCode::ShapeMismatch, "write_bytes: {} bytes at byte offset {} run past 'dst' ({} bytes)",
         bytes, dst_byte_offset, dst.nbytes());
  }
  if (host_copy_needed(check, host, "dst", dst, dst_byte_offset, bytes)) {
    check.run([&] { do_write_bytes("write_bytes", dst, dst_byte_offset, host, bytes); });
  }
}

std::vector<float> Backend::download(const Buffer& src, std::size_t count) {
  OpCheck check(*this, "download");
  refuse_during_capture(check);
  check.buffer("src", src);
  if (count > src.numel()) {
    check.fail(ErrorCode::ShapeMismatch, "download: argument 'count' = {} exceeds the buffer's {} elements",
         count, src.numel());
  }
  std::vector<std::uint8_t> raw = host_staging<std::uint8_t>("download", count * size_of(src.dtype()));
  if (count > 0) check.run([&] { do_read_bytes("download", src, 0, raw.data(), raw.size()); });
  std::vector<float> out = host_staging<float>("download", count);
  decode_to_f32(src.dtype(), raw.data(), count, out.data());
  return out;
}

void Backend::read_bytes(const Buffer& src, void* host, std::size_t bytes, std::size_t src_byte_offset) {
  OpCheck check(*this, "read_bytes");
  refuse_during_capture(check);
  check.buffer("src", src);
  if (host == nullptr && bytes > 0) check.fail(ErrorCode::NullBuffer, "read_bytes: argument 'host' is null");
  if (src_byte_offset > src.nbytes() || bytes > src.nbytes() - src_byte_offset) {
    check.fail(ErrorCode::ShapeMismatch, "read_bytes: {} bytes at byte offset {} run past 'src' ({} bytes)",
         bytes, src_byte_offset, src.nbytes());
  }
  if (host_copy_needed(check, host, "src", src, src_byte_offset, bytes)) {
    check.run([&] { do_read_bytes("read_bytes", src, src_byte_offset, host, bytes); });
  }
}

void Backend::copy_slice(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                         std::size_t len) {
  OpCheck check(*this, "copy_slice");
  check.buffer("src", src);
  check.buffer("dst", dst);
  check.same_dtype("dst", dst, "src", src);
  check.size("len", len);
  if (src_offset > src.numel() || len > src.numel() - src_offset) {
    check.fail(ErrorCode::ShapeMismatch, "copy_slice: source range {} runs past 'src' ({} elements)",
               range_text(src_offset, len), src.numel());
  }
  if (dst_offset > dst.numel() || len > dst.numel() - dst_offset) {
    check.fail(ErrorCode::ShapeMismatch, "copy_slice: destination range {} runs past 'dst' ({} elements)",
               range_text(dst_offset, len), dst.numel());
  }
  if (copy_needed(check, src, src_offset, "src", dst, dst_offset, "dst", len)) {
    check.run([&] { do_copy_slice("copy_slice", src, src_offset, dst, dst_offset, len); });
  }
}

// ── Decode state and graphs ───────────────────────────────────────────────

void Backend::set_decode_state(std::uint32_t token, std::uint32_t step) {
  OpCheck check(*this, "set_decode_state");
  refuse_during_capture(check);
  constexpr auto kMax = static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max());
  if (token > kMax) check.fail(ErrorCode::InvalidArgument, "set_decode_state: argument 'token' = {} exceeds {}", token, kMax);
  if (step >= kMax) check.fail(ErrorCode::InvalidArgument, "set_decode_state: argument 'step' = {} must be below {}", step, kMax);
  check.run([&] {
    do_set_decode_state(static_cast<std::int32_t>(token), static_cast<std::int32_t>(step),
                        static_cast<std::int32_t>(step) + 1);
  });
}

void Backend::advance_decode_state(const Buffer& next_token, Buffer& token_log) {
  OpCheck check(*this, "advance_decode_state");
  check.buffer("next_token", next_token);
  check.buffer("token_log", token_log);
  check.dtype("next_token", next_token, DType::I32);
  check.dtype("token_log", token_log, DType::I32);
  check.holds("next_token", next_token, 1, "[1]");
  check.holds("token_log", token_log, 2, "[positions]");  // one slot past position 0 at least
  // Positions are int32: a longer log could not be indexed, and the
  // position could wrap while the log still had room.
  constexpr auto kMaxLog = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());
  if (token_log.numel() > kMaxLog) {
    check.fail(ErrorCode::InvalidArgument,
               "advance_decode_state: argument 'token_log' holds {} positions, past INT32_MAX = {} (positions "
               "are int32)",
               token_log.numel(), kMaxLog);
  }
  check.run([&] { do_advance_decode_state(next_token, token_log); });
}

void Backend::begin_graph_capture() {
  OpCheck check(*this, "begin_graph_capture");
  if (is_capturing()) check.fail(ErrorCode::GraphCapture, "begin_graph_capture: a capture is already in progress");
  check.run([&] { do_begin_graph_capture(); });
}

void Backend::end_graph_capture() {
  OpCheck check(*this, "end_graph_capture");
  if (!is_capturing()) check.fail(ErrorCode::GraphCapture, "end_graph_capture: no capture is in progress");
  check.run([&] { do_end_graph_capture(); });
}

bool Backend::replay_last_graph() {
  OpCheck check(*this, "replay_last_graph");
  if (is_capturing()) check.fail(ErrorCode::GraphCapture, "replay_last_graph: not allowed while capturing");
  return check.run([&] { return do_replay_last_graph(); });
}

void Backend::reset_graph() {
  OpCheck check(*this, "reset_graph");
  if (is_capturing()) check.fail(ErrorCode::GraphCapture, "reset_graph: not allowed while capturing");
  check.run([&] { do_reset_graph(); });
}

void Backend::do_begin_graph_capture() {
  OpCheck check(*this, "begin_graph_capture");
  check.fail(ErrorCode::Unsupported, "begin_graph_capture: the {} backend has no graph capture", name());
}
void Backend::do_end_graph_capture() {
  OpCheck check(*this, "end_graph_capture");
  check.fail(ErrorCode::Unsupported, "end_graph_capture: the {} backend has no graph capture", name());
}
bool Backend::do_replay_last_graph() { return false; }
void Backend::do_reset_graph() {}

// ── Norms ──────────────────────────────────────────────────────────────────

namespace {

struct NamedBuffer {
  std::string_view name;
  const Buffer& buffer;
};

// The checks the three row norms share: sizes and eps; x is an activation;
// every other buffer has x's dtype; `rows` hold [tokens, dim], `params` [dim].
void check_row_norm(OpCheck& check, const Buffer& x, std::initializer_list<NamedBuffer> rows,
                    std::initializer_list<NamedBuffer> params, float eps, std::size_t tokens, std::size_t dim) {
  check.size("tokens", tokens);
  check.size("dim", dim);
  check.eps("", eps);
  check.buffer("x", x);
  check.activation("x", x);
  const std::size_t n = check.product("[tokens, dim]", {tokens, dim});
  check.holds("x", x, n, "[tokens, dim]");
  for (const NamedBuffer& b : rows) {
    check.buffer(b.name, b.buffer);
    check.same_dtype(b.name, b.buffer, "x", x);
    check.holds(b.name, b.buffer, n, "[tokens, dim]");
  }
  for (const NamedBuffer& b : params) {
    check.buffer(b.name, b.buffer);
    check.same_dtype(b.name, b.buffer, "x", x);
    check.holds(b.name, b.buffer, dim, "[dim]");
  }
}

}  // namespace

void Backend::rms_norm(const Buffer& x, const Buffer& w, float eps, Buffer& out, std::size_t tokens,
                       std::size_t dim) {
  OpCheck check(*this, "rms_norm");
  check_row_norm(check, x, {{"out", out}}, {{"w", w}}, eps, tokens, dim);
  const std::size_t n = tokens * dim;
  check_outputs_apart(check, {{"out", out, n}}, {{"x", x, n}, {"w", w, dim}});
  check.run([&] { do_rms_norm(x, w, eps, out, tokens, dim); });
}

void Backend::fused_add_rms_norm(Buffer& residual, const Buffer& x, const Buffer& w, float eps,
                                 Buffer& out, std::size_t tokens, std::size_t dim) {
  OpCheck check(*this, "fused_add_rms_norm");
  check_row_norm(check, x, {{"residual", residual}, {"out", out}}, {{"w", w}}, eps, tokens, dim);
  const std::size_t n = tokens * dim;
  check_outputs_apart(check, {{"residual", residual, n}, {"out", out, n}}, {{"x", x, n}, {"w", w, dim}});
  check.run([&] { do_fused_add_rms_norm(residual, x, w, eps, out, tokens, dim); });
}

void Backend::layer_norm(const Buffer& x, const Buffer& gamma, const Buffer& beta, float eps,
                         Buffer& out, std::size_t tokens, std::size_t dim) {
  OpCheck check(*this, "layer_norm");
  check_row_norm(check, x, {{"out", out}}, {{"gamma", gamma}, {"beta", beta}}, eps, tokens, dim);
  const std::size_t n = tokens * dim;
  check_outputs_apart(check, {{"out", out, n}}, {{"x", x, n}, {"gamma", gamma, dim}, {"beta", beta, dim}});
  check.run([&] { do_layer_norm(x, gamma, beta, eps, out, tokens, dim); });
}

// ── Elementwise ────────────────────────────────────────────────────────────

void Backend::gelu(const Buffer& x, Buffer& out, std::size_t len, GeluApproximation approx) {
  OpCheck check(*this, "gelu");
  check.size("len", len);
  check.buffer("x", x);
  check.buffer("out", out);
  check.activation("x", x);
  check.same_dtype("out", out, "x", x);
  check.holds("x", x, len, "[len]");
  check.holds("out", out, len, "[len]");
  if (approx != GeluApproximation::Erf && approx != GeluApproximation::Tanh) {
    check.fail(ErrorCode::InvalidArgument, "gelu: argument 'approx' = {} is not a GeluApproximation",
         static_cast<int>(approx));
  }
  check_outputs_apart(check, {{"out", out, len}}, {{"x", x, len}});
  check.run([&] { do_gelu(x, out, len, approx); });
}

void Backend::add_bias(Buffer& data, const Buffer& bias, std::size_t rows, std::size_t cols) {
  OpCheck check(*this, "add_bias");
  check.size("rows", rows);
  check.size("cols", cols);
  check.buffer("data", data);
  check.buffer("bias", bias);
  check.activation("data", data);
  check.same_dtype("bias", bias, "data", data);
  check.holds("data", data, {rows, cols}, "[rows, cols]");
  check.holds("bias", bias, cols, "[cols]");
  check_outputs_apart(check, {{"data", data, rows * cols}}, {{"bias", bias, cols}});
  check.run([&] { do_add_bias(data, bias, rows, cols); });
}

void Backend::add_inplace(Buffer& residual, const Buffer& x, std::size_t len) {
  OpCheck check(*this, "add_inplace");
  check.size("len", len);
  check.buffer("residual", residual);
  check.buffer("x", x);
  check.activation("residual", residual);
  check.same_dtype("x", x, "residual", residual);
  check.holds("residual", residual, len, "[len]");
  check.holds("x", x, len, "[len]");
  check_outputs_apart(check, {{"residual", residual, len}}, {{"x", x, len}});
  check.run([&] { do_add_inplace(residual, x, len); });
}

void Backend::argmax(const Buffer& x, Buffer& out, std::size_t rows, std::size_t cols) {
  OpCheck check(*this, "argmax");
  check.size("rows", rows);
  check.size("cols", cols);  // < 2^31: every index fits out's i32
  check.buffer("x", x);
  check.buffer("out", out);
  check.one_of("x", x, {DType::F16, DType::BF16, DType::F32});
  check.dtype("out", out, DType::I32);
  check.holds("x", x, {rows, cols}, "[rows, cols]");
  check.holds("out", out, rows, "[rows]");
  check_outputs_apart(check, {{"out", out, rows}}, {{"x", x, rows * cols}});
  check.run([&] { do_argmax(x, out, rows, cols); });
}

// ── GEMM ───────────────────────────────────────────────────────────────────

void Backend::gemm(const Buffer& a, const Buffer& b, Buffer& out, std::size_t m, std::size_t n,
                   std::size_t k) {
  OpCheck check(*this, "gemm");
  check.size("m", m);
  check.size("n", n);
  check.size("k", k);
  check.buffer("a", a);
  check.buffer("b", b);
  check.buffer("out", out);
  check.activation("a", a);
  check.same_dtype("b", b, "a", a);
  check.same_dtype("out", out, "a", a);
  check.holds("a", a, {m, k}, "[m, k]");
  check.holds("b", b, {n, k}, "[n, k]");
  check.holds("out", out, {m, n}, "[m, n]");
  check_outputs_apart(check, {{"out", out, m * n}}, {{"a", a, m * k}, {"b", b, n * k}});
  check.run([&] { do_gemm(a, b, out, m, n, k); });
}

void Backend::gemm_silu_mul(const Buffer& a, const Buffer& w, Buffer& gate_up, Buffer& act, std::size_t m,
                            std::size_t im, std::size_t k) {
  OpCheck check(*this, "gemm_silu_mul");
  check.size("m", m);
  check.size("im", im);
  check.size("k", k);
  check.size("2 * im", check.product("2 * im", {2, im}));
  check.buffer("a", a);
  check.buffer("w", w);
  check.buffer("gate_up", gate_up);
  check.buffer("act", act);
  check.activation("a", a);
  check.same_dtype("w", w, "a", a);
  check.same_dtype("gate_up", gate_up, "a", a);
  check.same_dtype("act", act, "a", a);
  check.holds("a", a, {m, k}, "[m, k]");
  check.holds("w", w, {2, im, k}, "[2*im, k]");
  check.holds("gate_up", gate_up, {m, 2, im}, "[m, 2*im]");
  check.holds("act", act, {m, im}, "[m, im]");
  check_outputs_apart(check, {{"gate_up", gate_up, m * 2 * im}, {"act", act, m * im}},
                      {{"a", a, m * k}, {"w", w, 2 * im * k}});
  check.run([&] { do_gemm_silu_mul(a, w, gate_up, act, m, im, k); });
}

// ── Embedding and reshaping ────────────────────────────────────────────────

void Backend::embedding_lookup(const Buffer& table, const Buffer& ids, Buffer& out, std::size_t tokens,
                               std::size_t dim, std::size_t vocab) {
  OpCheck check(*this, "embedding_lookup");
  check.size("tokens", tokens);
  check.size("dim", dim);
  check.size("vocab", vocab);
  check.buffer("table", table);
  check.buffer("out", out);
  check.activation("table", table);
  check.same_dtype("out", out, "table", table);
  check.holds("table", table, {vocab, dim}, "[vocab, dim]");
  check.holds("out", out, {tokens, dim}, "[tokens, dim]");
  const bool use_state = device_state_mode_ && tokens == 1;
  if (!use_state) {
    check.buffer("ids", ids);
    check.dtype("ids", ids, DType::I32);
    check.holds("ids", ids, tokens, "[tokens]");
  }
  check_outputs_apart(check, {{"out", out, tokens * dim}},
                      {{"table", table, vocab * dim}, {"ids", use_state ? nullptr : &ids, tokens}});
  check.run([&] { do_embedding_lookup(table, ids, out, tokens, dim, vocab, use_state); });
}

void Backend::split_qkv(const Buffer& qkv, Buffer& q, Buffer& k, Buffer& v, std::size_t tokens,
                        std::size_t q_dim, std::size_t kv_dim) {
  OpCheck check(*this, "split_qkv");
  check.size("tokens", tokens);
  check.size("q_dim", q_dim);
  check.size("kv_dim", kv_dim);
  check.buffer("qkv", qkv);
  check.buffer("q", q);
  check.buffer("k", k);
  check.buffer("v", v);
  check.activation("qkv", qkv);
  check.same_dtype("q", q, "qkv", qkv);
  check.same_dtype("k", k, "qkv", qkv);
  check.same_dtype("v", v, "qkv", qkv);
  const std::size_t row = q_dim + 2 * kv_dim;
  check.holds("qkv", qkv, {tokens, row}, "[tokens, q_dim + 2*kv_dim]");
  check.holds("q", q, {tokens, q_dim}, "[tokens, q_dim]");
  check.holds("k", k, {tokens, kv_dim}, "[tokens, kv_dim]");
  check.holds("v", v, {tokens, kv_dim}, "[tokens, kv_dim]");
  check_outputs_apart(check, {{"q", q, tokens * q_dim}, {"k", k, tokens * kv_dim}, {"v", v, tokens * kv_dim}},
                      {{"qkv", qkv, tokens * row}});
  check.run([&] { do_split_qkv(qkv, q, k, v, tokens, q_dim, kv_dim); });
}

void Backend::fused_silu_mul_split(const Buffer& gate_up, Buffer& out, std::size_t tokens, std::size_t im) {
  OpCheck check(*this, "fused_silu_mul_split");
  check.size("tokens", tokens);
  check.size("im", im);
  check.buffer("gate_up", gate_up);
  check.buffer("out", out);
  check.activation("gate_up", gate_up);
  check.same_dtype("out", out, "gate_up", gate_up);
  check.holds("gate_up", gate_up, {tokens, 2, im}, "[tokens, 2*im]");
  check.holds("out", out, {tokens, im}, "[tokens, im]");
  check_outputs_apart(check, {{"out", out, tokens * im}}, {{"gate_up", gate_up, tokens * 2 * im}});
  check.run([&] { do_fused_silu_mul_split(gate_up, out, tokens, im); });
}

namespace {

// The RoPE checks qk_norm_rope and qkv_rope_append share (`cfg` is "" or
// "cfg.", as the op spells its arguments; the norm weights must have the
// dtype of `activation`): an even head_dim and a RopeMode,
// f32 cos / sin tables of max_pos rows, in NormAndRope the norm weights
// (non-null, the activation's dtype, head_dim long) and eps, and positions
// [pos_offset, pos_offset + tokens) inside the tables unless the decode state
// supplies them (use_state).
void check_rope(const OpCheck& check, std::string_view cfg, std::string_view activation_name, const Buffer& activation,
                std::initializer_list<std::pair<const char*, const Buffer*>> norms, const Buffer& cos,
                const Buffer& sin, std::size_t tokens, std::size_t head_dim, std::size_t pos_offset,
                std::size_t max_pos, float eps, RopeMode mode, bool use_state) {
  if (head_dim % 2 != 0) {
    check.fail(ErrorCode::InvalidArgument, "{}: argument '{}head_dim' = {} must be even (NeoX rotation pairs halves)",
               check.op(), cfg, head_dim);
  }
  if (mode != RopeMode::NormAndRope && mode != RopeMode::RopeOnly) {
    check.fail(ErrorCode::InvalidArgument, "{}: argument '{}mode' = {} is not a RopeMode", check.op(), cfg,
               static_cast<int>(mode));
  }
  check.buffer("cos", cos);
  check.buffer("sin", sin);
  check.dtype("cos", cos, DType::F32);
  check.dtype("sin", sin, DType::F32);
  if (mode == RopeMode::NormAndRope) {
    check.eps(cfg, eps);
    for (const auto& [name, w] : norms) {
      if (w == nullptr) {
        check.fail(ErrorCode::NullBuffer, "{}: argument '{}' is null but '{}mode' is NormAndRope", check.op(), name,
                   cfg);
      }
      check.buffer(name, *w);
      check.same_dtype(name, *w, activation_name, activation);
      check.holds(name, *w, head_dim, "[head_dim]");
    }
  }
  const std::size_t table = check.product("[max_pos, head_dim/2]", {max_pos, head_dim / 2});
  check.holds("cos", cos, table, "[max_pos, head_dim/2]");
  check.holds("sin", sin, table, "[max_pos, head_dim/2]");
  if (!use_state && (pos_offset > max_pos || tokens > max_pos - pos_offset)) {
    check.fail(ErrorCode::CapacityExceeded,
               "{}: positions {} (argument 'pos_offset' = {}, 'tokens' = {}) run past the max_pos = {} positions of "
               "the cos/sin tables",
               check.op(), range_text(pos_offset, tokens), pos_offset, tokens, max_pos);
  }
}

}  // namespace

void Backend::qk_norm_rope(const Buffer& input, const Buffer* norm_w, const Buffer& cos, const Buffer& sin,
                           Buffer& output, std::size_t tokens, std::size_t heads, std::size_t head_dim,
                           std::size_t pos_offset, std::size_t max_pos, float eps, RopeMode mode) {
  OpCheck check(*this, "qk_norm_rope");
  check.size("tokens", tokens);
  check.size("heads", heads);
  check.size("head_dim", head_dim);
  check.size("max_pos", max_pos);
  check.buffer("input", input);
  check.buffer("output", output);
  check.activation("input", input);
  check.same_dtype("output", output, "input", input);
  const std::size_t n = check.product("[tokens, heads, head_dim]", {tokens, heads, head_dim});
  check.holds("input", input, n, "[tokens, heads, head_dim]");
  check.holds("output", output, n, "[heads, tokens, head_dim]");
  const bool use_state = device_state_mode() && tokens == 1;
  check_rope(check, "", "input", input, {{"norm_w", norm_w}}, cos, sin, tokens, head_dim, pos_offset, max_pos, eps, mode,
             use_state);
  const std::size_t table = max_pos * (head_dim / 2);
  check_outputs_apart(check, {{"output", output, n}},
                      {{"input", input, n},
                       {"norm_w", mode == RopeMode::NormAndRope ? norm_w : nullptr, head_dim},
                       {"cos", cos, table},
                       {"sin", sin, table}});
  check.run([&] {
    do_qk_norm_rope(input, norm_w, cos, sin, output, tokens, heads, head_dim, pos_offset, max_pos, eps, mode,
                    use_state);
  });
}

void Backend::kv_cache_append_head_major(Buffer& cache_k, Buffer& cache_v, std::size_t cache_len,
                                         std::size_t capacity, const Buffer& new_k, const Buffer& new_v,
                                         std::size_t new_tokens, std::size_t nkv, std::size_t hd) {
  OpCheck check(*this, "kv_cache_append_head_major");
  check.size("capacity", capacity);
  check.size("new_tokens", new_tokens);
  check.size("nkv", nkv);
  check.size("hd", hd);
  check.buffer("cache_k", cache_k);
  check.buffer("cache_v", cache_v);
  check.buffer("new_k", new_k);
  check.buffer("new_v", new_v);
  check.activation("cache_k", cache_k);
  check.same_dtype("cache_v", cache_v, "cache_k", cache_k);
  check.same_dtype("new_k", new_k, "cache_k", cache_k);
  check.same_dtype("new_v", new_v, "cache_k", cache_k);
  const std::size_t cache_n = check.product("[nkv, capacity, hd]", {nkv, capacity, hd});
  check.holds("cache_k", cache_k, cache_n, "[nkv, capacity, hd]");
  check.holds("cache_v", cache_v, cache_n, "[nkv, capacity, hd]");
  const std::size_t new_n = check.product("[nkv, new_tokens, hd]", {nkv, new_tokens, hd});
  check.holds("new_k", new_k, new_n, "[nkv, new_tokens, hd]");
  check.holds("new_v", new_v, new_n, "[nkv, new_tokens, hd]");
  const bool use_state = device_state_mode_ && new_tokens == 1;
  if (new_tokens > capacity || (!use_state && cache_len > capacity - new_tokens)) {
    check.fail(ErrorCode::CapacityExceeded,
               "kv_cache_append_head_major: argument 'cache_len' = {} + 'new_tokens' = {} exceeds 'capacity' = {}",
               cache_len, new_tokens, capacity);
  }
  check_outputs_apart(check, {{"cache_k", cache_k, cache_n}, {"cache_v", cache_v, cache_n}},
                      {{"new_k", new_k, new_n}, {"new_v", new_v, new_n}});
  check.run([&] {
    do_kv_cache_append_head_major(cache_k, cache_v, cache_len, capacity, new_k, new_v, new_tokens, nkv, hd,
                                  use_state);
  });
}

namespace {

// What qkv_rope_append and its ragged form share: the geometry, the buffers
// and their dtype, q_out and qkv for `tokens` rows, caches for `sequences`
// sequences, the rope tables, the host-known positions [pos_offset,
// pos_offset + tokens) inside the tables unless `positions_on_device`, the
// ragged form's `positions` ([tokens] i32; null for the other form), and
// the overlap rule.
void check_qkv_rope_append(const OpCheck& check, const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm,
                           const Buffer& cos, const Buffer& sin, const Buffer& q_out, const Buffer& k_cache,
                           const Buffer& v_cache, const Buffer* positions, std::size_t tokens, std::size_t sequences,
                           std::size_t pos_offset, bool positions_on_device, const QkvRopeAppendConfig& cfg,
                           std::string_view tokens_name,
                           std::string_view qkv_layout, std::string_view q_layout, std::string_view cache_layout) {
  check.size(tokens_name, tokens);
  check.size("cfg.heads", cfg.heads);
  check.size("cfg.kv_heads", cfg.kv_heads);
  check.size("cfg.head_dim", cfg.head_dim);
  check.size("cfg.capacity", cfg.capacity);
  check.size("cfg.max_pos", cfg.max_pos);
  // The kernels index a qkv row's heads in 32 bits.
  check.size("cfg.heads + 2 * cfg.kv_heads", cfg.heads + 2 * cfg.kv_heads);
  check.buffer("qkv", qkv);
  check.buffer("q_out", q_out);
  check.buffer("k_cache", k_cache);
  check.buffer("v_cache", v_cache);
  check.activation("qkv", qkv);
  check.same_dtype("q_out", q_out, "qkv", qkv);
  check.same_dtype("k_cache", k_cache, "qkv", qkv);
  check.same_dtype("v_cache", v_cache, "qkv", qkv);
  const std::size_t row = check.product("[heads + 2*kv_heads, head_dim]", {cfg.heads + 2 * cfg.kv_heads, cfg.head_dim});
  check.holds("qkv", qkv, {tokens, row}, qkv_layout);
  check.holds("q_out", q_out, {cfg.heads, tokens, cfg.head_dim}, q_layout);
  const std::size_t cache_n = check.product(cache_layout, {sequences, cfg.kv_heads, cfg.capacity, cfg.head_dim});
  check.holds("k_cache", k_cache, cache_n, cache_layout);
  check.holds("v_cache", v_cache, cache_n, cache_layout);
  check_rope(check, "cfg.", "qkv", qkv, {{"q_norm", q_norm}, {"k_norm", k_norm}}, cos, sin, tokens, cfg.head_dim,
             pos_offset, cfg.max_pos, cfg.eps, cfg.mode, positions_on_device);
  if (positions != nullptr) {
    check.buffer("positions", *positions);
    check.dtype("positions", *positions, DType::I32);
    check.holds("positions", *positions, tokens, "[batch]");
  }
  const bool norms = cfg.mode == RopeMode::NormAndRope;
  const std::size_t table = cfg.max_pos * (cfg.head_dim / 2);
  check_outputs_apart(check,
                      {{"q_out", q_out, cfg.heads * tokens * cfg.head_dim},
                       {"k_cache", k_cache, cache_n},
                       {"v_cache", v_cache, cache_n}},
                      {{"qkv", qkv, tokens * row},
                       {"q_norm", norms ? q_norm : nullptr, cfg.head_dim},
                       {"k_norm", norms ? k_norm : nullptr, cfg.head_dim},
                       {"cos", cos, table},
                       {"sin", sin, table},
                       {"positions", positions, tokens}});
}

}  // namespace

void Backend::qkv_rope_append(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                              const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache, std::size_t tokens,
                              std::size_t pos_offset, const QkvRopeAppendConfig& cfg) {
  OpCheck check(*this, "qkv_rope_append");
  const bool use_state = device_state_mode() && tokens == 1;
  check_qkv_rope_append(check, qkv, q_norm, k_norm, cos, sin, q_out, k_cache, v_cache, /*positions=*/nullptr, tokens,
                        1, pos_offset, use_state, cfg, "tokens", "[tokens, (heads + 2 kv_heads) * head_dim]", "[heads, tokens, head_dim]", "[kv_heads, capacity, head_dim]");
  if (tokens > cfg.capacity || (!use_state && pos_offset > cfg.capacity - tokens)) {
    check.fail(ErrorCode::CapacityExceeded, "qkv_rope_append: positions {} run past cfg.capacity = {}",
               range_text(pos_offset, tokens), cfg.capacity);
  }
  check.run([&] { do_qkv_rope_append(qkv, q_norm, k_norm, cos, sin, q_out, k_cache, v_cache, tokens, pos_offset, cfg, use_state); });
}

void Backend::qkv_rope_append_ragged(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                                     const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache,
                                     const Buffer& positions, std::size_t batch, const QkvRopeAppendConfig& cfg) {
  OpCheck check(*this, "qkv_rope_append_ragged");
  check_qkv_rope_append(check, qkv, q_norm, k_norm, cos, sin, q_out, k_cache, v_cache, &positions, batch, batch,
                        /*pos_offset (unused)=*/0, /*positions_on_device=*/true, cfg, "batch", "[batch, (heads + 2 kv_heads) * head_dim]",
                        "[batch, heads, head_dim]",
                        "[batch, kv_heads, capacity, head_dim]");
  check.run([&] { do_qkv_rope_append_ragged(qkv, q_norm, k_norm, cos, sin, q_out, k_cache, v_cache, positions, batch, cfg); });
}

void Backend::do_qkv_rope_append_ragged(const Buffer&, const Buffer*, const Buffer*, const Buffer&, const Buffer&,
                                        Buffer&, Buffer&, Buffer&, const Buffer&, std::size_t,
                                        const QkvRopeAppendConfig&) {
  OpCheck check(*this, "qkv_rope_append_ragged");
  check.fail(ErrorCode::Unsupported, "qkv_rope_append_ragged: not implemented on the {} backend", name());
}

void Backend::transpose_head_to_token(const Buffer& src, Buffer& dst, std::size_t tokens, std::size_t heads,
                                      std::size_t dim) {
  OpCheck check(*this, "transpose_head_to_token");
  check.size("tokens", tokens);
  check.size("heads", heads);
  check.size("dim", dim);
  check.buffer("src", src);
  check.buffer("dst", dst);
  check.activation("src", src);
  check.same_dtype("dst", dst, "src", src);
  const std::size_t n = check.product("[tokens, heads, dim]", {tokens, heads, dim});
  check.holds("src", src, n, "[heads, tokens, dim]");
  check.holds("dst", dst, n, "[tokens, heads, dim]");
  check_outputs_apart(check, {{"dst", dst, n}}, {{"src", src, n}});
  check.run([&] { do_transpose_head_to_token(src, dst, tokens, heads, dim); });
}

// ── Attention ──────────────────────────────────────────────────────────────

namespace {

// What flash_attention and flash_decode_ragged share: the head counts and
// GQA ratio, the scale, and q / k / v / out present with one activation dtype.
void check_attention_common(const OpCheck& check, const AttnConfig& cfg, const Buffer& q, const Buffer& k,
                            const Buffer& v, const Buffer& out) {
  check.size("cfg.num_heads", cfg.num_heads);
  check.size("cfg.num_kv_heads", cfg.num_kv_heads);
  check.size("cfg.head_dim", cfg.head_dim);
  if (cfg.num_heads % cfg.num_kv_heads != 0) {
    check.fail(ErrorCode::InvalidArgument, "{}: cfg.num_heads = {} is not a multiple of cfg.num_kv_heads = {} (GQA group)",
               check.op(), cfg.num_heads, cfg.num_kv_heads);
  }
  check.scale("cfg.scale", cfg.scale, "1/sqrt(head_dim)");
  check.buffer("q", q);
  check.buffer("k", k);
  check.buffer("v", v);
  check.buffer("out", out);
  check.activation("q", q);
  check.same_dtype("k", k, "q", q);
  check.same_dtype("v", v, "q", q);
  check.same_dtype("out", out, "q", q);
}

}  // namespace

void Backend::flash_attention(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                              std::size_t batch, std::size_t q_len, std::size_t kv_len,
                              std::size_t pos_offset, const AttnConfig& cfg) {
  OpCheck check(*this, "flash_attention");
  check.size("batch", batch);
  check.size("q_len", q_len);
  check.size("kv_len", kv_len);
  check_attention_common(check, cfg, q, k, v, out);
  const bool use_state = device_state_mode_ && q_len == 1;
  if (use_state && cfg.kv_seq_stride == 0) {
    check.fail(ErrorCode::InvalidArgument,
               "flash_attention: device-state decode needs cfg.kv_seq_stride (the cache capacity); 0 would bake "
               "the host kv_len = {} into a captured graph",
               kv_len);
  }
  if (cfg.kv_seq_stride > 0) check.size("cfg.kv_seq_stride", cfg.kv_seq_stride);
  const std::size_t stride = cfg.kv_seq_stride > 0 ? cfg.kv_seq_stride : kv_len;
  if (kv_len > stride) {
    check.fail(ErrorCode::CapacityExceeded, "flash_attention: kv_len = {} exceeds cfg.kv_seq_stride = {}", kv_len,
         stride);
  }
  if (cfg.causal && !use_state && (pos_offset > kv_len || q_len > kv_len - pos_offset)) {
    check.fail(ErrorCode::InvalidArgument,
               "flash_attention: causal queries at positions {} (argument 'pos_offset' = {}, 'q_len' = {}) need keys "
               "past 'kv_len' = {}",
               range_text(pos_offset, q_len), pos_offset, q_len, kv_len);
  }
  constexpr std::string_view q_shape = "[batch, num_heads, q_len, head_dim]";
  constexpr std::string_view kv_shape = "[batch, num_kv_heads, kv_seq_stride, head_dim]";
  const std::size_t qn = check.holds("q", q, {batch, cfg.num_heads, q_len, cfg.head_dim}, q_shape);
  const std::size_t kvn = check.holds("k", k, {batch, cfg.num_kv_heads, stride, cfg.head_dim}, kv_shape);
  check.holds("v", v, kvn, kv_shape);
  check.holds("out", out, qn, q_shape);
  check_outputs_apart(check, {{"out", out, qn}}, {{"q", q, qn}, {"k", k, kvn}, {"v", v, kvn}});
  check.run([&] { do_flash_attention(q, k, v, out, batch, q_len, kv_len, pos_offset, cfg, use_state); });
}

void Backend::do_flash_attention(const Buffer&, const Buffer&, const Buffer&, Buffer&, std::size_t,
                                 std::size_t, std::size_t, std::size_t, const AttnConfig&, bool) {
  OpCheck check(*this, "flash_attention");
  check.fail(ErrorCode::Unsupported,
       "flash_attention: not implemented on the {} backend yet (split-K decode and tensor-core prefill "
       "kernels are still to come)",
       name());
}

void Backend::flash_decode_ragged(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                  const Buffer& kv_lens, std::size_t batch, const AttnConfig& cfg) {
  OpCheck check(*this, "flash_decode_ragged");
  check.size("batch", batch);
  check.size("cfg.kv_seq_stride", cfg.kv_seq_stride);
  check_attention_common(check, cfg, q, k, v, out);
  check.buffer("kv_lens", kv_lens);
  check.dtype("kv_lens", kv_lens, DType::I32);
  constexpr std::string_view q_shape = "[batch, num_heads, head_dim]";
  constexpr std::string_view kv_shape = "[batch, num_kv_heads, kv_seq_stride, head_dim]";
  const std::size_t qn = check.holds("q", q, {batch, cfg.num_heads, cfg.head_dim}, q_shape);
  const std::size_t kvn = check.holds("k", k, {batch, cfg.num_kv_heads, cfg.kv_seq_stride, cfg.head_dim}, kv_shape);
  check.holds("v", v, kvn, kv_shape);
  check.holds("out", out, qn, q_shape);
  check.holds("kv_lens", kv_lens, batch, "[batch]");
  check_outputs_apart(check, {{"out", out, qn}}, {{"q", q, qn}, {"k", k, kvn}, {"v", v, kvn}, {"kv_lens", kv_lens, batch}});
  check.run([&] { do_flash_decode_ragged(q, k, v, out, kv_lens, batch, cfg); });
}

void Backend::do_flash_decode_ragged(const Buffer&, const Buffer&, const Buffer&, Buffer&, const Buffer&,
                                     std::size_t, const AttnConfig&) {
  OpCheck check(*this, "flash_decode_ragged");
  check.fail(ErrorCode::Unsupported, "flash_decode_ragged: not implemented on the {} backend", name());
}

void Backend::mla_attention(const Buffer& q, const Buffer& kv_latent, Buffer& out, std::size_t batch,
                            std::size_t q_len, std::size_t kv_len, const MlaConfig& cfg) {
  OpCheck check(*this, "mla_attention");
  check.size("batch", batch);
  check.size("q_len", q_len);
  check.size("kv_len", kv_len);
  check.size("cfg.num_heads", cfg.num_heads);
  check.size("cfg.kv_lora_rank", cfg.kv_lora_rank);
  check.size("cfg.qk_nope_head_dim", cfg.qk_nope_head_dim);
  check.size("cfg.qk_rope_head_dim", cfg.qk_rope_head_dim);
  check.size("cfg.v_head_dim", cfg.v_head_dim);
  // Both below 2^31 (above): the sum cannot wrap.
  const std::size_t latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim;
  check.size("cfg.kv_lora_rank + cfg.qk_rope_head_dim", latent);
  check.scale("cfg.scale", cfg.scale, "the backend's default");
  check.buffer("q", q);
  check.buffer("kv_latent", kv_latent);
  check.buffer("out", out);
  check.activation("q", q);
  check.same_dtype("kv_latent", kv_latent, "q", q);
  check.same_dtype("out", out, "q", q);
  const std::size_t qn =
      check.holds("q", q, {batch, cfg.num_heads, q_len, latent}, "[batch, num_heads, q_len, kv_lora_rank + rope_dim]");
  const std::size_t kvn =
      check.holds("kv_latent", kv_latent, {batch, kv_len, latent}, "[batch, kv_len, kv_lora_rank + rope_dim]");
  const std::size_t outn =
      check.holds("out", out, {batch, cfg.num_heads, q_len, cfg.v_head_dim}, "[batch, num_heads, q_len, v_head_dim]");
  check_outputs_apart(check, {{"out", out, outn}}, {{"q", q, qn}, {"kv_latent", kv_latent, kvn}});
  check.run([&] { do_mla_attention(q, kv_latent, out, batch, q_len, kv_len, cfg); });
}

void Backend::do_mla_attention(const Buffer&, const Buffer&, Buffer&, std::size_t, std::size_t, std::size_t,
                               const MlaConfig&) {
  OpCheck check(*this, "mla_attention");
  check.fail(ErrorCode::Unsupported, "mla_attention: not implemented on the {} backend (no MLA kernel yet)", name());
}

// ── Quantized GEMM ─────────────────────────────────────────────────────────

std::unique_ptr<QuantWeight> Backend::load_gptq(const GptqHostTensors& tensors) {
  OpCheck check(*this, "load_gptq");
  refuse_during_capture(check);
  detail::validate_gptq(tensors, "load_gptq");  // every shape and divisibility rule, for every backend
  return check.run([&] { return do_load_gptq(tensors); });
}

std::unique_ptr<QuantWeight> Backend::do_load_gptq(const GptqHostTensors&) {
  OpCheck check(*this, "load_gptq");
  check.fail(ErrorCode::Unsupported,
       "load_gptq: not implemented on the {} backend yet (GPTQ repack and INT4 GEMM are still to come)",
       name());
}

namespace {

// The checks gemm_gptq and gemm_quant share (each reports under its own name).
// out_name / a_name: how the op names its [m, n] result ("out"; gemm_silu_mul_gptq's "gate_up") and its
// [m, k] operand ("a"; the rms_norm forms' "normed").
void check_quant_gemm(OpCheck& check, const Buffer& a, const QuantWeight& w,
                      const Buffer& out, std::size_t m, std::string_view out_name = "out",
                      std::string_view a_name = "a") {
  check.size("m", m);
  check.owned("w", w.backend());
  check.buffer(a_name, a);
  check.buffer(out_name, out);
  check.activation(a_name, a);
  check.same_dtype(out_name, out, a_name, a);
  check.holds(a_name, a, {m, w.k()}, "[m, k]");
  check.holds(out_name, out, {m, w.n()}, "[m, n]");
}

std::string_view quant_kind_name(QuantKind kind) noexcept {
  switch (kind) {
    case QuantKind::Gptq: return "Gptq";
    case QuantKind::Awq: return "Awq";
    case QuantKind::Fp8: return "Fp8";
  }
  return "not a QuantKind";
}

// The weight of an op that takes GPTQ weights only.
void check_gptq_weight(const OpCheck& check, const QuantWeight& w) {
  if (w.kind() != QuantKind::Gptq) {
    check.fail(ErrorCode::InvalidArgument, "{}: argument 'w' has quant kind {} ({}), expected a GPTQ weight",
               check.op(), quant_kind_name(w.kind()), static_cast<int>(w.kind()));
  }
}

}  // namespace

void Backend::gemm_gptq(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m) {
  OpCheck check(*this, "gemm_gptq");
  check_quant_gemm(check, a, w, out, m);
  check_gptq_weight(check, w);
  check_outputs_apart(check, {{"out", out, m * w.n()}}, {{"a", a, m * w.k()}});
  check.run([&] { do_gemm_gptq(a, w, out, m, "gemm_gptq"); });
}

void Backend::do_gemm_gptq(const Buffer&, const QuantWeight&, Buffer&, std::size_t, const char* op) {
  OpCheck check(*this, op);
  check.fail(ErrorCode::Unsupported, "{}: not implemented on the {} backend yet", op, name());
}

void Backend::gemm_silu_mul_gptq(const Buffer& a, const QuantWeight& w, Buffer& gate_up, Buffer& act,
                                 std::size_t m) {
  OpCheck check(*this, "gemm_silu_mul_gptq");
  check_quant_gemm(check, a, w, gate_up, m, "gate_up");
  check_gptq_weight(check, w);
  // w.n() is even: load_gptq takes multiples of 8 only.
  check.buffer("act", act);
  check.same_dtype("act", act, "a", a);
  check.holds("act", act, {m, w.n() / 2}, "[m, im]");
  check_outputs_apart(check, {{"gate_up", gate_up, m * w.n()}, {"act", act, m * (w.n() / 2)}}, {{"a", a, m * w.k()}});
  check.run([&] { do_gemm_silu_mul_gptq(a, w, gate_up, act, m); });
}

void Backend::do_gemm_silu_mul_gptq(const Buffer&, const QuantWeight&, Buffer&, Buffer&, std::size_t) {
  OpCheck check(*this, "gemm_silu_mul_gptq");
  check.fail(ErrorCode::Unsupported, "gemm_silu_mul_gptq: not implemented on the {} backend yet", name());
}

// ── The row_sq ops ───────────────────────────────────────────────────────────

namespace {

// row_sq for rows x cols: f32, [rows, row_sq_groups(cols)].
void check_row_sq(const OpCheck& check, const Buffer& row_sq, std::size_t rows, std::size_t cols) {
  check.buffer("row_sq", row_sq);
  check.dtype("row_sq", row_sq, DType::F32);
  check.holds("row_sq", row_sq, {rows, row_sq_groups(cols)}, "[rows, ceil(cols / 16)]");
}

// The norm half of rms_norm_gemm_gptq and its SiLU·mul form: x [m, k],
// row_sq of x, norm_w [k], eps, normed [m, k] beside a GEMM on normed.
void check_norm_in(const OpCheck& check, const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                   const QuantWeight& w, const Buffer& normed, std::size_t m) {
  check.eps("", eps);
  check.buffer("x", x);
  check.activation("x", x);
  const std::size_t elems = check.product("[m, k]", {m, w.k()});
  check.holds("x", x, elems, "[m, k]");
  check_row_sq(check, row_sq, m, w.k());
  check.buffer("norm_w", norm_w);
  check.same_dtype("norm_w", norm_w, "x", x);
  check.holds("norm_w", norm_w, w.k(), "[k]");
  check.same_dtype("normed", normed, "x", x);
}

}  // namespace

void Backend::row_sum_squares(const Buffer& x, Buffer& row_sq, std::size_t rows, std::size_t cols) {
  OpCheck check(*this, "row_sum_squares");
  check.size("rows", rows);
  check.size("cols", cols);
  check.buffer("x", x);
  check.activation("x", x);
  const std::size_t elems = check.product("[rows, cols]", {rows, cols});
  check.holds("x", x, elems, "[rows, cols]");
  check_row_sq(check, row_sq, rows, cols);
  check_outputs_apart(check, {{"row_sq", row_sq, rows * row_sq_groups(cols)}}, {{"x", x, elems}});
  check.run([&] { do_row_sum_squares(x, row_sq, rows, cols); });
}

void Backend::gemm_gptq_add_residual(const Buffer& a, const QuantWeight& w, Buffer& out, Buffer& residual,
                                     Buffer& row_sq, std::size_t m) {
  OpCheck check(*this, "gemm_gptq_add_residual");
  check_quant_gemm(check, a, w, out, m);
  check_gptq_weight(check, w);
  check.buffer("residual", residual);
  check.same_dtype("residual", residual, "a", a);
  const std::size_t out_elems = check.product("[m, n]", {m, w.n()});
  check.holds("residual", residual, out_elems, "[m, n]");
  check_row_sq(check, row_sq, m, w.n());
  check_outputs_apart(
      check, {{"out", out, out_elems}, {"residual", residual, out_elems}, {"row_sq", row_sq, m * row_sq_groups(w.n())}},
      {{"a", a, m * w.k()}});
  check.run([&] { do_gemm_gptq_add_residual(a, w, out, residual, row_sq, m); });
}

void Backend::rms_norm_gemm_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                                 const QuantWeight& w, Buffer& normed, Buffer& out, std::size_t m) {
  OpCheck check(*this, "rms_norm_gemm_gptq");
  check_quant_gemm(check, normed, w, out, m, "out", "normed");
  check_gptq_weight(check, w);
  check_norm_in(check, x, row_sq, norm_w, eps, w, normed, m);
  check_outputs_apart(check, {{"normed", normed, m * w.k()}, {"out", out, m * w.n()}},
                      {{"x", x, m * w.k()}, {"row_sq", row_sq, m * row_sq_groups(w.k())}, {"norm_w", norm_w, w.k()}});
  check.run([&] { do_rms_norm_gemm_gptq(x, row_sq, norm_w, eps, w, normed, out, m); });
}

void Backend::rms_norm_gemm_silu_mul_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                                          const QuantWeight& w, Buffer& normed, Buffer& gate_up, Buffer& act,
                                          std::size_t m) {
  OpCheck check(*this, "rms_norm_gemm_silu_mul_gptq");
  check_quant_gemm(check, normed, w, gate_up, m, "gate_up", "normed");
  check_gptq_weight(check, w);
  check_norm_in(check, x, row_sq, norm_w, eps, w, normed, m);
  check.buffer("act", act);
  check.same_dtype("act", act, "x", x);
  check.holds("act", act, {m, w.n() / 2}, "[m, im]");
  check_outputs_apart(
      check, {{"normed", normed, m * w.k()}, {"gate_up", gate_up, m * w.n()}, {"act", act, m * (w.n() / 2)}},
      {{"x", x, m * w.k()}, {"row_sq", row_sq, m * row_sq_groups(w.k())}, {"norm_w", norm_w, w.k()}});
  check.run([&] { do_rms_norm_gemm_silu_mul_gptq(x, row_sq, norm_w, eps, w, normed, gate_up, act, m); });
}

void Backend::do_row_sum_squares(const Buffer&, Buffer&, std::size_t, std::size_t) {
  OpCheck check(*this, "row_sum_squares");
  check.fail(ErrorCode::Unsupported, "row_sum_squares: not implemented on the {} backend yet", name());
}

void Backend::do_gemm_gptq_add_residual(const Buffer&, const QuantWeight&, Buffer&, Buffer&, Buffer&, std::size_t) {
  OpCheck check(*this, "gemm_gptq_add_residual");
  check.fail(ErrorCode::Unsupported, "gemm_gptq_add_residual: not implemented on the {} backend yet", name());
}

void Backend::do_rms_norm_gemm_gptq(const Buffer&, const Buffer&, const Buffer&, float, const QuantWeight&, Buffer&,
                                    Buffer&, std::size_t) {
  OpCheck check(*this, "rms_norm_gemm_gptq");
  check.fail(ErrorCode::Unsupported, "rms_norm_gemm_gptq: not implemented on the {} backend yet", name());
}

void Backend::do_rms_norm_gemm_silu_mul_gptq(const Buffer&, const Buffer&, const Buffer&, float,
                                             const QuantWeight&, Buffer&, Buffer&, Buffer&, std::size_t) {
  OpCheck check(*this, "rms_norm_gemm_silu_mul_gptq");
  check.fail(ErrorCode::Unsupported, "rms_norm_gemm_silu_mul_gptq: not implemented on the {} backend yet", name());
}

void Backend::gemm_quant(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m) {
  OpCheck check(*this, "gemm_quant");
  check_quant_gemm(check, a, w, out, m);
  check_outputs_apart(check, {{"out", out, m * w.n()}}, {{"a", a, m * w.k()}});
  switch (w.kind()) {
    case QuantKind::Gptq:
      if (!supports(Op::GemmGptq)) {
        check.fail(ErrorCode::Unsupported, "gemm_quant: GPTQ weights need gemm_gptq, which the {} backend lacks yet",
                   name());
      }
      check.run([&] { do_gemm_gptq(a, w, out, m, "gemm_quant"); });
      return;
    case QuantKind::Awq:
    case QuantKind::Fp8:
      check.fail(ErrorCode::Unsupported, "gemm_quant: argument 'w' has quant kind {}, which no backend runs yet (GPTQ only)",
                 quant_kind_name(w.kind()));
  }
  check.fail(ErrorCode::InvalidArgument, "gemm_quant: argument 'w' has unknown quant kind {}", static_cast<int>(w.kind()));
}

// ── Collectives ────────────────────────────────────────────────────────────

namespace {

// all_gather and reduce_scatter: a source and a destination, one of them
// world_size shards of `len` elements and the other one shard; f16 / bf16 /
// f32 as the source is, the destination of the same dtype.
// The shard may share bytes with the full buffer only as this rank's slice
// of it, full[rank * len, (rank + 1) * len) (NCCL's in-place form; at world
// size 1 the same range), whatever the world size: NCCL leaves any other
// overlap undefined, and the world-size-1 copy refuses it too.
void check_shard_pair(const OpCheck& check, NamedBuffer source, NamedBuffer dest, bool source_is_full,
                      std::string_view len_name, std::size_t len, std::size_t world, std::size_t rank) {
  check.size(len_name, len);
  check.buffer(source.name, source.buffer);
  check.buffer(dest.name, dest.buffer);
  check.one_of(source.name, source.buffer, {DType::F16, DType::BF16, DType::F32});
  check.same_dtype(dest.name, dest.buffer, source.name, source.buffer);
  const NamedBuffer& full = source_is_full ? source : dest;
  const NamedBuffer& shard = source_is_full ? dest : source;
  check.holds(shard.name, shard.buffer, len, "[len]");
  const std::size_t full_len = check.product("[world_size * len]", {world, len});
  check.holds(full.name, full.buffer, full_len, "[world_size * len]");
  const ByteSpan s = byte_span(shard.buffer, 0, len), f = byte_span(full.buffer, 0, full_len);
  if (s.overlaps(f) && s.begin != byte_span(full.buffer, rank * len, len).begin) {
    check.fail(ErrorCode::InvalidArgument,
               "{}: '{}' [0, {}) overlaps '{}' [0, {}) in memory (views of one buffer) without being rank {}'s "
               "slice [{}, {}) of it (the in-place form); use separate buffers",
               check.op(), shard.name, len, full.name, full_len, rank, rank * len, (rank + 1) * len);
  }
}

void check_reduce_op(const OpCheck& check, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::Min:
    case ReduceOp::Prod:
    case ReduceOp::Avg:
      return;
  }
  check.fail(ErrorCode::InvalidArgument, "{}: argument 'op' = {} is not a ReduceOp", check.op(), static_cast<int>(op));
}

}  // namespace

void Backend::all_reduce(Buffer& buf, std::size_t len, ReduceOp op) {
  OpCheck check(*this, "all_reduce");
  check.size("len", len);
  check.buffer("buf", buf);
  check.one_of("buf", buf, {DType::F16, DType::BF16, DType::F32});
  check.holds("buf", buf, len, "[len]");
  check_reduce_op(check, op);
  check.run([&] { do_all_reduce(buf, len, op); });
}

void Backend::all_gather(const Buffer& local, Buffer& global, std::size_t local_len) {
  OpCheck check(*this, "all_gather");
  check_shard_pair(check, {"local", local}, {"global", global}, /*source_is_full=*/false, "local_len", local_len,
                   world_size(), rank());
  check.run([&] { do_all_gather(local, global, local_len); });
}

void Backend::broadcast(Buffer& buf, std::size_t len, std::size_t src_rank) {
  OpCheck check(*this, "broadcast");
  check.size("len", len);
  check.buffer("buf", buf);
  check.one_of("buf", buf, {DType::F16, DType::BF16, DType::F32});
  check.holds("buf", buf, len, "[len]");
  if (src_rank >= world_size()) {
    check.fail(ErrorCode::InvalidArgument, "broadcast: argument 'src_rank' = {} is not below world size {}", src_rank,
         world_size());
  }
  check.run([&] { do_broadcast(buf, len, src_rank); });
}

void Backend::reduce_scatter(const Buffer& input, Buffer& output, std::size_t len, ReduceOp op) {
  OpCheck check(*this, "reduce_scatter");
  check_shard_pair(check, {"input", input}, {"output", output}, /*source_is_full=*/true, "len", len, world_size(),
                   rank());
  check_reduce_op(check, op);
  check.run([&] { do_reduce_scatter(input, output, len, op); });
}

// World size 1 without a communicator: the collectives are identities.
void Backend::do_all_reduce(Buffer&, std::size_t, ReduceOp) {
  OpCheck check(*this, "all_reduce");
  if (world_size() != 1) {
    check.fail(ErrorCode::Unsupported, "all_reduce: world size is {} but the {} backend has no communicator",
         world_size(), name());
  }
}

void Backend::do_all_gather(const Buffer& local, Buffer& global, std::size_t local_len) {
  OpCheck check(*this, "all_gather");
  if (world_size() != 1) {
    check.fail(ErrorCode::Unsupported, "all_gather: world size is {} but the {} backend has no communicator",
         world_size(), name());
  }
  if (copy_needed(check, local, 0, "local", global, 0, "global", local_len)) {
    do_copy_slice("all_gather", local, 0, global, 0, local_len);
  }
}

void Backend::do_broadcast(Buffer&, std::size_t, std::size_t) {
  OpCheck check(*this, "broadcast");
  if (world_size() != 1) {
    check.fail(ErrorCode::Unsupported, "broadcast: world size is {} but the {} backend has no communicator",
         world_size(), name());
  }
}

// One rank: the reduction over ranks of input[0 .. len) is input itself (any op).
void Backend::do_reduce_scatter(const Buffer& input, Buffer& output, std::size_t len, ReduceOp) {
  OpCheck check(*this, "reduce_scatter");
  if (world_size() != 1) {
    check.fail(ErrorCode::Unsupported, "reduce_scatter: world size is {} but the {} backend has no communicator",
         world_size(), name());
  }
  if (copy_needed(check, input, 0, "input", output, 0, "output", len)) {
    do_copy_slice("reduce_scatter", input, 0, output, 0, len);
  }
}

}  // namespace ferrum
