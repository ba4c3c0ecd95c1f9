#include "model_config.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "checkpoint_file.hpp"
#include "engine_error.hpp"
#include "json_text.hpp"

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
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be a positive integer, got ", describe_json(value));
  }
  return value.get<std::size_t>();
}

double number_field(const Json& value, const char* key, const std::string& source) {
  if (!value.is_number() || !(value.get<double>() > 0.0) || !std::isfinite(value.get<double>())) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be a positive number, got ", describe_json(value));
  }
  return value.get<double>();
}

bool bool_field(const Json& config, const char* key, bool fallback, const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_boolean()) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be true or false, got ", describe_json(config[key]));
  }
  return config[key].get<bool>();
}

Architecture parse_architecture(const Json& config, const std::string& source) {
  const Json& archs = required(config, "architectures", source);
  if (!archs.is_array() || archs.size() != 1 || !archs[0].is_string()) {
    fail(ErrorCode::InvalidArgument, source, ": \"architectures\" must be a one-string array, got ", describe_json(archs));
  }
  const std::string name = archs[0].get<std::string>();
  if (name == "LlamaForCausalLM") return Architecture::Llama;
  if (name == "Qwen3ForCausalLM") return Architecture::Qwen3;
  fail(ErrorCode::Unsupported, source, ": architecture \"", name,
       "\" is not supported (LlamaForCausalLM or Qwen3ForCausalLM)");
}

// The dtype the model runs in: the checkpoint's torch_dtype, or `run_dtype`
// where the caller gives one (the weights are converted at load). A float32
// checkpoint needs one: the backends run half-precision activations only.
DType parse_torch_dtype(const Json& config, const std::string& source, std::optional<DType> run_dtype) {
  // Newer transformers write "dtype"; older ones "torch_dtype" (a null one
  // beside "dtype" is taken as absent).
  const char* key = config.contains("torch_dtype") && !config["torch_dtype"].is_null() ? "torch_dtype" : "dtype";
  if (!config.contains(key) || config[key].is_null()) {
    fail(ErrorCode::InvalidArgument, source, ": required field \"torch_dtype\" (or \"dtype\") is missing");
  }
  const Json& value = config[key];
  const bool half = value == "float16" || value == "bfloat16";
  if (run_dtype && (half || value == "float32")) return *run_dtype;
  if (value == "float16") return DType::F16;
  if (value == "bfloat16") return DType::BF16;
  if (value == "float32") {
    fail(ErrorCode::DTypeMismatch, source, ": \"", key, "\" is \"float32\"; the engine runs float16 or bfloat16 "
         "activations: name one to convert the weights to at load (ferrum_engine --dtype f16 or bf16)");
  }
  fail(ErrorCode::DTypeMismatch, source, ": \"", key, "\" is ", describe_json(value),
       "; the engine runs float16 or bfloat16 activations (float32 checkpoints converted at load)");
}

// Features of the HF configs that this engine does not implement: refuse
// them rather than run a different model.
void refuse_unsupported(const Json& config, const std::string& source) {
  // Attention over a sliding window or RoPE over part of each head: another
  // model than the one the engine runs.
  if (bool_field(config, "use_sliding_window", false, source)) {
    fail(ErrorCode::Unsupported, source, ": \"use_sliding_window\" = true is not supported (full attention only)");
  }
  if (config.contains("layer_types") && !config["layer_types"].is_null()) {
    const Json& types = config["layer_types"];
    bool full = types.is_array();
    for (std::size_t i = 0; full && i < types.size(); ++i) full = types[i] == "full_attention";
    if (!full) {
      fail(ErrorCode::Unsupported, source, ": \"layer_types\" ", describe_json(types),
           " is not supported (every layer \"full_attention\")");
    }
  }
  if (config.contains("partial_rotary_factor") && !config["partial_rotary_factor"].is_null() &&
      config["partial_rotary_factor"] != 1.0) {  // JSON numbers compare by value: 1 and 1.0 both pass
    fail(ErrorCode::Unsupported, source, ": \"partial_rotary_factor\" ", describe_json(config["partial_rotary_factor"]),
         " is not supported (RoPE over the whole head: 1)");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (bool_field(config, key, false, source)) fail(ErrorCode::Unsupported, source, ": \"", key, "\" = true is not supported");
  }
  if (config.contains("hidden_act") && config["hidden_act"] != "silu") {
    fail(ErrorCode::Unsupported, source, ": \"hidden_act\" ", describe_json(config["hidden_act"]),
         " is not supported (silu)");
  }
}

