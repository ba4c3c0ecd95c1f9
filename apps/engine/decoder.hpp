// Decoder: the forward pass of a Llama / Qwen3 decoder on the Backend API,
// mirroring Hugging Face's LlamaForCausalLM / Qwen3ForCausalLM, for one
// sequence or a batch of sequences of different lengths.
//
//   residual = embed(ids); normed = rms_norm(residual, input_norm[0])
//   per layer l:
//     qkv = normed · qkv_projᵀ; qkv_rope_append: q (norm +) RoPE to q_heads,
//       k (norm +) RoPE and v into the sequence's slice [kv, capacity, hd] of
//       the layer's caches [sequences, kv, capacity, hd] at pos
//       (unfused GPTQ parts: q, k, v projected apart, then qk_norm_rope,
//       transpose and kv_cache_append_head_major op by op)
//     attn = causal GQA attention over the cache -> token-major -> o_proj
//     residual += attn; normed = rms_norm(residual, post_attention_norm[l])
//     mlp = down(silu(gate) · up)  (dense: gemm_silu_mul over the interleaved
//       gate|up weight, one launch at decode; GPTQ with gate and up of one
//       g_idx: gemm_silu_mul_gptq over the interleaved columns, one launch at
//       decode; other GPTQ: gemm_gptq per part + fused_silu_mul_split)
//     residual += mlp; normed = rms_norm(residual, input_norm[l+1] or final norm)
//   logits = normed[last] · lm_headᵀ (a batch step: every row's); next
//   token = argmax(logits) on the device
//
// A batch step (decode_batch_next) runs one token of every sequence as the
// rows of one forward pass: the projections, norms and MLP see m = sequences
// rows; qkv_rope_append_ragged and flash_decode_ragged put each row at its
// own sequence's position, in its own caches (the lengths come from device
// buffers, so one captured graph serves every step).
//
// Every buffer is allocated in the constructor and reused; a decode step
// only enqueues ops, so it can be captured once and replayed (Graph mode).
// Projections run gemm (dense) or gemm_gptq (GPTQ INT4); gemm_gptq is
// allocation- and sync-free on both backends, so it is captured like gemm.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

#include "weights.hpp"

