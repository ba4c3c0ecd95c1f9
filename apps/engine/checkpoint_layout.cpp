#include "checkpoint_layout.hpp"

namespace ferrum::engine {

std::string layer_tensor_name(std::size_t layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  const std::size_t hidden = c.hidden_size;
  std::vector<ExpectedTensor> tensors;
  tensors.push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}});
  for (std::size_t i = 0; i < c.num_hidden_layers; ++i) {
    tensors.push_back({layer_tensor_name(i, "input_layernorm.weight"), {hidden}});
    tensors.push_back({layer_tensor_name(i, "self_attn.q_proj.weight"), {c.q_dim(), hidden}});
    tensors.push_back({layer_tensor_name(i, "self_attn.k_proj.weight"), {c.kv_dim(), hidden}});
    tensors.push_back({layer_tensor_name(i, "self_attn.v_proj.weight"), {c.kv_dim(), hidden}});
    if (c.has_qk_norm()) {
      tensors.push_back({layer_tensor_name(i, "self_attn.q_norm.weight"), {c.head_dim}});
      tensors.push_back({layer_tensor_name(i, "self_attn.k_norm.weight"), {c.head_dim}});
    }
    tensors.push_back({layer_tensor_name(i, "self_attn.o_proj.weight"), {hidden, c.q_dim()}});
    tensors.push_back({layer_tensor_name(i, "post_attention_layernorm.weight"), {hidden}});
    tensors.push_back({layer_tensor_name(i, "mlp.gate_proj.weight"), {c.intermediate_size, hidden}});
    tensors.push_back({layer_tensor_name(i, "mlp.up_proj.weight"), {c.intermediate_size, hidden}});
    tensors.push_back({layer_tensor_name(i, "mlp.down_proj.weight"), {hidden, c.intermediate_size}});
  }
  tensors.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) tensors.push_back({"lm_head.weight", {c.vocab_size, hidden}});
  return tensors;
}

}  // namespace ferrum::engine
