// Backend: the per-layer op interface an engine calls.
//
// Every public op is a non-virtual method that validates its arguments
// (shapes, dtypes, alignment, capacity, ownership) and throws ferrum::Error
// naming the op, the argument and the offending value; only then does it call
// the backend's protected `do_*` implementation. So CpuBackend and
// CudaBackend share one set of checks and can never disagree on what is legal,
// except where a CUDA kernel has a limit of its own, which CudaBackend checks
// and names too (supports / supports_head_dim say which ops and head dims it
// runs): attention and the GPTQ ops need 16-byte-aligned buffers
// (Misaligned; the GPTQ ops' row operands: a, out, residual, x, norm_w,
// normed, gate_up), attention head_dim 64 / 128 / 256 and at most 65535
// heads (Unsupported), the RoPE ops head_dim <= 512 (Unsupported), and the
// norms' and row_sum_squares' row lengths have kernel limits (2^30 columns
// for the norms, 65535 x 512 for row_sum_squares and for
// gemm_gptq_add_residual's n; Unsupported), and attention, the GPTQ ops and
// the collectives refuse host memory (InvalidArgument; see alloc_host).
//
// Layout conventions (row-major everywhere):
//   token-major activations  [tokens, dim]
//   head-major activations   [heads, tokens, head_dim]
//   KV cache (per layer)     [num_kv_heads, capacity, head_dim]
//   attention q / out        [batch, num_heads, q_len, head_dim]
//   attention k / v          [batch, num_kv_heads, kv_seq_stride, head_dim]
//   linear weight            [n, k]   (out = a · weightᵀ)
// Buffers may be larger than an op needs (scratch sized for the maximum);
// the op touches exactly the elements its sizes name.
//
// Dtypes, in the ops from Norms on: a buffer whose comment names no dtype
// holds f16 or bf16, the same as the op's other such buffers
// (DTypeMismatch otherwise; copy_slice and the host copies take any
// dtype); the comments name the rest (i32 ids, positions and lengths; f32
// RoPE tables and row sums; argmax and the collectives take f32 too).
// Sizes: every count and dimension argument (tokens, rows, dim, m, n, k,
// batch, heads, head_dim, q_len, kv_len, len, ...) lies in [1, 2^31 - 1]
// (InvalidArgument); offsets and positions (pos_offset, cache_len, the
// copy offsets) may be 0.
//
// Graph capture (CudaBackend; Op::GraphCapture): every op from Norms on but
// load_gptq may be captured between begin_graph_capture and
// end_graph_capture, and so may copy_slice and advance_decode_state. A capture bakes in every host
// argument (sizes, pos_offset, cache_len, kv_len, eps, ...); what a replay
// sees anew comes only from device or alloc_host memory: the decode state
// (set_device_state_mode), the positions / kv_lens arrays of the ragged
// ops, and what copy_slice reads from an alloc_host buffer. The setup
// calls refuse a capture in progress (GraphCapture): alloc, alloc_host,
// upload, write, write_bytes, download, read_bytes, load_gptq,
// set_decode_state, synchronize, replay_last_graph, reset_graph and a
// second begin_graph_capture. Any error thrown during a capture, these
// included, first ends and discards the capture (the stream stays usable;
// end_graph_capture then throws GraphCapture): capture again.
//
// Outputs and inputs: views of one allocation may share bytes, and an op
// refuses (InvalidArgument, naming both arguments and their byte ranges) an
// output whose elements share a byte with another output's or an input's;
// no op runs in place on an input (the kernels take their inputs as
// __restrict__). copy_slice and the collectives state their own rules;
// advance_decode_state's next_token may lie inside token_log. An "in/out"
// argument counts as an output.
//
// Threads: a backend is driven by one thread at a time; nothing in it locks
// against a second caller. The CudaBackends of one device share that
// device's stream, cuBLAS handle, workspaces, decode state and graph slot,
// so together they count as one backend for this rule; backends on
// different devices may run in different threads at once (one thread per
// GPU, as tensor parallelism does). Every CudaBackend op makes the backend's
// device current on the calling thread and leaves it so.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferrum/buffer.hpp"
#include "ferrum/dtype.hpp"
#include "ferrum/error.hpp"

