// Loading a tiny checkpoint directory: fused layouts, tables, and every error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include <ferrum/half.hpp>

#include "checkpoint_layout.hpp"
#include "engine_error.hpp"
#include "engine_test_support.hpp"
#include "support/test_support.hpp"
#include "weights.hpp"

namespace ferrum::engine {
namespace {

using testing::write_checkpoint;

// `config`'s random weights (seed 5) as a one-file f16 checkpoint in a fresh
// scratch directory, for the tests that then change its config.json.
std::filesystem::path write_random_checkpoint(const ModelConfig& config) {
  const RandomTensorSource src(config, 5);
  const auto dir = testing::scratch_dir() / "ckpt";
  write_checkpoint(dir, config, src, SafetensorsDType::F16, 1);
  return dir;
}

std::vector<float> rows_of(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Rows of a and b alternating (a_0, b_0, a_1, b_1, ...), rows of `k` elements.
std::vector<float> interleaved_rows_of(const std::vector<float>& a, const std::vector<float>& b, std::size_t k) {
  std::vector<float> out;
  for (std::size_t r = 0; r * k < a.size(); ++r) {
    out.insert(out.end(), a.begin() + static_cast<std::ptrdiff_t>(r * k), a.begin() + static_cast<std::ptrdiff_t>((r + 1) * k));
    out.insert(out.end(), b.begin() + static_cast<std::ptrdiff_t>(r * k), b.begin() + static_cast<std::ptrdiff_t>((r + 1) * k));
  }
  return out;
}

void expect_loaded_like(CpuBackend& be, const ModelWeights& w, const TensorSource& src) {
  const ModelConfig& c = w.config;
  EXPECT_EQ(be.download(w.embed_tokens), src.read_f32("model.embed_tokens.weight"));
  ASSERT_EQ(w.layers.size(), c.num_hidden_layers);
  for (std::size_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& lw = w.layers[i];
    auto host = [&](const char* suffix) { return src.read_f32(layer_tensor_name(i, suffix)); };
    // Dense parts are always fused into one projection.
    ASSERT_TRUE(lw.qkv_proj.fused());
    const Projection& qkv = lw.qkv_proj.parts[0];
    EXPECT_FALSE(qkv.quantized());
    EXPECT_EQ(qkv.n, c.qkv_dim());
    EXPECT_EQ(qkv.k, c.hidden_size);
    EXPECT_EQ(qkv.dense.numel(), c.qkv_dim() * c.hidden_size);
    EXPECT_EQ(be.download(qkv.dense), rows_of({host("self_attn.q_proj.weight"), host("self_attn.k_proj.weight"),
                                               host("self_attn.v_proj.weight")}));
    // gate | up: one weight, rows interleaved (gate_j, up_j) for gemm_silu_mul.
    ASSERT_TRUE(lw.gate_up_proj.fused());
    EXPECT_TRUE(lw.gate_up_proj.interleaved_pairs);
    const Projection& gate_up = lw.gate_up_proj.parts[0];
    EXPECT_EQ(gate_up.n, 2 * c.intermediate_size);
    EXPECT_EQ(gate_up.dense.numel(), 2 * c.intermediate_size * c.hidden_size);
    EXPECT_EQ(be.download(gate_up.dense),
              interleaved_rows_of(host("mlp.gate_proj.weight"), host("mlp.up_proj.weight"), c.hidden_size));
    EXPECT_EQ(be.download(lw.o_proj.dense), host("self_attn.o_proj.weight"));
    EXPECT_EQ(lw.o_proj.n, c.hidden_size);
    EXPECT_EQ(lw.o_proj.k, c.q_dim());
    EXPECT_EQ(be.download(lw.down_proj.dense), host("mlp.down_proj.weight"));
    EXPECT_EQ(lw.down_proj.k, c.intermediate_size);
    EXPECT_EQ(be.download(lw.input_norm), host("input_layernorm.weight"));
    EXPECT_EQ(be.download(lw.post_attention_norm), host("post_attention_layernorm.weight"));
    if (c.has_qk_norm()) {
      EXPECT_EQ(be.download(lw.q_norm), host("self_attn.q_norm.weight"));
      EXPECT_EQ(be.download(lw.k_norm), host("self_attn.k_norm.weight"));
    } else {
      EXPECT_TRUE(lw.q_norm.is_null());
    }
    EXPECT_EQ(qkv.dense.dtype(), c.dtype);
  }
  EXPECT_FALSE(w.has_gptq());
  EXPECT_EQ(be.download(w.final_norm), src.read_f32("model.norm.weight"));
  if (c.tie_word_embeddings) {
    EXPECT_TRUE(w.lm_head.is_null());
    EXPECT_EQ(&w.output_projection(), &w.embed_tokens);
  } else {
    EXPECT_EQ(be.download(w.lm_head), src.read_f32("lm_head.weight"));
  }
}

class WeightsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightsTest, LoadsShardedCheckpointIntoFusedLayouts) {
  const ModelConfig config = preset_config(GetParam());
  const RandomTensorSource src(config, 7);
  const auto dir = testing::scratch_dir() / "ckpt";
  write_checkpoint(dir, config, src, SafetensorsDType::F16, 3);
  CpuBackend be;
  const auto start = std::chrono::steady_clock::now();
  const ModelWeights w = load_checkpoint(be, dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_loaded_like(be, w, src);
  // The load's time in Backend calls (every tensor went through one): some,
  // and no more than the whole load.
  EXPECT_GT(w.backend_load_seconds, 0.0);
  EXPECT_LE(w.backend_load_seconds, seconds);
}

INSTANTIATE_TEST_SUITE_P(Presets, WeightsTest, ::testing::Values("tiny-llama", "tiny-qwen3"));

// The random presets fill their weights on every core; the values must still
// be the one sequential splitmix64 stream per tensor (seed ^ FNV-1a of the
// name), whatever the number of threads. 2M elements: split over 2+ threads.
TEST(Weights, RandomProjectionIsTheSequentialSplitmixStream) {
  const ModelConfig c = preset_config("qwen3-0.6b");
  const std::uint64_t seed = 11;
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  const std::vector<float> got = RandomTensorSource(c, seed).read_f32(name);
  std::uint64_t state = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) state = (state ^ ch) * 0x100000001b3ull;
  state ^= seed;
  const float half_width = static_cast<float>(std::sqrt(3.0 / static_cast<double>(c.hidden_size)));
  ASSERT_EQ(got.size(), c.num_attention_heads * c.head_dim * c.hidden_size);
  ASSERT_GE(got.size(), std::size_t{2} << 20);
  std::size_t mismatches = 0;
  for (float value : got) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double unit = static_cast<double>(z >> 11) * 0x1.0p-53;
    const float expected = bf16_to_f32(f32_to_bf16(half_width * static_cast<float>(2.0 * unit - 1.0)));
    mismatches += value != expected;
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Weights, RopeTablesFollowRotateHalfConvention) {
  const ModelConfig c = preset_config("tiny-qwen3");
  CpuBackend be;
  const ModelWeights w = random_weights(be, c, 1);
  const std::size_t half = c.head_dim / 2;
  ASSERT_EQ(w.rope_cos.numel(), c.max_position_embeddings * half);
  EXPECT_EQ(w.rope_cos.dtype(), DType::F32);
  const std::vector<float> cos = be.download(w.rope_cos), sin = be.download(w.rope_sin);
  for (std::size_t pos : {0u, 1u, 17u, 127u}) {
    for (std::size_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
      EXPECT_NEAR(cos[pos * half + i], std::cos(angle), 1e-6);
      EXPECT_NEAR(sin[pos * half + i], std::sin(angle), 1e-6);
    }
  }
}

// LoadOptions::rope_positions: tables of that many rows, each row the
// full-length table's (same bits); zero means max_position_embeddings; past
// max_position_embeddings refused by name.
TEST(Weights, RopePositionsCutTheTablesToTheirFirstRows) {
  const ModelConfig c = preset_config("tiny-qwen3");
  CpuBackend be;
  const std::size_t half = c.head_dim / 2;
  const ModelWeights full = random_weights(be, c, 1);
  EXPECT_EQ(full.rope_positions(), c.max_position_embeddings);
  const std::size_t rows = 37;
  const ModelWeights cut = random_weights(be, c, 1, {.rope_positions = rows});
  EXPECT_EQ(cut.rope_positions(), rows);
  ASSERT_EQ(cut.rope_cos.numel(), rows * half);
  ASSERT_EQ(cut.rope_sin.numel(), rows * half);
  const std::vector<float> full_cos = be.download(full.rope_cos), full_sin = be.download(full.rope_sin);
  const std::vector<float> cut_cos = be.download(cut.rope_cos), cut_sin = be.download(cut.rope_sin);
  EXPECT_TRUE(std::equal(cut_cos.begin(), cut_cos.end(), full_cos.begin()));
  EXPECT_TRUE(std::equal(cut_sin.begin(), cut_sin.end(), full_sin.begin()));
  EXPECT_EQ(random_weights(be, c, 1, {.rope_positions = c.max_position_embeddings}).rope_cos.numel(),
            c.max_position_embeddings * half);
  EXPECT_ENGINE_ERROR(random_weights(be, c, 1, {.rope_positions = c.max_position_embeddings + 1}),
                      ErrorCode::InvalidArgument, "rope_positions", std::to_string(c.max_position_embeddings + 1),
                      "max_position_embeddings");
}

// Llama 3.1 8B's RoPE (theta 500000, head_dim 128, llama3: factor 8,
// low_freq_factor 1, high_freq_factor 4, original context 8192), checked
// against the definition band by band: pairs whose wavelength 2 pi / f is
// under 8192 / 4 keep f, those over 8192 / 1 take f / 8, those between lie
// strictly between, fall with i, and meet the outer bands at their edges.
TEST(Weights, Llama3RopeScalingKeepsScalesAndBlendsItsBands) {
  ModelConfig c = preset_config("llama3-8b");
  c.rope_theta = 500000.0;
  c.rope_scaling.type = RopeScaling::Type::Llama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192.0;
  ModelConfig unscaled = c;
  unscaled.rope_scaling = RopeScaling{};
  const std::vector<double> f = rope_inverse_frequencies(unscaled), g = rope_inverse_frequencies(c);
  ASSERT_EQ(g.size(), 64u);
  int kept = 0, divided = 0, blended = 0;
  double previous_ratio = 1.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_DOUBLE_EQ(f[i], std::pow(500000.0, -static_cast<double>(2 * i) / 128.0));
    const double wavelength = 2.0 * M_PI / f[i];
    const double ratio = g[i] / f[i];
    if (wavelength < 2048.0) {
      EXPECT_EQ(g[i], f[i]);
      ++kept;
    } else if (wavelength > 8192.0) {
      EXPECT_DOUBLE_EQ(g[i], f[i] / 8.0);
      ++divided;
    } else {
      EXPECT_GT(ratio, 1.0 / 8.0);
      EXPECT_LT(ratio, 1.0);
      EXPECT_LT(ratio, previous_ratio) << "the blend falls towards the stretched band";
      // The blend's weight on f: 8192 / wavelength - 1, over 4 - 1.
      EXPECT_NEAR(ratio, (1.0 - (8192.0 / wavelength - 1.0) / 3.0) / 8.0 + (8192.0 / wavelength - 1.0) / 3.0, 1e-12);
      ++blended;
    }
    previous_ratio = ratio;
  }
  // Llama 3.1 8B: pairs 0..28 kept, 29..34 blended, 35..63 stretched.
  EXPECT_EQ(kept, 29);
  EXPECT_EQ(blended, 6);
  EXPECT_EQ(divided, 29);
  // Linear scaling divides every pair by the factor.
  c.rope_scaling = RopeScaling{.type = RopeScaling::Type::Linear, .factor = 4.0};
  const std::vector<double> linear = rope_inverse_frequencies(c);
  for (std::size_t i = 0; i < linear.size(); ++i) EXPECT_DOUBLE_EQ(linear[i], f[i] / 4.0) << i;
  // The tables take the scaled frequencies.
  std::vector<float> cos, sin;
  make_rope_tables(c, 3, cos, sin);
  EXPECT_FLOAT_EQ(cos[2 * 64 + 5], static_cast<float>(std::cos(2.0 * f[5] / 4.0)));
}

// YaRN as Qwen3's long-context configs set it (factor 4 over 32768, beta 32 /
// 1, theta 10^6, head_dim 128): pairs 0..23 turn more than 32 times over the
// original context (pair index 23.6, floored) and are kept, pairs from 40
// (39.65, ceiled) on are divided by the factor, and 24..39 ramp linearly
// between; the tables carry the attention factor.
TEST(Weights, YarnRopeScalingKeepsRampsAndDividesItsPairs) {
  ModelConfig c = preset_config("qwen3-0.6b");
  c.rope_scaling = RopeScaling{.type = RopeScaling::Type::Yarn,
                               .factor = 4.0,
                               .original_max_position_embeddings = 32768.0,
                               .beta_fast = 32.0,
                               .beta_slow = 1.0,
                               .attention_factor = 1.25};
  ModelConfig unscaled = c;
  unscaled.rope_scaling = RopeScaling{};
  const std::vector<double> f = rope_inverse_frequencies(unscaled), g = rope_inverse_frequencies(c);
  ASSERT_EQ(g.size(), 64u);
  for (std::size_t i = 0; i < g.size(); ++i) {
    SCOPED_TRACE(i);
    if (i <= 23) {
      EXPECT_EQ(g[i], f[i]);
    } else if (i >= 40) {
      EXPECT_DOUBLE_EQ(g[i], f[i] / 4.0);
    } else {
      const double ramp = (static_cast<double>(i) - 23.0) / 17.0;
      EXPECT_NEAR(g[i] / f[i], ramp / 4.0 + (1.0 - ramp), 1e-12);
    }
  }
  // Without truncate the range is [23.60, 39.65]: pair 23 is kept, 24 ramps.
  c.rope_scaling.truncate = false;
  const std::vector<double> u = rope_inverse_frequencies(c);
  EXPECT_EQ(u[23], f[23]);
  EXPECT_LT(u[24], f[24]);
  EXPECT_GT(u[24], g[24]) << "the unrounded ramp starts later: less of pair 24 is divided";
  EXPECT_NEAR(u[24] / f[24], 1.0 - 0.75 * (24.0 - 23.5959476083381) / (39.6508807104171 - 23.5959476083381), 1e-9);
  EXPECT_DOUBLE_EQ(u[40], f[40] / 4.0);
  // The tables: cos and sin of the scaled angle, times the attention factor.
  std::vector<float> cos, sin;
  make_rope_tables(c, 3, cos, sin);
  EXPECT_FLOAT_EQ(cos[2 * 64 + 30], static_cast<float>(1.25 * std::cos(2.0 * u[30])));
  EXPECT_FLOAT_EQ(sin[2 * 64 + 30], static_cast<float>(1.25 * std::sin(2.0 * u[30])));
  EXPECT_FLOAT_EQ(cos[0], 1.25f);
  EXPECT_EQ(rope_attention_factor(unscaled), 1.0);
  // A config validate() would refuse (rope_theta 1: the range divides by
  // log 1): the tables refuse it too, rather than fill with NaN.
  c.rope_theta = 1.0;
  EXPECT_ENGINE_ERROR(make_rope_tables(c, 3, cos, sin), ErrorCode::InvalidArgument, "make_rope_tables",
                      "inverse frequency", "not finite");
}

TEST(Weights, Bf16CheckpointConvertsToF16Config) {
  const ModelConfig config = preset_config("tiny-llama");  // f16
  const RandomTensorSource src(config, 3);
  const auto dir = testing::scratch_dir() / "ckpt";
  write_checkpoint(dir, config, src, SafetensorsDType::BF16, 1);
  CpuBackend be;
  const ModelWeights w = load_checkpoint(be, dir);  // converted via f32
  EXPECT_EQ(w.embed_tokens.dtype(), DType::F16);
  const std::vector<float> host = src.read_f32("model.embed_tokens.weight");
  const std::vector<float> loaded = be.download(w.embed_tokens);
  for (std::size_t i = 0; i < host.size(); ++i) {
    ASSERT_EQ(loaded[i], f16_to_f32(f32_to_f16(bf16_to_f32(f32_to_bf16(host[i])))));
  }
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir, LoadOptions{.allow_dtype_conversion = false}), ErrorCode::DTypeMismatch,
                      "model.embed_tokens.weight", "BF16", "F16");
}