// One "rope_scaling" / "rope_parameters" object (`key` names it). Its type
// is "rope_type", or "type" (the older name) without it; where both are
// given they must agree, since transformers versions differ in which one
// they read.
RopeScaling parse_rope_object(const Json& rope, const char* key, const std::string& source) {
  if (!rope.is_object()) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, "\" must be an object, got ", describe_json(rope));
  }
  if (!rope.contains("rope_type") && !rope.contains("type")) {
    fail(ErrorCode::Unsupported, source, ": \"", key, "\" ", describe_json(rope),
         " names no rope_type (default, linear, llama3 or yarn)");
  }
  if (rope.contains("rope_type") && rope.contains("type") && rope["rope_type"] != rope["type"]) {
    fail(ErrorCode::InvalidArgument, source, ": \"", key, ".rope_type\" ", describe_json(rope["rope_type"]), " and \"",
         key, ".type\" ", describe_json(rope["type"]), " disagree");
  }
  const Json& type = rope.contains("rope_type") ? rope["rope_type"] : rope["type"];
  auto field = [&](const char* name) {
    const std::string where = std::string(key) + "." + name;
    if (!rope.contains(name) || rope[name].is_null()) {
      fail(ErrorCode::InvalidArgument, source, ": required field \"", where, "\" is missing (rope_type ",
           describe_json(type), ")");
    }
    return number_field(rope[name], where.c_str(), source);
  };
  RopeScaling scaling;
  std::vector<std::string> fields;  // the type's own keys
  if (type == "default") {
  } else if (type == "linear") {
    scaling.type = RopeScaling::Type::Linear;
    fields = {"factor"};
    scaling.factor = field("factor");
  } else if (type == "llama3") {
    scaling.type = RopeScaling::Type::Llama3;
    fields = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    scaling.factor = field("factor");
    scaling.low_freq_factor = field("low_freq_factor");
    scaling.high_freq_factor = field("high_freq_factor");
    scaling.original_max_position_embeddings = field("original_max_position_embeddings");
  } else if (type == "yarn") {
    scaling.type = RopeScaling::Type::Yarn;
    fields = {"factor",         "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "attention_factor",                 "truncate"};
    scaling.factor = field("factor");
    if (!rope.contains("original_max_position_embeddings") || rope["original_max_position_embeddings"].is_null()) {
      fail(ErrorCode::InvalidArgument, source, ": required field \"", key,
           ".original_max_position_embeddings\" is missing (rope_type \"yarn\"; transformers would take the "
           "top-level original_max_position_embeddings or max_position_embeddings: write the pretraining context)");
    }
    scaling.original_max_position_embeddings = field("original_max_position_embeddings");
    // transformers reads these with `or` / truthiness: null and 0 take the default.
    auto optional = [&](const char* name) -> std::optional<double> {
      if (!rope.contains(name) || rope[name].is_null() || (rope[name].is_number() && rope[name] == 0)) {
        return std::nullopt;
      }
      return field(name);
    };
    scaling.beta_fast = optional("beta_fast").value_or(32.0);
    scaling.beta_slow = optional("beta_slow").value_or(1.0);
    // 0.1 * mscale * ln(scale) + 1 past scale 1, as transformers' get_mscale.
    auto get_mscale = [](double scale, double mscale) {
      return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
    };
    if (rope.contains("attention_factor") && !rope["attention_factor"].is_null()) {
      scaling.attention_factor = field("attention_factor");
    } else {
      const std::optional<double> mscale = optional("mscale");
      const std::optional<double> mscale_all_dim = optional("mscale_all_dim");
      scaling.attention_factor = mscale && mscale_all_dim ? get_mscale(scaling.factor, *mscale) /
                                                                 get_mscale(scaling.factor, *mscale_all_dim)
                                                           : get_mscale(scaling.factor, 1.0);
    }
    if (rope.contains("truncate") && rope["truncate"].is_null()) {
      scaling.truncate = false;  // transformers: get("truncate", True) is None, which is falsy
    } else if (rope.contains("truncate")) {
      if (!rope["truncate"].is_boolean()) {
        fail(ErrorCode::InvalidArgument, source, ": \"", key, ".truncate\" must be true or false, got ",
             describe_json(rope["truncate"]));
      }
      scaling.truncate = rope["truncate"].get<bool>();
    }
  } else {
    fail(ErrorCode::Unsupported, source, ": \"", key, "\" ", describe_json(rope),
         " is not supported (rope_type default, linear, llama3 or yarn)");
  }
  // Any other key could change the model (transformers 5 reads e.g.
  // partial_rotary_factor from here): refused unless it is a no-op.
  for (const auto& [name, value] : rope.items()) {
    if (name == "rope_type" || name == "type" || name == "rope_theta") continue;
    if (std::find(fields.begin(), fields.end(), name) != fields.end()) continue;
    if (name == "partial_rotary_factor" && value == 1.0) continue;
    fail(ErrorCode::Unsupported, source, ": \"", key, ".", name, "\" ", describe_json(value),
         " is not supported (rope_type ", describe_json(type), " takes no such field here)");
  }
  return scaling;
}

