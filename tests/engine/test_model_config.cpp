// config.json parsing and presets.
#include <cmath>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "engine_error.hpp"
#include "engine_test_support.hpp"
#include "support/test_support.hpp"
#include "model_config.hpp"

namespace ferrum::engine {
namespace {

// Trimmed from meta-llama/Meta-Llama-3-8B's config.json.
const char* kLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 500000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
  "use_cache": true, "vocab_size": 128256})";

// Trimmed from Qwen/Qwen3-0.6B's config.json.
const char* kQwen3Config = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.dtype, b.dtype);
}

TEST(ModelConfig, ParsesLlama3Config) {
  const ModelConfig c = parse_model_config(kLlamaConfig, "llama config");
  EXPECT_EQ(c.architecture, Architecture::Llama);
  EXPECT_EQ(c.head_dim, 128u);  // hidden / heads
  EXPECT_FALSE(c.has_qk_norm());
  expect_same(c, preset_config("llama3-8b"));
}

TEST(ModelConfig, ParsesQwen3Config) {
  const ModelConfig c = parse_model_config(kQwen3Config, "qwen3 config");
  EXPECT_EQ(c.architecture, Architecture::Qwen3);
  EXPECT_TRUE(c.has_qk_norm());
  EXPECT_EQ(c.qkv_dim(), (16u + 2 * 8u) * 128u);
  expect_same(c, preset_config("qwen3-0.6b"));
}

TEST(ModelConfig, Defaults) {
  nlohmann::json j = nlohmann::json::parse(kLlamaConfig);
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("tie_word_embeddings");
  j["torch_dtype"] = "float16";
  const ModelConfig c = parse_model_config(j.dump(), "cfg");
  EXPECT_EQ(c.num_key_value_heads, 32u);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::F16);
}

// transformers >= 5 keeps RoPE settings in "rope_parameters".
TEST(ModelConfig, RopeParametersOfTransformers5) {
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  j["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  EXPECT_DOUBLE_EQ(parse_model_config(j.dump(), "cfg").rope_theta, 1000000.0);
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1000000.0}, {"factor", 4.0}};
  j.erase("rope_scaling");
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::Unsupported, "rope_parameters");
}

