// GPTQ INT4 models in the engine: quantization_config parsing and its errors,
// loading (fused and unfused projections, act-order, missing g_idx, mixed
// dense / GPTQ), and greedy decoding with gemm_gptq on CpuBackend against the
// fp64 NaiveDecoder running on the exactly dequantized weights
// (testing::DequantizedSource). One test runs the same on the GPU and skips
// without one.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <ferrum/cuda_backend.hpp>

#include "checkpoint_layout.hpp"
#include "decoder.hpp"
#include "engine_test_support.hpp"
#include "naive_decoder.hpp"
#include "weights.hpp"

namespace ferrum::engine {
namespace {

using testing::DequantizedSource;
using testing::GptqTestOptions;
using testing::GptqTestSource;
using testing::expect_logits_near;
using testing::gpu_tiny_llama_config;
using testing::logit_bound;
using testing::max_abs;
using testing::max_diff;

const std::vector<std::int32_t> kPrompt = {1, 17, 42, 255, 3, 99, 200};
constexpr std::size_t kSteps = 6;

ModelConfig gptq_config(const std::string& preset, int group_size = 32,
                        GptqZeroFormat format = GptqZeroFormat::V1, bool desc_act = false) {
  ModelConfig c = preset_config(preset);
  GptqConfig g;
  g.group_size = group_size;
  g.zero_format = format;
  g.desc_act = desc_act;
  c.gptq = g;
  c.validate("test config");
  return c;
}

// Prefill kPrompt, then kSteps greedy steps, against the fp64 reference on
// `dequantized` (engine_test_support.hpp).
std::vector<std::int32_t> expect_decodes_like_reference(Backend& be, const ModelWeights& weights,
                                                        const TensorSource& dequantized,
                                                        DecodeMode mode = DecodeMode::Eager,
                                                        DecoderOptions options = {}) {
  return testing::expect_decodes_like_reference(be, weights, dequantized, kPrompt, kSteps, /*min_exact=*/kSteps - 1,
                                                mode, options);
}

void expect_projection(const Projection& p, std::size_t n, std::size_t k, bool quantized) {
  EXPECT_EQ(p.n, n);
  EXPECT_EQ(p.k, k);
  EXPECT_EQ(p.quantized(), quantized);
  EXPECT_EQ(p.dense.is_null(), quantized);
  if (quantized) {
    EXPECT_EQ(p.gptq->kind(), QuantKind::Gptq);
    EXPECT_EQ(p.gptq->n(), n);
    EXPECT_EQ(p.gptq->k(), k);
  }
}

// ── quantization_config ──────────────────────────────────────────────────

// The tiny-llama config.json with `quantization_config` (a JSON object text) added.
std::string tiny_config_with(const std::string& quantization_config) {
  nlohmann::json j = nlohmann::json::parse(testing::config_json(preset_config("tiny-llama")));
  j["quantization_config"] = nlohmann::json::parse(quantization_config);
  return j.dump();
}

TEST(GptqConfig, ParsesQuantizationConfig) {
  // As transformers / AutoGPTQ write it (trimmed).
  const ModelConfig c = parse_model_config(
      tiny_config_with(R"({"bits": 4, "group_size": 32, "damp_percent": 0.01, "desc_act": true, "sym": false,
                           "true_sequential": true, "quant_method": "gptq", "checkpoint_format": "gptq_v2",
                           "model_name_or_path": null, "static_groups": false})"),
      "cfg");
  ASSERT_TRUE(c.gptq.has_value());
  EXPECT_EQ(c.gptq->bits, 4);
  EXPECT_EQ(c.gptq->group_size, 32);
  EXPECT_TRUE(c.gptq->desc_act);
  EXPECT_FALSE(c.gptq->sym);
  EXPECT_EQ(c.gptq->zero_format, GptqZeroFormat::V2);
  EXPECT_EQ(c.gptq->groups(64), 2u);