namespace ferrum {

namespace detail {
class OpCheck;
}

enum class BackendKind { Cpu, Cuda };

// Every op of the interface, for supports().
enum class Op {
  RmsNorm,
  FusedAddRmsNorm,
  LayerNorm,
  Gelu,
  AddBias,
  AddInplace,
  Argmax,
  Gemm,
  EmbeddingLookup,
  SplitQkv,
  FusedSiluMulSplit,
  QkNormRope,
  KvCacheAppendHeadMajor,
  QkvRopeAppend,
  TransposeHeadToToken,
  CopySlice,
  FlashAttention,
  FlashDecodeRagged,
  LoadGptq,
  GemmGptq,
  GemmQuant,
  AllReduce,
  AllGather,
  Broadcast,
  ReduceScatter,
  MlaAttention,
  GraphCapture,
  DeviceStateMode,
  GemmSiluMul,
  QkvRopeAppendRagged,
  AdvanceDecodeState,
  GemmSiluMulGptq,
  RowSumSquares,
  GemmGptqAddResidual,
  RmsNormGemmGptq,
  RmsNormGemmSiluMulGptq,
};
inline constexpr int kNumOps = static_cast<int>(Op::RmsNormGemmSiluMulGptq) + 1;
// row_sq buffers (Backend::gemm_gptq_add_residual and the ops beside it):
// one f32 sum of squares per 16 columns of a row.
inline constexpr std::size_t kRowSqColumns = 16;
constexpr std::size_t row_sq_groups(std::size_t cols) noexcept { return (cols + kRowSqColumns - 1) / kRowSqColumns; }
std::string_view to_string(Op op) noexcept;

// GELU formula. Erf is torch's F.gelu default; Tanh is approximate='tanh'.
enum class GeluApproximation { Erf, Tanh };

// qk_norm_rope: NormAndRope is Qwen3 (per-head RMSNorm with a [head_dim]
// weight, then RoPE); RopeOnly is Llama (no norm; norm weight not read).
enum class RopeMode { NormAndRope, RopeOnly };

enum class ReduceOp { Sum, Max, Min, Prod, Avg };

// The geometry of qkv_rope_append (see there).
struct QkvRopeAppendConfig {
  std::size_t heads = 0;     // q heads
  std::size_t kv_heads = 0;  // k and v heads
  std::size_t head_dim = 0;  // even
  std::size_t capacity = 0;  // positions per kv head in the caches
  std::size_t max_pos = 0;   // rows of the cos / sin tables
  float eps = 1e-6f;         // NormAndRope only
  RopeMode mode = RopeMode::RopeOnly;
};

// The largest softmax scale the attention ops take (2^16; models use
// 1/sqrt(head_dim) or 1): a larger one is a units mistake, and past ~2.4e38
// the kernels' scale · log2 e is inf (NaN rows).
// Scores: CUDA's softmax forms each exponent with one FMA per score,
// s · scale · log2 e − (row max · scale · log2 e), FlashAttention's form, so
// the rounding of the row max in those units (half an ulp; twice where the
// decode merges split partials) enters every weight. While every
// |q·k| · scale stays within kAttentionExactLogit those units stay below
// 2^15, so a weight is off by less than 2^-9 relatively (P is rounded to
// f16 / bf16 for P·V anyway); past it accuracy falls with the logits'
// magnitude, and past ~2^30 rows come back NaN. CpuBackend computes in fp64
// at any size. bf16 q·k must stay within fp32's range.
inline constexpr float kMaxAttentionScale = 65536.0f;
inline constexpr float kAttentionExactLogit = 16384.0f;  // 2^14

struct AttnConfig {
  std::size_t num_heads = 0;
  std::size_t num_kv_heads = 0;  // num_heads % num_kv_heads == 0 (GQA group)
  std::size_t head_dim = 0;
  // Causal: query i sees keys 0 .. pos_offset + i, pos_offset as passed
  // (never inferred from kv_len): the usual bottom-right mask when
  // pos_offset = kv_len - q_len, e.g. kv_len - 1 for a decode step. In
  // device-state decode (q_len 1) the state's kv_len - 1 stands in for it.
  bool causal = true;
  float scale = 0.0f;  // softmax scale in [0, kMaxAttentionScale]; 0 means 1/sqrt(head_dim)
  std::size_t kv_seq_stride = 0;  // positions per kv head in k/v; 0 means kv_len
};

// DeepSeek-style multi-head latent attention (not implemented yet).
struct MlaConfig {
  std::size_t num_heads = 0;
  std::size_t kv_lora_rank = 0;
  std::size_t qk_nope_head_dim = 0;
  std::size_t qk_rope_head_dim = 0;
  std::size_t v_head_dim = 0;
  float scale = 0.0f;  // in [0, kMaxAttentionScale]; 0 means the backend's default
};

// GPTQ zero-point convention: V1 stores zero - 1 (AutoGPTQ's historical
// format), V2 stores the zero itself.
enum class GptqZeroFormat { V1, V2 };

// A GPTQ checkpoint's tensors as they sit on disk (host memory).
struct GptqHostTensors {
  std::span<const std::int32_t> qweight;  // [k / 8, n], packed along k, low nibble first
  std::span<const std::int32_t> qzeros;   // [groups, n / 8], packed along n (groups: see load_gptq)
  std::span<const float> scales;          // [groups, n]
  std::span<const std::int32_t> g_idx;    // [k] group of each input row; may be empty
  int bits = 4;
  int group_size = 128;  // -1: one group over all of k
  std::size_t k = 0;
  std::size_t n = 0;
  // Informational (the checkpoint's "sym"): every kernel and the CPU
  // reference read the zeros from qzeros, whatever it says.
  bool symmetric = true;
  GptqZeroFormat zero_format = GptqZeroFormat::V1;
};

enum class QuantKind { Gptq, Awq, Fp8 };

// A quantized weight living on one backend, made by load_gptq.
class QuantWeight {
 public:
  virtual ~QuantWeight() = default;
  virtual QuantKind kind() const noexcept = 0;
  virtual std::size_t k() const noexcept = 0;
  virtual std::size_t n() const noexcept = 0;
  // The backend whose load made it; null once that backend is destroyed
  // (detail::BackendRef), so that no op takes it any more.
  virtual const Backend* backend() const noexcept = 0;
};

namespace detail {
// What a Buffer keeps of its backend, shared so that it outlives the backend:
// a Buffer destroyed after its backend still frees its memory, and sees the
// backend gone (Buffer::backend() null) instead of calling into it.
struct BufferOwner {
  explicit BufferOwner(Backend* owner) noexcept : backend(owner) {}
  Backend* const backend;
  std::atomic<bool> alive{true};  // false from ~Backend on
  // Frees one allocate_bytes allocation, also after the backend is gone
  // (set by the backend's constructor; null: nothing to free).
  void (*free)(void* ptr, int device) noexcept = nullptr;
  int device = -1;
  // The backend while it lives; null from ~Backend on.
  Backend* live() const noexcept { return alive.load(std::memory_order_acquire) ? backend : nullptr; }
};

// What an object made by a backend (a QuantWeight) keeps of it: the backend
// while it lives, null once it is destroyed, so that a later backend at the
// same address does not pass for it in the ops' ownership checks.
class BackendRef {
 public:
  BackendRef() noexcept = default;
  explicit BackendRef(std::shared_ptr<BufferOwner> owner) noexcept : owner_(std::move(owner)) {}
  Backend* get() const noexcept { return owner_ != nullptr ? owner_->live() : nullptr; }