// Llama 3.1 / 3.2's RoPE scaling (rope_type llama3) as transformers 4
// writes it, and as transformers 5 does (in rope_parameters, beside
// rope_theta); linear scaling; what is refused.
TEST(ModelConfig, RopeScaling) {
  const nlohmann::json llama31_scaling = {{"factor", 8.0},
                                          {"low_freq_factor", 1.0},
                                          {"high_freq_factor", 4.0},
                                          {"original_max_position_embeddings", 8192},
                                          {"rope_type", "llama3"}};
  nlohmann::json j = nlohmann::json::parse(kLlamaConfig);
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = llama31_scaling;
  const ModelConfig c = parse_model_config(j.dump(), "llama 3.1");
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  // transformers 5: rope_parameters holds the type, its fields and rope_theta.
  nlohmann::json j5 = j;
  j5.erase("rope_theta");
  j5.erase("rope_scaling");
  j5["rope_parameters"] = llama31_scaling;
  j5["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig c5 = parse_model_config(j5.dump(), "llama 3.1, transformers 5");
  EXPECT_EQ(c5.rope_scaling, c.rope_scaling);
  EXPECT_DOUBLE_EQ(c5.rope_theta, 500000.0);
  // Both keys, saying the same: taken; saying different things: refused.
  j5["rope_scaling"] = llama31_scaling;
  EXPECT_EQ(parse_model_config(j5.dump(), "both").rope_scaling, c.rope_scaling);
  j5["rope_scaling"]["factor"] = 32.0;
  EXPECT_ENGINE_ERROR(parse_model_config(j5.dump(), "c"), ErrorCode::InvalidArgument, "disagree", "factor 32");
  // The older key "type" for "rope_type".
  nlohmann::json old = j;
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(parse_model_config(old.dump(), "type").rope_scaling, c.rope_scaling);
  // Linear.
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse_model_config(j.dump(), "linear").rope_scaling.type, RopeScaling::Type::Linear);
  EXPECT_EQ(parse_model_config(j.dump(), "linear").rope_scaling.factor, 2.0);
  // Each llama3 field is required and must be a positive number; the band
  // edges must be ordered.
  for (const char* field : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SCOPED_TRACE(field);
    j["rope_scaling"] = llama31_scaling;
    j["rope_scaling"].erase(field);
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument,
                        std::string("rope_scaling.") + field, "missing");
    j["rope_scaling"][field] = -1.0;
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument,
                        std::string("rope_scaling.") + field, "positive");
    j["rope_scaling"][field] = "8";
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument,
                        std::string("rope_scaling.") + field);
  }
  j["rope_scaling"] = llama31_scaling;
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "high_freq_factor must be larger");
  // Types the engine does not compute.
  for (const char* type : {"dynamic", "longrope", "ntk"}) {
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::Unsupported, "rope_scaling", type);
  }
  j["rope_scaling"] = "llama3";
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "rope_scaling", "object");
  // A field the type does not take could change the model (transformers 5
  // reads partial_rotary_factor from rope_parameters): refused, unless a no-op.
  j["rope_scaling"] = llama31_scaling;
  j["rope_scaling"]["partial_rotary_factor"] = 0.5;
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::Unsupported, "rope_scaling.partial_rotary_factor");
  j["rope_scaling"]["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(parse_model_config(j.dump(), "c"));
  j["rope_scaling"] = {{"rope_type", "default"}, {"mrope_section", {16, 24, 24}}};
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::Unsupported, "rope_scaling.mrope_section");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}};
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::Unsupported, "rope_scaling.low_freq_factor");
  // A top-level rope_theta and rope_parameters' must agree.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "rope_theta", "disagree");
  j["rope_parameters"]["rope_theta"] = 500000.0;
  EXPECT_DOUBLE_EQ(parse_model_config(j.dump(), "c").rope_theta, 500000.0);
}