// The RoPE scaling of a config: transformers >= 5 writes "rope_parameters"
// (and may keep "rope_scaling"), older ones "rope_scaling"; where both are
// given they must say the same.
RopeScaling parse_rope_scaling(const Json& config, const std::string& source) {
  std::optional<RopeScaling> chosen;
  const char* chosen_key = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const RopeScaling scaling = parse_rope_object(config[key], key, source);
    if (chosen && !(*chosen == scaling)) {
      fail(ErrorCode::InvalidArgument, source, ": \"", chosen_key, "\" (", to_string(*chosen), ") and \"", key, "\" (",
           to_string(scaling), ") disagree");
    }
    chosen = scaling;
    chosen_key = key;
  }
  // transformers 5 copies a top-level original_max_position_embeddings over
  // the rope object's (llama3, yarn): where the two differ it would run
  // another model than the object says, so they must agree. (A null one is
  // taken as absent, as transformers 4 does; transformers 5 fails to load it.)
  if (chosen && (chosen->type == RopeScaling::Type::Llama3 || chosen->type == RopeScaling::Type::Yarn) &&
      config.contains("original_max_position_embeddings") && !config["original_max_position_embeddings"].is_null()) {
    const double top =
        number_field(config["original_max_position_embeddings"], "original_max_position_embeddings", source);
    if (top != chosen->original_max_position_embeddings) {
      fail(ErrorCode::InvalidArgument, source, ": \"original_max_position_embeddings\" ",
           describe_json(config["original_max_position_embeddings"]), " and \"", chosen_key,
           ".original_max_position_embeddings\" ", describe_json(config[chosen_key]["original_max_position_embeddings"]),
           " disagree");
    }
  }
  return chosen.value_or(RopeScaling{});
}

// A config file of the checkpoint: a regular file (a FIFO would block the
// read, /dev/zero never end it) of at most kMaxConfigBytes, read whole.
constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{16} << 20;

std::string read_text_file(const std::filesystem::path& path, const char* what) {
  return read_regular_file(path, concat(what, " '", path.string(), "'"), kMaxConfigBytes);
}

// An integer field of quantization_config (JSON integers only: 4, not 4.0).
long long gptq_int(const Json& q, const char* key, const std::string& where) {
  const Json& value = q[key];
  // An unsigned integer past long long's range would wrap to a negative
  // value (2^64 - 1 read as -1, "one group"): refused as it is written.
  if (!value.is_number_integer() ||
      (value.is_number_unsigned() && value.get<unsigned long long>() > static_cast<unsigned long long>(LLONG_MAX))) {
    fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.", key, "\" must be an integer, got ",
         describe_json(value));
  }
  return value.get<long long>();
}

bool gptq_bool(const Json& q, const char* key, bool fallback, const std::string& where) {
  if (!q.contains(key) || q[key].is_null()) return fallback;
  if (!q[key].is_boolean()) {
    fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.", key, "\" must be true or false, got ",
         describe_json(q[key]));
  }
  return q[key].get<bool>();
}

