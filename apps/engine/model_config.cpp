#include "model_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine_error.hpp"

namespace ferrum::engine {

namespace {

using Json = nlohmann::json;

const Json& required(const Json& config, const char* key, const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) {
    fail(ErrorCode::InvalidArgument, source, ": required field \"", key, "\" is missing");
  }
  return config[key];
}

std::size_t size_field(const Json& value, const char* key, const std::string& source) {
  if (!value.is_number_unsigned() || value.get<std::size_t>() == 0) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be a positive integer, got ", value.dump());
  }
  return value.get<std::size_t>();
}

double number_field(const Json& value, const char* key, const std::string& source) {
  if (!value.is_number() || !(value.get<double>() > 0.0) || !std::isfinite(value.get<double>())) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be a positive number, got ", value.dump());
  }
  return value.get<double>();
}

bool bool_field(const Json& config, const char* key, bool fallback, const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_boolean()) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be true or false, got ", config[key].dump());
  }
  return config[key].get<bool>();
}

Architecture parse_architecture(const Json& config, const std::string& source) {
  const Json& archs = required(config, "architectures", source);
  if (!archs.is_array() || archs.size() != 1 || !archs[0].is_string()) {
    fail(ErrorCode::InvalidArgument, source, ": \"architectures\" must be a one-string array, got ", archs.dump());
  }
  const std::string name = archs[0].get<std::string>();
  if (name == "LlamaForCausalLM") return Architecture::Llama;
  if (name == "Qwen3ForCausalLM") return Architecture::Qwen3;
  fail(ErrorCode::Unsupported, source, ": architecture \"", name,
       "\" is not supported (LlamaForCausalLM or Qwen3ForCausalLM)");
}

DType parse_torch_dtype(const Json& config, const std::string& source) {
  // Newer transformers write "dtype"; older ones "torch_dtype".
  const char* key = config.contains("torch_dtype") ? "torch_dtype" : "dtype";
  if (!config.contains(key) || config[key].is_null()) {
    fail(ErrorCode::InvalidArgument, source, ": required field \"torch_dtype\" (or \"dtype\") is missing");
  }
  const Json& value = config[key];
  const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (text == "float16") return DType::F16;
  if (text == "bfloat16") return DType::BF16;
  fail(ErrorCode::DTypeMismatch, source, ": \"", key, "\" is ", text,
       "; the engine runs float16 or bfloat16 activations");
}

// Features of the HF configs that this engine does not implement: refuse
// them rather than run a different model.
void refuse_unsupported(const Json& config, const std::string& source) {
  // transformers >= 5 writes "rope_parameters" (and may keep "rope_scaling")
  // with rope_type "default" for plain RoPE; any other type is refused.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const Json& rope = config[key];
    const Json* type = nullptr;
    if (rope.is_object() && rope.contains("rope_type")) type = &rope["rope_type"];
    if (rope.is_object() && rope.contains("type")) type = &rope["type"];
    if (type == nullptr || !type->is_string() || *type != "default") {
      fail(ErrorCode::Unsupported, source, ": \"", key, "\" ", rope.dump(), " is not supported yet (plain RoPE only)");
    }
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (bool_field(config, key, false, source)) fail(ErrorCode::Unsupported, source, ": \"", key, "\" = true is not supported");
  }
  if (config.contains("hidden_act") && config["hidden_act"] != "silu") {
    fail(ErrorCode::Unsupported, source, ": \"hidden_act\" ", config["hidden_act"].dump(), " is not supported (silu)");
  }
}

}  // namespace

std::string to_string(Architecture arch) { return arch == Architecture::Llama ? "llama" : "qwen3"; }

