// The ferrum_engine program itself (CPU backend): --dump-logits writes one
// float32 row per generated token, the rows are the in-process Decoder's
// logits bit for bit, the "generated:" line lists their argmaxes, and a bad
// dump path is an error before any work.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "decoder.hpp"
#include "engine_test_support.hpp"
#include "weights.hpp"

namespace ferrum::engine {
namespace {

const std::vector<std::int32_t> kPrompt = {1, 17, 42, 3};
constexpr std::size_t kSteps = 6;
constexpr std::uint64_t kSeed = 77;

// Runs ferrum_engine with `args` (stdout and stderr to `log`); returns its exit status.
int run_engine(const std::string& args, const std::filesystem::path& log) {
  const std::string command = std::string("\"") + FERRUM_ENGINE_PATH + "\" " + args + " > \"" + log.string() + "\" 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<float> read_floats(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size() % sizeof(float), 0u);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

// The ids on the "  generated: ..." line of the engine's output.
std::vector<std::int32_t> generated_tokens(const std::string& output) {
  const std::string marker = "  generated:";
  const std::size_t at = output.find(marker);
  EXPECT_NE(at, std::string::npos) << output;
  if (at == std::string::npos) return {};
  std::istringstream line(output.substr(at + marker.size(), output.find('\n', at) - at - marker.size()));
  std::vector<std::int32_t> tokens;
  for (std::int32_t id; line >> id;) tokens.push_back(id);
  return tokens;
}

class EngineCliTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineCliTest, DumpLogitsMatchesInProcessDecoder) {
  const std::filesystem::path dir = testing::scratch_dir();
  const ModelConfig config = preset_config(GetParam());
  const RandomTensorSource source(config, kSeed);
  // A checkpoint on disk, so the program's --model path is what runs.
  testing::write_checkpoint(dir / "model", config, source, SafetensorsDType::F16, 1);

  const std::filesystem::path dump = dir / "logits.bin";
  const std::filesystem::path log = dir / "engine.log";
  const int rc = run_engine("--model \"" + (dir / "model").string() + "\" --cpu --prompt-tokens 1,17,42,3 --steps " +
                                std::to_string(kSteps) + " --dump-logits \"" + dump.string() + "\"",
                            log);
  const std::string output = read_text(log);
  ASSERT_EQ(rc, 0) << output;

  const std::vector<float> rows = read_floats(dump);
  ASSERT_EQ(rows.size(), kSteps * config.vocab_size) << "file size " << std::filesystem::file_size(dump);
  for (std::size_t i = 0; i < rows.size(); ++i) ASSERT_TRUE(std::isfinite(rows[i])) << "value " << i;

  const std::vector<std::int32_t> tokens = generated_tokens(output);
  ASSERT_EQ(tokens.size(), kSteps) << output;

  // The same model in process: the CPU backend is deterministic, so the rows are identical.
  CpuBackend be;
  const ModelWeights weights = random_weights(be, config, kSeed);
  Decoder decoder(be, weights, kPrompt.size() + kSteps, kPrompt.size());
  std::vector<float> logits = decoder.prefill(kPrompt);
  for (std::size_t step = 0; step < kSteps; ++step) {
    if (step > 0) logits = decoder.decode(tokens[step - 1]);
    const std::vector<float> row(rows.begin() + static_cast<std::ptrdiff_t>(step * config.vocab_size),
                                 rows.begin() + static_cast<std::ptrdiff_t>((step + 1) * config.vocab_size));
    EXPECT_EQ(row, logits) << "row " << step;
    EXPECT_EQ(argmax(row), tokens[step]) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineCliTest, ::testing::Values("tiny-llama", "tiny-qwen3"));

TEST(EngineCli, DumpLogitsRandomPresetHasOneRowPerStep) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path dump = dir / "logits.bin";
  const std::filesystem::path log = dir / "engine.log";
  ASSERT_EQ(run_engine("--random tiny-qwen3 --cpu --steps 3 --dump-logits \"" + dump.string() + "\"", log), 0)
      << read_text(log);
  EXPECT_EQ(std::filesystem::file_size(dump), 3 * preset_config("tiny-qwen3").vocab_size * sizeof(float));
  EXPECT_EQ(generated_tokens(read_text(log)).size(), 3u);
}

TEST(EngineCli, UnwritableDumpPathIsAnError) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::string bad = (dir / "no-such-dir" / "logits.bin").string();
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 2 --dump-logits \"" + bad + "\"", log), 1);
  const std::string output = read_text(log);
  EXPECT_NE(output.find("--dump-logits: cannot open"), std::string::npos) << output;
  EXPECT_EQ(output.find("prefill:"), std::string::npos) << "ran before failing: " << output;
}

TEST(EngineCli, DtypeOverridesTheRandomPresetsDtype) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  for (const char* dtype : {"f16", "bf16"}) {
    ASSERT_EQ(run_engine(std::string("--random tiny-llama --cpu --steps 2 --dtype ") + dtype, log), 0) << read_text(log);
    const std::string output = read_text(log);
    EXPECT_NE(output.find(std::string(", ") + dtype), std::string::npos) << output;
    EXPECT_EQ(generated_tokens(output).size(), 2u);
  }
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 2 --dtype f32", log), 1);
  EXPECT_NE(read_text(log).find("--dtype takes f16 or bf16, got 'f32'"), std::string::npos) << read_text(log);
}

}  // namespace
}  // namespace ferrum::engine
