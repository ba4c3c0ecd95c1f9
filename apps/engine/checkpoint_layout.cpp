#include "checkpoint_layout.hpp"

namespace ferrum::engine {

std::string layer_tensor_name(std::size_t layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::vector<ProjectionShape> projection_shapes(const ModelConfig& c) {
  const std::size_t hidden = c.hidden_size;
  return {{"self_attn.q_proj", c.q_dim(), hidden},
          {"self_attn.k_proj", c.kv_dim(), hidden},
          {"self_attn.v_proj", c.kv_dim(), hidden},
          {"self_attn.o_proj", hidden, c.q_dim()},
          {"mlp.gate_proj", c.intermediate_size, hidden},
          {"mlp.up_proj", c.intermediate_size, hidden},
          {"mlp.down_proj", hidden, c.intermediate_size}};
}

std::vector<ExpectedTensor> gptq_tensors(const std::string& base, std::size_t n, std::size_t k,
                                         const GptqConfig& gptq) {
  const std::size_t groups = gptq.groups(k);
  return {{base + ".qweight", {k / 8, n}, TensorKind::Int32},
          {base + ".qzeros", {groups, n / 8}, TensorKind::Int32},
          {base + ".scales", {groups, n}, TensorKind::Float},
          {base + ".g_idx", {k}, TensorKind::Int32}};
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  const std::size_t hidden = c.hidden_size;
  const std::vector<ProjectionShape> projections = projection_shapes(c);
  std::vector<ExpectedTensor> tensors;
  auto add_projection = [&](std::size_t layer, std::size_t index) {
    const ProjectionShape& p = projections[index];
    const std::string base = layer_tensor_name(layer, p.suffix);
    if (!c.gptq) {
      tensors.push_back({base + ".weight", {p.n, p.k}});
      return;
    }
    for (ExpectedTensor& t : gptq_tensors(base, p.n, p.k, *c.gptq)) tensors.push_back(std::move(t));
  };
  tensors.push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}});
  for (std::size_t i = 0; i < c.num_hidden_layers; ++i) {
    tensors.push_back({layer_tensor_name(i, "input_layernorm.weight"), {hidden}});
    for (std::size_t p = 0; p < 3; ++p) add_projection(i, p);  // q, k, v
    if (c.has_qk_norm()) {
      tensors.push_back({layer_tensor_name(i, "self_attn.q_norm.weight"), {c.head_dim}});
      tensors.push_back({layer_tensor_name(i, "self_attn.k_norm.weight"), {c.head_dim}});
    }
    add_projection(i, 3);  // o
    tensors.push_back({layer_tensor_name(i, "post_attention_layernorm.weight"), {hidden}});
    for (std::size_t p = 4; p < 7; ++p) add_projection(i, p);  // gate, up, down
  }
  tensors.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) tensors.push_back({"lm_head.weight", {c.vocab_size, hidden}});
  return tensors;
}

}  // namespace ferrum::engine