  // GPTQModel writes "format"; no format at all is v1; group_size -1 is one group.
  const ModelConfig v1 = parse_model_config(
      tiny_config_with(R"({"bits": 4, "group_size": -1, "quant_method": "gptq", "format": "gptq"})"), "cfg");
  EXPECT_EQ(v1.gptq->zero_format, GptqZeroFormat::V1);
  EXPECT_EQ(v1.gptq->group_size, -1);
  EXPECT_EQ(v1.gptq->groups(128), 1u);
  EXPECT_TRUE(v1.gptq->sym);
  EXPECT_FALSE(v1.gptq->desc_act);
  EXPECT_EQ(parse_model_config(tiny_config_with(R"({"bits": 4, "group_size": 64, "quant_method": "gptq"})"), "cfg")
                .gptq->zero_format,
            GptqZeroFormat::V1);
  EXPECT_FALSE(parse_model_config(testing::config_json(preset_config("tiny-llama")), "cfg").gptq.has_value());
}

struct BadQuantConfig {
  const char* json;
  ErrorCode code;
  std::vector<std::string> needles;
};

TEST(GptqConfig, RefusesBadQuantizationConfigs) {
  const std::vector<BadQuantConfig> cases = {
      {R"({"bits": 8, "group_size": 32, "quant_method": "gptq"})", ErrorCode::Unsupported,
       {"quantization_config.bits", "8", "only 4"}},
      {R"({"bits": 3, "group_size": 32, "quant_method": "gptq"})", ErrorCode::Unsupported, {"bits", "3"}},
      {R"({"bits": "4", "group_size": 32, "quant_method": "gptq"})", ErrorCode::InvalidArgument,
       {"quantization_config.bits", "integer"}},
      {R"({"group_size": 32, "quant_method": "gptq"})", ErrorCode::InvalidArgument,
       {"quantization_config.bits", "missing"}},
      {R"({"bits": 4, "quant_method": "awq", "version": "gemm"})", ErrorCode::Unsupported,
       {"quantization_config.quant_method", "awq", "gptq"}},
      {R"({"bits": 4, "quant_method": "fp8"})", ErrorCode::Unsupported, {"quant_method", "fp8"}},
      {R"({"bits": 4, "group_size": 32})", ErrorCode::InvalidArgument, {"quantization_config.quant_method", "missing"}},
      {R"({"bits": 4, "group_size": 0, "quant_method": "gptq"})", ErrorCode::InvalidArgument,
       {"quantization_config.group_size", "0"}},
      {R"({"bits": 4, "group_size": -2, "quant_method": "gptq"})", ErrorCode::InvalidArgument,
       {"quantization_config.group_size", "-2"}},
      {R"({"bits": 4, "group_size": 12, "quant_method": "gptq"})", ErrorCode::Unsupported,
       {"quantization_config.group_size", "12", "multiple of 8"}},
      {R"({"bits": 4, "group_size": 48, "quant_method": "gptq"})", ErrorCode::InvalidArgument,
       {"group_size = 48", "hidden_size = 64"}},
      {R"({"bits": 4, "group_size": 32, "quant_method": "gptq", "checkpoint_format": "marlin"})",
       ErrorCode::Unsupported, {"quantization_config.checkpoint_format", "marlin"}},
      {R"({"bits": 4, "group_size": 32, "quant_method": "gptq", "checkpoint_format": "gptq", "format": "gptq_v2"})",
       ErrorCode::InvalidArgument, {"checkpoint_format", "format", "disagree"}},
      {R"({"bits": 4, "group_size": 32, "quant_method": "gptq", "desc_act": "yes"})", ErrorCode::InvalidArgument,
       {"quantization_config.desc_act", "yes"}},
      {R"({"bits": 4, "group_size": 32, "quant_method": "gptq", "lm_head": true})", ErrorCode::Unsupported,
       {"quantization_config.lm_head"}},
      {R"([4])", ErrorCode::InvalidArgument, {"quantization_config", "object"}},
  };
  for (const BadQuantConfig& c : cases) {
    SCOPED_TRACE(c.json);
    try {
      parse_model_config(tiny_config_with(c.json), "config 'x.json'");
      ADD_FAILURE() << "expected ferrum::Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      for (const std::string& needle : c.needles) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message lacks '" << needle << "': " << e.what();
      }
      EXPECT_NE(std::string(e.what()).find("config 'x.json'"), std::string::npos) << e.what();
    }
  }
}