void ModelConfig::validate(const std::string& source) const {
  const std::pair<const char*, std::size_t> sizes[] = {
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings}};
  for (const auto& [name, value] : sizes) {
    if (value == 0) fail(ErrorCode::InvalidArgument, source, ": ", name, " must be positive");
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    fail(ErrorCode::InvalidArgument, source, ": num_attention_heads = ", num_attention_heads,
         " is not a multiple of num_key_value_heads = ", num_key_value_heads);
  }
  if (head_dim % 2 != 0) fail(ErrorCode::InvalidArgument, source, ": head_dim = ", head_dim, " must be even (RoPE)");
  if (!(rms_norm_eps > 0.0)) fail(ErrorCode::InvalidArgument, source, ": rms_norm_eps = ", rms_norm_eps, " must be > 0");
  if (!(rope_theta > 0.0)) fail(ErrorCode::InvalidArgument, source, ": rope_theta = ", rope_theta, " must be > 0");
  if (!is_half_precision(dtype)) {
    fail(ErrorCode::DTypeMismatch, source, ": dtype ", ferrum::to_string(dtype), " is not f16 or bf16");
  }
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  Json config;
  try {
    config = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    fail(ErrorCode::InvalidArgument, source, ": not valid JSON (", e.what(), ")");
  }
  if (!config.is_object()) fail(ErrorCode::InvalidArgument, source, ": must be a JSON object");

  ModelConfig cfg;
  cfg.architecture = parse_architecture(config, source);
  refuse_unsupported(config, source);
  auto size_of_key = [&](const char* key) { return size_field(required(config, key, source), key, source); };
  cfg.hidden_size = size_of_key("hidden_size");
  cfg.intermediate_size = size_of_key("intermediate_size");
  cfg.num_hidden_layers = size_of_key("num_hidden_layers");
  cfg.num_attention_heads = size_of_key("num_attention_heads");
  cfg.vocab_size = size_of_key("vocab_size");
  cfg.max_position_embeddings = size_of_key("max_position_embeddings");
  cfg.rms_norm_eps = number_field(required(config, "rms_norm_eps", source), "rms_norm_eps", source);
  // HF defaults: kv heads = heads, theta 10000, head_dim = hidden / heads.
  cfg.num_key_value_heads = config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()
                                ? size_field(config["num_key_value_heads"], "num_key_value_heads", source)
                                : cfg.num_attention_heads;
  // Top-level rope_theta (transformers 4), else rope_parameters.rope_theta
  // (transformers 5), else HF's default.
  cfg.rope_theta = 10000.0;
  if (config.contains("rope_theta") && !config["rope_theta"].is_null()) {
    cfg.rope_theta = number_field(config["rope_theta"], "rope_theta", source);
  } else if (config.contains("rope_parameters") && config["rope_parameters"].is_object() &&
             config["rope_parameters"].contains("rope_theta")) {
    cfg.rope_theta = number_field(config["rope_parameters"]["rope_theta"], "rope_parameters.rope_theta", source);
  }
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    cfg.head_dim = size_field(config["head_dim"], "head_dim", source);
  } else if (cfg.architecture == Architecture::Qwen3) {
    fail(ErrorCode::InvalidArgument, source, ": required field \"head_dim\" is missing (Qwen3 configs give it)");
  } else {
    if (cfg.hidden_size % cfg.num_attention_heads != 0) {
      fail(ErrorCode::InvalidArgument, source, ": hidden_size = ", cfg.hidden_size,
           " is not a multiple of num_attention_heads = ", cfg.num_attention_heads, " (and no head_dim is given)");
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  }
  cfg.tie_word_embeddings = bool_field(config, "tie_word_embeddings", false, source);
  cfg.dtype = parse_torch_dtype(config, source);
  cfg.validate(source);
  return cfg;
}

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  std::ifstream in(config_json);
  if (!in) fail(ErrorCode::InvalidArgument, "config '", config_json.string(), "': cannot open it for reading");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), concat("config '", config_json.string(), "'"));
}

std::vector<std::string> preset_names() { return {"llama3-8b", "qwen3-0.6b", "tiny-llama", "tiny-qwen3"}; }

ModelConfig preset_config(const std::string& name) {
  ModelConfig cfg;
  if (name == "llama3-8b") {
    cfg = {Architecture::Llama, 4096, 14336, 32, 32, 8, 128, 128256, 1e-5, 500000.0, 8192, false, DType::BF16};
  } else if (name == "qwen3-0.6b") {
    cfg = {Architecture::Qwen3, 1024, 3072, 28, 16, 8, 128, 151936, 1e-6, 1000000.0, 40960, true, DType::BF16};
  } else if (name == "tiny-llama") {
    cfg = {Architecture::Llama, 64, 128, 2, 4, 2, 16, 256, 1e-5, 10000.0, 128, false, DType::F16};
  } else if (name == "tiny-qwen3") {
    cfg = {Architecture::Qwen3, 64, 128, 2, 4, 2, 16, 256, 1e-6, 1000000.0, 128, true, DType::F16};
  } else {
    std::string known;
    for (const std::string& preset : preset_names()) known += " " + preset;
    fail(ErrorCode::InvalidArgument, "preset '", name, "' is unknown (known:", known, ")");
  }
  cfg.validate(concat("preset '", name, "'"));
  return cfg;
}

}  // namespace ferrum::engine
