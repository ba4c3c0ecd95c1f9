// CudaBackend: the GPU implementation. All CudaBackend objects on one device
// share one process-global runtime: the stream every op is queued on, the
// cuBLAS handle with its workspace and device-resident alpha/beta, the
// decode-state buffers and the graph slot. They are process-global because a
// captured graph holds raw pointers to all of them, and must stay valid for
// as long as the graph exists, whatever the engine does with its backend
// objects. They are never freed before process exit.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "ferrum/backend.hpp"
#include "ferrum/communicator.hpp"

typedef struct CUstream_st* cudaStream_t;

namespace ferrum {

namespace detail {
struct CudaRuntime;
}

// Which INT4 kernel gemm_gptq runs for launches of up to 64 rows on a
// fused-layout weight (kernels/gptq_gemm.hpp). The streaming kinds cover
// m <= 16 (larger launches take the fused kernel); layouts no kernel covers,
// and m past the crossover, take the dequantize + cuBLAS path. The kernels
// sum in different orders: on general data their bits differ (each is
// deterministic).
enum class GptqKernel {
  // The library's choice: Wgmma where it runs and measured faster
  // (kernels::gptq_wgmma_preferred: above 16 rows; at 9..16 by column
  // groups of 256: 12 or more but 16, 16 where k <= 8192 or at 16 rows,
  // 8..11 where k <= 4096, 4..7 where k <= 3072); else
  // StreamBulk for m <= 16 (without bulk copies: Stream for m <= 8, then
  // Fused) and Fused above.
  Auto = 0,
  Fused = 1,   // the fused kernel (shared-memory cp.async pipeline)
  Stream = 2,  // the register-streaming kernel for every m <= 16
  // The same streaming kernel with its weights, activation rows and scale
  // rows brought into warp-private shared-memory rings by bulk copies (the
  // TMA engine, sm_90+), for every m <= 16; below sm_90, and for groups of
  // 16 rows, the register source runs.
  StreamBulk = 3,
  // The warpgroup-MMA kernel (kernels/gptq_gemm_wgmma.cu) for every launch:
  // sm_90a builds on a 9.0 device; elsewhere the fused kernel runs.
  Wgmma = 4,
};

// Which kernel flash_attention runs at prefill (q_len > 1). Both are
// checked against the CPU reference. Nothing promises that they agree to
// the bit (they have on every spec the tests run, H100, session 58).
enum class PrefillKernel {
  // The wgmma kernel (kernels/attention_prefill_wgmma.cu) where it applies:
  // a build with sm_90a code (CMAKE_CUDA_ARCHITECTURES holding 90a, the
  // default, and not plain 90 as well: with both, the wgmma kernels stay
  // out of the build) on a compute-capability 9.0 device (H100 / H200),
  // head_dim 64 or 128. Elsewhere MmaSync.
  Auto = 0,
  MmaSync = 1,  // the mma.sync kernel (kernels/attention_prefill.cu), sm_80+, every head_dim
};

// The largest CudaBackendConfig::gemm_skinny_max_m (the skinny decode
// kernel's rows per launch).
inline constexpr int kGemmSkinnyMaxM = 16;
// The largest CudaBackendConfig::gptq_stream_ctas_per_sm.
inline constexpr int kGptqStreamMaxCtasPerSm = 16;

struct CudaBackendConfig {
  int device = 0;
  // cuBLAS workspace, set once per device with cublasSetWorkspace. The first
  // CudaBackend on a device decides it; later ones must agree.
  std::size_t cublas_workspace_bytes = std::size_t{32} << 20;
  // Split-K scratch of decode attention, allocated once with the runtime
  // (ops never allocate). A decode call needs batch * num_heads * splits *
  // (head_dim + 1) floats, splits (at most 16) from the cache capacity:
  // attention_decode_workspace_bytes below gives the bytes for an engine's
  // largest batch and capacity; a call needing more throws
  // CapacityExceeded naming this field. Like the cuBLAS workspace, the
  // first CudaBackend on a device decides it.
  std::size_t attention_workspace_bytes = std::size_t{256} << 20;
  // Tensor parallelism: the collectives run over this communicator, and
  // world_size() / rank() come from it. Its device must be `device`. Null:
  // world size 1 (the collectives are identities). A graph this backend
  // captures keeps it alive while the device's slot holds that graph (its
  // collectives are nodes of the graph), past the backend if need be: it is
  // then released by the reset_graph or end_graph_capture that drops the
  // graph (on any backend of the device; NCCL may then tear down its group),
  // and never if the graph is still held at exit. Reset the graph before
  // building new communicators for the same devices.
  std::shared_ptr<Communicator> communicator;
  // With a communicator, synchronize() (and the blocking reads / writes,
  // reset_graph) wait at most this long for the stream; past it, or on an
  // asynchronous NCCL error (a peer gone), the communicator is aborted and
  // they throw ErrorCode::Nccl. A held graph with its collectives is
  // destroyed first (NCCL's abort waits for it): held_graph() is then 0.
  // Must be positive.
  std::chrono::milliseconds collective_timeout{60000};
  // gemm with m <= gemm_skinny_max_m (0..kGemmSkinnyMaxM) takes the skinny decode kernel
  // (kernels/gemm_skinny.cu) where it applies; larger m, and 0, use cuBLAS.
  // -1: the library's measured per-shape default (kernels/gemm_skinny.hpp,
  // gemm_skinny_default), which takes it where it beat cuBLAS on the H200.
  int gemm_skinny_max_m = -1;
  // The decode-step kernels (norms, elementwise, RoPE, row copies, skinny
  // GEMM, decode attention) launch with programmatic dependent launch on
  // sm_90+ (kernels/common/launch.cuh); false launches them the ordinary
  // way (an A/B switch: results are identical either way). Like the
  // workspaces, the first CudaBackend on a device decides it; later ones
  // must agree.
  bool programmatic_dependent_launch = true;
  // Two switches of the decode step (see kernels/common/launch.cuh; results
  // are bitwise the same either way). pdl_early_trigger, on by default: the
  // norms, SiLU·mul and decode attention let the next kernel launch while
  // they run (griddepcontrol.launch_dependents; needs
  // programmatic_dependent_launch). On the H200 (session 11) it took the
  // llama3-8b GPTQ decode from 406 to 428 tok/s (f16, graph; bf16 388 to
  // 410) and left the f16 one level (237-239 tok/s either way).
  // gemm_prefetch_before_wait, off by default (measured slower): the skinny
  // GEMM asks L2 for its first round of weights before it waits on the
  // previous kernel. Per device, like programmatic_dependent_launch.
  bool pdl_early_trigger = true;
  bool gemm_prefetch_before_wait = false;
  // Off by default (an A/B switch; results are bitwise the same either
  // way): a GEMM -> norm -> GEMM chain of a decode step released one launch
  // further ahead. The GPTQ streaming kernel's bulk source triggers the next
  // kernel right after its own wait, and the norms and SiLU·mul trigger
  // theirs before their wait (not after it, as pdl_early_trigger does), so
  // the second GEMM's CTAs can become resident in the slots the first leaves
  // free (see gptq_stream_ctas_per_sm) and, under gemm_weights_before_wait,
  // stream their first weights while the first GEMM still streams its own
  // (docs/design/gptq_small_m.md §13.4). On the H200 (session 24), with
  // gptq_stream_ctas_per_sm = 3 and the promise, the llama3-8b GPTQ graph
  // decode went 458-468 -> 473-477 tok/s; alone it was level (458 / 459),
  // as was the cap alone. Off here because it pays only with the promise
  // and the cap (ferrum_engine turns all three on for a GPTQ model decoding
  // one sequence from a graph). Needs programmatic_dependent_launch. Per device, like
  // programmatic_dependent_launch.
  bool pdl_chain_release = false;
  // On by default: the GPTQ streaming kernel's bulk source reads its weights
  // and scale rows with an L2 evict-first policy (as the skinny dense GEMM
  // always does), so that a weight stream larger than L2 does not push out
  // what the small ops between the GEMMs reuse (the residual, the norm
  // weights, the KV cache). On the H200 (session 21) the llama3-8b GPTQ
  // graph decode went 434-437 -> 443-448 tok/s with it; the norms, RoPE and
  // decode attention in the step got 0.2-0.4 us faster each, q|k|v, gate|up
  // and down 0.3-0.8 us (o level). Results are bitwise the same (an A/B
  // switch). Per device, like programmatic_dependent_launch.
  bool gptq_weights_evict_first = true;
  // A promise, off by default: no kernel ordered before a gemm,
  // gemm_silu_mul, gemm_gptq or gemm_silu_mul_gptq on its stream (or in its
  // graph) that may not have completed writes the weight operand (gemm's b,
  // gemm_silu_mul's w, the GPTQ ops' QuantWeight). True for model weights
  // loaded before decoding; false, e.g., when b is the output of the op just
  // before. With it, the skinny SIMT decode GEMM (m <= 2) reads its first
  // round of weights into registers, and the GPTQ streaming kernel's bulk
  // source requests its first ring fills' weights and scale rows, before
  // they wait on the previous kernel (PDL), so that DRAM latency overlaps
  // the previous kernel's tail; and gemm_silu_mul_gptq's fused launch
  // releases the kernel after it (an engine's down projection) right after
  // its own wait, so that kernel's weight stream starts during it (llama3-8b
  // GPTQ graph decode 439-446 -> 467-469 tok/s, session 22). Results are
  // bitwise the same. Per device, like programmatic_dependent_launch.
  bool gemm_weights_before_wait = false;
  // A promise, off by default: when a decode flash_attention or
  // flash_decode_ragged (q_len = 1) starts, no kernel ordered before it that
  // may not have completed writes a sequence's kv_len (the decode state's or
  // kv_lens) or its keys and values below the newest row (kv_len - 1). True
  // for a decode step whose one new row is appended by the op just before
  // the attention (qkv_rope_append, kv_cache_append_head_major) and whose
  // older rows by earlier steps: ferrum's kernels release the next one only
  // after their own wait, so every kernel two launches back has completed
  // (under pdl_chain_release the norms and SiLU·mul release theirs before
  // it: then the op just before the attention must not be one of them).
  // With it, the decode attention requests each warp's first sub-tile of
  // those rows before it waits on the previous kernel (PDL), and
  // qkv_rope_append releases the kernel after it right after its own wait,
  // so the attention's K / V stream starts during the append; Q, the newest
  // row and every write come after the wait. Results are bitwise the same.
  // Per device, like programmatic_dependent_launch. Measured (H100, session
  // 65): qwen3-0.6b f16 graph decode +1.6 %, llama3-8b GPTQ -1.4 %; session
  // 30's attention half alone was level (docs/design/decode_attention.md
  // §4.7, §4.23).
  bool attention_kv_before_wait = false;
  // The GPTQ INT4 kernel per launch of up to 64 rows (see GptqKernel); with
  // gptq_fused_max_m = -1 it also picks the crossover rule (Auto and Wgmma
  // where the wgmma kernel runs: that kernel's). Per backend object (it
  // changes no workspace). A value outside the enum throws InvalidArgument
  // naming this field.
  GptqKernel gptq_kernel = GptqKernel::Auto;
  // GptqKernel::StreamBulk: chunks (4 KiB of weights each) each warp keeps
  // in flight in its shared-memory ring, 1..6; 0: the library's choice (the
  // most that keep 4 CTAs per SM). An A/B switch; outside [0, 6] throws
  // InvalidArgument naming this field.
  int gptq_stream_ring = 0;
  // The streaming GPTQ kernel plans its splits for at most this many CTAs
  // per SM, 1..kGptqStreamMaxCtasPerSm; 0: every resident slot (the
  // default, measured fastest standalone). Fewer CTAs leave room for the
  // next kernel's CTAs, which PDL may start early in a decode step's GEMM ->
  // norm -> GEMM chain (pdl_chain_release; docs/design/gptq_small_m.md
  // §13.4): llama3-8b GPTQ graph decode +2 % with both at 3; alone 2 lost
  // 5 %, 3 was level or 1 % slower, 4 level (session 24). Fewer splits sum
  // in another order, so outputs may differ in the last bits. An A/B
  // switch; outside [0, 16] throws InvalidArgument naming this field. Per
  // backend object.
  int gptq_stream_ctas_per_sm = 0;
  // GptqKernel::StreamBulk launches split over k into 2..8 CTAs, of at most
  // 3 CTAs per SM (kernels/gptq_gemm.hpp, kGptqClusterMaxCtasPerSm), and
  // wgmma launches of 2..8 splits: the splits of a column block (group) run
  // as one thread-block cluster and sum through distributed shared memory
  // instead of the workspace, with no fence or atomic (the same bits either
  // way: the same sums in the same order). On by default: on the H200 it
  // wins 4-11 % on one-wave streaming launches (4096 x 4096, 4096 x 6144)
  // and lost ~20 % on larger ones (session 12), hence the CTA-per-SM gate;
  // the llama3-8b GPTQ engine decodes 3.5-4 % faster with it (session 13);
  // the wgmma kernel at 8192 x 8192, m = 64, 85.8 -> 50.3 us (session 17),
  // and 2-4x on 4096 x 4096 at 6 and 8 splits (m = 64, 8 splits: 65.1
  // against 18.1 us; session 46). false: the workspace reduction everywhere
  // (an A/B switch, slow on the wgmma kernel). Per backend object.
  bool gptq_cluster_reduce = true;
  // gemm_silu_mul_gptq computes silu·mul in the GPTQ streaming kernel's
  // epilogue where that kernel takes the launch with its bulk source, m <= 8
  // and one split (kernels::launch_gptq_gemm_silu_mul), instead of storing
  // gate_up and running the pairs kernel after it. The same bits either way
  // (an A/B switch). Per backend object.
  bool gptq_fuse_silu_mul = true;
  // gemm_gptq_add_residual runs as one GPTQ launch where the streaming kernel
  // takes it (the residual add and row_sq in its final store): the same bits
  // as its composition (gemm_gptq and the add-and-sum kernel), which runs
  // where it does not and with this off (an A/B switch). Per backend object.
  // (rms_norm_gemm_gptq and its SiLU·mul form always run the norm kernel
  // first: the norm inside the GEMM measured slower, docs/design/gptq_small_m.md §13.7.)
  bool gptq_fuse_residual_add = true;
  // The largest m for which gemm_gptq runs the INT4 kernels on a fused-layout
  // weight (in launches of 64 rows); larger m dequantize the weight in column
  // chunks and call cuBLAS. -1: the library's rule, by the weight's size and
  // the kernel of the launches above 16 rows (kernels::gptq_fused_max_m,
  // measured on the H200: with wgmma 96 at 4096 x 4096 up to 256 at 8192 x
  // 28672; with the fused kernel 32 up to 192); 0: dequantize + cuBLAS at
  // every m. The paths sum in different orders, so on general data their
  // bits differ (each is deterministic). gptq_kernel applies only to m that
  // run the INT4 kernels.
  // Per backend object. Below -1 throws InvalidArgument naming this field.
  int gptq_fused_max_m = -1;
  // The prefill attention kernel (see PrefillKernel). Per backend object. A
  // value outside the enum throws InvalidArgument naming this field.
  PrefillKernel prefill_kernel = PrefillKernel::Auto;
};

// The bytes of CudaBackendConfig::attention_workspace_bytes that a decode
// (flash_attention with q_len 1, or flash_decode_ragged) of `batch`
// sequences of `num_heads` q heads of `head_dim` over caches of
// `kv_seq_stride` positions needs (the split count follows the capacity
// alone, so this is the need of every kv_len up to it). Throws
// InvalidArgument for a zero argument or one past what the kernels index
// (2^31 - 1), and for a product past 2^64.
std::size_t attention_decode_workspace_bytes(std::size_t batch, std::size_t num_heads, std::size_t head_dim,
                                             std::size_t kv_seq_stride);

// In a library built without CUDA (FERRUM_CUDA=OFF) this header is the
// same, and the constructor throws Unsupported naming FERRUM_CUDA.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(CudaBackendConfig config = {});
  ~CudaBackend() override;