// The zero-point convention: "checkpoint_format" (transformers / AutoGPTQ),
// or "format" (GPTQModel); absent means v1, as every older export is.
GptqZeroFormat parse_checkpoint_format(const Json& q, const std::string& where) {
  std::optional<std::string> chosen;
  const char* chosen_key = nullptr;
  for (const char* key : {"checkpoint_format", "format"}) {
    if (!q.contains(key) || q[key].is_null()) continue;
    if (!q[key].is_string()) {
      fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.", key, "\" must be a string, got ",
           describe_json(q[key]));
    }
    const std::string text = q[key].get<std::string>();
    if (chosen && *chosen != text) {
      fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.", chosen_key, "\" \"", *chosen, "\" and \"", key,
           "\" \"", text, "\" disagree");
    }
    chosen = text;
    chosen_key = key;
  }
  if (!chosen || *chosen == "gptq") return GptqZeroFormat::V1;
  if (*chosen == "gptq_v2") return GptqZeroFormat::V2;
  fail(ErrorCode::Unsupported, where, ": \"quantization_config.", chosen_key, "\" \"", *chosen,
       "\" is not supported (\"gptq\" or \"gptq_v2\")");
}

GptqConfig parse_gptq_object(const Json& q, const std::string& where) {
  if (!q.is_object()) {
    fail(ErrorCode::InvalidArgument, where, ": \"quantization_config\" must be an object, got ", describe_json(q));
  }
  GptqConfig gptq;
  if (!q.contains("quant_method") || q["quant_method"].is_null()) {
    fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.quant_method\" is missing");
  }
  const Json& method = q["quant_method"];
  if (!method.is_string() || method.get<std::string>() != "gptq") {
    fail(ErrorCode::Unsupported, where, ": \"quantization_config.quant_method\" ", describe_json(method),
         " is not supported (only \"gptq\")");
  }
  if (!q.contains("bits") || q["bits"].is_null()) {
    fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.bits\" is missing");
  }
  const long long bits = gptq_int(q, "bits", where);
  if (bits != 4) {
    fail(ErrorCode::Unsupported, where, ": \"quantization_config.bits\" = ", bits, " is not supported (only 4)");
  }
  gptq.bits = 4;
  if (q.contains("group_size") && !q["group_size"].is_null()) {  // transformers' default is 128
    const long long group = gptq_int(q, "group_size", where);
    if (group != -1 && group <= 0) {
      fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.group_size\" = ", group,
           " must be positive or -1 (one group)");
    }
    if (group > 0 && group % 8 != 0) {
      fail(ErrorCode::Unsupported, where, ": \"quantization_config.group_size\" = ", group,
           " is not a multiple of 8 (the INT4 GEMM packs 8 rows per word)");
    }
    if (group > 0x7fffffff) {
      fail(ErrorCode::InvalidArgument, where, ": \"quantization_config.group_size\" = ", group, " is too large");
    }
    gptq.group_size = static_cast<int>(group);
  }
  gptq.desc_act = gptq_bool(q, "desc_act", false, where);
  gptq.sym = gptq_bool(q, "sym", true, where);
  gptq.zero_format = parse_checkpoint_format(q, where);
  if (gptq_bool(q, "lm_head", false, where)) {
    fail(ErrorCode::Unsupported, where, ": \"quantization_config.lm_head\" = true (a quantized lm_head) is not supported");
  }
  return gptq;
}

}  // namespace

std::string to_string(Architecture arch) { return arch == Architecture::Llama ? "llama" : "qwen3"; }

std::string to_string(const RopeScaling& s) {
  switch (s.type) {
    case RopeScaling::Type::None: return "none";
    case RopeScaling::Type::Linear: return concat("linear (factor ", s.factor, ")");
    case RopeScaling::Type::Llama3:
      return concat("llama3 (factor ", s.factor, ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ",
                    s.high_freq_factor, ", original_max_position_embeddings ", s.original_max_position_embeddings, ")");
    case RopeScaling::Type::Yarn:
      return concat("yarn (factor ", s.factor, ", original_max_position_embeddings ",
                    s.original_max_position_embeddings, ", beta_fast ", s.beta_fast, ", beta_slow ", s.beta_slow,
                    ", attention_factor ", s.attention_factor, ", truncate ", s.truncate ? "true" : "false", ")");
  }
  return "unknown";
}