TEST(GptqConfig, QuantizeConfigJsonOfOlderExports) {
  // AutoGPTQ before transformers integration: config.json without
  // quantization_config, the settings in quantize_config.json (no quant_method).
  const auto dir = testing::scratch_dir();
  std::ofstream(dir / "config.json") << testing::config_json(preset_config("tiny-llama"));
  std::ofstream(dir / "quantize_config.json")
      << R"({"bits": 4, "group_size": 32, "damp_percent": 0.01, "desc_act": false, "sym": true, "true_sequential": true})";
  const ModelConfig c = load_checkpoint_config(dir);
  ASSERT_TRUE(c.gptq.has_value());
  EXPECT_EQ(c.gptq->group_size, 32);
  EXPECT_EQ(c.gptq->zero_format, GptqZeroFormat::V1);

  std::ofstream(dir / "quantize_config.json") << R"({"bits": 2, "group_size": 32})";
  EXPECT_ENGINE_ERROR(load_checkpoint_config(dir), ErrorCode::Unsupported, "quantize_config.json", "bits", "2");
  std::ofstream(dir / "quantize_config.json") << R"({"bits": 4, "group_size": 48})";
  EXPECT_ENGINE_ERROR(load_checkpoint_config(dir), ErrorCode::InvalidArgument, "quantize_config.json", "48");
}

TEST(GptqConfig, RandomPresetSettings) {
  const GptqConfig big = random_gptq_config(preset_config("llama3-8b"));
  EXPECT_EQ(big.group_size, 128);
  EXPECT_TRUE(big.sym);
  EXPECT_FALSE(big.desc_act);
  EXPECT_EQ(big.zero_format, GptqZeroFormat::V1);
  EXPECT_EQ(random_gptq_config(preset_config("qwen3-0.6b")).group_size, 128);
  EXPECT_EQ(random_gptq_config(preset_config("tiny-llama")).group_size, 64);  // hidden 64

  ModelConfig c = preset_config("llama3-8b");
  c.gptq = big;
  const std::vector<ExpectedTensor> tensors = expected_tensors(c);
  const auto find = [&](const std::string& name) {
    return *std::find_if(tensors.begin(), tensors.end(), [&](const ExpectedTensor& t) { return t.name == name; });
  };
  EXPECT_EQ(find("model.layers.0.mlp.down_proj.qweight").shape, (std::vector<std::size_t>{14336 / 8, 4096}));
  EXPECT_EQ(find("model.layers.0.mlp.down_proj.qweight").kind, TensorKind::Int32);
  EXPECT_EQ(find("model.layers.0.mlp.down_proj.qzeros").shape, (std::vector<std::size_t>{112, 512}));
  EXPECT_EQ(find("model.layers.0.self_attn.k_proj.scales").shape, (std::vector<std::size_t>{32, 1024}));
  EXPECT_EQ(find("model.layers.0.self_attn.k_proj.scales").kind, TensorKind::Float);
  EXPECT_EQ(find("model.layers.31.self_attn.o_proj.g_idx").shape, (std::vector<std::size_t>{4096}));
  EXPECT_EQ(std::count_if(tensors.begin(), tensors.end(),
                          [](const ExpectedTensor& t) { return t.name.find(".weight") != std::string::npos &&
                                                               t.name.find("_proj") != std::string::npos; }),
            0);
}

// ── random GPTQ models ───────────────────────────────────────────────────

