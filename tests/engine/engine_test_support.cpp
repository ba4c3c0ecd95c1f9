#include "engine_test_support.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint_layout.hpp"

namespace ferrum::engine::testing {

std::filesystem::path scratch_dir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::path(FERRUM_ENGINE_TEST_DIR) / info->test_suite_name() / info->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::uint8_t>& data, std::uint64_t header_length) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>(header_length >> (8 * b)));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::uint8_t>& data) {
  write_raw_safetensors(path, header, data, header.size());
}

std::string config_json(const ModelConfig& c) {
  nlohmann::json j;
  j["architectures"] = {c.architecture == Architecture::Llama ? "LlamaForCausalLM" : "Qwen3ForCausalLM"};
  j["model_type"] = c.architecture == Architecture::Llama ? "llama" : "qwen3";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.dtype == DType::F16 ? "float16" : "bfloat16";
  j["hidden_act"] = "silu";
  j["rope_scaling"] = nullptr;
  return j.dump(2);
}

void write_checkpoint(const std::filesystem::path& dir, const ModelConfig& config, const TensorSource& source,
                      SafetensorsDType dtype, std::size_t shards) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config_json(config);
  const std::vector<ExpectedTensor> expected = expected_tensors(config);
  const std::size_t per_shard = (expected.size() + shards - 1) / shards;
  for (std::size_t s = 0; s < shards; ++s) {
    std::vector<SafetensorsWriteTensor> tensors;
    for (std::size_t i = s * per_shard; i < std::min(expected.size(), (s + 1) * per_shard); ++i) {
      tensors.push_back(make_write_tensor(expected[i].name, dtype, expected[i].shape, source.read_f32(expected[i].name)));
    }
    write_safetensors(dir / ("model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors"),
                      tensors, {{"format", "pt"}});
  }
}

}  // namespace ferrum::engine::testing
