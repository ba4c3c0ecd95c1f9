// ModelWeights: a Llama / Qwen3 decoder's weights on a Backend, fused into
// the layouts the Backend ops want, plus the RoPE tables.
#pragma once

#include <cstdint>
#include <filesystem>
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
};

struct LayerWeights {
  Buffer input_norm;           // [hidden]
  Buffer qkv_proj;             // [(heads + 2*kv_heads) * hd, hidden]: rows q | k | v
  Buffer q_norm;               // [hd]  Qwen3 only (null for Llama)
  Buffer k_norm;               // [hd]  Qwen3 only (null for Llama)
  Buffer o_proj;               // [hidden, heads * hd]
  Buffer post_attention_norm;  // [hidden]
  Buffer gate_up_proj;         // [2 * im, hidden]: rows gate | up
  Buffer down_proj;            // [hidden, im]
};

struct ModelWeights {
  ModelConfig config;
  Buffer embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Buffer final_norm;  // [hidden]
  Buffer lm_head;     // [vocab, hidden]; null when tie_word_embeddings
  Buffer rope_cos;    // [max_position_embeddings, hd / 2] f32
  Buffer rope_sin;    // [max_position_embeddings, hd / 2] f32

  const Buffer& output_projection() const noexcept {  // [vocab, hidden]
    return config.tie_word_embeddings ? embed_tokens : lm_head;
  }
};

// Host RoPE tables [rows, hd / 2] in the NeoX / HF rotate_half convention:
// inv_freq[i] = theta^(-2i / hd), angle = pos * inv_freq[i] (computed in fp64).
void make_rope_tables(const ModelConfig& config, std::size_t rows, std::vector<float>& cos,
                      std::vector<float>& sin);

// Reads one tensor after checking presence (InvalidArgument), dtype
// (DTypeMismatch) and shape (ShapeMismatch) against `expected`; every
// message names the tensor, where it lives and the expected and actual values.
std::vector<float> read_checked(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                                const LoadOptions& options = {});

ModelWeights load_weights(Backend& backend, const ModelConfig& config, const TensorSource& source,
                          const LoadOptions& options = {});
// dir holds config.json and one or more *.safetensors.
ModelWeights load_checkpoint(Backend& backend, const std::filesystem::path& dir, const LoadOptions& options = {});
ModelWeights random_weights(Backend& backend, const ModelConfig& config, std::uint64_t seed);

}  // namespace ferrum::engine