// YaRN as Qwen3's long-context configs write it (factor and the original
// context only) and with every field given, resolved as transformers
// resolves them; what is refused.
TEST(ModelConfig, YarnRopeScaling) {
  const nlohmann::json qwen3_yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = qwen3_yarn;
  const RopeScaling s = parse_model_config(j.dump(), "qwen3 yarn").rope_scaling;
  EXPECT_EQ(s.type, RopeScaling::Type::Yarn);
  EXPECT_EQ(s.factor, 4.0);
  EXPECT_EQ(s.original_max_position_embeddings, 32768.0);
  EXPECT_EQ(s.beta_fast, 32.0);
  EXPECT_EQ(s.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(s.attention_factor, 0.1 * std::log(4.0) + 1.0);  // transformers' get_mscale(factor)
  EXPECT_TRUE(s.truncate);
  // transformers 5's rope_parameters, and the same in both keys.
  nlohmann::json j5 = j;
  j5.erase("rope_theta");
  j5.erase("rope_scaling");
  j5["rope_parameters"] = qwen3_yarn;
  j5["rope_parameters"]["rope_theta"] = 1000000.0;
  EXPECT_EQ(parse_model_config(j5.dump(), "transformers 5").rope_scaling, s);
  // null and 0 take transformers' defaults (it reads them with `or`).
  j["rope_scaling"]["beta_fast"] = 0;
  j["rope_scaling"]["beta_slow"] = nullptr;
  j["rope_scaling"]["attention_factor"] = nullptr;
  EXPECT_EQ(parse_model_config(j.dump(), "defaults").rope_scaling, s);
  // Every field given.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0},   {"original_max_position_embeddings", 4096},
                       {"beta_fast", 16.0},   {"beta_slow", 2.0}, {"attention_factor", 1.5},
                       {"truncate", false}};
  const RopeScaling all = parse_model_config(j.dump(), "all").rope_scaling;
  EXPECT_EQ(all.factor, 8.0);
  EXPECT_EQ(all.original_max_position_embeddings, 4096.0);
  EXPECT_EQ(all.beta_fast, 16.0);
  EXPECT_EQ(all.beta_slow, 2.0);
  EXPECT_EQ(all.attention_factor, 1.5);
  EXPECT_FALSE(all.truncate);
  // An explicit null truncate is falsy to transformers: not rounded.
  j["rope_scaling"]["truncate"] = nullptr;
  EXPECT_FALSE(parse_model_config(j.dump(), "null truncate").rope_scaling.truncate);
  // A top-level original_max_position_embeddings (transformers 5 copies it
  // over the rope object's) must agree with the object.
  j["original_max_position_embeddings"] = 4096;
  EXPECT_NO_THROW(parse_model_config(j.dump(), "same"));
  j["original_max_position_embeddings"] = 8192;
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "original_max_position_embeddings",
                      "8192", "4096", "disagree");
  j.erase("original_max_position_embeddings");
  // The same through rope_parameters, and for llama3; a bad top-level value is refused by name.
  nlohmann::json l = nlohmann::json::parse(kLlamaConfig);
  l["rope_parameters"] = {{"rope_type", "llama3"},  {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}, {"rope_theta", 500000.0}};
  l["original_max_position_embeddings"] = 1048576;
  EXPECT_ENGINE_ERROR(parse_model_config(l.dump(), "c"), ErrorCode::InvalidArgument, "1048576", "8192", "disagree");
  l["original_max_position_embeddings"] = -1;
  EXPECT_ENGINE_ERROR(parse_model_config(l.dump(), "c"), ErrorCode::InvalidArgument, "original_max_position_embeddings",
                      "positive");
  l["original_max_position_embeddings"] = 8192;
  EXPECT_NO_THROW(parse_model_config(l.dump(), "same"));
  // mscale and mscale_all_dim (DeepSeek's form): their get_mscale ratio.
  j["rope_scaling"] = qwen3_yarn;
  j["rope_scaling"]["mscale"] = 1.0;
  j["rope_scaling"]["mscale_all_dim"] = 0.5;
  EXPECT_DOUBLE_EQ(parse_model_config(j.dump(), "mscale").rope_scaling.attention_factor,
                   (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0));
  // mscale alone: transformers ignores it (it needs both).
  j["rope_scaling"].erase("mscale_all_dim");
  EXPECT_DOUBLE_EQ(parse_model_config(j.dump(), "mscale alone").rope_scaling.attention_factor,
                   0.1 * std::log(4.0) + 1.0);
  // Required fields, positive numbers, a boolean truncate, no other keys.
  for (const char* field : {"factor", "original_max_position_embeddings"}) {
    SCOPED_TRACE(field);
    j["rope_scaling"] = qwen3_yarn;
    j["rope_scaling"].erase(field);
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument,
                        std::string("rope_scaling.") + field, "missing");
  }
  // mscale is refused when negative even alone, where transformers ignores
  // it (deliberately: a negative scale is no config anyone means).
  for (const char* field : {"factor", "beta_fast", "beta_slow", "attention_factor", "mscale"}) {
    SCOPED_TRACE(field);
    j["rope_scaling"] = qwen3_yarn;
    j["rope_scaling"][field] = -2.0;
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument,
                        std::string("rope_scaling.") + field, "positive");
  }
  j["rope_scaling"] = qwen3_yarn;
  j["rope_scaling"]["truncate"] = "yes";
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "rope_scaling.truncate",
                      "true or false");
  j["rope_scaling"] = qwen3_yarn;
  j["rope_scaling"]["low_freq_factor"] = 1.0;
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::Unsupported, "rope_scaling.low_freq_factor");
  // yarn's correction range divides by log(rope_theta): 1 (a division by
  // zero, NaN tables) and below (the range turned over) are refused.
  j["rope_scaling"] = qwen3_yarn;
  for (const double theta : {1.0, 0.5}) {
    j["rope_theta"] = theta;
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument,
                        concat("rope_theta = ", theta), "must be larger than 1");
  }
  j["rope_theta"] = 1.5;
  EXPECT_NO_THROW(parse_model_config(j.dump(), "just above 1"));
}