 private:
  std::shared_ptr<BufferOwner> owner_;
};
}  // namespace detail

class Backend {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // ── Lifecycle ──────────────────────────────────────────────────────────
  virtual BackendKind kind() const noexcept = 0;
  virtual std::string name() const = 0;
  virtual bool supports(Op op) const noexcept = 0;
  // Whether this backend runs `op` on heads of `head_dim` elements. The
  // attention ops (FlashAttention, FlashDecodeRagged) and the RoPE ops
  // (QkNormRope, QkvRopeAppend, QkvRopeAppendRagged) may have kernels for
  // some head sizes only: a call at a head_dim this says no to throws
  // ErrorCode::Unsupported (a head_dim the op itself forbids, e.g. an odd one
  // for RoPE, throws InvalidArgument on every backend). Other ops, and the
  // default: supports(op). Lets an engine choose a backend for a model
  // before it allocates anything.
  virtual bool supports_head_dim(Op op, std::size_t /*head_dim*/) const noexcept { return supports(op); }
  // Waits for all queued work; then reports any bad device-side value a
  // kernel found (ErrorCode::DeviceCheck). Not allowed during capture.
  // download and read_bytes, which wait too, report such values the same
  // way (after the copy, whose bytes may be what the bad value left), so an
  // engine reading its tokens or logits learns of them there; a read that
  // copies nothing (count 0, 0 bytes, or a host buffer read into its own
  // bytes) neither waits nor reports. Each value is reported once, by
  // whichever comes first; the log is the device's, shared by the backends
  // on it.
  virtual void synchronize() = 0;

  // ── Buffers (setup-time: these may allocate and synchronize) ──────────
  Buffer alloc(DType dtype, std::size_t numel);
  // Host memory this backend's copies and ops reach, for the values an
  // engine changes every step (token ids, positions, lengths): page-locked
  // on CudaBackend (cudaHostAlloc, portable; freed with the Buffer),
  // ordinary memory on CpuBackend. The host reads and writes it through
  // data() directly, with no call in between. It is a Buffer like any
  // other: copy_slice from it into a device buffer is asynchronous and
  // capture-safe, and a captured copy reads the host bytes at each replay,
  // so one graph picks up what the host wrote before that replay. The host
  // must not write it while queued work may still read it, nor read it
  // while queued work may still write it (a copy_slice into it): do either
  // after synchronize() or a blocking read such as download or read_bytes.
  // It is meant for copy_slice, download and read_bytes. Ops whose kernels
  // read plain pointers take it too (over the bus on CudaBackend), but not
  // every op can: CudaBackend's attention ops, GPTQ GEMMs and collectives
  // need device memory and refuse it (InvalidArgument; Buffer::host_memory
  // says which Buffers are). Copy it to the device first.
  Buffer alloc_host(DType dtype, std::size_t numel);
  // Allocates and fills from host f32, converting (round to nearest even;
  // i32/u8 take the value truncated toward zero, and refuse values that do
  // not fit).
  Buffer upload(std::span<const float> host, DType dtype);
  // Writes host f32 values (converted) into dst starting at element offset.
  void write(Buffer& dst, std::span<const float> host, std::size_t dst_offset = 0);
  // Writes raw bytes (already in dst's element format). The host range
  // and dst's may be the same (nothing to do) but must not otherwise share
  // bytes (InvalidArgument), as for copy_slice; so for read_bytes.
  void write_bytes(Buffer& dst, const void* host, std::size_t bytes, std::size_t dst_byte_offset = 0);
  // Reads `count` elements as f32 (synchronizes; on CudaBackend then reports
  // a bad device-side value as synchronize() does: DeviceCheck).
  std::vector<float> download(const Buffer& src, std::size_t count);
  std::vector<float> download(const Buffer& src) { return download(src, src.numel()); }
  // Reads raw bytes (in src's element format), synchronizing and reporting as
  // download does.
  void read_bytes(const Buffer& src, void* host, std::size_t bytes, std::size_t src_byte_offset = 0);

  // dst[dst_offset .. +len) = src[src_offset .. +len); same dtype. Capture-safe.
  // The two ranges may be the same (nothing to do) but must not otherwise
  // share bytes (views of one buffer): InvalidArgument.
  void copy_slice(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                  std::size_t len);

  // ── Decode state (one captured graph serves every decode step) ───────
  // On CudaBackend the decode state, the device error log and the graph
  // slot belong to the device, not to the object: every CudaBackend on one
  // device shares them (a captured graph points at them), so
  // set_decode_state, advance_decode_state, synchronize's DeviceCheck and
  // reset_graph act for all.
  // Device-state mode is per object. CpuBackend keeps all of it per object.
  // Sets token, pos = step and kv_len = step + 1 in the backend's decode
  // state. Stream-ordered and allocation-free; call it before each replay,
  // not inside a capture (GraphCapture: it records host values; inside a
  // step, advance_decode_state moves the state). token <= 2^31 - 1 and
  // step < 2^31 - 1 (InvalidArgument).
  void set_decode_state(std::uint32_t token, std::uint32_t step);
  // The decode state's step on the device, for decode steps enqueued back to
  // back (one captured step replayed with no host read of the token in
  // between): token_log[pos + 1] = next_token[0], then token =
  // next_token[0], pos += 1 and kv_len += 1. Capture it as a step's last op,
  // after the argmax that writes next_token. Stream-ordered, allocation-free
  // and capture-safe; the token is not range-checked here (the next step's
  // embedding_lookup does that). A pos + 1 outside token_log changes
  // nothing: CpuBackend throws CapacityExceeded, CudaBackend raises a device
  // error reported as DeviceCheck (see synchronize()). token_log holds at least
  // 2 elements (ShapeMismatch otherwise).
  void advance_decode_state(const Buffer& next_token /*[1] i32*/, Buffer& token_log /*[positions] i32*/);
  // In device-state mode, single-token embedding_lookup, qk_norm_rope,
  // kv_cache_append_head_major, qkv_rope_append and decode flash_attention read token / pos /
  // kv_len from the decode state instead of their host arguments.
  void set_device_state_mode(bool enable) { device_state_mode_ = enable; }
  bool device_state_mode() const noexcept { return device_state_mode_; }

  // ── Graph capture ──────────────────────────────────────────────────────
  // On a backend without Op::GraphCapture (CpuBackend) begin_graph_capture
  // throws Unsupported; the other three act as with no graph held:
  // end_graph_capture throws GraphCapture (no capture in progress),
  // replay_last_graph returns false and reset_graph does nothing.
  void begin_graph_capture();
  void end_graph_capture();     // instantiates and uploads; replaces any previous graph
  bool replay_last_graph();     // false when no graph is held
  void reset_graph();           // drops the held graph
  // (CudaBackend keeps library memory freed while a graph is held until the
  // graph is dropped: see CudaBackend::graph_retained_allocations.)
  virtual bool is_capturing() const noexcept { return false; }
  // Which graph the slot holds: 0 when none, else an id no earlier capture
  // on this device had (end_graph_capture draws a new one). On CudaBackend
  // the slot is the device's, so another object's capture replaces the
  // graph; a caller that captured compares this with the id it saw after
  // end_graph_capture before it replays.
  virtual std::uint64_t held_graph() const noexcept { return 0; }