// read_half_into (what the upload streams through): the bits of read_f32's
// values, straight from the file when its dtype matches, converted when it
// does not; a wrong-size destination or a non-half dtype is refused.
TEST(Weights, ReadHalfIntoEncodesReadF32AndChecksTheDestination) {
  const ModelConfig config = preset_config("tiny-llama");  // f16
  const RandomTensorSource random(config, 4);
  const auto f16_dir = testing::scratch_dir() / "f16";
  const auto bf16_dir = testing::scratch_dir() / "bf16";
  write_checkpoint(f16_dir, config, random, SafetensorsDType::F16, 1);
  write_checkpoint(bf16_dir, config, random, SafetensorsDType::BF16, 1);
  const CheckpointDirectory f16_file(f16_dir), bf16_file(bf16_dir);
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  for (const TensorSource* source : {static_cast<const TensorSource*>(&random),
                                     static_cast<const TensorSource*>(&f16_file),
                                     static_cast<const TensorSource*>(&bf16_file)}) {
    for (DType dtype : {DType::F16, DType::BF16}) {
      const std::vector<float> values = source->read_f32(name);
      const std::vector<std::uint16_t> bits = source->read_half(name, dtype);
      ASSERT_EQ(bits.size(), values.size());
      for (std::size_t i = 0; i < bits.size(); ++i) {
        ASSERT_EQ(bits[i], dtype == DType::F16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]))
            << source->describe(name) << " element " << i;
      }
    }
    std::vector<std::uint16_t> short_by_one(source->read_f32(name).size() - 1);
    EXPECT_ENGINE_ERROR(source->read_half_into(name, DType::F16, short_by_one), ErrorCode::InvalidArgument,
                        "'" + name + "'", "destination holds");
    std::vector<std::uint16_t> room(short_by_one.size() + 1);
    EXPECT_ENGINE_ERROR(source->read_half_into(name, DType::F32, room), ErrorCode::DTypeMismatch, "'" + name + "'",
                        "f32");
  }
}