// RoPE settings validate() takes field by field can still overflow
// together: a yarn factor or beta of 5e-324, a llama3 factor of 5e-324
// give NaN or infinite frequencies. Refused when the config is parsed, not
// by make_rope_tables after every weight has loaded.
TEST(ModelConfig, RopeSettingsWithNonFiniteFrequenciesAreRefused) {
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);
  const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  for (const char* field : {"factor", "beta_fast"}) {
    SCOPED_TRACE(field);
    j["rope_scaling"] = yarn;
    j["rope_scaling"][field] = 5e-324;
    if (std::string(field) == "beta_fast") j["rope_scaling"]["beta_slow"] = 5e-324;
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "c: RoPE yarn",
                        "inverse frequency", "not finite");
  }
  nlohmann::json l = nlohmann::json::parse(kLlamaConfig);
  l["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 5e-324},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_ENGINE_ERROR(parse_model_config(l.dump(), "c"), ErrorCode::InvalidArgument, "c: RoPE llama3",
                      "inverse frequency = inf", "not finite");
  // A theta so small its powers overflow, with no scaling at all.
  l["rope_scaling"] = nullptr;
  l["rope_theta"] = 5e-324;
  EXPECT_ENGINE_ERROR(parse_model_config(l.dump(), "c"), ErrorCode::InvalidArgument, "c: RoPE none",
                      "inverse frequency = inf");
  l["rope_theta"] = 500000.0;
  EXPECT_NO_THROW(parse_model_config(l.dump(), "c"));
  // A yarn attention factor a double holds and an f32 does not: the
  // tables would hold inf (found by review, session 69). Given directly or
  // through mscale / mscale_all_dim.
  j["rope_scaling"] = yarn;
  j["rope_scaling"]["attention_factor"] = 1e39;
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "c: RoPE yarn",
                      "attention factor (as f32) = 1e+39", "not finite");
  j["rope_scaling"] = yarn;
  j["rope_scaling"]["mscale"] = 1e300;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::InvalidArgument, "attention factor (as f32)");
}

// The dtype the model runs in: the checkpoint's torch_dtype, or the one the
// caller names (the weights converted at load); float32 needs one.
TEST(ModelConfig, RunDTypeOverridesTorchDType) {
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);  // bfloat16
  EXPECT_EQ(parse_model_config(j.dump(), "c").dtype, DType::BF16);
  EXPECT_EQ(parse_model_config(j.dump(), "c", DType::F16).dtype, DType::F16);
  j["torch_dtype"] = "float32";
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c"), ErrorCode::DTypeMismatch, "float32", "--dtype f16 or bf16");
  EXPECT_EQ(parse_model_config(j.dump(), "c", DType::BF16).dtype, DType::BF16);
  EXPECT_EQ(parse_model_config(j.dump(), "c", DType::F16).dtype, DType::F16);
  // Only the half dtypes run, whatever is asked.
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c", DType::F32), ErrorCode::DTypeMismatch, "not f16 or bf16");
  j["torch_dtype"] = "float64";
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "c", DType::F16), ErrorCode::DTypeMismatch, "float64");
}

TEST(ModelConfig, NewerDTypeKey) {
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  EXPECT_EQ(parse_model_config(j.dump(), "cfg").dtype, DType::F16);
  // A null torch_dtype beside it is absent, not a missing dtype.
  j["torch_dtype"] = nullptr;
  EXPECT_EQ(parse_model_config(j.dump(), "cfg").dtype, DType::F16);
}

TEST(ModelConfig, MissingRequiredFields) {
  for (const char* key : {"architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size", "rms_norm_eps", "max_position_embeddings",
                          "torch_dtype"}) {
    nlohmann::json j = nlohmann::json::parse(kLlamaConfig);
    j.erase(key);
    EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "my/config.json"), ErrorCode::InvalidArgument,
                        "my/config.json", key, "missing");
  }
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);
  j.erase("head_dim");
  EXPECT_ENGINE_ERROR(parse_model_config(j.dump(), "q"), ErrorCode::InvalidArgument, "head_dim", "missing");
}