  // ── Norms ──────────────────────────────────────────────────────────────
  // out = x / sqrt(mean(x²) + eps) * w
  void rms_norm(const Buffer& x /*[tokens, dim]*/, const Buffer& w /*[dim]*/, float eps,
                Buffer& out /*[tokens, dim]*/, std::size_t tokens, std::size_t dim);
  // residual = residual + x (rounded to the dtype); out = rms_norm(residual) * w
  void fused_add_rms_norm(Buffer& residual /*[tokens, dim], in/out*/, const Buffer& x /*[tokens, dim]*/,
                          const Buffer& w /*[dim]*/, float eps, Buffer& out /*[tokens, dim]*/,
                          std::size_t tokens, std::size_t dim);
  // out = (x - mean) / sqrt(var + eps) * gamma + beta  (biased variance, as torch)
  void layer_norm(const Buffer& x /*[tokens, dim]*/, const Buffer& gamma /*[dim]*/,
                  const Buffer& beta /*[dim]*/, float eps, Buffer& out /*[tokens, dim]*/,
                  std::size_t tokens, std::size_t dim);

  // ── Elementwise ────────────────────────────────────────────────────────
  void gelu(const Buffer& x /*[len]*/, Buffer& out /*[len]*/, std::size_t len, GeluApproximation approx);
  // data[r, c] += bias[c]
  void add_bias(Buffer& data /*[rows, cols], in/out*/, const Buffer& bias /*[cols]*/, std::size_t rows,
                std::size_t cols);
  // residual += x
  void add_inplace(Buffer& residual /*[len], in/out*/, const Buffer& x /*[len]*/, std::size_t len);
  // out[r] = the column of row r's largest value: the first one on ties, and
  // NaN counts as larger than every number (torch.argmax). Greedy sampling
  // on the device: an engine reads 4 bytes per row instead of the logits,
  // and a captured decode step can end with it. cols < 2^31.
  void argmax(const Buffer& x /*[rows, cols] f16, bf16 or f32*/, Buffer& out /*[rows] i32*/, std::size_t rows,
              std::size_t cols);

  // ── GEMM ───────────────────────────────────────────────────────────────
  // out[m, n] = a[m, k] · b[n, k]ᵀ (fp32 accumulation on CUDA, fp64 on CPU).
  void gemm(const Buffer& a /*[m, k]*/, const Buffer& b /*[n, k]*/, Buffer& out /*[m, n]*/,
            std::size_t m, std::size_t n, std::size_t k);

  // act[t, j] = silu(g) · u with g = gate_up[t, 2j], u = gate_up[t, 2j + 1]
  // and gate_up = a · wᵀ rounded to the dtype (as gemm): SwiGLU's input to a
  // down projection, from a gate|up weight whose rows interleave gate and up
  // (row 2j = gate_j, row 2j + 1 = up_j). The bits are those of gemm into
  // gate_up followed by silu·mul of each pair (fp32 math, one rounding, as
  // fused_silu_mul_split), and that is what a backend may run: gate_up is a
  // workspace, its contents unspecified after the call. CudaBackend fuses
  // the two for m <= 2 where gemm would take the skinny kernel (a and w
  // 16-byte aligned, k % 8 == 0, CudaBackendConfig::gemm_skinny_max_m
  // allowing it): the silu·mul runs in its epilogue, and gate_up is neither
  // written nor read. gate_up and act overlap neither a nor w (the overlap
  // rule at the top of this file).
  void gemm_silu_mul(const Buffer& a /*[m, k]*/, const Buffer& w /*[2*im, k], (gate, up) rows interleaved*/,
                     Buffer& gate_up /*[m, 2*im], workspace*/, Buffer& act /*[m, im]*/, std::size_t m,
                     std::size_t im, std::size_t k);