// A checkpoint whose tensor `name` is replaced by `replacement` (or dropped).
std::filesystem::path checkpoint_with(const ModelConfig& config, const std::string& name,
                                      const SafetensorsWriteTensor* replacement) {
  const RandomTensorSource src(config, 5);
  const auto dir = testing::scratch_dir() / "ckpt";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << testing::config_json(config);
  std::vector<SafetensorsWriteTensor> tensors;
  for (const ExpectedTensor& t : expected_tensors(config)) {
    if (t.name != name) {
      tensors.push_back(make_write_tensor(t.name, SafetensorsDType::F16, t.shape, src.read_f32(t.name)));
    } else if (replacement != nullptr) {
      tensors.push_back(*replacement);
    }
  }
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

TEST(Weights, MissingTensor) {
  const ModelConfig config = preset_config("tiny-qwen3");
  const auto dir = checkpoint_with(config, "model.layers.1.self_attn.k_norm.weight", nullptr);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.layers.1.self_attn.k_norm.weight",
                      "missing", "[16]", dir.string());
}

TEST(Weights, MissingUntiedLmHead) {
  const ModelConfig config = preset_config("tiny-llama");
  const auto dir = checkpoint_with(config, "lm_head.weight", nullptr);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "lm_head.weight", "[256, 64]");
}

