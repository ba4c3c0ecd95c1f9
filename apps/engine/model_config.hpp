// ModelConfig: the shape of a Llama / Qwen3 decoder, from a Hugging Face
// config.json or a named preset.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

namespace ferrum::engine {

// Llama: LlamaForCausalLM (RoPE only). Qwen3: Qwen3ForCausalLM (per-head
// q_norm / k_norm before RoPE).
enum class Architecture { Llama, Qwen3 };

std::string to_string(Architecture arch);

// The "quantization_config" of a GPTQ checkpoint (quant_method "gptq").
// Every projection of the decoder layers is INT4 with these settings;
// embeddings, norms and lm_head stay dense.
struct GptqConfig {
  int bits = 4;          // only 4 is supported
  int group_size = 128;  // rows of k per scale / zero; -1: one group over all of k
  bool desc_act = false;  // act-order: g_idx may be any grouping of the rows (read from the checkpoint)
  bool sym = true;        // informational: the stored zeros are what is used
  GptqZeroFormat zero_format = GptqZeroFormat::V1;  // checkpoint_format "gptq" (v1) or "gptq_v2"

  // Groups of a projection with k input features: k / group_size, or 1.
  std::size_t groups(std::size_t k) const noexcept {
    return group_size < 0 ? 1 : k / static_cast<std::size_t>(group_size);
  }
};

// How RoPE's frequencies are scaled for a longer context: a Hugging Face
// "rope_scaling" / "rope_parameters" of rope_type "linear", "llama3" (Llama
// 3.1 and 3.2) or "yarn" (Qwen3's long-context configs, among others);
// rope_inverse_frequencies and rope_attention_factor (below) apply it.
// Other rope types are refused when the config is parsed.
struct RopeScaling {
  enum class Type { None, Linear, Llama3, Yarn };
  Type type = Type::None;
  double factor = 1.0;                            // linear, llama3, yarn: how far the context is stretched
  double low_freq_factor = 0.0;                   // llama3
  double high_freq_factor = 0.0;                  // llama3
  double original_max_position_embeddings = 0.0;  // llama3, yarn: the pretraining context
  // yarn, as transformers resolves them: beta_fast 32 and beta_slow 1 where
  // left out, null or 0; attention_factor where left out or null from mscale
  // and mscale_all_dim (both given and nonzero), else 0.1 ln(factor) + 1;
  // truncate true where left out, false where null (transformers reads
  // get("truncate", True), and null is falsy).
  double beta_fast = 0.0;         // yarn: rotations at which a pair starts to be interpolated
  double beta_slow = 0.0;         // yarn: rotations at which it is interpolated wholly
  double attention_factor = 1.0;  // yarn: cos and sin are scaled by it
  bool truncate = true;           // yarn: the correction range rounded outward to whole pairs
  bool operator==(const RopeScaling&) const = default;
};

// "none", "linear (factor 4)", "llama3 (factor 8, low_freq_factor 1, ...)",
// "yarn (factor 4, original_max_position_embeddings 32768, ...)".
std::string to_string(const RopeScaling& scaling);

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
  std::optional<GptqConfig> gptq;  // from quantization_config; none: dense projections
  RopeScaling rope_scaling;        // from rope_scaling / rope_parameters; none: plain RoPE

  std::size_t q_dim() const noexcept { return num_attention_heads * head_dim; }
  std::size_t kv_dim() const noexcept { return num_key_value_heads * head_dim; }
  std::size_t qkv_dim() const noexcept { return q_dim() + 2 * kv_dim(); }
  bool has_qk_norm() const noexcept { return architecture == Architecture::Qwen3; }

  // The largest size field validate() accepts (2^24).
  static constexpr std::size_t kMaxConfigSize = std::size_t{1} << 24;
  // Throws InvalidArgument naming the field when sizes are zero, past
  // kMaxConfigSize or disagree
  // (heads % kv_heads, odd head_dim, dtype not f16/bf16, a RoPE scaling
  // factor that is not a positive number, RoPE settings whose frequencies
  // are not finite, a GPTQ group size that does not divide a projection's
  // k, ...).
  void validate(const std::string& source) const;
};

// RoPE's inverse frequency of each pair i < head_dim / 2, in fp64:
// theta^(-2i / head_dim), scaled as config.rope_scaling says (transformers'
// rope types of the same names): linear divides each by the factor; llama3
// keeps the pairs whose wavelength 2 pi / f is under original / high_freq_factor,
// divides those over original / low_freq_factor by the factor, and
// interpolates between the two with s = (original / wavelength -
// low_freq_factor) / (high_freq_factor - low_freq_factor):
// (1 - s) f / factor + s f; yarn finds the pairs low and high that turn
// beta_fast and beta_slow times over the original context (pair index
// head_dim ln(original / (2 pi rotations)) / (2 ln theta), rounded outward
// under truncate, kept in [0, head_dim - 1]) and blends with the ramp
// r = clamp((i - low) / (high - low), 0, 1): r f / factor + (1 - r) f.
std::vector<double> rope_inverse_frequencies(const ModelConfig& config);

// The factor cos and sin are scaled by: yarn's attention_factor, else 1
// (transformers multiplies its rotary embedding's cos and sin by it, so q
// and k each carry it).
double rope_attention_factor(const ModelConfig& config);

// rope_inverse_frequencies, after checking that they and
// rope_attention_factor are finite (InvalidArgument naming `context`
// otherwise): factors validate() takes one by one can still overflow
// together (a yarn factor of 5e-324 divides a frequency to infinity).
std::vector<double> checked_rope_inverse_frequencies(const ModelConfig& config, const std::string& context);

// Parses the text of a config.json; `source` names it in error messages.
// RoPE: "rope_theta" (transformers 4) or "rope_parameters.rope_theta" (5);
// "rope_scaling" and "rope_parameters" of rope_type default, linear or
// llama3 (when both are given they must agree), any other type Unsupported.
// A "quantization_config" must be GPTQ (quant_method "gptq", bits 4,
// checkpoint_format / format "gptq" or "gptq_v2", lm_head not quantized):
// anything else is Unsupported, a malformed field InvalidArgument, each
// message naming the field and its value. The model runs in its
// torch_dtype (float16 or bfloat16), or in `run_dtype` (F16 or BF16) where
// given, which also takes float32 checkpoints (their weights converted at
// load, as any tensor dtype is).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source,
                               std::optional<DType> run_dtype = std::nullopt);
ModelConfig load_model_config(const std::filesystem::path& config_json, std::optional<DType> run_dtype = std::nullopt);
// The text of a "quantization_config" object alone (as in AutoGPTQ's
// quantize_config.json); `source` names it in error messages.
GptqConfig parse_gptq_config(const std::string& json_text, const std::string& source);
// dir/config.json; when it has no "quantization_config" and the directory
// holds a quantize_config.json (older AutoGPTQ exports), that one is used.
ModelConfig load_checkpoint_config(const std::filesystem::path& dir, std::optional<DType> run_dtype = std::nullopt);

// The GPTQ settings of a random --quant gptq model: group 128, symmetric,
// v1 zeros, no act-order; a smaller group (64, 32, 16, 8) when 128 does not
// divide every projection's k (the tiny presets).
GptqConfig random_gptq_config(const ModelConfig& config);

// "llama3-8b", "qwen3-0.6b", "tiny-llama", "tiny-qwen3"; InvalidArgument otherwise.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace ferrum::engine