std::vector<double> rope_inverse_frequencies(const ModelConfig& config) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const RopeScaling& s = config.rope_scaling;
  // yarn: pairs that turn fewer than beta_slow times over the pretraining
  // context are interpolated (f / factor), more than beta_fast times kept
  // (f), and a linear ramp over the pair index [low, high] blends between.
  // The range depends on the config only: found once, not per pair.
  const double dim = static_cast<double>(config.head_dim);
  auto correction_pair = [&](double rotations) {
    return dim * std::log(s.original_max_position_embeddings / (rotations * kTwoPi)) /
           (2.0 * std::log(config.rope_theta));
  };
  double low = 0.0, high = 0.0;
  if (s.type == RopeScaling::Type::Yarn) {
    low = correction_pair(s.beta_fast);
    high = correction_pair(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // as transformers: no division by zero
  }
  std::vector<double> inv(config.head_dim / 2);
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const double f = std::pow(config.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(config.head_dim));
    switch (s.type) {
      case RopeScaling::Type::None: inv[i] = f; break;
      case RopeScaling::Type::Linear: inv[i] = f / s.factor; break;
      case RopeScaling::Type::Llama3: {
        const double wavelength = kTwoPi / f;
        if (wavelength < s.original_max_position_embeddings / s.high_freq_factor) {
          inv[i] = f;
        } else if (wavelength > s.original_max_position_embeddings / s.low_freq_factor) {
          inv[i] = f / s.factor;
        } else {
          const double smooth = (s.original_max_position_embeddings / wavelength - s.low_freq_factor) /
                                (s.high_freq_factor - s.low_freq_factor);
          inv[i] = (1.0 - smooth) * f / s.factor + smooth * f;
        }
        break;
      }
      case RopeScaling::Type::Yarn: {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        inv[i] = f / s.factor * ramp + f * (1.0 - ramp);
        break;
      }
    }
  }
  return inv;
}

double rope_attention_factor(const ModelConfig& config) {
  return config.rope_scaling.type == RopeScaling::Type::Yarn ? config.rope_scaling.attention_factor : 1.0;
}