TEST(GptqRandom, SourceHoldsSymmetricInt4Tensors) {
  ModelConfig c = preset_config("tiny-qwen3");
  c.gptq = random_gptq_config(c);
  const RandomTensorSource a(c, 5), b(c, 5), other(c, 6);
  const std::string base = "model.layers.1.mlp.down_proj";  // k = 128, n = 64, group 64
  EXPECT_EQ(a.meta(base + ".qweight").dtype, SafetensorsDType::I32);
  EXPECT_EQ(a.meta(base + ".qweight").shape, (std::vector<std::size_t>{16, 64}));
  EXPECT_EQ(a.meta(base + ".scales").dtype, SafetensorsDType::F16);
  EXPECT_EQ(a.meta(base + ".scales").shape, (std::vector<std::size_t>{2, 64}));
  EXPECT_EQ(a.read_i32(base + ".qweight"), b.read_i32(base + ".qweight"));
  EXPECT_NE(a.read_i32(base + ".qweight"), other.read_i32(base + ".qweight"));
  for (std::int32_t z : a.read_i32(base + ".qzeros")) EXPECT_EQ(static_cast<std::uint32_t>(z), 0x77777777u);  // v1: 8 - 1
  const std::vector<std::int32_t> g_idx = a.read_i32(base + ".g_idx");
  for (std::size_t r = 0; r < g_idx.size(); ++r) ASSERT_EQ(g_idx[r], static_cast<std::int32_t>(r / 64));
  for (float s : a.read_f32(base + ".scales")) {
    ASSERT_EQ(s, f16_to_f32(f32_to_f16(s)));
    ASSERT_GT(s, 0.0f);
  }
  // Every 4-bit code appears.
  std::vector<int> seen(16, 0);
  for (std::int32_t w : a.read_i32(base + ".qweight")) {
    for (int j = 0; j < 8; ++j) ++seen[(static_cast<std::uint32_t>(w) >> (4 * j)) & 15u];
  }
  for (int code = 0; code < 16; ++code) EXPECT_GT(seen[code], 0) << "code " << code;
  EXPECT_ENGINE_ERROR(a.read_f32(base + ".qweight"), ErrorCode::DTypeMismatch, "qweight");
  EXPECT_ENGINE_ERROR(a.read_i32("model.norm.weight"), ErrorCode::DTypeMismatch, "model.norm.weight");
  EXPECT_FALSE(a.contains(base + ".weight"));
}

class GptqRandomTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GptqRandomTest, FusedGptqProjectionsDecodeLikeDequantizedReference) {
  ModelConfig c = preset_config(GetParam());
  c.gptq = random_gptq_config(c);
  CpuBackend be;
  const ModelWeights w = random_weights(be, c, 2024);
  EXPECT_TRUE(w.has_gptq());
  ASSERT_EQ(w.layers.size(), c.num_hidden_layers);
  for (const LayerWeights& l : w.layers) {
    ASSERT_TRUE(l.qkv_proj.fused());  // no act-order: q | k | v concatenated along n
    expect_projection(l.qkv_proj.parts[0], c.qkv_dim(), c.hidden_size, true);
    ASSERT_TRUE(l.gate_up_proj.fused());
    EXPECT_TRUE(l.gate_up_proj.interleaved_pairs);  // gate and up columns interleaved: gemm_silu_mul_gptq
    expect_projection(l.gate_up_proj.parts[0], 2 * c.intermediate_size, c.hidden_size, true);
    expect_projection(l.o_proj, c.hidden_size, c.q_dim(), true);
    expect_projection(l.down_proj, c.hidden_size, c.intermediate_size, true);
  }
  EXPECT_FALSE(w.embed_tokens.is_null());
  EXPECT_EQ(w.embed_tokens.dtype(), c.dtype);  // dense rest

  const RandomTensorSource source(c, 2024);
  const DequantizedSource dequantized(c, source);
  expect_decodes_like_reference(be, w, dequantized);
  testing::expect_device_state_equals_eager(be, w, kPrompt, 32, kSteps);
}

// DecoderOptions::gptq_row_sq_norms: the residual adds and norms inside the
// GPTQ ops, prefill and decode, against the same reference.
TEST_P(GptqRandomTest, RowSqNormsDecodeLikeDequantizedReference) {
  ModelConfig c = preset_config(GetParam());
  c.gptq = random_gptq_config(c);
  CpuBackend be;
  const ModelWeights w = random_weights(be, c, 2025);
  const RandomTensorSource source(c, 2025);
  const DequantizedSource dequantized(c, source);
  const std::vector<std::int32_t> with = expect_decodes_like_reference(be, w, dequantized, DecodeMode::Eager,
                                                                       {.gptq_row_sq_norms = true});
  EXPECT_EQ(with, expect_decodes_like_reference(be, w, dequantized));
  // A model with dense projections does not fit it.
  const ModelWeights dense = random_weights(be, preset_config(GetParam()), 2025);
  EXPECT_ENGINE_ERROR(Decoder(be, dense, 64, 8, DecodeMode::Eager, 1, {.gptq_row_sq_norms = true}),
                      ErrorCode::InvalidArgument, "gptq_row_sq_norms");
}

INSTANTIATE_TEST_SUITE_P(Presets, GptqRandomTest, ::testing::Values("tiny-llama", "tiny-qwen3"));

