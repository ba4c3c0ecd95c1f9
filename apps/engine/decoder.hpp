// Decoder: the forward pass of a Llama / Qwen3 decoder on the Backend API,
// mirroring Hugging Face's LlamaForCausalLM / Qwen3ForCausalLM. Batch 1.
//
//   residual = embed(ids); normed = rms_norm(residual, input_norm[0])
//   per layer l:
//     qkv = normed · qkv_projᵀ; qkv_rope_append: q (norm +) RoPE to q_heads,
//       k (norm +) RoPE and v into the layer's cache [kv, capacity, hd] at pos
//       (unfused GPTQ parts: q, k, v projected apart, then qk_norm_rope,
//       transpose and kv_cache_append_head_major op by op)
//     attn = causal GQA attention over the cache -> token-major -> o_proj
//     residual += attn; normed = rms_norm(residual, post_attention_norm[l])
//     mlp = down(silu(gate) · up)  (dense: gemm_silu_mul over the interleaved
//       gate|up weight, one launch at decode; GPTQ: gemm_gptq + fused_silu_mul_split)
//     residual += mlp; normed = rms_norm(residual, input_norm[l+1] or final norm)
//   logits = normed[last] · lm_headᵀ; next token = argmax(logits) on the device
//
// Every buffer is allocated in the constructor and reused; a decode step
// only enqueues ops, so it can be captured once and replayed (Graph mode).
// Projections run gemm (dense) or gemm_gptq (GPTQ INT4); gemm_gptq is
// allocation- and sync-free on both backends, so it is captured like gemm.
#pragma once

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
  Graph,        // DeviceState, captured once and replayed (needs Op::GraphCapture)
};
std::string to_string(DecodeMode mode);

// The ops a decoder in `mode` calls (with `gptq`: also LoadGptq and
// GemmGptq, for a model with GPTQ projections), and those `backend` lacks.
std::vector<Op> required_ops(DecodeMode mode, bool gptq = false);
std::vector<Op> missing_ops(const Backend& backend, DecodeMode mode, bool gptq = false);

class Decoder {
 public:
  // kv_capacity: most positions a sequence may reach (<= max_position_embeddings).
  // max_prefill_tokens: most tokens one prefill call may take.
  // Throws Unsupported (listing them) when the backend lacks an op the mode needs.
  Decoder(Backend& backend, const ModelWeights& weights, std::size_t kv_capacity, std::size_t max_prefill_tokens,
          DecodeMode mode = DecodeMode::Eager);

  // Runs tokens at positions position() .. position() + n - 1 (q_len = n),
  // appending them to the KV caches; returns the last token's logits [vocab].
  std::vector<float> prefill(std::span<const std::int32_t> tokens);
  // One token at position() (q_len = 1), in the decoder's mode; returns logits [vocab].
  std::vector<float> decode(std::int32_t token);
  // The same two steps, returning only the greedy next token: every forward
  // pass ends with Backend::argmax on the logits (inside the captured graph),
  // so 4 bytes come back per step instead of vocab_size logits. The token is
  // the first maximum of the logits prefill / decode would return.
  std::int32_t prefill_next(std::span<const std::int32_t> tokens);
  std::int32_t decode_next(std::int32_t token);
  // The logits [vocab] of the last prefill / decode step (a read-back).
  std::vector<float> logits();
  // Starts a new sequence at position 0 (keeps buffers and any captured graph).
  void reset() noexcept { position_ = 0; }

  std::size_t position() const noexcept { return position_; }
  std::size_t capacity() const noexcept { return capacity_; }
  DecodeMode mode() const noexcept { return mode_; }
  bool graph_captured() const noexcept { return graph_captured_; }

 private:
  void check_tokens(std::span<const std::int32_t> tokens) const;
  // Enqueues the whole forward pass for `tokens` new tokens at pos_offset;
  // no allocation, no host transfer (so it can be captured).
  void enqueue_forward(std::size_t tokens, std::size_t pos_offset);
  void enqueue_attention(std::size_t layer, std::size_t tokens, std::size_t pos_offset);
  void enqueue_mlp(std::size_t layer, std::size_t tokens);
  // out[m, p.n] = x[m, p.k] · Wᵀ with gemm or gemm_gptq.
  void project(const Projection& p, const Buffer& x, Buffer& out, std::size_t m);
  std::int32_t read_next_token();
  void run_prefill(std::span<const std::int32_t> tokens);
  void run_decode(std::int32_t token);

  Backend& be_;
  const ModelWeights& w_;
  const ModelConfig& cfg_;
  std::size_t capacity_;
  std::size_t max_tokens_;
  DecodeMode mode_;
  std::size_t position_ = 0;
  bool graph_captured_ = false;

  // Per layer KV caches [kv_heads, capacity, hd].
  std::vector<Buffer> k_cache_;
  std::vector<Buffer> v_cache_;
  // Scratch sized for max_tokens_ (T) rows.
  Buffer ids_;          // [T] i32
  Buffer residual_;     // [T, hidden]
  Buffer normed_;       // [T, hidden]
  Buffer qkv_;          // [T, (heads + 2*kv) * hd]
  // q_, k_, v_, k_heads_, v_heads_: only with unfused q / k / v projections
  // (GPTQ parts whose g_idx differ); null otherwise.
  Buffer q_;            // [T, heads, hd]
  Buffer k_;            // [T, kv, hd]
  Buffer v_;            // [T, kv, hd]
  Buffer q_heads_;      // [heads, T, hd]
  Buffer k_heads_;      // [kv, T, hd]
  Buffer v_heads_;      // [kv, T, hd]
  Buffer attn_heads_;   // [heads, T, hd]
  Buffer attn_tokens_;  // [T, heads * hd]
  Buffer attn_out_;     // [T, hidden]
  Buffer gate_up_;      // [T, 2 * im]
  Buffer act_;          // [T, im]; also the gate / up scratch of an unfused gate_up_proj
  Buffer mlp_out_;      // [T, hidden]
  Buffer logits_;       // [vocab]
  Buffer next_token_;   // [1] i32: argmax of logits_
};

// Index of the largest logit (the first on ties), on the host: the engine
// tests' reference for decode_next. Unlike Backend::argmax it gives NaN no
// rank (std::max_element), so logits must be finite.
std::int32_t argmax(std::span<const float> logits);

}  // namespace ferrum::engine