  // ── Embedding and reshaping ────────────────────────────────────────────
  // out[t, :] = table[ids[t], :]; ids is i32 in [0, vocab). In device-state
  // mode with tokens == 1 the id comes from the decode state and `ids` is
  // not read. An id outside [0, vocab) throws InvalidArgument on
  // CpuBackend; on CudaBackend the kernel writes a zero row and it is
  // reported as DeviceCheck (see synchronize()).
  void embedding_lookup(const Buffer& table /*[vocab, dim]*/, const Buffer& ids /*[tokens] i32*/,
                        Buffer& out /*[tokens, dim]*/, std::size_t tokens, std::size_t dim, std::size_t vocab);
  // qkv[t] = [q | k | v] -> q[t], k[t], v[t]
  void split_qkv(const Buffer& qkv /*[tokens, q_dim + 2*kv_dim]*/, Buffer& q /*[tokens, q_dim]*/,
                 Buffer& k /*[tokens, kv_dim]*/, Buffer& v /*[tokens, kv_dim]*/, std::size_t tokens,
                 std::size_t q_dim, std::size_t kv_dim);
  // out[t, j] = silu(gate_up[t, j]) * gate_up[t, im + j]
  void fused_silu_mul_split(const Buffer& gate_up /*[tokens, 2*im] as [gate | up]*/,
                            Buffer& out /*[tokens, im]*/, std::size_t tokens, std::size_t im);
  // Per (token, head): optional RMSNorm over head_dim (weight norm_w), then
  // NeoX RoPE (rotate halves) at position pos_offset + t, from tables
  // cos/sin [max_pos, head_dim / 2] in f32. Reads token-major, writes
  // head-major. In device-state mode with tokens == 1 the position is the
  // decode state's pos. Host positions pos_offset .. pos_offset + tokens - 1
  // past max_pos throw CapacityExceeded; a decode-state pos past it throws
  // CapacityExceeded on CpuBackend, and on CudaBackend that row is left
  // unwritten and it is reported as DeviceCheck (see synchronize()).
  void qk_norm_rope(const Buffer& input /*[tokens, heads, head_dim]*/,
                    const Buffer* norm_w /*[head_dim]; null in RopeOnly mode*/,
                    const Buffer& cos /*[max_pos, head_dim/2] f32*/,
                    const Buffer& sin /*[max_pos, head_dim/2] f32*/,
                    Buffer& output /*[heads, tokens, head_dim]*/, std::size_t tokens,
                    std::size_t heads, std::size_t head_dim, std::size_t pos_offset, std::size_t max_pos,
                    float eps, RopeMode mode);
  // cache[h, cache_len + t, :] = new[h, t, :] for K and V. In device-state
  // mode with new_tokens == 1, cache_len is the decode state's pos.
  // cache_len + new_tokens past capacity throws CapacityExceeded; a
  // decode-state pos past it throws CapacityExceeded on CpuBackend, and on
  // CudaBackend nothing is written and it is reported as DeviceCheck (see
  // synchronize()).
  void kv_cache_append_head_major(Buffer& cache_k /*[nkv, capacity, hd]*/,
                                  Buffer& cache_v /*[nkv, capacity, hd]*/, std::size_t cache_len,
                                  std::size_t capacity, const Buffer& new_k /*[nkv, new_tokens, hd]*/,
                                  const Buffer& new_v /*[nkv, new_tokens, hd]*/,
                                  std::size_t new_tokens, std::size_t nkv, std::size_t hd);
  // One launch for a decode step's qk_norm_rope (q and k) and
  // kv_cache_append_head_major, read straight from the QKV projection's
  // output, which holds q | k | v per token:
  //   q_out[h, t, :] = rope(norm(q[t, h, :], q_norm))        as qk_norm_rope
  //   k_cache[h, pos + t, :] = rope(norm(k[t, h, :], k_norm)) as qk_norm_rope + append
  //   v_cache[h, pos + t, :] = v[t, h, :]                     as the append
  // with pos = pos_offset, or in device-state mode with tokens == 1 the
  // decode state's pos (as both ops it replaces). Bitwise what split_qkv,
  // qk_norm_rope twice and kv_cache_append_head_major write, without their
  // scratch buffers. q_norm / k_norm are read in NormAndRope mode only.
  void qkv_rope_append(const Buffer& qkv /*[tokens, (heads + 2 kv_heads) * head_dim]*/,
                       const Buffer* q_norm /*[head_dim]*/, const Buffer* k_norm /*[head_dim]*/,
                       const Buffer& cos /*[max_pos, head_dim/2] f32*/, const Buffer& sin /*[max_pos, head_dim/2] f32*/,
                       Buffer& q_out /*[heads, tokens, head_dim]*/,
                       Buffer& k_cache /*[kv_heads, capacity, head_dim]*/,
                       Buffer& v_cache /*[kv_heads, capacity, head_dim]*/, std::size_t tokens, std::size_t pos_offset,
                       const QkvRopeAppendConfig& cfg);
  // qkv_rope_append for a batch decode step: one new token per sequence,
  // sequence b at its own position positions[b] (read on the device, I32, so
  // one captured graph serves every step), with q in the layout
  // flash_decode_ragged reads:
  //   q_out[b, h, :]                  = rope(norm(q[b, h, :], q_norm))
  //   k_cache[b, h, positions[b], :]  = rope(norm(k[b, h, :], k_norm))
  //   v_cache[b, h, positions[b], :]  = v[b, h, :]
  // Row b is bitwise what qkv_rope_append writes for one token at
  // pos_offset = positions[b] into sequence b's views. A position outside
  // [0, min(cfg.capacity, cfg.max_pos)) refuses the whole op (nothing
  // written): thrown (CPU, CapacityExceeded) or reported as DeviceCheck
  // (CUDA; see synchronize()).
  void qkv_rope_append_ragged(const Buffer& qkv /*[batch, (heads + 2 kv_heads) * head_dim]*/,
                              const Buffer* q_norm /*[head_dim]*/, const Buffer* k_norm /*[head_dim]*/,
                              const Buffer& cos /*[max_pos, head_dim/2] f32*/,
                              const Buffer& sin /*[max_pos, head_dim/2] f32*/, Buffer& q_out /*[batch, heads, head_dim]*/,
                              Buffer& k_cache /*[batch, kv_heads, capacity, head_dim]*/,
                              Buffer& v_cache /*[batch, kv_heads, capacity, head_dim]*/,
                              const Buffer& positions /*[batch] i32*/, std::size_t batch,
                              const QkvRopeAppendConfig& cfg);
  // dst[t, h, :] = src[h, t, :]
  void transpose_head_to_token(const Buffer& src /*[heads, tokens, dim]*/,
                               Buffer& dst /*[tokens, heads, dim]*/, std::size_t tokens,
                               std::size_t heads, std::size_t dim);