TEST(Weights, ShapeDisagreesWithConfig) {
  const ModelConfig config = preset_config("tiny-llama");
  const SafetensorsWriteTensor wrong =
      make_write_tensor("model.layers.0.mlp.up_proj.weight", SafetensorsDType::F16, {64, 128},
                        std::vector<float>(64 * 128, 0.5f));  // transposed
  const auto dir = checkpoint_with(config, wrong.name, &wrong);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::ShapeMismatch, "model.layers.0.mlp.up_proj.weight",
                      "[64, 128]", "[128, 64]", "model.safetensors");
}

TEST(Weights, WrongDType) {
  const ModelConfig config = preset_config("tiny-llama");
  const SafetensorsWriteTensor ints{"model.norm.weight", SafetensorsDType::I32, {64},
                                    std::vector<std::uint8_t>(64 * 4)};
  const auto dir = checkpoint_with(config, ints.name, &ints);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::DTypeMismatch, "model.norm.weight", "I32");
}

TEST(Weights, DuplicateTensorAcrossShards) {
  const ModelConfig config = preset_config("tiny-llama");
  const RandomTensorSource src(config, 5);
  const auto dir = testing::scratch_dir() / "ckpt";
  write_checkpoint(dir, config, src, SafetensorsDType::F16, 2);
  write_safetensors(dir / "extra.safetensors",
                    {make_write_tensor("model.norm.weight", SafetensorsDType::F16, {64}, std::vector<float>(64, 1.0f))});
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.norm.weight", "extra.safetensors");
}

