// The Hugging Face tensor names and shapes of a Llama / Qwen3 checkpoint.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model_config.hpp"

namespace ferrum::engine {

// What a tensor holds: floats (F16 / BF16 / F32 on disk) or GPTQ's packed
// int32 words and group indices (I32 on disk).
enum class TensorKind { Float, Int32 };

// A tensor the config requires: its Hugging Face name and shape.
struct ExpectedTensor {
  std::string name;
  std::vector<std::size_t> shape;
  TensorKind kind = TensorKind::Float;
};

// One linear layer of a decoder layer: y[n] = W[n, k] · x[k].
struct ProjectionShape {
  std::string suffix;  // "self_attn.q_proj", ... (no ".weight")
  std::size_t n = 0;   // output features
  std::size_t k = 0;   // input features
};

// q, k, v, o, gate, up, down, in that order.
std::vector<ProjectionShape> projection_shapes(const ModelConfig& config);

// The GPTQ tensors of projection `base` ("model.layers.0.self_attn.q_proj"):
// qweight I32 [k / 8, n], qzeros I32 [G, n / 8], scales [G, n], g_idx I32 [k].
std::vector<ExpectedTensor> gptq_tensors(const std::string& base, std::size_t n, std::size_t k,
                                         const GptqConfig& gptq);

// Every tensor a config needs, in load order: model.embed_tokens.weight,
// per layer input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm
// (Qwen3), post_attention_layernorm, mlp.{gate,up,down}_proj; model.norm;
// lm_head.weight unless the embeddings are tied. A projection is
// `<name>.weight` [n, k], or with config.gptq its gptq_tensors() (the loader
// also takes a dense `<name>.weight` in a GPTQ checkpoint, and a missing g_idx).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);
std::string layer_tensor_name(std::size_t layer, const std::string& suffix);  // "model.layers.{i}.{suffix}"

}  // namespace ferrum::engine