  // ── Attention ──────────────────────────────────────────────────────────
  // softmax(q kᵀ · scale + mask) v, per (batch, head); q head h reads kv head
  // h / (num_heads / num_kv_heads). Keys 0 .. kv_len-1 are valid. In
  // device-state mode with q_len == 1, kv_len is the decode state's and
  // cfg.kv_seq_stride must be set (the cache capacity); the host kv_len is
  // then not used but still checked (1 .. kv_seq_stride). CudaBackend: q, k, v
  // and out 16-byte aligned; head_dim 64, 128 or 256; at most 65535 heads,
  // and at most 65535 sequences when q_len > 1. Errors: kv_len past
  // cfg.kv_seq_stride is CapacityExceeded; causal queries at positions
  // pos_offset .. pos_offset + q_len - 1 need pos_offset + q_len <= kv_len
  // (InvalidArgument); device-state decode without cfg.kv_seq_stride is
  // InvalidArgument; a device-state kv_len outside [1, kv_seq_stride] is
  // thrown (CPU, CapacityExceeded) or reported as DeviceCheck (CUDA, zeros
  // written; see synchronize()); on CUDA a decode whose split-K scratch
  // exceeds CudaBackendConfig::attention_workspace_bytes is
  // CapacityExceeded (attention_decode_workspace_bytes sizes it).
  void flash_attention(const Buffer& q /*[batch, num_heads, q_len, head_dim]*/,
                       const Buffer& k /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                       const Buffer& v /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                       Buffer& out /*[batch, num_heads, q_len, head_dim]*/, std::size_t batch,
                       std::size_t q_len, std::size_t kv_len, std::size_t pos_offset,
                       const AttnConfig& cfg);
  // Decode for a batch of sequences of different lengths: one new query per
  // sequence, and sequence b sees keys [0, kv_lens[b]) of its cache. kv_lens
  // is read on the device (I32), so one captured graph serves every step.
  // cfg.kv_seq_stride is the cache capacity and is required; cfg.causal does
  // not matter (the query is the newest position). A kv_lens[b] outside
  // [1, capacity] is reported as DeviceCheck (CUDA; see synchronize()) or
  // thrown (CPU, CapacityExceeded).
  void flash_decode_ragged(const Buffer& q /*[batch, num_heads, head_dim]*/,
                           const Buffer& k /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                           const Buffer& v /*[batch, num_kv_heads, kv_seq_stride, head_dim]*/,
                           Buffer& out /*[batch, num_heads, head_dim]*/, const Buffer& kv_lens /*[batch] i32*/,
                           std::size_t batch, const AttnConfig& cfg);
  void mla_attention(const Buffer& q /*[batch, num_heads, q_len, kv_lora_rank + qk_rope_head_dim]*/,
                     const Buffer& kv_latent /*[batch, kv_len, kv_lora_rank + qk_rope_head_dim]*/,
                     Buffer& out /*[batch, num_heads, q_len, v_head_dim]*/, std::size_t batch,
                     std::size_t q_len, std::size_t kv_len, const MlaConfig& cfg);

  // ── Quantized GEMM ─────────────────────────────────────────────────────
  // Repacks a GPTQ checkpoint's tensors for this backend (setup-time).
  // groups = k / group_size, or 1 for group_size -1. Refused: bits other
  // than 4 (Unsupported); k or n not a multiple of 8, or outside
  // [1, 2^31 - 1] (InvalidArgument); group_size not -1 and not positive
  // (InvalidArgument), not a multiple of 8 (Unsupported) or not dividing k
  // (ShapeMismatch); qweight, qzeros, scales (and g_idx, when not empty)
  // not exactly their shapes above (ShapeMismatch); a g_idx entry outside
  // [0, groups) (InvalidArgument); a scale not finite or past f16's range,
  // |s| > 65504 (InvalidArgument).
  std::unique_ptr<QuantWeight> load_gptq(const GptqHostTensors& tensors);
  // out[m, n] = a[m, k] · dequant(w)  (w is [k, n] as GPTQ stores it).
  // CudaBackend: a and out 16-byte aligned.
  void gemm_gptq(const Buffer& a /*[m, k]*/, const QuantWeight& w, Buffer& out /*[m, n]*/,
                 std::size_t m);
  // gemm_silu_mul for a GPTQ gate|up weight: act[t, j] = silu(g) · u with
  // g = gate_up[t, 2j], u = gate_up[t, 2j + 1] and gate_up = gemm_gptq(a, w)
  // (w.n() = 2 * im, its output columns interleaving gate and up: column 2j
  // = gate_j, 2j + 1 = up_j). The bits of gemm_gptq into gate_up followed
  // by silu·mul of each pair (fp32 math, one rounding), and that is what a
  // backend may run: gate_up is a workspace, its contents unspecified after
  // the call. CudaBackend (CudaBackendConfig::gptq_fuse_silu_mul, on by
  // default) fuses the two where the streaming GPTQ kernel takes the launch
  // with its bulk source, m <= 8 and one split (llama-style decode shapes):
  // silu·mul in its epilogue, gate_up neither written nor read. a and
  // gate_up 16-byte aligned on CudaBackend. gate_up and act must not overlap a.
  void gemm_silu_mul_gptq(const Buffer& a /*[m, k]*/, const QuantWeight& w /*[k, 2*im], (gate, up) columns*/,
                          Buffer& gate_up /*[m, 2*im], workspace*/, Buffer& act /*[m, im]*/, std::size_t m);
  // The residual add and the RMSNorm around GPTQ projections, in a form a
  // backend can fuse into the projections (CudaBackend's streaming GPTQ
  // kernel; docs/design/gptq_small_m.md §13.6): the op that writes the
  // residual also leaves its per-row sums of squares, and the norm reads
  // them instead of the row. row_sq [rows, ceil(cols / 16)] f32: element
  // (r, g) = the sum over columns 16g .. min(16g + 16, cols) - 1 of row r's
  // squares, as stored (rounded to the dtype), summed in an order each
  // backend fixes.
  //
  // row_sq of x [rows, cols] (e.g. the embedding's rows, for the first
  // layer's norm).
  void row_sum_squares(const Buffer& x /*[rows, cols]*/, Buffer& row_sq /*[rows, ceil(cols/16)] f32*/,
                       std::size_t rows, std::size_t cols);
  // residual = residual + gemm_gptq(a, w) (each rounded to the dtype, as
  // gemm_gptq then fused_add_rms_norm's add); row_sq of the new residual.
  // out is a workspace, its contents unspecified after the call (a fusing
  // backend never writes it; a composing one stores the GEMM there first).
  // No two of a, out, residual and row_sq may overlap.
  void gemm_gptq_add_residual(const Buffer& a /*[m, k]*/, const QuantWeight& w, Buffer& out /*[m, n], workspace*/,
                              Buffer& residual /*[m, n], in/out*/, Buffer& row_sq /*[m, ceil(n/16)] f32*/,
                              std::size_t m);
  // normed = rms_norm(x) * norm_w (f32 math, one rounding, as rms_norm) with
  // mean(x²) = (sum over g of row_sq[r, g]) / k, row_sq being x's (as
  // gemm_gptq_add_residual or row_sum_squares left it); out =
  // gemm_gptq(normed, w). normed is a workspace, its contents unspecified
  // after the call (a fusing backend never writes it). The outputs (normed,
  // out; gate_up and act below) overlap none of x, row_sq and norm_w.
  void rms_norm_gemm_gptq(const Buffer& x /*[m, k]*/, const Buffer& row_sq /*[m, ceil(k/16)] f32*/,
                          const Buffer& norm_w /*[k]*/, float eps, const QuantWeight& w,
                          Buffer& normed /*[m, k], workspace*/, Buffer& out /*[m, n]*/, std::size_t m);
  // The same norm, then gemm_silu_mul_gptq (gate_up a workspace, as there).
  void rms_norm_gemm_silu_mul_gptq(const Buffer& x /*[m, k]*/, const Buffer& row_sq /*[m, ceil(k/16)] f32*/,
                                   const Buffer& norm_w /*[k]*/, float eps,
                                   const QuantWeight& w /*[k, 2*im], (gate, up) columns*/,
                                   Buffer& normed /*[m, k], workspace*/, Buffer& gate_up /*[m, 2*im], workspace*/,
                                   Buffer& act /*[m, im]*/, std::size_t m);
  // Routes by w.kind(): Gptq -> gemm_gptq; other kinds are Unsupported.
  void gemm_quant(const Buffer& a /*[m, k]*/, const QuantWeight& w, Buffer& out /*[m, n]*/,
                  std::size_t m);