namespace ferrum::engine {

enum class DecodeMode {
  Eager,        // decode steps are ordinary op calls with host positions
  DeviceState,  // the graph's op sequence, run op by op: token/pos from set_decode_state
  Graph,        // the step captured once and replayed (needs Op::GraphCapture): a
                // single-sequence step as DeviceState, a batch step reading its buffers
};
std::string to_string(DecodeMode mode);

// How a decoder arranges its ops (the engine's choices; figures in docs/PERFORMANCE.md).
struct DecoderOptions {
  // Every projection GPTQ, q|k|v fused and gate|up interleaved: the residual
  // adds and RMSNorms ride on the projections (Backend::gemm_gptq_add_residual
  // on o and down, rms_norm_gemm_gptq on q|k|v, rms_norm_gemm_silu_mul_gptq on
  // gate|up, which carry the residual's row_sq between them) instead of a
  // fused_add_rms_norm between each pair; the embedding's rows get
  // row_sum_squares, the final norm stays rms_norm. Refused (InvalidArgument)
  // on a model it does not fit. Off: not faster on the H200
  // (docs/design/gptq_small_m.md §13.7).
  bool gptq_row_sq_norms = false;
};

// The ops a decoder in `mode` calls (with `gptq`: also LoadGptq and
// GemmGptq, for a model with GPTQ projections; with `batch`: the ragged ops
// of decode_batch_next), and those `backend` lacks.
std::vector<Op> required_ops(DecodeMode mode, bool gptq = false, bool batch = false);
std::vector<Op> missing_ops(const Backend& backend, DecodeMode mode, bool gptq = false, bool batch = false);
// Of those ops, the ones `backend` supports but not on heads of `head_dim`
// elements (Backend::supports_head_dim).
std::vector<Op> ops_refusing_head_dim(const Backend& backend, std::size_t head_dim, DecodeMode mode, bool gptq = false,
                                      bool batch = false);
// The ops' names joined by ", " (for messages).
std::string op_names(const std::vector<Op>& ops);

class Decoder {
 public:
  // kv_capacity: most positions a sequence may reach (<= weights.rope_positions(),
  // which is at most max_position_embeddings).
  // max_prefill_tokens: most tokens one prefill call may take.
  // sequences: how many sequences the decoder holds (each its own KV caches
  // and position); more than one needs the ragged ops and a fused QKV
  // projection (dense, or GPTQ parts that share g_idx).
  // Throws Unsupported (listing them) when the backend lacks an op the mode needs.
  // The decoder keeps a reference to `backend`, which must outlive it (the
  // destructor may reset the backend's graph slot).
  Decoder(Backend& backend, const ModelWeights& weights, std::size_t kv_capacity, std::size_t max_prefill_tokens,
          DecodeMode mode = DecodeMode::Eager, std::size_t sequences = 1, DecoderOptions options = {});
  // Drops the device's graph if it is still this decoder's capture: the
  // graph points at this decoder's buffers, which the backend would
  // otherwise keep allocated until the slot is reset or recaptured
  // (CudaBackend::graph_retained_allocations). Unless a capture is open
  // (Backend::is_capturing): then the slot is left alone. A capture opened
  // directly on CudaBackend::stream() is not seen: the reset's stream
  // synchronization would invalidate it, so destroy decoders outside such
  // captures.
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Runs tokens at positions position() .. position() + n - 1 (q_len = n),
  // appending them to the KV caches; returns the last token's logits [vocab].
  // Without a sequence index: sequence 0.
  std::vector<float> prefill(std::span<const std::int32_t> tokens) { return prefill(0, tokens); }
  std::vector<float> prefill(std::size_t seq, std::span<const std::int32_t> tokens);
  // One token at position() (q_len = 1) of sequence 0, in the decoder's mode; returns logits [vocab].
  std::vector<float> decode(std::int32_t token);
  // The same two steps, returning only the greedy next token: every forward
  // pass ends with Backend::argmax on the logits (inside the captured graph),
  // so 4 bytes come back per step instead of vocab_size logits. The token is
  // the first maximum of the logits prefill / decode would return.
  std::int32_t prefill_next(std::span<const std::int32_t> tokens) { return prefill_next(0, tokens); }
  std::int32_t prefill_next(std::size_t seq, std::span<const std::int32_t> tokens);
  std::int32_t decode_next(std::int32_t token);
  // `steps` greedy steps of sequence 0 enqueued back to back: token at
  // position(), then each step's argmax as the next step's token, passed on
  // the device (Backend::advance_decode_state, the step's last op), so the
  // host never waits between steps; the generated tokens come back in one
  // read at the end. Returns the `steps` tokens decode_next would have
  // returned one by one (the same bits). DeviceState or Graph mode (Graph:
  // the step with its advance is captured once and replayed); position()
  // moves by `steps` (zero steps: nothing runs, nothing is checked).
  std::vector<std::int32_t> decode_pipelined(std::int32_t token, std::size_t steps);
  // One step of every sequence: tokens[s] at position(s), one forward pass
  // of sequences() rows; returns logits [sequences, vocab], or (the _next
  // form) each sequence's greedy next token. Graph mode captures this step
  // once and replays it.
  std::vector<float> decode_batch(std::span<const std::int32_t> tokens);
  std::vector<std::int32_t> decode_batch_next(std::span<const std::int32_t> tokens);
  // The logits of the last step (a read-back): [vocab] after prefill /
  // decode, [sequences, vocab] after a batch step.
  std::vector<float> logits();
  // Starts every sequence anew at position 0 (keeps buffers and any captured graph).
  void reset() noexcept { std::fill(positions_.begin(), positions_.end(), 0); }

  std::size_t position(std::size_t seq = 0) const {
    check_sequence(seq);
    return positions_[seq];
  }
  std::size_t sequences() const noexcept { return positions_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }
  DecodeMode mode() const noexcept { return mode_; }
  // Whether the backend's graph slot still holds this decoder's last capture
  // (another decoder's or caller's capture on the device replaces it; the
  // next step then captures again).
  bool graph_captured() const noexcept {
    return captured_ != Captured::None && be_.held_graph() == captured_graph_;
  }

 private:
  // One forward pass: `rows` rows; either `rows` tokens of sequence `seq` at
  // pos_offset (prefill, or a single-sequence decode step), or (ragged) one
  // token of each of `rows` sequences at the positions in seq_positions_.
  struct Pass {
    std::size_t rows = 1;
    std::size_t pos_offset = 0;
    std::size_t seq = 0;
    bool ragged = false;
  };
  enum class Captured { None, Single, Batch, Pipelined };