// model.safetensors.index.json, where present, must agree with the files: a
// shard it names but the directory lacks is named as missing (not as the
// first tensor the load needs from it), and a tensor in another file than
// the index says is refused; an index that agrees loads.
TEST(Weights, ShardIndexMustAgreeWithTheFiles) {
  const ModelConfig config = preset_config("tiny-llama");
  const RandomTensorSource src(config, 5);
  const auto dir = testing::scratch_dir() / "ckpt";
  write_checkpoint(dir, config, src, SafetensorsDType::F16, 2);
  const std::string first = "model-00001-of-00002.safetensors", second = "model-00002-of-00002.safetensors";
  std::map<std::string, std::string> weight_map;
  {
    const CheckpointDirectory files(dir);
    for (const SafetensorsFile& f : files.files()) {
      for (const auto& [name, info] : f.tensors()) weight_map[name] = f.path().filename().string();
    }
  }
  ASSERT_EQ(weight_map.at("model.embed_tokens.weight"), first);
  auto write_index = [&](const std::map<std::string, std::string>& map) {
    std::string json = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {";
    for (auto it = map.begin(); it != map.end(); ++it) {
      json += (it == map.begin() ? "\"" : ", \"") + it->first + "\": \"" + it->second + "\"";
    }
    std::ofstream(dir / "model.safetensors.index.json") << json << "}}";
  };
  CpuBackend be;
  write_index(weight_map);
  EXPECT_NO_THROW(load_checkpoint(be, dir));
  // A tensor the index puts in the other shard.
  std::map<std::string, std::string> swapped = weight_map;
  swapped["model.embed_tokens.weight"] = second;
  write_index(swapped);
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.safetensors.index.json",
                      "\"model.embed_tokens.weight\"", second, "but it is in '" + first + "'");
  // A shard the index names that is not there.
  std::map<std::string, std::string> gone = weight_map;
  gone["model.norm.weight"] = "model-00003-of-00003.safetensors";
  write_index(gone);
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model-00003-of-00003.safetensors",
                      "a missing shard");
  // Not JSON, or no weight_map.
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": ";
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.safetensors.index.json",
                      "not valid JSON");
  std::ofstream(dir / "model.safetensors.index.json") << "{\"metadata\": {}}";
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "no \"weight_map\" object");
}