std::vector<double> checked_rope_inverse_frequencies(const ModelConfig& config, const std::string& context) {
  std::vector<double> inv_freqs = rope_inverse_frequencies(config);
  auto refuse = [&](const std::string& what, double value) {
    fail(ErrorCode::InvalidArgument, context, ": RoPE ", to_string(config.rope_scaling), " with rope_theta = ",
         config.rope_theta, " gives ", what, " = ", value, ": not finite");
  };
  // The tables are f32: a factor past FLT_MAX would write inf into them.
  const double scale = rope_attention_factor(config);
  if (!(std::abs(scale) <= std::numeric_limits<float>::max())) refuse("attention factor (as f32)", scale);
  for (std::size_t i = 0; i < inv_freqs.size(); ++i) {
    if (!std::isfinite(inv_freqs[i])) refuse(concat("pair ", i, "'s inverse frequency"), inv_freqs[i]);
  }
  return inv_freqs;
}

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
  // The cap keeps every product of two of them (the projections' and
  // embeddings' element counts, the RoPE tables) far inside size_t (2^48);
  // no real model comes near it.
  for (const auto& [name, value] : sizes) {
    if (value == 0) fail(ErrorCode::InvalidArgument, source, ": ", name, " must be positive");
    if (value > kMaxConfigSize) {
      fail(ErrorCode::InvalidArgument, source, ": ", name, " = ", value, " is larger than ", kMaxConfigSize);
    }
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    fail(ErrorCode::InvalidArgument, source, ": num_attention_heads = ", num_attention_heads,
         " is not a multiple of num_key_value_heads = ", num_key_value_heads);
  }
  if (head_dim % 2 != 0) fail(ErrorCode::InvalidArgument, source, ": head_dim = ", head_dim, " must be even (RoPE)");
  // The norms take it as f32: past FLT_MAX it would reach them as inf.
  if (!(rms_norm_eps > 0.0) || rms_norm_eps > std::numeric_limits<float>::max()) {
    fail(ErrorCode::InvalidArgument, source, ": rms_norm_eps = ", rms_norm_eps, " must be > 0 and fit an f32");
  }
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) {
    fail(ErrorCode::InvalidArgument, source, ": rope_theta = ", rope_theta, " must be a positive number");
  }
  if (rope_scaling.type != RopeScaling::Type::None) {
    auto positive = [&](const char* name, double value) {
      if (!(value > 0.0) || !std::isfinite(value)) {
        fail(ErrorCode::InvalidArgument, source, ": RoPE scaling ", to_string(rope_scaling), ": ", name, " = ", value,
             " must be a positive number");
      }
    };
    positive("factor", rope_scaling.factor);
    if (rope_scaling.type == RopeScaling::Type::Llama3) {
      positive("low_freq_factor", rope_scaling.low_freq_factor);
      positive("high_freq_factor", rope_scaling.high_freq_factor);
      positive("original_max_position_embeddings", rope_scaling.original_max_position_embeddings);
      // The smooth band divides by their difference (transformers only warns).
      if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
        fail(ErrorCode::InvalidArgument, source, ": RoPE scaling ", to_string(rope_scaling),
             ": high_freq_factor must be larger than low_freq_factor");
      }
    }
    if (rope_scaling.type == RopeScaling::Type::Yarn) {
      positive("original_max_position_embeddings", rope_scaling.original_max_position_embeddings);
      positive("beta_fast", rope_scaling.beta_fast);
      positive("beta_slow", rope_scaling.beta_slow);
      positive("attention_factor", rope_scaling.attention_factor);
      // Its correction range divides by log(rope_theta) (transformers
      // raises ZeroDivisionError at 1; below 1 the range turns over).
      if (!(rope_theta > 1.0)) {
        fail(ErrorCode::InvalidArgument, source, ": RoPE scaling ", to_string(rope_scaling), ": rope_theta = ",
             rope_theta, " must be larger than 1 (yarn divides by its logarithm)");
      }
    }
  }
  // Each factor above can be in range and the frequencies still overflow
  // (a yarn factor or beta of 5e-324): found here, not by make_rope_tables
  // after every weight has loaded. head_dim / 2 values: cheap.
  (void)checked_rope_inverse_frequencies(*this, source);
  if (!is_half_precision(dtype)) {
    fail(ErrorCode::DTypeMismatch, source, ": dtype ", ferrum::to_string(dtype), " is not f16 or bf16");
  }
  if (gptq) {
    if (gptq->bits != 4) fail(ErrorCode::Unsupported, source, ": GPTQ bits = ", gptq->bits, " (only 4)");
    if (gptq->group_size == 0 || gptq->group_size < -1 || (gptq->group_size > 0 && gptq->group_size % 8 != 0)) {
      fail(ErrorCode::InvalidArgument, source, ": GPTQ group_size = ", gptq->group_size,
           " must be a positive multiple of 8 or -1");
    }
    // Every projection's k must split into whole groups and whole 8-row
    // words, and its n into whole 8-column qzeros words.
    const std::pair<const char*, std::size_t> ks[] = {
        {"hidden_size", hidden_size}, {"num_attention_heads * head_dim", q_dim()}, {"intermediate_size", intermediate_size}};
    for (const auto& [name, k] : ks) {
      if (k % 8 != 0 || (gptq->group_size > 0 && k % static_cast<std::size_t>(gptq->group_size) != 0)) {
        fail(ErrorCode::InvalidArgument, source, ": GPTQ group_size = ", gptq->group_size, " and 8-row packing need ",
             name, " = ", k, " to be a multiple of both");
      }
    }
    if (kv_dim() % 8 != 0) {
      fail(ErrorCode::InvalidArgument, source, ": GPTQ packs 8 columns per qzeros word; num_key_value_heads * head_dim = ",
           kv_dim(), " is not a multiple of 8");
    }
  }
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source,
                               std::optional<DType> run_dtype) {
  Json config;
  try {
    config = Json::parse(json_text);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past a double
    fail(ErrorCode::InvalidArgument, source, ": not valid JSON (", e.what(), ")");
  }
  if (!config.is_object()) fail(ErrorCode::InvalidArgument, source, ": must be a JSON object");

  ModelConfig cfg;
  cfg.architecture = parse_architecture(config, source);
  refuse_unsupported(config, source);
  cfg.rope_scaling = parse_rope_scaling(config, source);
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
  // Both given: they must agree.
  cfg.rope_theta = 10000.0;
  const bool nested_theta = config.contains("rope_parameters") && config["rope_parameters"].is_object() &&
                            config["rope_parameters"].contains("rope_theta");
  if (nested_theta) {
    cfg.rope_theta = number_field(config["rope_parameters"]["rope_theta"], "rope_parameters.rope_theta", source);
  }
  if (config.contains("rope_theta") && !config["rope_theta"].is_null()) {
    const double top = number_field(config["rope_theta"], "rope_theta", source);
    if (nested_theta && top != cfg.rope_theta) {
      fail(ErrorCode::InvalidArgument, source, ": \"rope_theta\" = ", top, " and \"rope_parameters.rope_theta\" = ",
           cfg.rope_theta, " disagree");
    }
    cfg.rope_theta = top;
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
  cfg.dtype = parse_torch_dtype(config, source, run_dtype);
  if (config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    cfg.gptq = parse_gptq_object(config["quantization_config"], source);
  }
  cfg.validate(source);
  return cfg;
}

GptqConfig parse_gptq_config(const std::string& json_text, const std::string& source) {
  Json q;
  try {
    q = Json::parse(json_text);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past a double
    fail(ErrorCode::InvalidArgument, source, ": not valid JSON (", e.what(), ")");
  }
  // AutoGPTQ's quantize_config.json has no quant_method: it is GPTQ by being there.
  if (q.is_object() && !q.contains("quant_method")) q["quant_method"] = "gptq";
  return parse_gptq_object(q, source);
}

ModelConfig load_model_config(const std::filesystem::path& config_json, std::optional<DType> run_dtype) {
  return parse_model_config(read_text_file(config_json, "config"), concat("config '", config_json.string(), "'"),
                            run_dtype);
}

ModelConfig load_checkpoint_config(const std::filesystem::path& dir, std::optional<DType> run_dtype) {
  // The folder first, so that a mistyped path is named as such and not as
  // a config.json that cannot be opened.
  std::error_code dir_ec;
  const auto dir_kind = std::filesystem::status(dir, dir_ec).type();
  if (dir_kind == std::filesystem::file_type::not_found) {
    fail(ErrorCode::InvalidArgument, "checkpoint '", dir.string(), "': no such directory");
  }
  if (!dir_ec && dir_kind != std::filesystem::file_type::directory) {
    fail(ErrorCode::InvalidArgument, "checkpoint '", dir.string(),
         "' is not a directory (give the folder holding config.json and the *.safetensors files)");
  }
  ModelConfig cfg = load_model_config(dir / "config.json", run_dtype);
  const std::filesystem::path quantize_config = dir / "quantize_config.json";
  // Read wherever the name exists in any form: a FIFO, a dangling link or
  // an unreadable file there is an error named as such, not skipped.
  std::error_code ec;
  const auto kind = std::filesystem::symlink_status(quantize_config, ec).type();
  if (!cfg.gptq && kind != std::filesystem::file_type::not_found) {
    const std::string source = concat("quantize config '", quantize_config.string(), "'");
    cfg.gptq = parse_gptq_config(read_text_file(quantize_config, "quantize config"), source);
    cfg.validate(source);
  }
  return cfg;
}

GptqConfig random_gptq_config(const ModelConfig& config) {
  GptqConfig gptq;  // group 128, symmetric, v1, no act-order
  for (int group : {128, 64, 32, 16, 8}) {
    gptq.group_size = group;
    const auto g = static_cast<std::size_t>(group);
    if (config.hidden_size % g == 0 && config.q_dim() % g == 0 && config.intermediate_size % g == 0) break;
  }
  return gptq;
}

std::vector<std::string> preset_names() { return {"llama3-8b", "qwen3-0.6b", "tiny-llama", "tiny-qwen3"}; }

ModelConfig preset_config(const std::string& name) {
  ModelConfig cfg;
  if (name == "llama3-8b") {
    cfg = {Architecture::Llama, 4096, 14336, 32, 32, 8, 128, 128256, 1e-5, 500000.0, 8192, false, DType::BF16, std::nullopt, RopeScaling{}};
  } else if (name == "qwen3-0.6b") {
    cfg = {Architecture::Qwen3, 1024, 3072, 28, 16, 8, 128, 151936, 1e-6, 1000000.0, 40960, true, DType::BF16, std::nullopt, RopeScaling{}};
  } else if (name == "tiny-llama") {
    cfg = {Architecture::Llama, 64, 128, 2, 4, 2, 16, 256, 1e-5, 10000.0, 128, false, DType::F16, std::nullopt, RopeScaling{}};
  } else if (name == "tiny-qwen3") {
    cfg = {Architecture::Qwen3, 64, 128, 2, 4, 2, 16, 256, 1e-6, 1000000.0, 128, true, DType::F16, std::nullopt, RopeScaling{}};
  } else {
    std::string known;
    for (const std::string& preset : preset_names()) known += " " + preset;
    fail(ErrorCode::InvalidArgument, "preset '", name, "' is unknown (known:", known, ")");
  }
  cfg.validate(concat("preset '", name, "'"));
  return cfg;
}

}  // namespace ferrum::engine