TEST(ModelConfig, BadValues) {
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = nlohmann::json::parse(kLlamaConfig);
    j[key] = std::move(value);
    return j.dump();
  };
  EXPECT_ENGINE_ERROR(parse_model_config(with("hidden_size", 0), "c"), ErrorCode::InvalidArgument, "hidden_size");
  EXPECT_ENGINE_ERROR(parse_model_config(with("hidden_size", "4096"), "c"), ErrorCode::InvalidArgument, "hidden_size");
  EXPECT_ENGINE_ERROR(parse_model_config(with("num_key_value_heads", 5), "c"), ErrorCode::InvalidArgument,
                      "num_key_value_heads = 5");
  EXPECT_ENGINE_ERROR(parse_model_config(with("rms_norm_eps", -1), "c"), ErrorCode::InvalidArgument, "rms_norm_eps");
  // The norms take eps as f32: one past FLT_MAX is refused here, not by the
  // first norm after every weight has loaded.
  EXPECT_ENGINE_ERROR(parse_model_config(with("rms_norm_eps", 1e39), "c"), ErrorCode::InvalidArgument,
                      "rms_norm_eps = 1e+39", "fit an f32");
  EXPECT_ENGINE_ERROR(parse_model_config(with("torch_dtype", "float32"), "c"), ErrorCode::DTypeMismatch, "float32");
  EXPECT_ENGINE_ERROR(parse_model_config(with("architectures", {"MistralForCausalLM"}), "c"), ErrorCode::Unsupported,
                      "MistralForCausalLM");
  EXPECT_ENGINE_ERROR(parse_model_config(with("rope_scaling", {{"rope_type", "dynamic"}}), "c"),
                      ErrorCode::Unsupported, "rope_scaling");
  EXPECT_ENGINE_ERROR(parse_model_config(with("rope_scaling", {{"rope_type", "yarn"}}), "c"),
                      ErrorCode::InvalidArgument, "rope_scaling.factor");
  EXPECT_ENGINE_ERROR(parse_model_config(with("rope_scaling", {{"rope_type", "llama3"}}), "c"),
                      ErrorCode::InvalidArgument, "rope_scaling.factor");
  EXPECT_ENGINE_ERROR(parse_model_config(with("attention_bias", true), "c"), ErrorCode::Unsupported, "attention_bias");
  EXPECT_ENGINE_ERROR(parse_model_config("{not json", "c"), ErrorCode::InvalidArgument, "not valid JSON");
}

