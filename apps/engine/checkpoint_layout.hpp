// The Hugging Face tensor names and shapes of a Llama / Qwen3 checkpoint.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model_config.hpp"

namespace ferrum::engine {

// A tensor the config requires: its Hugging Face name and shape.
struct ExpectedTensor {
  std::string name;
  std::vector<std::size_t> shape;
};

// Every tensor a config needs, in load order: model.embed_tokens.weight,
// per layer input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm
// (Qwen3), post_attention_layernorm, mlp.{gate,up,down}_proj; model.norm;
// lm_head.weight unless the embeddings are tied.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);
std::string layer_tensor_name(std::size_t layer, const std::string& suffix);  // "model.layers.{i}.{suffix}"

}  // namespace ferrum::engine
