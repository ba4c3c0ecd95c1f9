// An independent fp64 implementation of LlamaForCausalLM / Qwen3ForCausalLM
// (plain loops over host weights), the oracle for the engine's Decoder.
#pragma once

#include <cstdint>
#include <vector>

#include "model_config.hpp"
#include "tensor_source.hpp"

namespace ferrum::engine::testing {

class NaiveDecoder {
 public:
  NaiveDecoder(const ModelConfig& config, const TensorSource& source);
  // Logits [tokens.size()][vocab] of every position of the sequence.
  std::vector<std::vector<double>> forward(const std::vector<std::int32_t>& tokens) const;

 private:
  struct Layer {
    std::vector<double> input_norm, q, k, v, q_norm, k_norm, o, post_norm, gate, up, down;
  };
  ModelConfig c_;
  std::vector<double> embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace ferrum::engine::testing