// Values past any model's, or built to break the error path: a named error,
// never a crash, a wrapped size or a silently different model.
TEST(ModelConfig, HostileValues) {
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = nlohmann::json::parse(kLlamaConfig);
    j[key] = std::move(value);
    return j.dump();
  };
  // Sizes whose products would wrap size_t (the RoPE tables at 2^62
  // positions were empty, then written past their end).
  EXPECT_ENGINE_ERROR(parse_model_config(with("max_position_embeddings", std::uint64_t{1} << 62), "c"),
                      ErrorCode::InvalidArgument, "max_position_embeddings = 4611686018427387904");
  EXPECT_ENGINE_ERROR(parse_model_config(with("num_attention_heads", (std::uint64_t{1} << 63) + 1), "c"),
                      ErrorCode::InvalidArgument, "num_attention_heads");
  // Nested 100 000 deep: quoted a few levels deep (dump() overflowed the stack).
  constexpr int kDepth = 100000;
  std::string text = with("architectures", "@nested@");
  text.replace(text.find("\"@nested@\""), 10, std::string(kDepth, '[') + std::string(kDepth, ']'));
  EXPECT_ENGINE_ERROR(parse_model_config(text, "c"), ErrorCode::InvalidArgument, "architectures", "[[[[...]]]]");
  // rope_type and type disagreeing: transformers versions differ in which
  // they read, so neither order may pass.
  EXPECT_ENGINE_ERROR(parse_model_config(with("rope_scaling", {{"rope_type", "llama3"}, {"type", "default"}}), "c"),
                      ErrorCode::InvalidArgument, "rope_scaling.rope_type", "disagree");
  EXPECT_ENGINE_ERROR(parse_model_config(with("rope_scaling", {{"type", "llama3"}, {"rope_type", "default"}}), "c"),
                      ErrorCode::InvalidArgument, "rope_scaling.rope_type", "disagree");
  EXPECT_ENGINE_ERROR(parse_model_config(with("rope_scaling", {{"factor", 8.0}}), "c"), ErrorCode::Unsupported,
                      "rope_scaling");
  // Attention the engine does not run.
  EXPECT_ENGINE_ERROR(parse_model_config(with("use_sliding_window", true), "c"), ErrorCode::Unsupported,
                      "use_sliding_window");
  EXPECT_ENGINE_ERROR(parse_model_config(with("layer_types", {"full_attention", "sliding_attention"}), "c"),
                      ErrorCode::Unsupported, "layer_types", "sliding_attention");
  EXPECT_ENGINE_ERROR(parse_model_config(with("partial_rotary_factor", 0.5), "c"), ErrorCode::Unsupported,
                      "partial_rotary_factor", "0.5");
  // ... and what it does run, written out.
  EXPECT_NO_THROW(parse_model_config(with("use_sliding_window", false), "c"));
  EXPECT_NO_THROW(parse_model_config(with("layer_types", {"full_attention", "full_attention"}), "c"));
  EXPECT_NO_THROW(parse_model_config(with("partial_rotary_factor", 1.0), "c"));
  EXPECT_NO_THROW(parse_model_config(with("rope_scaling", {{"rope_type", "default"}, {"type", "default"}}), "c"));
  // A GPTQ integer past long long: refused as written, not wrapped to -1
  // ("one group").
  EXPECT_ENGINE_ERROR(
      parse_gptq_config(R"({"quant_method": "gptq", "bits": 4, "group_size": 18446744073709551615})", "q"),
      ErrorCode::InvalidArgument, "group_size", "18446744073709551615");
  // A number past a double: the JSON reader's own out-of-range error, as a
  // named ferrum::Error (found by fuzzing the parsers, session 49).
  std::string huge = with("rms_norm_eps", "@huge@");
  huge.replace(huge.find("\"@huge@\""), 8, "1e999");
  EXPECT_ENGINE_ERROR(parse_model_config(huge, "c"), ErrorCode::InvalidArgument, "not valid JSON", "1e999");
  EXPECT_ENGINE_ERROR(parse_gptq_config(R"({"quant_method": "gptq", "bits": 4e999})", "q"), ErrorCode::InvalidArgument,
                      "not valid JSON", "4e999");
  // A long string quoted in a message is cut at 160 bytes, never inside a
  // UTF-8 sequence (dump() threw type_error 316 on the half character).
  const std::string long_act = std::string(159, 'a') + "\xC3\xA9" + std::string(40, 'b');
  EXPECT_ENGINE_ERROR(parse_model_config(with("hidden_act", long_act), "c"), ErrorCode::Unsupported, "hidden_act",
                      std::string(159, 'a') + "\"...");
}

TEST(ModelConfig, LoadFromFile) {
  const auto dir = testing::scratch_dir();
  std::ofstream(dir / "config.json") << kQwen3Config;
  expect_same(load_model_config(dir / "config.json"), preset_config("qwen3-0.6b"));
  EXPECT_ENGINE_ERROR(load_model_config(dir / "absent.json"), ErrorCode::InvalidArgument, "absent.json");
}