TEST(GptqRandom, DecoderNeedsTheGptqOps) {
  EXPECT_EQ(required_ops(DecodeMode::Eager, false).size() + 4, required_ops(DecodeMode::Eager, true).size());
  const std::vector<Op> ops = required_ops(DecodeMode::Graph, true);
  for (Op op : {Op::LoadGptq, Op::GemmGptq, Op::GemmSiluMulGptq, Op::CopySlice, Op::GraphCapture}) {
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << to_string(op);
  }
  CpuBackend be;
  EXPECT_TRUE(missing_ops(be, DecodeMode::DeviceState, true).empty());
}

// ── GPTQ checkpoints on disk ─────────────────────────────────────────────

struct CheckpointCase {
  const char* name;
  const char* preset;
  int group_size;
  GptqZeroFormat format;
  GptqTestOptions options;
  std::size_t shards;
};

std::ostream& operator<<(std::ostream& out, const CheckpointCase& c) { return out << c.name; }

class GptqCheckpointTest : public ::testing::TestWithParam<CheckpointCase> {};

// Writes a real GPTQ checkpoint (config.json with quantization_config, I32
// qweight / qzeros / g_idx, F16 scales), loads it, and decodes it against the
// fp64 reference on its own dequantized tensors.
TEST_P(GptqCheckpointTest, DecodesLikeDequantizedReference) {
  const CheckpointCase& tc = GetParam();
  const ModelConfig config = gptq_config(tc.preset, tc.group_size, tc.format, tc.options.act_order);
  const GptqTestSource source(config, 31, tc.options);
  const auto dir = testing::scratch_dir() / "ckpt";
  testing::write_checkpoint(dir, config, source, SafetensorsDType::F16, tc.shards);

  const CheckpointDirectory files(dir);
  const std::string q = "model.layers.0.self_attn.q_proj";
  EXPECT_EQ(files.meta(q + ".qweight").dtype, SafetensorsDType::I32);
  EXPECT_EQ(files.meta(q + ".scales").dtype, SafetensorsDType::F16);
  EXPECT_EQ(files.contains(q + ".g_idx"), tc.options.write_g_idx);
  EXPECT_FALSE(files.contains(q + ".weight"));

  CpuBackend be;
  const ModelWeights w = load_checkpoint(be, dir);
  ASSERT_TRUE(w.config.gptq.has_value());
  EXPECT_EQ(w.config.gptq->zero_format, tc.format);
  EXPECT_TRUE(w.has_gptq());
  const ModelConfig& c = w.config;
  for (const LayerWeights& l : w.layers) {
    // q / k / v share their g_idx (one permutation under act-order): fused.
    ASSERT_TRUE(l.qkv_proj.fused());
    expect_projection(l.qkv_proj.parts[0], c.qkv_dim(), c.hidden_size, true);
    if (tc.options.act_order && tc.options.split_gate_up) {
      ASSERT_EQ(l.gate_up_proj.parts.size(), 2u);  // different g_idx: two GEMMs
      expect_projection(l.gate_up_proj.parts[0], c.intermediate_size, c.hidden_size, true);
      expect_projection(l.gate_up_proj.parts[1], c.intermediate_size, c.hidden_size, true);
    } else {
      // One g_idx: gate and up columns interleaved for gemm_silu_mul_gptq
      // (asymmetric cases: the qzeros nibbles moved too, or the decode below
      // leaves the reference).
      ASSERT_TRUE(l.gate_up_proj.fused());
      EXPECT_TRUE(l.gate_up_proj.interleaved_pairs);
      expect_projection(l.gate_up_proj.parts[0], 2 * c.intermediate_size, c.hidden_size, true);
    }
  }
  const DequantizedSource dequantized(config, files);
  expect_decodes_like_reference(be, w, dequantized);
  testing::expect_device_state_equals_eager(be, w, kPrompt, 32, kSteps);
}

GptqTestOptions act_order_options(bool split_gate_up) {
  GptqTestOptions o;
  o.act_order = true;
  o.split_gate_up = split_gate_up;
  o.symmetric = false;
  return o;
}

GptqTestOptions no_g_idx_options() {
  GptqTestOptions o;
  o.write_g_idx = false;
  return o;
}