// A checkpoint with a layer past the config's num_hidden_layers: refused,
// naming the layer's tensor and the config's count (not decoded with the
// first layers only).
TEST(Weights, CheckpointHasMoreLayersThanTheConfig) {
  ModelConfig config = preset_config("tiny-llama");
  const auto dir = write_random_checkpoint(config);
  config.num_hidden_layers -= 1;
  std::ofstream(dir / "config.json") << testing::config_json(config);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::ShapeMismatch,
                      layer_tensor_name(config.num_hidden_layers, "input_layernorm.weight"),
                      concat("num_hidden_layers = ", config.num_hidden_layers));
}

// A Qwen3 checkpoint (per-head q / k norms) under a Llama config: refused,
// naming the norm tensor and the architecture, where it decoded another model
// with the norms left unread (found by review, session 69).
TEST(Weights, QkNormsUnderAConfigWithoutThemAreRefused) {
  ModelConfig config = preset_config("tiny-qwen3");
  const auto dir = write_random_checkpoint(config);
  config.architecture = Architecture::Llama;
  std::ofstream(dir / "config.json") << testing::config_json(config);
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::ShapeMismatch,
                      concat("'", layer_tensor_name(0, "self_attn.q_norm.weight"), "'"), "no per-head q / k norm");
}

// And fewer: refused, naming the last layer's tensor, before the loader
// tables every layer's tensors (a config claiming 2^24 layers beside a small
// checkpoint used to build tens of GB of names first).
TEST(Weights, CheckpointHasFewerLayersThanTheConfig) {
  ModelConfig config = preset_config("tiny-llama");
  const auto dir = write_random_checkpoint(config);
  for (const std::size_t layers : {config.num_hidden_layers + 1, std::size_t{1} << 24}) {
    config.num_hidden_layers = layers;
    std::ofstream(dir / "config.json") << testing::config_json(config);
    CpuBackend be;
    EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::ShapeMismatch,
                        concat("num_hidden_layers = ", layers),
                        concat("no tensor '", layer_tensor_name(layers - 1, "input_layernorm.weight"), "'"));
  }
}