  // ── Tensor-parallel collectives ───────────────────────────────────────
  // At world size 1 these are identities: all_reduce leaves buf as is,
  // all_gather copies local into global, broadcast needs src_rank == 0,
  // reduce_scatter copies input into output. A CudaBackend with a
  // Communicator (communicator.hpp) runs them over NCCL on its stream
  // (capture-safe); a world size above 1 without a communicator throws
  // Unsupported, never a silent no-op. f16, bf16 and f32. all_gather's local
  // and reduce_scatter's output may share memory with the full buffer only
  // as its rank's slice [rank * len, (rank + 1) * len) (in place); any other
  // overlap is InvalidArgument.
  virtual std::size_t world_size() const noexcept { return 1; }
  virtual std::size_t rank() const noexcept { return 0; }
  void all_reduce(Buffer& buf /*[len], in place*/, std::size_t len, ReduceOp op);
  void all_gather(const Buffer& local /*[local_len]*/, Buffer& global /*[world * local_len]*/,
                  std::size_t local_len);
  void broadcast(Buffer& buf /*[len], in place*/, std::size_t len, std::size_t src_rank);
  // output = op over ranks of input[rank * len .. +len): each rank gets its
  // own len-slice of the reduced [world_size * len].
  void reduce_scatter(const Buffer& input /*[world_size * len]*/, Buffer& output /*[len]*/, std::size_t len,
                      ReduceOp op);

 protected:
  Backend();
  // Each backend's constructor says how its allocations are freed: a
  // function that needs nothing of the backend object but `device`.
  void set_deallocator(void (*free)(void* ptr, int device) noexcept, int device) noexcept;

  // Called before any op error is thrown: a backend that is capturing a
  // graph ends and discards the capture, leaving its stream usable.
  friend class detail::OpCheck;
  virtual void abandon_capture() noexcept {}

  // Memory hooks used by Buffer.
  friend class Buffer;
  virtual void* allocate_bytes(std::size_t bytes) = 0;
  // alloc_host's memory, freed by the same deallocator as allocate_bytes'.
  virtual void* allocate_host_bytes(std::size_t bytes) = 0;
  // Buffer::wrap: throws ferrum::Error (naming Buffer::wrap and 'ptr') when
  // this backend's ops cannot touch `bytes` bytes at `ptr`; else returns
  // whether it is host memory rather than the backend's own (Buffer::
  // host_memory). Default: any memory, the backend's own. CpuBackend refuses
  // CUDA device memory (asking the CUDA driver, which creates no context for
  // it); CudaBackend answers true for page-locked host memory.
  virtual bool check_wrapped(const void* ptr, std::size_t bytes) const {
    (void)ptr;
    (void)bytes;
    return false;
  }
  // An allocation of this backend's, which the Buffer frees.
  Buffer make_buffer(void* data, DType dtype, std::size_t numel, bool host_memory) {
    return Buffer(owner_, data, dtype, numel, /*alloc=*/data, host_memory);
  }
  // For the QuantWeights a backend makes (QuantWeight::backend()).
  detail::BackendRef backend_ref() const noexcept { return detail::BackendRef(owner_); }

  // `op`: the public op the copy serves (upload, download, all_gather, ...),
  // which a failure's message names.
  virtual void do_write_bytes(const char* op, Buffer& dst, std::size_t dst_byte_offset, const void* host,
                              std::size_t bytes) = 0;
  virtual void do_read_bytes(const char* op, const Buffer& src, std::size_t src_byte_offset, void* host,
                             std::size_t bytes) = 0;
  virtual void do_copy_slice(const char* op, const Buffer& src, std::size_t src_offset, Buffer& dst,
                             std::size_t dst_offset, std::size_t len) = 0;
  virtual void do_set_decode_state(std::int32_t token, std::int32_t pos, std::int32_t kv_len) = 0;
  virtual void do_advance_decode_state(const Buffer& next_token, Buffer& token_log) = 0;

  virtual void do_begin_graph_capture();
  virtual void do_end_graph_capture();
  virtual bool do_replay_last_graph();
  virtual void do_reset_graph();