GptqTestOptions asymmetric_options() {
  GptqTestOptions o;
  o.symmetric = false;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, GptqCheckpointTest,
    ::testing::Values(CheckpointCase{"V1Symmetric", "tiny-llama", 32, GptqZeroFormat::V1, {}, 1},
                      CheckpointCase{"V1AsymmetricSharded", "tiny-qwen3", 64, GptqZeroFormat::V1, asymmetric_options(), 3},
                      CheckpointCase{"V2Asymmetric", "tiny-llama", 32, GptqZeroFormat::V2, asymmetric_options(), 2},
                      CheckpointCase{"OneGroup", "tiny-qwen3", -1, GptqZeroFormat::V2, asymmetric_options(), 1},
                      CheckpointCase{"NoGIdx", "tiny-llama", 32, GptqZeroFormat::V1, no_g_idx_options(), 1},
                      CheckpointCase{"ActOrder", "tiny-llama", 32, GptqZeroFormat::V1, act_order_options(false), 1},
                      CheckpointCase{"ActOrderSplitGateUp", "tiny-qwen3", 32, GptqZeroFormat::V2,
                                     act_order_options(true), 2}),
    [](const ::testing::TestParamInfo<CheckpointCase>& info) { return std::string(info.param.name); });

TEST(GptqCheckpoint, ActOrderGIdxIsReallyPermuted) {
  const ModelConfig config = gptq_config("tiny-llama", 32, GptqZeroFormat::V1, true);
  const GptqTestSource source(config, 31, act_order_options(true));
  const std::vector<std::int32_t> g_idx = source.read_i32("model.layers.0.mlp.gate_proj.g_idx");
  EXPECT_FALSE(std::is_sorted(g_idx.begin(), g_idx.end()));
  EXPECT_EQ(std::count(g_idx.begin(), g_idx.end(), 0), 32);  // every group keeps group_size rows
  EXPECT_NE(g_idx, source.read_i32("model.layers.0.mlp.up_proj.g_idx"));
  EXPECT_EQ(source.read_i32("model.layers.0.self_attn.q_proj.g_idx"),
            source.read_i32("model.layers.0.self_attn.v_proj.g_idx"));
}

// A GPTQ checkpoint whose tensor `name` is replaced by `replacement` (or
// dropped), plus `extra` tensors; `config_text` as config.json.
std::filesystem::path gptq_checkpoint_with(const ModelConfig& config, const std::string& config_text,
                                           const std::string& name, const SafetensorsWriteTensor* replacement,
                                           const std::vector<SafetensorsWriteTensor>& extra = {}) {
  const GptqTestSource source(config, 8);
  const auto dir = testing::scratch_dir() / "ckpt";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config_text;
  std::vector<SafetensorsWriteTensor> tensors = extra;
  for (const ExpectedTensor& t : expected_tensors(config)) {
    if (t.name != name) {
      tensors.push_back(testing::write_tensor_from(source, t, SafetensorsDType::F16));
    } else if (replacement != nullptr) {
      tensors.push_back(*replacement);
    }
  }
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

std::filesystem::path gptq_checkpoint_with(const ModelConfig& config, const std::string& name,
                                           const SafetensorsWriteTensor* replacement,
                                           const std::vector<SafetensorsWriteTensor>& extra = {}) {
  return gptq_checkpoint_with(config, testing::config_json(config), name, replacement, extra);
}

// desc_act = true without a g_idx tensor: refused, naming it (row / group
// in its place would pair permuted rows with the wrong scales and zeros).
TEST(GptqCheckpoint, ActOrderNeedsGIdx) {
  const ModelConfig config = gptq_config("tiny-llama", 32, GptqZeroFormat::V1, true);
  const std::string name = "model.layers.1.mlp.down_proj.g_idx";
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, name, nullptr)), ErrorCode::InvalidArgument,
                      name, "missing", "desc_act = true");
}

TEST(GptqCheckpoint, QweightMustBeI32) {
  const ModelConfig config = gptq_config("tiny-llama");
  const std::string name = "model.layers.1.self_attn.o_proj.qweight";
  const SafetensorsWriteTensor wrong = make_write_tensor(name, SafetensorsDType::F16, {8, 64}, std::vector<float>(512));
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, name, &wrong)), ErrorCode::DTypeMismatch, name,
                      "F16", "I32", "model.safetensors");
}