// Loads `dir` in a forked child whose address space may grow by 4 GiB at
// most, and prints what the load threw (or "loaded") to stderr, for
// EXPECT_EXIT to match: a load that takes memory by the config's claims
// rather than the checkpoint's shows as std::bad_alloc or ferrum's
// OutOfMemory instead of the expected error, not as a machine out of memory.
void load_in_bounded_memory(const std::filesystem::path& dir) {
  test::bound_address_space_growth(std::size_t{4} << 30);
  try {
    CpuBackend be(CpuBackendConfig{.num_threads = 1});
    (void)load_checkpoint(be, dir);
    std::fprintf(stderr, "loaded\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  std::fflush(stderr);
  std::_Exit(0);
}

// A config claiming 2^24 layers beside a checkpoint that holds two and the
// last one's input_layernorm (so the layer-count checks pass): the first
// missing tensor is named at once. The loader used to table every layer's
// tensors first: tens of GB, then std::bad_alloc or the OOM killer.
TEST(Weights, LayerCountPastTheCheckpointNamesTheFirstMissingTensorInBoundedMemory) {
  ModelConfig config = preset_config("tiny-llama");
  const auto dir = write_random_checkpoint(config);
  config.num_hidden_layers = ModelConfig::kMaxConfigSize;
  const std::string last = layer_tensor_name(config.num_hidden_layers - 1, "input_layernorm.weight");
  write_safetensors(dir / "last.safetensors",
                    {make_write_tensor(last, SafetensorsDType::F16, {64}, std::vector<float>(64, 1.0f))});
  std::ofstream(dir / "config.json") << testing::config_json(config);
  EXPECT_EXIT(load_in_bounded_memory(dir), ::testing::ExitedWithCode(0),
              "\\[InvalidArgument\\].*missing tensor 'model\\.layers\\.2\\.input_layernorm\\.weight'");
}

// A config.json whose vocab_size x hidden_size (2^21 x 2048: 8 GiB as f16)
// disagrees with the checkpoint's embeddings: the shape mismatch, before
// anything is allocated at the config's size (the load used to allocate
// the buffer and zero-fill as much host scratch first, or at the size
// limits fail with a misleading out-of-memory).
TEST(Weights, ConfigSizesPastTheCheckpointAreNamedBeforeAnyAllocation) {
  ModelConfig config = preset_config("tiny-llama");
  const auto dir = write_random_checkpoint(config);
  config.vocab_size = std::size_t{1} << 21;
  config.hidden_size = 2048;
  std::ofstream(dir / "config.json") << testing::config_json(config);
  EXPECT_EXIT(load_in_bounded_memory(dir), ::testing::ExitedWithCode(0),
              "\\[ShapeMismatch\\].*'model\\.embed_tokens\\.weight' has shape \\[256, 64\\] but the config needs "
              "\\[2097152, 2048\\]");
}

// Every tensor's presence, dtype and shape is checked, from the headers,
// before any value is read or uploaded: a missing lm_head.weight is named
// even where layer 0 holds a bad value (it used to come out only after
// every layer had loaded, minutes on a large model).
TEST(Weights, HeadersAreCheckedBeforeAnyValue) {
  const ModelConfig config = preset_config("tiny-llama");
  const auto dir = checkpoint_with(config, "lm_head.weight", nullptr);
  std::vector<float> bias(64, 0.0f);
  bias[1] = 0.5f;  // a nonzero bias: Unsupported, found when its values are read
  write_safetensors(dir / "bias.safetensors",
                    {make_write_tensor("model.layers.0.self_attn.q_proj.bias", SafetensorsDType::F16, {64}, bias)});
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "missing tensor 'lm_head.weight'");
  std::filesystem::remove(dir / "bias.safetensors");
  write_safetensors(dir / "bias.safetensors",
                    {make_write_tensor("model.layers.1.self_attn.q_proj.bias", SafetensorsDType::F16, {32},
                                       std::vector<float>(32))});  // and a bias's shape is a header check
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::ShapeMismatch, "model.layers.1.self_attn.q_proj.bias",
                      "[32]", "[64]");
}

