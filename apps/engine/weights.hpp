// ModelWeights: a Llama / Qwen3 decoder's weights on a Backend, fused into
// the layouts the Backend ops want, plus the RoPE tables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

#include "checkpoint_layout.hpp"
#include "model_config.hpp"
#include "tensor_source.hpp"

namespace ferrum::engine {

struct LoadOptions {
  // F16 / BF16 / F32 tensors are converted (via f32) to the config dtype.
  // Off: a tensor whose dtype differs from the config's is DTypeMismatch.
  bool allow_dtype_conversion = true;
  // Rows of the RoPE tables (positions 0 .. rope_positions - 1); 0 means
  // max_position_embeddings. An engine that knows its longest sequence
  // (prompt + generated tokens) passes it: a long-context config (131072
  // positions) would otherwise cost 64 MiB of tables at head_dim 128 and
  // their host computation at every load. At most max_position_embeddings.
  std::size_t rope_positions = 0;
};

// One linear layer, out[m, n] = x[m, k] · Wᵀ, on the backend: dense (gemm
// with `dense` [n, k]) or GPTQ INT4 (gemm_gptq with `gptq`, W stored [k, n]).
struct Projection {
  std::size_t n = 0;                  // output features
  std::size_t k = 0;                  // input features
  Buffer dense;                       // [n, k] in the config dtype; null when quantized
  std::unique_ptr<QuantWeight> gptq;  // null when dense

  bool quantized() const noexcept { return gptq != nullptr; }
};

// Projections that read the same input and whose outputs sit side by side
// in one row (q | k | v, gate | up). `parts` is ONE projection over the
// concatenated output whenever that is exact:
//   dense parts: rows stacked, [n_q + n_k + n_v, k];
//   GPTQ parts with identical g_idx (always without act-order; with act-order
//   when the parts were quantized from the same Hessian, as AutoGPTQ does for
//   q/k/v): qweight / scales / qzeros columns concatenated along n, one
//   gemm_gptq (the qzeros words never straddle parts: every n is a multiple of 8).
// Otherwise (GPTQ parts with different g_idx, or a mix of dense and GPTQ
// parts) one projection per part, in output order, each its own GEMM.
// gate | up is the exception (interleaved_pairs): dense, one [2 * im, k]
// weight with the rows interleaved (row 2j = gate_j, row 2j + 1 = up_j), the
// layout Backend::gemm_silu_mul takes; GPTQ with identical g_idx, one weight
// of 2 * im output columns interleaved the same way (qweight, scales and the
// qzeros nibbles), the layout Backend::gemm_silu_mul_gptq takes. SwiGLU then
// runs in the GEMM.
struct FusedProjection {
  std::vector<Projection> parts;
  bool interleaved_pairs = false;  // one part, (gate, up) output features interleaved

  bool fused() const noexcept { return parts.size() == 1; }
};

struct LayerWeights {
  Buffer input_norm;             // [hidden]
  FusedProjection qkv_proj;      // n = (heads + 2*kv_heads) * hd, k = hidden: outputs q | k | v
  Buffer q_norm;                 // [hd]  Qwen3 only (null for Llama)
  Buffer k_norm;                 // [hd]  Qwen3 only (null for Llama)
  Projection o_proj;             // n = hidden, k = heads * hd
  Buffer post_attention_norm;    // [hidden]
  FusedProjection gate_up_proj;  // n = 2 * im, k = hidden: outputs gate | up
  Projection down_proj;          // n = hidden, k = im
};

struct ModelWeights {
  ModelConfig config;
  Buffer embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Buffer final_norm;  // [hidden]
  Buffer lm_head;     // [vocab, hidden]; null when tie_word_embeddings
  Buffer rope_cos;    // [rope_positions(), hd / 2] f32
  Buffer rope_sin;    // [rope_positions(), hd / 2] f32
  // Seconds the load spent inside Backend calls (alloc, write_bytes, upload,
  // load_gptq with its host repack); the rest of it read or generated the
  // values and joined the projections.
  double backend_load_seconds = 0.0;

  // The RoPE tables' rows: the positions a decoder may reach.
  std::size_t rope_positions() const noexcept {
    return config.head_dim < 2 ? 0 : rope_cos.numel() / (config.head_dim / 2);
  }

  const Buffer& output_projection() const noexcept {  // [vocab, hidden]
    return config.tie_word_embeddings ? embed_tokens : lm_head;
  }
  // Whether any projection runs gemm_gptq (the decoder then needs Op::GemmGptq).
  bool has_gptq() const noexcept;
};

// Host RoPE tables [rows, hd / 2] in the NeoX / HF rotate_half convention:
// angle = pos * rope_inverse_frequencies(config)[i] (computed in fp64),
// cos and sin times rope_attention_factor(config) (model_config.hpp);
// InvalidArgument where those are not finite (a config not validated).
void make_rope_tables(const ModelConfig& config, std::size_t rows, std::vector<float>& cos,
                      std::vector<float>& sin);

// Reads one tensor after checking presence (InvalidArgument), dtype
// (DTypeMismatch) and shape (ShapeMismatch) against `expected`; every
// message names the tensor, where it lives and the expected and actual values.
std::vector<float> read_checked(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                                const LoadOptions& options = {});
// The same checks; the values as config-dtype bits into `out` (exactly the
// tensor's element count), which is what the upload takes.
void read_checked_half_into(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                            std::span<std::uint16_t> out, const LoadOptions& options = {});

// A projection `<base>` is GPTQ when the source has `<base>.qweight` (then
// the config must have a quantization_config), else dense `<base>.weight`.
// GPTQ: qweight / qzeros / g_idx must be I32 and scales F16 / BF16 / F32
// (passed to load_gptq as floats, never rounded to the config dtype); a
// missing g_idx means row / group_size. A `<base>.bias` must be all zeros
// (some exports write zero biases; a nonzero one is Unsupported, as
// attention_bias / mlp_bias are).
ModelWeights load_weights(Backend& backend, const ModelConfig& config, const TensorSource& source,
                          const LoadOptions& options = {});
// dir holds config.json (and for older GPTQ exports quantize_config.json,
// see load_checkpoint_config) and one or more *.safetensors.
ModelWeights load_checkpoint(Backend& backend, const std::filesystem::path& dir, const LoadOptions& options = {});
// Seeded random weights (RandomTensorSource); GPTQ projections when config.gptq is set.
ModelWeights random_weights(Backend& backend, const ModelConfig& config, std::uint64_t seed,
                            const LoadOptions& options = {});

}  // namespace ferrum::engine