TEST(GptqCheckpoint, ScalesMustBeFloats) {
  const ModelConfig config = gptq_config("tiny-llama");
  const std::string name = "model.layers.0.mlp.up_proj.scales";
  const SafetensorsWriteTensor wrong = make_write_tensor(name, {2, 128}, std::vector<std::int32_t>(256));
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, name, &wrong)), ErrorCode::DTypeMismatch, name,
                      "I32");
}

TEST(GptqCheckpoint, QzerosShapeDisagreesWithConfig) {
  const ModelConfig config = gptq_config("tiny-llama");  // group 32: down_proj k = 128 has 4 groups
  const std::string name = "model.layers.0.mlp.down_proj.qzeros";
  const SafetensorsWriteTensor wrong = make_write_tensor(name, {2, 8}, std::vector<std::int32_t>(16));
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, name, &wrong)), ErrorCode::ShapeMismatch, name,
                      "[2, 8]", "[4, 8]");
}

TEST(GptqCheckpoint, MissingQweight) {
  const ModelConfig config = gptq_config("tiny-qwen3");
  const std::string name = "model.layers.1.self_attn.k_proj.qweight";
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, name, nullptr)), ErrorCode::InvalidArgument,
                      name, "missing", "[8, 32]");
}

TEST(GptqCheckpoint, GIdxOutsideTheGroupsIsRefusedByLoadGptq) {
  const ModelConfig config = gptq_config("tiny-llama");
  const std::string name = "model.layers.0.self_attn.q_proj.g_idx";
  std::vector<std::int32_t> g_idx(64, 0);
  g_idx[5] = 7;  // hidden 64 / group 32: groups 0 and 1 only
  const SafetensorsWriteTensor wrong = make_write_tensor(name, {64}, g_idx);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, name, &wrong)), ErrorCode::InvalidArgument,
                      "load_gptq", "g_idx");
}

TEST(GptqCheckpoint, GptqTensorsNeedAQuantizationConfig) {
  const ModelConfig config = gptq_config("tiny-llama");
  ModelConfig dense = config;
  dense.gptq.reset();
  CpuBackend be;
  const auto dir = gptq_checkpoint_with(config, testing::config_json(dense), "", nullptr);
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.layers.0.self_attn.q_proj.qweight",
                      "quantization_config");
}

TEST(GptqCheckpoint, ZeroBiasIsAcceptedNonzeroIsNot) {
  // Some exports write an all-zero bias for every quantized linear.
  const ModelConfig config = gptq_config("tiny-llama");
  const std::string name = "model.layers.0.self_attn.v_proj.bias";
  CpuBackend be;
  const auto zero = make_write_tensor(name, SafetensorsDType::F16, {32}, std::vector<float>(32, 0.0f));
  EXPECT_TRUE(load_checkpoint(be, gptq_checkpoint_with(config, "", nullptr, {zero})).has_gptq());
  std::vector<float> values(32, 0.0f);
  values[3] = 0.25f;
  const auto nonzero = make_write_tensor(name, SafetensorsDType::F16, {32}, values);
  EXPECT_ENGINE_ERROR(load_checkpoint(be, gptq_checkpoint_with(config, "", nullptr, {nonzero})),
                      ErrorCode::Unsupported, name, "nonzero bias", "0.25");
}

TEST(GptqCheckpoint, DenseProjectionInAGptqCheckpoint) {
  // A projection left unquantized (dense k_proj.weight) beside GPTQ q and v:
  // q | k | v cannot be one GPTQ weight, so the three run as separate GEMMs.
  const ModelConfig config = gptq_config("tiny-qwen3");
  const GptqTestSource source(config, 8);
  const auto dir = testing::scratch_dir() / "ckpt";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << testing::config_json(config);
  ModelConfig dense_config = config;
  dense_config.gptq.reset();
  const RandomTensorSource dense(dense_config, 99);
  const std::string base = "model.layers.1.self_attn.k_proj";
  std::vector<SafetensorsWriteTensor> tensors = {make_write_tensor(
      base + ".weight", SafetensorsDType::F16, {32, 64}, dense.read_f32(base + ".weight"))};
  for (const ExpectedTensor& t : expected_tensors(config)) {
    if (t.name.rfind(base + ".", 0) != 0) tensors.push_back(testing::write_tensor_from(source, t, SafetensorsDType::F16));
  }
  write_safetensors(dir / "model.safetensors", tensors);

  CpuBackend be;
  const ModelWeights w = load_checkpoint(be, dir);
  ASSERT_TRUE(w.layers[0].qkv_proj.fused());
  ASSERT_EQ(w.layers[1].qkv_proj.parts.size(), 3u);
  expect_projection(w.layers[1].qkv_proj.parts[0], 64, 64, true);
  expect_projection(w.layers[1].qkv_proj.parts[1], 32, 64, false);
  expect_projection(w.layers[1].qkv_proj.parts[2], 32, 64, true);
  const CheckpointDirectory files(dir);
  const DequantizedSource dequantized(config, files);  // k_proj.weight comes through as stored
  expect_decodes_like_reference(be, w, dequantized);
  testing::expect_device_state_equals_eager(be, w, kPrompt, 32, kSteps);
}