  void check_sequence(std::size_t seq) const;
  void check_tokens(std::size_t seq, std::span<const std::int32_t> tokens) const;
  // Throws Unsupported when q / k / v are projected apart (no batch step).
  void require_fused_qkv() const;
  // Enqueues the whole forward pass; no allocation and no copy from pageable
  // memory, so it can be captured (a batch pass starts with a copy from the
  // page-locked batch_host_).
  void enqueue_forward(const Pass& pass);
  void enqueue_attention(std::size_t layer, const Pass& pass);
  void enqueue_mlp(std::size_t layer, std::size_t tokens);
  // out[m, p.n] = x[m, p.k] · Wᵀ with gemm or gemm_gptq.
  void project(const Projection& p, const Buffer& x, Buffer& out, std::size_t m);
  // Layer l's fused q|k|v into `qkv` from the layer's input: normed_, or
  // (gptq_row_sq_norms) residual_ normalized by rms_norm_gemm_gptq.
  void project_qkv(std::size_t layer, Buffer& qkv, std::size_t m);
  // o / down: project, and under gptq_row_sq_norms also residual_ += out
  // with its row_sq.
  void project_residual(const Projection& p, const Buffer& x, Buffer& out, std::size_t m);
  // Whether `weights` fit DecoderOptions::gptq_row_sq_norms.
  static bool fits_row_sq_norms(const ModelWeights& weights);
  // Runs one decode step (Pipelined: the forward pass, then the decode
  // state's advance): eagerly, or in Graph mode by replaying `kind`,
  // captured first unless the backend's graph slot already holds it.
  void run_step(Captured kind, const Pass& pass);
  AttnConfig attn_config() const;
  std::vector<std::int32_t> read_next_tokens(std::size_t count);
  void run_prefill(std::size_t seq, std::span<const std::int32_t> tokens);
  // Waits for the stream if queued work may still read the host input
  // buffers (ids_host_, batch_host_), so the host may write them.
  void wait_for_host_inputs();
  void run_decode(std::int32_t token);
  void run_decode_batch(std::span<const std::int32_t> tokens);

  Backend& be_;
  const ModelWeights& w_;
  const ModelConfig& cfg_;
  std::size_t capacity_;
  std::size_t max_tokens_;
  DecodeMode mode_;
  std::vector<std::size_t> positions_;  // per sequence: the next position
  bool unfused_qkv_ = false;            // q, k, v projected apart (no batch step)
  bool row_sq_norms_ = false;           // DecoderOptions::gptq_row_sq_norms
  std::size_t last_rows_ = 1;           // rows of logits_ the last step wrote
  // Whether queued work may still read ids_host_ / batch_host_ (a step was
  // enqueued and no blocking read has followed it): the next step waits for
  // the stream before the host writes them again.
  bool host_inputs_queued_ = false;
  Captured captured_ = Captured::None;
  std::uint64_t captured_graph_ = 0;  // Backend::held_graph() right after the capture of captured_

  // Per layer KV caches [sequences, kv_heads, capacity, hd].
  std::vector<Buffer> k_cache_;
  std::vector<Buffer> v_cache_;
  // Scratch sized for R = max(max_tokens_, sequences) rows.
  Buffer ids_;          // [max_tokens_] i32 (prefill and single-sequence steps)
  Buffer ids_host_;     // [max_tokens_] i32, Backend::alloc_host: the host writes a prefill's ids here
  // A batch step's inputs: [3, sequences] i32 = batch_ids_ (each sequence's
  // token) | seq_positions_ | kv_lens_ (positions + 1). The host writes them
  // into batch_host_ (Backend::alloc_host), and the step's first op copies
  // them to batch_state_, in the captured graph too: each replay reads what
  // the host wrote before it, with no copy from pageable memory.
  Buffer batch_host_;
  Buffer batch_state_;
  Buffer batch_ids_;
  Buffer seq_positions_;
  Buffer kv_lens_;
  Buffer residual_;     // [R, hidden]
  Buffer normed_;       // [R, hidden]
  Buffer qkv_;          // [R, (heads + 2*kv) * hd]
  // q_, k_, v_, k_heads_, v_heads_: only with unfused q / k / v projections
  // (GPTQ parts whose g_idx differ); null otherwise.
  Buffer q_;            // [T, heads, hd]
  Buffer k_;            // [T, kv, hd]
  Buffer v_;            // [T, kv, hd]
  Buffer q_heads_;      // [heads, T, hd]; a batch step: [sequences, heads, hd]
  Buffer k_heads_;      // [kv, T, hd]
  Buffer v_heads_;      // [kv, T, hd]
  Buffer attn_heads_;   // [heads, T, hd]; a batch step: [sequences, heads, hd]
  Buffer attn_tokens_;  // [T, heads * hd]
  Buffer attn_out_;     // [R, hidden]
  Buffer gate_up_;      // [R, 2 * im]
  Buffer act_;          // [R, im]; also the gate / up scratch of an unfused gate_up_proj
  Buffer mlp_out_;      // [R, hidden]
  Buffer row_sq_;       // [R, ceil(hidden / 16)] f32 (gptq_row_sq_norms only): residual_'s
  Buffer logits_;       // [sequences, vocab]
  Buffer next_token_;   // [sequences] i32: argmax of logits_ rows
  Buffer token_log_;    // [kv_capacity + 1] i32: decode_pipelined's tokens, at their positions
};

// Index of the largest logit (the first on ties), on the host: the engine
// tests' reference for decode_next. Unlike Backend::argmax it gives NaN no
// rank (std::max_element), so logits must be finite.
std::int32_t argmax(std::span<const float> logits);

}  // namespace ferrum::engine
