// ModelConfig: the shape of a Llama / Qwen3 decoder, from a Hugging Face
// config.json or a named preset.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

namespace ferrum::engine {

// Llama: LlamaForCausalLM (RoPE only). Qwen3: Qwen3ForCausalLM (per-head
// q_norm / k_norm before RoPE).
enum class Architecture { Llama, Qwen3 };

std::string to_string(Architecture arch);

struct ModelConfig {
  Architecture architecture = Architecture::Llama;
  std::size_t hidden_size = 0;
  std::size_t intermediate_size = 0;
  std::size_t num_hidden_layers = 0;
  std::size_t num_attention_heads = 0;
  std::size_t num_key_value_heads = 0;
  std::size_t head_dim = 0;  // Qwen3 gives it; Llama: hidden_size / num_attention_heads
  std::size_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::size_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  DType dtype = DType::BF16;  // from torch_dtype: f16 or bf16

  std::size_t q_dim() const noexcept { return num_attention_heads * head_dim; }
  std::size_t kv_dim() const noexcept { return num_key_value_heads * head_dim; }
  std::size_t qkv_dim() const noexcept { return q_dim() + 2 * kv_dim(); }
  bool has_qk_norm() const noexcept { return architecture == Architecture::Qwen3; }

  // Throws InvalidArgument naming the field when sizes are zero or disagree
  // (heads % kv_heads, odd head_dim, dtype not f16/bf16, ...).
  void validate(const std::string& source) const;
};

// Parses the text of a config.json; `source` names it in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& config_json);

// "llama3-8b", "qwen3-0.6b", "tiny-llama", "tiny-qwen3"; InvalidArgument otherwise.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace ferrum::engine