// ── on the GPU (skipped without one) ─────────────────────────────────────

// The GPU tests' model: tiny-llama's GPU shape with GPTQ groups of 128.
ModelConfig gpu_gptq_config(bool act_order) {
  ModelConfig c = gpu_tiny_llama_config();
  c.intermediate_size = 512;
  c.vocab_size = 512;
  GptqConfig g;
  g.group_size = 128;
  g.desc_act = act_order;
  c.gptq = g;
  c.validate("gpu test config");
  return c;
}

TEST(GptqGpu, GraphDecodeMatchesDequantizedReference) {
  // A GPU this build cannot run fails here (Unsupported), not as a skip.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: the CUDA backend is not available";
  std::unique_ptr<Backend> be = std::make_unique<CudaBackend>();
  for (const bool act_order : {false, true}) {
    SCOPED_TRACE(act_order ? "act-order, gate / up unfused" : "group 128, fused");
    const ModelConfig c = gpu_gptq_config(act_order);
    GptqTestOptions options;
    options.act_order = act_order;
    options.split_gate_up = act_order;
    options.symmetric = !act_order;
    const GptqTestSource source(c, 41, options);
    const ModelWeights w = load_weights(*be, c, source);
    const DequantizedSource dequantized(c, source);
    const std::vector<std::int32_t> graph = expect_decodes_like_reference(*be, w, dequantized, DecodeMode::Graph);
    be->reset_graph();
    const std::vector<std::int32_t> eager = expect_decodes_like_reference(*be, w, dequantized, DecodeMode::Eager);
    EXPECT_EQ(graph, eager);
  }
}

// DecoderOptions::gptq_row_sq_norms on the GPU: graph and eager decoding
// against the reference (the fused forms where the streaming kernel takes
// them), and a two-sequence batch step (the ragged path) with both options
// giving the same tokens.
TEST(GptqGpu, RowSqNormsGraphDecodeMatchesDequantizedReference) {
  // A GPU this build cannot run fails here (Unsupported), not as a skip.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: the CUDA backend is not available";
  std::unique_ptr<Backend> be = std::make_unique<CudaBackend>();
  const ModelConfig c = gpu_gptq_config(false);
  const GptqTestSource source(c, 43, GptqTestOptions{});
  const ModelWeights w = load_weights(*be, c, source);
  const DequantizedSource dequantized(c, source);
  const DecoderOptions row_sq{.gptq_row_sq_norms = true};
  const std::vector<std::int32_t> graph = expect_decodes_like_reference(*be, w, dequantized, DecodeMode::Graph, row_sq);
  be->reset_graph();
  EXPECT_EQ(graph, expect_decodes_like_reference(*be, w, dequantized, DecodeMode::Eager, row_sq));
  // A batch step of two sequences (qkv_rope_append_ragged, flash_decode_ragged).
  std::vector<std::int32_t> batch_tokens[2];
  for (int with : {0, 1}) {
    Decoder decoder(*be, w, 64, kPrompt.size(), DecodeMode::Eager, 2, {.gptq_row_sq_norms = with == 1});
    decoder.prefill(0, kPrompt);
    decoder.prefill(1, std::span<const std::int32_t>(kPrompt).first(4));
    batch_tokens[with] = decoder.decode_batch_next(std::vector<std::int32_t>{5, 9});
  }
  EXPECT_EQ(batch_tokens[0], batch_tokens[1]);
}

}  // namespace
}  // namespace ferrum::engine