// The values load_gptq refuses (a g_idx past the groups, a scale that is
// not finite) name the projection's tensors and their file, and for a
// fused projection its parts and their layout (load_gptq itself can name
// only its argument).
TEST(Weights, GptqValueErrorsNameTheTensorsAndTheFile) {
  ModelConfig config = preset_config("tiny-llama");
  config.gptq = GptqConfig{};
  config.gptq->group_size = 32;
  config.validate("test config");
  const testing::GptqTestSource source(config, 3);
  const std::string g_idx = "model.layers.1.self_attn.o_proj.g_idx";
  const std::string scales = "model.layers.0.mlp.up_proj.scales";
  for (const std::string& broken : {g_idx, scales}) {
    SCOPED_TRACE(broken);
    const auto dir = testing::scratch_dir() / "ckpt";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << testing::config_json(config);
    std::vector<SafetensorsWriteTensor> tensors;
    for (const ExpectedTensor& t : expected_tensors(config)) {
      if (t.name == broken && broken == g_idx) {
        std::vector<std::int32_t> values = source.read_i32(t.name);
        values[5] = 7;  // o_proj's k = 64 in groups of 32: groups 0 and 1 only
        tensors.push_back(make_write_tensor(t.name, t.shape, values));
      } else if (t.name == broken) {
        std::vector<float> values = source.read_f32(t.name);
        values[3] = std::numeric_limits<float>::infinity();
        tensors.push_back(make_write_tensor(t.name, SafetensorsDType::F16, t.shape, values));
      } else {
        tensors.push_back(testing::write_tensor_from(source, t, SafetensorsDType::F16));
      }
    }
    write_safetensors(dir / "model.safetensors", tensors);
    CpuBackend be;
    if (broken == g_idx) {
      EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.safetensors",
                          "GPTQ projection 'model.layers.1.self_attn.o_proj':", "load_gptq", "'g_idx' entry 5 = 7");
    } else {
      EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "model.safetensors",
                          "'model.layers.0.mlp.gate_proj' and 'model.layers.0.mlp.up_proj' (columns interleaved",
                          "load_gptq", "'scales'", "not finite");
    }
  }
}

TEST(Weights, DirectoryWithoutSafetensors) {
  const auto dir = testing::scratch_dir();
  std::ofstream(dir / "config.json") << testing::config_json(preset_config("tiny-llama"));
  CpuBackend be;
  EXPECT_ENGINE_ERROR(load_checkpoint(be, dir), ErrorCode::InvalidArgument, "no *.safetensors");
}

TEST(Weights, RandomWeightsAreSeededAndRounded) {
  const ModelConfig config = preset_config("tiny-qwen3");
  const RandomTensorSource a(config, 11), b(config, 11), c(config, 12);
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(a.read_f32(name), b.read_f32(name));
  EXPECT_NE(a.read_f32(name), c.read_f32(name));
  for (float v : a.read_f32(name)) {
    ASSERT_EQ(v, f16_to_f32(f32_to_f16(v)));
    ASSERT_LE(std::fabs(v), std::sqrt(3.0 / 64.0) + 1e-3);
  }
  for (float v : a.read_f32("model.norm.weight")) ASSERT_NEAR(v, 1.0f, 0.2001f);
}

}  // namespace
}  // namespace ferrum::engine