  BackendKind kind() const noexcept override { return BackendKind::Cuda; }
  std::string name() const override;
  bool supports(Op op) const noexcept override;
  // Attention: head_dim 64, 128 or 256; RoPE ops: head_dim <= 512.
  bool supports_head_dim(Op op, std::size_t head_dim) const noexcept override;
  void synchronize() override;
  bool is_capturing() const noexcept override;
  std::uint64_t held_graph() const noexcept override;
  // A captured graph points at the memory its ops used, and the library
  // cannot see which. So library memory (a Buffer's allocation, a GPTQ
  // weight's memory and workspace) freed while this device's graph slot
  // holds a graph, or while a capture is open, is kept until every graph
  // that may point at it is dropped (reset_graph, or replaced by the next
  // end_graph_capture: then what only the old graph could use is freed) and
  // freed then, whether the graph used it or not: a replay never touches
  // freed memory. Returns how many allocations are kept so now; an engine
  // that frees much while holding a graph resets the graph first. Memory
  // passed in through Buffer::wrap is the caller's: it must outlive every
  // graph that captured an op on it.
  std::size_t graph_retained_allocations() const noexcept;

  int device() const noexcept { return device_; }
  std::size_t world_size() const noexcept override;
  std::size_t rank() const noexcept override;
  // The attached communicator; null at world size 1.
  const std::shared_ptr<Communicator>& communicator() const noexcept { return comm_; }
  // The stream every op of this device is queued on (for interop: engines
  // that launch their own kernels between ours must use it too). A capture
  // the caller opens on it directly (cudaStreamBeginCapture) is not the
  // graph slot's: memory the library frees meanwhile is not kept for it
  // (graph_retained_allocations), so such a graph must not outlive the
  // Buffers it captured; begin_graph_capture does keep them. While it is
  // open, is_capturing() is true, and synchronize, the setup ops,
  // begin_graph_capture, replay_last_graph and reset_graph refuse
  // (GraphCapture) as during the slot's own capture, leaving it open;
  // end_graph_capture leaves it to the caller too.
  cudaStream_t stream() const noexcept;
  // CudaBackendConfig::gptq_kernel of this backend.
  GptqKernel gptq_kernel() const noexcept { return gptq_kernel_; }
  // CudaBackendConfig::gptq_stream_ring of this backend.
  int gptq_stream_ring() const noexcept { return gptq_stream_ring_; }
  // CudaBackendConfig::gptq_stream_ctas_per_sm of this backend.
  int gptq_stream_ctas_per_sm() const noexcept { return gptq_stream_ctas_per_sm_; }
  // CudaBackendConfig::gptq_cluster_reduce of this backend.
  bool gptq_cluster_reduce() const noexcept { return gptq_cluster_reduce_; }
  // CudaBackendConfig::gptq_fused_max_m of this backend.
  int gptq_fused_max_m() const noexcept { return gptq_fused_max_m_; }
  // CudaBackendConfig::gptq_fuse_silu_mul of this backend.
  bool gptq_fuse_silu_mul() const noexcept { return gptq_fuse_silu_mul_; }
  // CudaBackendConfig::gptq_fuse_residual_add of this backend.
  bool gptq_fuse_residual_add() const noexcept { return gptq_fuse_residual_add_; }
  // CudaBackendConfig::prefill_kernel of this backend.
  PrefillKernel prefill_kernel() const noexcept { return prefill_kernel_; }