// Only a regular file of at most 16 MiB is read: a FIFO would block the
// read (no writer ever comes) and /dev/zero never end it.
TEST(ModelConfig, LoadsOnlyABoundedRegularFile) {
  const auto dir = testing::scratch_dir();
  EXPECT_ENGINE_ERROR(load_model_config(dir), ErrorCode::InvalidArgument, "not a regular file", "a directory");
  if (std::filesystem::exists("/dev/zero")) {
    EXPECT_ENGINE_ERROR(load_model_config("/dev/zero"), ErrorCode::InvalidArgument, "not a regular file");
  }
  const auto big = dir / "big.json";
  {
    std::ofstream out(big);
    out << kQwen3Config << std::string((std::size_t{16} << 20) + 1, ' ');  // valid JSON, one byte too long
  }
  EXPECT_ENGINE_ERROR(load_model_config(big), ErrorCode::InvalidArgument, "big.json", "-byte limit");
  // A dangling link names its missing file.
  const auto dangling = dir / "dangling.json";
  std::filesystem::create_symlink(dir / "gone.json", dangling);
  EXPECT_ENGINE_ERROR(load_model_config(dangling), ErrorCode::InvalidArgument, "dangling.json", "no such file");
  // A quantize_config.json that is no regular file is an error, not skipped.
  const auto ckpt = dir / "ckpt";
  std::filesystem::create_directories(ckpt / "quantize_config.json");
  std::ofstream(ckpt / "config.json") << kQwen3Config;
  EXPECT_ENGINE_ERROR(load_checkpoint_config(ckpt), ErrorCode::InvalidArgument, "quantize_config.json",
                      "not a regular file");
  // The checkpoint folder itself: missing, or a file in its place, is named as such.
  EXPECT_ENGINE_ERROR(load_checkpoint_config(dir / "no-such-checkpoint"), ErrorCode::InvalidArgument,
                      "no-such-checkpoint", "no such directory");
  EXPECT_ENGINE_ERROR(load_checkpoint_config(ckpt / "config.json"), ErrorCode::InvalidArgument, "config.json",
                      "is not a directory");
  const auto fifo = dir / "fifo.json";
  if (mkfifo(fifo.c_str(), 0600) != 0) GTEST_SKIP() << "no FIFO on this filesystem: " << std::strerror(errno);
  EXPECT_ENGINE_ERROR(load_model_config(fifo), ErrorCode::InvalidArgument, "fifo.json", "not a regular file",
                      "a FIFO");
}

TEST(ModelConfig, TinyPresetsRoundTripThroughConfigJson) {
  for (const std::string& name : preset_names()) {
    const ModelConfig preset = preset_config(name);
    expect_same(parse_model_config(testing::config_json(preset), name), preset);
  }
  EXPECT_ENGINE_ERROR(preset_config("gpt2"), ErrorCode::InvalidArgument, "gpt2", "tiny-llama");
}

// Qwen3's config with a GPTQ quantization_config, edited at random 3000
// times: each parses (as a model config and as a GPTQ config) or throws
// ferrum::Error; nothing else escapes.
TEST(ModelConfig, RandomlyEditedTextsParseOrThrowNamedErrors) {
  nlohmann::json j = nlohmann::json::parse(kQwen3Config);
  j["quantization_config"] = {{"bits", 4}, {"group_size", 128}, {"desc_act", false}, {"sym", true},
                              {"quant_method", "gptq"}};
  const std::string valid = j.dump();
  FERRUM_SEEDED_RNG(seeded);  // FERRUM_TEST_SEED replays a failure
  std::mt19937_64& rng = seeded.engine();
  for (int round = 0; round < 3000; ++round) {
    std::string text = valid;
    testing::mutate_for_fuzz(text, rng);
    for (int parser = 0; parser < 2; ++parser) {
      try {
        if (parser == 0) {
          (void)parse_model_config(text, "c");
        } else {
          (void)parse_gptq_config(text, "q");
        }
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << seeded.describe() << ", round " << round << ", " << (parser == 0 ? "model" : "GPTQ")
                      << " config: " << e.what() << "\n" << text;
        return;
      }
    }
  }
}

}  // namespace
}  // namespace ferrum::engine