  virtual void do_rms_norm(const Buffer& x, const Buffer& w, float eps, Buffer& out,
                           std::size_t tokens, std::size_t dim) = 0;
  virtual void do_fused_add_rms_norm(Buffer& residual, const Buffer& x, const Buffer& w, float eps,
                                     Buffer& out, std::size_t tokens, std::size_t dim) = 0;
  virtual void do_layer_norm(const Buffer& x, const Buffer& gamma, const Buffer& beta, float eps,
                             Buffer& out, std::size_t tokens, std::size_t dim) = 0;
  virtual void do_gelu(const Buffer& x, Buffer& out, std::size_t len, GeluApproximation approx) = 0;
  virtual void do_add_bias(Buffer& data, const Buffer& bias, std::size_t rows, std::size_t cols) = 0;
  virtual void do_add_inplace(Buffer& residual, const Buffer& x, std::size_t len) = 0;
  virtual void do_argmax(const Buffer& x, Buffer& out, std::size_t rows, std::size_t cols) = 0;
  virtual void do_gemm(const Buffer& a, const Buffer& b, Buffer& out, std::size_t m, std::size_t n,
                       std::size_t k) = 0;
  virtual void do_gemm_silu_mul(const Buffer& a, const Buffer& w, Buffer& gate_up, Buffer& act, std::size_t m,
                                std::size_t im, std::size_t k) = 0;
  // use_decode_state: read the token from the decode state (tokens == 1).
  virtual void do_embedding_lookup(const Buffer& table, const Buffer& ids, Buffer& out,
                                   std::size_t tokens, std::size_t dim, std::size_t vocab,
                                   bool use_decode_state) = 0;
  virtual void do_split_qkv(const Buffer& qkv, Buffer& q, Buffer& k, Buffer& v, std::size_t tokens,
                            std::size_t q_dim, std::size_t kv_dim) = 0;
  virtual void do_fused_silu_mul_split(const Buffer& gate_up, Buffer& out, std::size_t tokens,
                                       std::size_t im) = 0;
  virtual void do_qk_norm_rope(const Buffer& input, const Buffer* norm_w, const Buffer& cos,
                               const Buffer& sin, Buffer& output, std::size_t tokens,
                               std::size_t heads, std::size_t head_dim, std::size_t pos_offset,
                               std::size_t max_pos, float eps, RopeMode mode,
                               bool use_decode_state) = 0;
  // use_decode_state: pos is the decode state's (tokens == 1).
  virtual void do_qkv_rope_append(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                                  const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache,
                                  std::size_t tokens, std::size_t pos_offset, const QkvRopeAppendConfig& cfg,
                                  bool use_decode_state) = 0;
  // Default: Unsupported (a backend that implements it says so in supports()).
  virtual void do_qkv_rope_append_ragged(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm,
                                         const Buffer& cos, const Buffer& sin, Buffer& q_out, Buffer& k_cache,
                                         Buffer& v_cache, const Buffer& positions, std::size_t batch,
                                         const QkvRopeAppendConfig& cfg);
  virtual void do_kv_cache_append_head_major(Buffer& cache_k, Buffer& cache_v, std::size_t cache_len,
                                             std::size_t capacity, const Buffer& new_k,
                                             const Buffer& new_v, std::size_t new_tokens,
                                             std::size_t nkv, std::size_t hd,
                                             bool use_decode_state) = 0;
  virtual void do_transpose_head_to_token(const Buffer& src, Buffer& dst, std::size_t tokens,
                                          std::size_t heads, std::size_t dim) = 0;
  // use_decode_state: kv_len comes from the decode state (q_len == 1).
  virtual void do_flash_attention(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                  std::size_t batch, std::size_t q_len, std::size_t kv_len,
                                  std::size_t pos_offset, const AttnConfig& cfg,
                                  bool use_decode_state);
  virtual void do_flash_decode_ragged(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                                     const Buffer& kv_lens, std::size_t batch, const AttnConfig& cfg);
  virtual void do_mla_attention(const Buffer& q, const Buffer& kv_latent, Buffer& out,
                                std::size_t batch, std::size_t q_len, std::size_t kv_len,
                                const MlaConfig& cfg);
  virtual std::unique_ptr<QuantWeight> do_load_gptq(const GptqHostTensors& tensors);
  // op: the public op that called it (gemm_gptq, gemm_quant, or
  // gemm_silu_mul_gptq's fallback), whose name its refusals carry.
  virtual void do_gemm_gptq(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m, const char* op);
  virtual void do_gemm_silu_mul_gptq(const Buffer& a, const QuantWeight& w, Buffer& gate_up, Buffer& act,
                                     std::size_t m);
  // The four row_sq ops (default: Unsupported).
  virtual void do_row_sum_squares(const Buffer& x, Buffer& row_sq, std::size_t rows, std::size_t cols);
  virtual void do_gemm_gptq_add_residual(const Buffer& a, const QuantWeight& w, Buffer& out, Buffer& residual,
                                         Buffer& row_sq, std::size_t m);
  virtual void do_rms_norm_gemm_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                                     const QuantWeight& w, Buffer& normed, Buffer& out, std::size_t m);
  virtual void do_rms_norm_gemm_silu_mul_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w,
                                              float eps, const QuantWeight& w, Buffer& normed, Buffer& gate_up,
                                              Buffer& act, std::size_t m);
  virtual void do_all_reduce(Buffer& buf, std::size_t len, ReduceOp op);
  virtual void do_all_gather(const Buffer& local, Buffer& global, std::size_t local_len);
  virtual void do_broadcast(Buffer& buf, std::size_t len, std::size_t src_rank);
  virtual void do_reduce_scatter(const Buffer& input, Buffer& output, std::size_t len, ReduceOp op);

 private:
  // alloc and alloc_host: one set of checks, then device (host = false) or
  // host memory.
  Buffer checked_alloc(const char* op, DType dtype, std::size_t numel, bool host);
  // write and upload: f32 values converted into dst, errors under `op`.
  void checked_write(const char* op, Buffer& dst, std::span<const float> host, std::size_t dst_offset);

  bool device_state_mode_ = false;
  std::shared_ptr<detail::BufferOwner> owner_;  // every Buffer of this backend holds it too
};

// CUDA devices visible to this process; 0 when there is no driver or GPU,
// and in a library built without CUDA (FERRUM_CUDA=OFF).
int cuda_device_count() noexcept;

// CudaBackend on device 0 when a GPU is present that this build's kernels
// run on, else CpuBackend (no GPU, or CudaBackend's constructor refusing
// device 0 as Unsupported). Other errors of CudaBackend's constructor (the
// driver, memory) throw.
std::unique_ptr<Backend> make_default_backend();
// The same with CudaBackend built from `config`; when it returns CpuBackend,
// *why (if given) says why: built without CUDA (FERRUM_CUDA=OFF), no CUDA
// device visible, or the Unsupported error's message.
struct CudaBackendConfig;
std::unique_ptr<Backend> make_default_backend(const CudaBackendConfig& config, std::string* why = nullptr);

}  // namespace ferrum