 protected:
  void abandon_capture() noexcept override;
  void* allocate_bytes(std::size_t bytes) override;
  void* allocate_host_bytes(std::size_t bytes) override;  // cudaHostAlloc, portable
  // Device memory of this backend's device, or pinned / managed host memory
  // (reachable from kernels); pageable host memory and another device's
  // memory are refused.
  bool check_wrapped(const void* ptr, std::size_t bytes) const override;
  void do_write_bytes(const char* op, Buffer& dst, std::size_t dst_byte_offset, const void* host,
                      std::size_t bytes) override;
  void do_read_bytes(const char* op, const Buffer& src, std::size_t src_byte_offset, void* host,
                     std::size_t bytes) override;
  void do_copy_slice(const char* op, const Buffer& src, std::size_t src_offset, Buffer& dst,
                     std::size_t dst_offset, std::size_t len) override;
  void do_set_decode_state(std::int32_t token, std::int32_t pos, std::int32_t kv_len) override;
  void do_advance_decode_state(const Buffer& next_token, Buffer& token_log) override;

  void do_begin_graph_capture() override;
  void do_end_graph_capture() override;
  bool do_replay_last_graph() override;
  void do_reset_graph() override;

  void do_rms_norm(const Buffer& x, const Buffer& w, float eps, Buffer& out, std::size_t tokens,
                   std::size_t dim) override;
  void do_fused_add_rms_norm(Buffer& residual, const Buffer& x, const Buffer& w, float eps,
                             Buffer& out, std::size_t tokens, std::size_t dim) override;
  void do_layer_norm(const Buffer& x, const Buffer& gamma, const Buffer& beta, float eps,
                     Buffer& out, std::size_t tokens, std::size_t dim) override;
  void do_gelu(const Buffer& x, Buffer& out, std::size_t len, GeluApproximation approx) override;
  void do_add_bias(Buffer& data, const Buffer& bias, std::size_t rows, std::size_t cols) override;
  void do_add_inplace(Buffer& residual, const Buffer& x, std::size_t len) override;
  void do_argmax(const Buffer& x, Buffer& out, std::size_t rows, std::size_t cols) override;
  void do_qkv_rope_append(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                          const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache, std::size_t tokens,
                          std::size_t pos_offset, const QkvRopeAppendConfig& cfg, bool use_decode_state) override;
  void do_qkv_rope_append_ragged(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                                 const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache,
                                 const Buffer& positions, std::size_t batch, const QkvRopeAppendConfig& cfg) override;
  void do_gemm(const Buffer& a, const Buffer& b, Buffer& out, std::size_t m, std::size_t n,
               std::size_t k) override;
  void do_gemm_silu_mul(const Buffer& a, const Buffer& w, Buffer& gate_up, Buffer& act, std::size_t m, std::size_t im,
                        std::size_t k) override;
  void do_embedding_lookup(const Buffer& table, const Buffer& ids, Buffer& out, std::size_t tokens,
                           std::size_t dim, std::size_t vocab, bool use_decode_state) override;
  void do_split_qkv(const Buffer& qkv, Buffer& q, Buffer& k, Buffer& v, std::size_t tokens,
                    std::size_t q_dim, std::size_t kv_dim) override;
  void do_fused_silu_mul_split(const Buffer& gate_up, Buffer& out, std::size_t tokens,
                               std::size_t im) override;
  void do_qk_norm_rope(const Buffer& input, const Buffer* norm_w, const Buffer& cos,
                       const Buffer& sin, Buffer& output, std::size_t tokens, std::size_t heads,
                       std::size_t head_dim, std::size_t pos_offset, std::size_t max_pos, float eps,
                       RopeMode mode, bool use_decode_state) override;
  void do_kv_cache_append_head_major(Buffer& cache_k, Buffer& cache_v, std::size_t cache_len,
                                     std::size_t capacity, const Buffer& new_k, const Buffer& new_v,
                                     std::size_t new_tokens, std::size_t nkv, std::size_t hd,
                                     bool use_decode_state) override;
  void do_transpose_head_to_token(const Buffer& src, Buffer& dst, std::size_t tokens,
                                  std::size_t heads, std::size_t dim) override;
  void do_flash_attention(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out, std::size_t batch,
                          std::size_t q_len, std::size_t kv_len, std::size_t pos_offset, const AttnConfig& cfg,
                          bool use_decode_state) override;
  void do_flash_decode_ragged(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                              const Buffer& kv_lens, std::size_t batch, const AttnConfig& cfg) override;
  std::unique_ptr<QuantWeight> do_load_gptq(const GptqHostTensors& tensors) override;
  void do_gemm_gptq(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m, const char* op) override;
  void do_gemm_silu_mul_gptq(const Buffer& a, const QuantWeight& w, Buffer& gate_up, Buffer& act,
                             std::size_t m) override;
  void do_row_sum_squares(const Buffer& x, Buffer& row_sq, std::size_t rows, std::size_t cols) override;
  void do_gemm_gptq_add_residual(const Buffer& a, const QuantWeight& w, Buffer& out, Buffer& residual,
                                 Buffer& row_sq, std::size_t m) override;
  void do_rms_norm_gemm_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                             const QuantWeight& w, Buffer& normed, Buffer& out, std::size_t m) override;
  void do_rms_norm_gemm_silu_mul_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                                      const QuantWeight& w, Buffer& normed, Buffer& gate_up, Buffer& act,
                                      std::size_t m) override;
  void do_all_reduce(Buffer& buf, std::size_t len, ReduceOp op) override;
  void do_all_gather(const Buffer& local, Buffer& global, std::size_t local_len) override;
  void do_broadcast(Buffer& buf, std::size_t len, std::size_t src_rank) override;
  void do_reduce_scatter(const Buffer& input, Buffer& output, std::size_t len, ReduceOp op) override;

 private:
  // Waits for the stream; with a communicator (this backend's, or for
  // reset_graph the held graph's), polls it under the collective timeout
  // and that communicator's asynchronous error.
  // (Owning: an abort may drop the graph's reference, perhaps the last.)
  void wait_stream(const char* op) { wait_stream(op, comm_); }
  void wait_stream(const char* op, std::shared_ptr<Communicator> comm);
  // After a wait for the stream: throws DeviceCheck, naming `op`, when a
  // kernel of this device logged a bad device-side value (each reported once).
  void report_device_errors(const char* op);
  // Aborts comm (a peer gone, or past collective_timeout), destroying first
  // the held graph if its collectives are comm's: NCCL's abort waits for
  // such graphs, so it would never return while this thread held one.
  void abort_communicator(Communicator& comm, const std::string& reason);
  // Throws Unsupported naming op and arg when head_dim exceeds the RoPE kernels' limit.
  void check_rope_head_dim(const char* op, const char* arg, std::size_t head_dim);
  // Before a collective, with or without comm_: refuses host memory among
  // `buffers` (InvalidArgument: NCCL reads device memory, and a call valid
  // at world size 1 must stay valid at more); with comm_, while capturing,
  // records comm_ as the capture's communicator, or ends the capture
  // (GraphCapture) when another one's collectives are already in it.
  void check_collective(const char* op, std::initializer_list<std::pair<const char*, const Buffer*>> buffers);

  int device_;
  detail::CudaRuntime* rt_;  // process-global, never freed (see above)
  std::shared_ptr<Communicator> comm_;
  std::chrono::milliseconds collective_timeout_;
  int gemm_skinny_max_m_;  // -1 (per-shape default) or 0..16
  // CudaBackendConfig::gptq_kernel; the constructor sets it through
  // checked_gptq_kernel (src/cuda/cuda_backend_gptq.cpp), which throws on a bad value.
  static GptqKernel checked_gptq_kernel(GptqKernel requested);
  // Every field's own check, before the device's runtime is made: a refused
  // config leaves no device-wide setting (workspaces, PDL) behind.
  static const CudaBackendConfig& checked_config(const CudaBackendConfig& config);
  GptqKernel gptq_kernel_ = GptqKernel::Auto;
  int gptq_stream_ring_ = 0;  // CudaBackendConfig::gptq_stream_ring, checked
  int gptq_stream_ctas_per_sm_ = 0;  // CudaBackendConfig::gptq_stream_ctas_per_sm, checked
  bool gptq_cluster_reduce_ = true;  // CudaBackendConfig::gptq_cluster_reduce
  int gptq_fused_max_m_ = -1;        // CudaBackendConfig::gptq_fused_max_m, checked
  bool gptq_fuse_silu_mul_ = true;   // CudaBackendConfig::gptq_fuse_silu_mul
  bool gptq_fuse_residual_add_ = true;  // CudaBackendConfig::gptq_fuse_residual_add
  // CudaBackendConfig::prefill_kernel, through checked_prefill_kernel
  // (src/cuda/cuda_backend_attention.cpp), which throws on a bad value.
  static PrefillKernel checked_prefill_kernel(PrefillKernel requested);
  PrefillKernel prefill_kernel_ = PrefillKernel::Auto;
};

}  // namespace ferrum
