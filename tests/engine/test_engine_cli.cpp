// The ferrum_engine program itself (CPU backend): --dump-logits writes one
// float32 row per generated token, the rows are the in-process Decoder's
// logits bit for bit (dense and GPTQ models: --random NAME --quant gptq, a
// GPTQ checkpoint), the "generated:" line lists their argmaxes, and a bad
// dump path or --quant value is an error before any work.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "decoder.hpp"
#include "engine_test_support.hpp"
#include "support/test_support.hpp"
#include "weights.hpp"

namespace ferrum::engine {
namespace {

using ::ferrum::test::cat;

const std::vector<std::int32_t> kPrompt = {1, 17, 42, 3};
constexpr std::size_t kSteps = 6;
constexpr std::uint64_t kSeed = 77;

// Runs ferrum_engine with `args` (stdout and stderr to `log`); returns its
// exit status (-1: ended by a signal). With `timeout_s`, killed past that
// many seconds (status 124).
int run_engine(const std::string& args, const std::filesystem::path& log, int timeout_s = 0) {
  const std::string prefix = timeout_s > 0 ? "timeout -s KILL " + std::to_string(timeout_s) + " " : "";
  const std::string command =
      prefix + "\"" + FERRUM_ENGINE_PATH + "\" " + args + " > \"" + log.string() + "\" 2>&1";
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

// The ids on the "  generated: ..." line of the engine's output (a batch:
// the "  generated[seq]: ..." line).
std::vector<std::int32_t> generated_tokens(const std::string& output, int seq = -1) {
  const std::string marker = seq < 0 ? "  generated:" : "  generated[" + std::to_string(seq) + "]:";
  const std::size_t at = output.find(marker);
  EXPECT_NE(at, std::string::npos) << output;
  if (at == std::string::npos) return {};
  std::istringstream line(output.substr(at + marker.size(), output.find('\n', at) - at - marker.size()));
  std::vector<std::int32_t> tokens;
  for (std::int32_t id; line >> id;) tokens.push_back(id);
  return tokens;
}

// The program's dumped rows (--prompt-tokens kPrompt) are the in-process
// Decoder's logits bit for bit, and `tokens` are their argmaxes.
void expect_rows_match_decoder(CpuBackend& be, const ModelWeights& weights, const std::vector<float>& rows,
                               const std::vector<std::int32_t>& tokens) {
  const std::size_t vocab = weights.config.vocab_size;
  ASSERT_EQ(rows.size(), tokens.size() * vocab);
  Decoder decoder(be, weights, kPrompt.size() + tokens.size(), kPrompt.size());
  std::vector<float> logits = decoder.prefill(kPrompt);
  for (std::size_t step = 0; step < tokens.size(); ++step) {
    if (step > 0) logits = decoder.decode(tokens[step - 1]);
    const std::vector<float> row(rows.begin() + static_cast<std::ptrdiff_t>(step * vocab),
                                 rows.begin() + static_cast<std::ptrdiff_t>((step + 1) * vocab));
    EXPECT_EQ(row, logits) << "row " << step;
    EXPECT_EQ(argmax(row), tokens[step]) << "step " << step;
  }
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
  expect_rows_match_decoder(be, random_weights(be, config, kSeed), rows, tokens);
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

// A usage error names what it could not place (exit 2, with the usage
// text); --help explains the everyday flags and their defaults (exit 0).
TEST(EngineCli, UsageErrorsNameTheArgument) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --bogus", log), 2);
  EXPECT_NE(read_text(log).find("ferrum_engine: unknown option '--bogus'"), std::string::npos) << read_text(log);
  EXPECT_NE(read_text(log).find("usage: ferrum_engine"), std::string::npos) << read_text(log);
  EXPECT_EQ(run_engine("--random tiny-llama --cpu tiny-qwen3", log), 2);
  EXPECT_NE(read_text(log).find("ferrum_engine: unexpected argument 'tiny-qwen3'"), std::string::npos)
      << read_text(log);
  ASSERT_EQ(run_engine("--help", log), 0) << read_text(log);
  const std::string help = read_text(log);
  for (const char* line : {"usage: ferrum_engine", "--steps N            tokens to generate per sequence (default 16)",
                           "--[no-]gemm-early-weights", "tiny-llama"}) {
    EXPECT_NE(help.find(line), std::string::npos) << "missing \"" << line << "\" in:\n" << help;
  }
  // A --model folder that is not there is named as one.
  EXPECT_EQ(run_engine("--model \"" + (dir / "absent").string() + "\" --cpu", log), 1);
  EXPECT_NE(read_text(log).find("absent': no such directory"), std::string::npos) << read_text(log);
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

// Counts are digits only (a sign or leading space read " -1" as 2^64 - 1)
// and within range; lengths and token ids are checked against the config
// before anything loads or --dump-logits empties its file; the caches hold
// the prompt and every generated token but the last, so tiny-llama's 128
// positions give 128 tokens from a one-token prompt.
TEST(EngineCli, CountsLengthsAndIdsAreCheckedFirst) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  for (const char* bad : {"\" -1\"", "+3", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(run_engine(std::string("--random tiny-llama --cpu --steps ") + bad, log), 1);
    EXPECT_NE(read_text(log).find("--steps"), std::string::npos) << read_text(log);
  }
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --seed \" -1\"", log), 1);
  EXPECT_NE(read_text(log).find("--seed"), std::string::npos) << read_text(log);

  const std::filesystem::path kept = dir / "kept.bin";
  std::ofstream(kept) << "keep";
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 130 --dump-logits \"" + kept.string() + "\"", log), 1);
  EXPECT_NE(read_text(log).find("max_position_embeddings = 128"), std::string::npos) << read_text(log);
  EXPECT_EQ(read_text(log).find("loaded in"), std::string::npos) << "loaded before failing: " << read_text(log);
  EXPECT_EQ(read_text(kept), "keep");
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 2 --prompt-tokens 5,256", log), 1);
  EXPECT_NE(read_text(log).find("token id 256 is past the vocabulary"), std::string::npos) << read_text(log);

  // More prompts than a batch holds (--batch caps at 1024): refused before the load.
  std::string prompts = "1";
  for (int i = 0; i < 1024; ++i) prompts += ";1";
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 2 --prompt-tokens \"" + prompts + "\"", log), 1);
  EXPECT_NE(read_text(log).find("gives 1025 prompts, past the 1024"), std::string::npos) << read_text(log);
  EXPECT_EQ(read_text(log).find("loaded in"), std::string::npos) << "loaded before failing: " << read_text(log);

  ASSERT_EQ(run_engine("--random tiny-llama --cpu --steps 128", log), 0) << read_text(log);
  EXPECT_EQ(generated_tokens(read_text(log)).size(), 128u);
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 129", log), 1);
}

// A checkpoint the CUDA backend can run (tiny-llama at head_dim 64: the
// tiny presets' head_dim 16 is not one of the CUDA attention kernels'), so
// that on a GPU machine the engine runs there and not on its CPU fallback.
std::filesystem::path write_gpu_tiny_checkpoint(const std::filesystem::path& dir) {
  const ModelConfig config = testing::gpu_tiny_llama_config();
  testing::write_checkpoint(dir / "gpu-model", config, RandomTensorSource(config, kSeed), SafetensorsDType::F16, 1);
  return dir / "gpu-model";
}

// The backend line the engine printed names CUDA whenever a GPU is present.
void expect_gpu_backend_when_present(const std::string& output) {
  if (cuda_device_count() > 0) {
    EXPECT_NE(output.find("backend cuda"), std::string::npos) << output;
  }
}

// The decode-step launch switches change no bit: each run's logits equal the
// default run's, eager and graph: PDL on and off, the early trigger off, the
// chain release on and off, the L2 prefetch, the pre-wait weight loads off (gemm_weights_before_wait, the
// engine's promise by default), the pre-wait K / V requests on and off (attention_kv_before_wait, the
// engine's default for dense graph steps) and the
// GPTQ weights' L2 policy off (gptq_weights_evict_first), which no other test can turn on
// (the first backend on a device fixes them), the GPTQ cluster reduce
// turned off and SiLU·mul outside the GPTQ gate|up GEMM's epilogue
// (gptq_fuse_silu_mul off; per backend; here only the flags' paths,
// CudaGptqStream and CudaGptqSiluMul test the kernels). GPU
// only: the flags configure CudaBackend, so on CpuBackend the runs could not
// differ.
void expect_launch_switches_keep_logits(const std::filesystem::path& dir, const std::filesystem::path& model) {
  const std::filesystem::path log = dir / "engine.log";
  for (const char* mode : {"--eager", "--graph"}) {
    SCOPED_TRACE(mode);
    const std::string base = "--model \"" + model.string() + "\" --steps 4 " + mode;
    ASSERT_EQ(run_engine(base + " --dump-logits \"" + (dir / "a.bin").string() + "\"", log), 0) << read_text(log);
    expect_gpu_backend_when_present(read_text(log));
    for (const char* switches : {"--no-pdl", "--no-pdl-trigger", "--pdl-chain-release", "--no-pdl-chain-release",
                                 "--no-gemm-early-weights", "--attention-early-kv", "--no-attention-early-kv",
                                 "--attention-early-kv --pdl-chain-release",
                                 "--no-pdl-trigger --gemm-prefetch", "--no-gptq-cluster-reduce",
                                 "--no-gptq-evict-first --no-gemm-early-weights", "--no-gptq-fuse-silu-mul",
                                 "--no-gptq-fuse-silu-mul --no-gemm-early-weights"}) {
      SCOPED_TRACE(switches);
      std::filesystem::remove(dir / "b.bin");
      ASSERT_EQ(run_engine(base + " " + switches + " --dump-logits \"" + (dir / "b.bin").string() + "\"", log), 0)
          << read_text(log);
      EXPECT_EQ(read_floats(dir / "a.bin"), read_floats(dir / "b.bin"));
    }
    std::filesystem::remove(dir / "a.bin");
  }
}

TEST(EngineCli, LaunchSwitchesGiveTheSameLogits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: the launch switches only configure CudaBackend";
  const std::filesystem::path dir = testing::scratch_dir();
  expect_launch_switches_keep_logits(dir, write_gpu_tiny_checkpoint(dir));
}

// A GPU-sized tiny Llama with GPTQ INT4 projections (group 128, symmetric),
// written under dir / "gptq-model"; returns that directory. Intermediate 2560:
// on the H200 the down projection (k = 2560: 20 chunks of 128 rows, n = 256)
// runs the streaming kernel's bulk source with 2 splits summed in a cluster,
// 10 chunks per CTA, so warps 0 and 1 take 3 chunks: both ring slots' first
// fills (which the engine's default promise requests before the PDL wait) and a
// refill after them.
std::filesystem::path write_gptq_tiny_checkpoint(const std::filesystem::path& dir) {
  ModelConfig config = testing::gpu_tiny_llama_config();
  config.intermediate_size = 2560;
  config.vocab_size = 512;
  GptqConfig gptq;
  gptq.group_size = 128;
  config.gptq = gptq;
  config.validate("gptq engine test config");
  testing::write_checkpoint(dir / "gptq-model", config, testing::GptqTestSource(config, kSeed), SafetensorsDType::F16, 1);
  return dir / "gptq-model";
}

// The same with GPTQ INT4 projections: on a GPU the streaming kernel's bulk
// source launched with PDL.
TEST(EngineCli, GptqLaunchSwitchesGiveTheSameLogits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: the launch switches only configure CudaBackend";
  const std::filesystem::path dir = testing::scratch_dir();
  expect_launch_switches_keep_logits(dir, write_gptq_tiny_checkpoint(dir));
}

// --gptq-fused-max-m (CudaBackendConfig::gptq_fused_max_m): dequantize +
// cuBLAS everywhere, the INT4 kernels everywhere and the default rule all
// decode a GPTQ model with a 5-token prompt (its prefill is m = 5); a value
// past the range is refused by name. (The paths round differently, so the
// tokens are not compared.)
TEST(EngineCli, GptqFusedMaxMRange) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = write_gptq_tiny_checkpoint(dir);
  for (const char* m : {"0", "4", "4096", ""}) {
    SCOPED_TRACE(m);
    const std::string flag = *m != '\0' ? std::string(" --gptq-fused-max-m ") + m : std::string();
    ASSERT_EQ(run_engine("--model \"" + model.string() + "\" --prompt-tokens 1,2,3,4,5 --steps 3" + flag, log), 0)
        << read_text(log);
    EXPECT_EQ(generated_tokens(read_text(log)).size(), 3u);
    expect_gpu_backend_when_present(read_text(log));
  }
  EXPECT_EQ(run_engine("--random tiny-llama --steps 2 --gptq-fused-max-m 70000", log), 1);
  EXPECT_NE(read_text(log).find("--gptq-fused-max-m takes 0..65536, got 70000"), std::string::npos) << read_text(log);
}

// --gptq-ctas-per-sm (CudaBackendConfig::gptq_stream_ctas_per_sm): a GPTQ
// model decodes at both ends of the range, 0 (every slot) included (on
// CpuBackend without a GPU), and values past 16 are refused by name. (Fewer
// splits may round otherwise, so the tokens are not compared.)
TEST(EngineCli, GptqCtasPerSmRange) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = write_gptq_tiny_checkpoint(dir);
  for (const char* n : {"0", "1", "2", "16"}) {
    SCOPED_TRACE(n);
    ASSERT_EQ(run_engine("--model \"" + model.string() + "\" --steps 3 --gptq-ctas-per-sm " + std::string(n), log), 0)
        << read_text(log);
    EXPECT_EQ(generated_tokens(read_text(log)).size(), 3u);
    expect_gpu_backend_when_present(read_text(log));
  }
  for (const char* bad : {"17", "1000"}) {
    EXPECT_EQ(run_engine("--random tiny-llama --steps 2 --gptq-ctas-per-sm " + std::string(bad), log), 1);
    EXPECT_NE(read_text(log).find(std::string("--gptq-ctas-per-sm takes 0..16, got ") + bad), std::string::npos)
        << read_text(log);
  }
}

// The engine's GPTQ launch plan on CudaBackend (the line it prints): a GPTQ
// model decoding one sequence from a graph releases its GEMM -> norm -> GEMM
// chains ahead with the streaming splits planned for 3 CTAs per SM; batch
// decoding, eager steps and a run without the gemm_weights_before_wait
// promise keep the library's defaults; either flag overrides its half. GPU only: the plan
// configures CudaBackend.
TEST(EngineCli, GptqLaunchPlanDefaults) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: the launch plan only configures CudaBackend";
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = write_gptq_tiny_checkpoint(dir);
  const std::string base = "--model \"" + model.string() + "\" --steps 2 --graph";
  struct Case {
    const char* flags;
    const char* plan;
  };
  for (const Case& c : {Case{"", "pdl_chain_release on, gptq_stream_ctas_per_sm 3"},
                        Case{"--batch 2", "pdl_chain_release off, gptq_stream_ctas_per_sm 0"},
                        Case{"--no-gemm-early-weights", "pdl_chain_release off, gptq_stream_ctas_per_sm 0"},
                        Case{"--eager", "pdl_chain_release off, gptq_stream_ctas_per_sm 0"},
                        Case{"--no-pdl-chain-release", "pdl_chain_release off, gptq_stream_ctas_per_sm 3"},
                        Case{"--gptq-ctas-per-sm 0", "pdl_chain_release on, gptq_stream_ctas_per_sm 0"},
                        Case{"--batch 2 --pdl-chain-release --gptq-ctas-per-sm 5",
                             "pdl_chain_release on, gptq_stream_ctas_per_sm 5"},
                        Case{"--no-pdl", "pdl_chain_release off (no PDL), gptq_stream_ctas_per_sm 3"}}) {
    SCOPED_TRACE(c.flags);
    ASSERT_EQ(run_engine(base + " " + c.flags, log), 0) << read_text(log);
    EXPECT_NE(read_text(log).find(std::string("GPTQ launches: ") + c.plan), std::string::npos) << read_text(log);
  }
}

// The engine's attention launch plan on CudaBackend (the line it prints): a
// dense model decoding one sequence from a graph makes the
// attention_kv_before_wait promise; a GPTQ model, batch decoding and eager
// steps keep the library's default (off); either flag overrides. GPU only:
// the plan configures CudaBackend.
TEST(EngineCli, AttentionLaunchPlanDefaults) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: the launch plan only configures CudaBackend";
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path dense = write_gpu_tiny_checkpoint(dir);
  const std::filesystem::path gptq = write_gptq_tiny_checkpoint(dir);
  struct Case {
    const std::filesystem::path* model;
    const char* flags;
    const char* plan;
  };
  for (const Case& c : {Case{&dense, "--graph", "on"}, Case{&dense, "--eager", "off"},
                        Case{&dense, "--graph --batch 2", "off"}, Case{&dense, "--graph --no-attention-early-kv", "off"},
                        Case{&dense, "--eager --attention-early-kv", "on"}, Case{&gptq, "--graph", "off"},
                        Case{&gptq, "--graph --attention-early-kv", "on"}}) {
    SCOPED_TRACE(c.model->filename().string() + " " + c.flags);
    ASSERT_EQ(run_engine("--model \"" + c.model->string() + "\" --steps 2 " + c.flags, log), 0) << read_text(log);
    EXPECT_NE(read_text(log).find(std::string("attention launches: attention_kv_before_wait ") + c.plan + "\n"),
              std::string::npos)
        << read_text(log);
  }
}

// A preset whose attention shape the CUDA backend cannot run (head_dim 16)
// still decodes on a GPU machine: the engine says so and takes CpuBackend.
TEST(EngineCli, UnsupportedAttentionShapeFallsBackToCpu) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  ASSERT_EQ(run_engine("--random tiny-qwen3 --steps 2", log), 0) << read_text(log);
  const std::string output = read_text(log);
  EXPECT_EQ(generated_tokens(output).size(), 2u);
  if (cuda_device_count() > 0) {
    EXPECT_NE(output.find("does not run flash_attention on heads of head_dim = 16"), std::string::npos) << output;
    EXPECT_NE(output.find("falling back to the CPU backend"), std::string::npos) << output;
  }
}

// --skinny-max-m (CudaBackendConfig::gemm_skinny_max_m): both ends of its
// range run (skinny wherever it applies, cuBLAS only; on CpuBackend without
// a GPU), and a value past kSkinnyMaxM is refused by name. (The two paths
// round differently, so their tokens are not compared.)
TEST(EngineCli, SkinnyMaxMRange) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = write_gpu_tiny_checkpoint(dir);
  for (const char* m : {"16", "8", "0"}) {
    ASSERT_EQ(run_engine("--model \"" + model.string() + "\" --steps 4 --skinny-max-m " + std::string(m), log), 0)
        << read_text(log);
    EXPECT_EQ(generated_tokens(read_text(log)).size(), 4u);
    expect_gpu_backend_when_present(read_text(log));
  }
  EXPECT_EQ(run_engine("--random tiny-llama --steps 2 --skinny-max-m 17", log), 1);
  EXPECT_NE(read_text(log).find("--skinny-max-m takes 0..16, got 17"), std::string::npos) << read_text(log);
}

// --batch 3 with one prompt: sequence b decodes the prompt's first len - b
// tokens, all three as the rows of each step; each sequence's tokens equal a
// run of that prompt alone, on CpuBackend, where a batch row is bitwise a
// lone step. (The GPU batch step against lone ones, where m = 3 may round
// otherwise than m = 1: DecoderGpu.GraphBatchStepEqualsEachSequenceAlone.)
TEST(EngineCli, BatchEqualsEachPromptAlone) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = write_gpu_tiny_checkpoint(dir);
  const std::string base = "--model \"" + model.string() + "\" --steps 6 --cpu";
  ASSERT_EQ(run_engine(base + " --prompt-tokens 1,17,42,3 --batch 3", log), 0) << read_text(log);
  const std::string batch_output = read_text(log);
  EXPECT_NE(batch_output.find("batch: 3 sequences"), std::string::npos) << batch_output;
  const char* prompts[] = {"1,17,42,3", "1,17,42", "1,17"};
  for (int b = 0; b < 3; ++b) {
    SCOPED_TRACE(prompts[b]);
    ASSERT_EQ(run_engine(base + " --prompt-tokens " + prompts[b], log), 0) << read_text(log);
    const std::vector<std::int32_t> want = generated_tokens(read_text(log));
    EXPECT_EQ(want.size(), 6u);
    EXPECT_EQ(generated_tokens(batch_output, b), want) << batch_output;
  }
  // The same batch from explicit ';'-separated prompts.
  ASSERT_EQ(run_engine(base + " --prompt-tokens \"1,17,42,3;1,17,42;1,17\"", log), 0) << read_text(log);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(generated_tokens(read_text(log), b), generated_tokens(batch_output, b));
  EXPECT_EQ(run_engine(base + " --prompt-tokens \"1;2\" --batch 3", log), 1);
  EXPECT_NE(read_text(log).find("--batch 3 needs one prompt or 3"), std::string::npos) << read_text(log);
}

// A batch's --dump-logits: per step one row per sequence, in sequence order
// (step 0: each prompt's prefill), bit for bit the in-process Decoder's
// prefill / decode_batch logits, and each "generated[b]:" token the argmax
// of its row.
TEST(EngineCli, BatchDumpLogitsMatchesInProcessDecoder) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path dump = dir / "logits.bin";
  const std::filesystem::path log = dir / "engine.log";
  const std::vector<std::vector<std::int32_t>> prompts = {{1, 17, 42, 3}, {5, 6}};
  constexpr std::size_t kBatchSteps = 4;
  ASSERT_EQ(run_engine("--random tiny-llama --cpu --seed " + std::to_string(kSeed) + " --steps " +
                           std::to_string(kBatchSteps) + " --prompt-tokens \"1,17,42,3;5,6\" --dump-logits \"" +
                           dump.string() + "\"",
                       log),
            0)
      << read_text(log);
  const std::string output = read_text(log);
  const ModelConfig config = preset_config("tiny-llama");
  const std::size_t vocab = config.vocab_size;
  const std::vector<float> rows = read_floats(dump);
  ASSERT_EQ(rows.size(), kBatchSteps * prompts.size() * vocab);

  CpuBackend be;
  const ModelWeights weights = random_weights(be, config, kSeed);
  Decoder decoder(be, weights, 4 + kBatchSteps, 4, DecodeMode::Eager, prompts.size());
  std::vector<float> want;
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const std::vector<float> logits = decoder.prefill(b, prompts[b]);
    want.insert(want.end(), logits.begin(), logits.end());
  }
  std::vector<std::vector<std::int32_t>> tokens(prompts.size());
  for (std::size_t step = 0; step < kBatchSteps; ++step) {
    if (step > 0) {
      std::vector<std::int32_t> last;
      for (const auto& t : tokens) last.push_back(t.back());
      want = decoder.decode_batch(last);
    }
    for (std::size_t b = 0; b < prompts.size(); ++b) {
      const std::size_t at = (step * prompts.size() + b) * vocab;
      const std::vector<float> row(rows.begin() + static_cast<std::ptrdiff_t>(at),
                                   rows.begin() + static_cast<std::ptrdiff_t>(at + vocab));
      EXPECT_EQ(row, std::vector<float>(want.begin() + static_cast<std::ptrdiff_t>(b * vocab),
                                        want.begin() + static_cast<std::ptrdiff_t>((b + 1) * vocab)))
          << "step " << step << ", sequence " << b;
      tokens[b].push_back(argmax(row));
    }
  }
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(generated_tokens(output, static_cast<int>(b)), tokens[b]) << "sequence " << b;
  }
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

// A float32 checkpoint (config and tensors) runs with --dtype, its weights
// converted at load: the same logits, bit for bit, as the in-process
// decoder on the f16 config over the same source; without --dtype it is a
// named error that says what to pass.
TEST(EngineCli, DtypeConvertsAFloat32Checkpoint) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const ModelConfig config = preset_config("tiny-llama");  // f16
  const RandomTensorSource source(config, kSeed);
  const std::filesystem::path model = dir / "f32-model";
  testing::write_checkpoint(model, config, source, SafetensorsDType::F32, 1);
  {  // config.json as an fp32 export writes it
    nlohmann::json j = nlohmann::json::parse(read_text(model / "config.json"));
    j["torch_dtype"] = "float32";
    std::ofstream(model / "config.json") << j.dump(2);
  }
  const std::string base = "--model \"" + model.string() + "\" --cpu --steps 4 --prompt-tokens 1,17,42,3";
  EXPECT_EQ(run_engine(base, log), 1);
  EXPECT_NE(read_text(log).find("--dtype f16 or bf16"), std::string::npos) << read_text(log);
  const std::filesystem::path dump = dir / "rows.bin";
  ASSERT_EQ(run_engine(base + " --dtype f16 --dump-logits \"" + dump.string() + "\"", log), 0) << read_text(log);
  EXPECT_NE(read_text(log).find(", f16"), std::string::npos) << read_text(log);
  CpuBackend be;
  const ModelWeights weights = load_weights(be, config, source);
  expect_rows_match_decoder(be, weights, read_floats(dump), generated_tokens(read_text(log)));
}

TEST(EngineCli, RandomGptqPresetMatchesInProcessDecoder) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path dump = dir / "logits.bin";
  const std::filesystem::path log = dir / "engine.log";
  ASSERT_EQ(run_engine("--random tiny-llama --quant gptq --cpu --graph --seed " + std::to_string(kSeed) +
                           " --prompt-tokens 1,17,42,3 --steps " +
                           std::to_string(kSteps) + " --dump-logits \"" + dump.string() + "\"",
                       log),
            0)
      << read_text(log);
  const std::string output = read_text(log);
  EXPECT_NE(output.find(", f16, gptq int4 group 64"), std::string::npos) << output;
  EXPECT_NE(output.find("decoding eagerly instead of with a graph"), std::string::npos) << output;  // CPU: no graphs
  ModelConfig config = preset_config("tiny-llama");
  config.gptq = random_gptq_config(config);
  CpuBackend be;
  expect_rows_match_decoder(be, random_weights(be, config, kSeed), read_floats(dump), generated_tokens(output));
}

TEST(EngineCli, GptqActOrderCheckpointMatchesInProcessDecoder) {
  const std::filesystem::path dir = testing::scratch_dir();
  ModelConfig config = preset_config("tiny-qwen3");
  GptqConfig gptq;
  gptq.group_size = 32;
  gptq.desc_act = true;
  gptq.zero_format = GptqZeroFormat::V2;
  config.gptq = gptq;
  testing::GptqTestOptions options;
  options.act_order = true;
  options.split_gate_up = true;
  options.symmetric = false;
  testing::write_checkpoint(dir / "model", config, testing::GptqTestSource(config, kSeed, options),
                            SafetensorsDType::F16, 2);
  const std::filesystem::path dump = dir / "logits.bin";
  const std::filesystem::path log = dir / "engine.log";
  ASSERT_EQ(run_engine("--model \"" + (dir / "model").string() + "\" --cpu --prompt-tokens 1,17,42,3 --steps " +
                           std::to_string(kSteps) + " --dump-logits \"" + dump.string() + "\"",
                       log),
            0)
      << read_text(log);
  const std::string output = read_text(log);
  EXPECT_NE(output.find("gptq int4 group 32 act-order v2"), std::string::npos) << output;
  CpuBackend be;
  expect_rows_match_decoder(be, load_checkpoint(be, dir / "model"), read_floats(dump), generated_tokens(output));
}

// --pipeline (every decode step enqueued before any token is read) prints
// the tokens of the step-by-step run: on CpuBackend as device-state
// decoding, and where a GPU is present also as a replayed graph against the
// graph run (the GPU-sized tiny checkpoint: CudaBackend runs its head_dim).
// Its refusals: a batch, --dump-logits.
TEST(EngineCli, PipelineGivesTheStepByStepTokens) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = write_gpu_tiny_checkpoint(dir);
  const std::string base = "--model \"" + model.string() + "\" --prompt-tokens 1,17,42,255,3,99,200 --steps 24";
  std::vector<std::string> backends = {" --cpu"};
  if (cuda_device_count() > 0) backends.push_back(" --graph");
  for (const std::string& backend : backends) {
    SCOPED_TRACE(backend);
    ASSERT_EQ(run_engine(base + backend, log), 0) << read_text(log);
    const std::vector<std::int32_t> want = generated_tokens(read_text(log));
    ASSERT_EQ(want.size(), 24u);
    ASSERT_EQ(run_engine(base + backend + " --pipeline", log), 0) << read_text(log);
    EXPECT_NE(read_text(log).find("decoding, pipelined"), std::string::npos) << read_text(log);
    EXPECT_EQ(generated_tokens(read_text(log)), want) << read_text(log);
  }
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 2 --pipeline --batch 2", log), 1);
  EXPECT_NE(read_text(log).find("--pipeline decodes one sequence"), std::string::npos) << read_text(log);
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --steps 2 --pipeline --dump-logits \"" + (dir / "x.bin").string() + "\"",
                       log),
            1);
  EXPECT_NE(read_text(log).find("cannot --dump-logits"), std::string::npos) << read_text(log);
}

// Random command lines: flags of the program's own set in random order and
// number, each with a value drawn from the right kind and from the wrong
// ones (negative, past 64 bits, empty, malformed prompt lists, names that
// are not presets, paths that do not exist, the real tiny checkpoint). The
// tiny presets only, so that a valid line runs in well under a second. Every
// run must end by itself with 0 (it ran), 1 (an error it named: a line
// "ferrum_engine: ferrum [Code] ...") or 2 (a usage error, with the usage text); a
// crash, a signal or a hang (killed after 60 s) fails, with the line.
TEST(EngineCli, RandomCommandLinesRunOrFailWithAMessage) {
  FERRUM_SEEDED_RNG(rng);  // FERRUM_TEST_SEED replays a failure
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  const std::filesystem::path model = dir / "model";
  const ModelConfig config = preset_config("tiny-llama");
  testing::write_checkpoint(model, config, RandomTensorSource(config, kSeed), SafetensorsDType::F16, 1);
  auto pick = [&](std::initializer_list<const char*> menu) {
    return std::string(menu.begin()[rng.below(static_cast<std::uint32_t>(menu.size()))]);
  };
  auto count = [&] { return pick({"0", "1", "2", "3", "7", "128", "129", "-1", "+3", "1e3", "0x10", "", "abc",
                                  "18446744073709551615", "18446744073709551616", "4294967297"}); };
  auto prompt = [&] {
    if (rng.below(3) == 0) {  // random characters of the list's alphabet
      std::string s;
      const std::uint32_t n = rng.below(12);
      for (std::uint32_t i = 0; i < n; ++i) s += "0123456789,; -+x"[rng.below(16)];
      return s;
    }
    return pick({"1,2,3", "1", "", ",", ";", "1,,2", "1;;2", "1,2;3", "5,256", "-1", "99999999999", "1;2;3;4",
                 " 1, 2", "1,2,"});
  };
  int ran = 0, named = 0, usage = 0;
  // The first three lines are one of each ending, so that every run checks
  // all three however its random lines fall.
  const char* const fixed[] = {" --random tiny-llama --cpu", " --random tiny-llama --steps abc", " --cpu"};
  for (int line = 0; line < 40; ++line) {
    std::string args;
    const std::uint32_t source = line < 3 ? 8 : rng.below(8);  // 8: the fixed line
    if (source == 8) args = fixed[line];
    if (source < 5) args += " --random " + pick({"tiny-llama", "tiny-qwen3", "tiny-llama", "nope", ""});
    if (source == 5 || source == 6) args += " --model \"" + (rng.below(4) == 0 ? (dir / "none").string() : model.string()) + "\"";
    // source 7: neither (a usage error), unless a flag below names one
    const std::uint32_t flags = source == 8 ? 0 : rng.below(6);
    for (std::uint32_t f = 0; f < flags; ++f) {
      switch (rng.below(14)) {
        case 0: args += cat(" --steps \"", count(), "\""); break;
        case 1: args += cat(" --batch \"", count(), "\""); break;
        case 2: args += cat(" --seed \"", count(), "\""); break;
        case 3: args += cat(" --prompt-tokens \"", prompt(), "\""); break;
        case 4: args += cat(" --dtype ", pick({"f16", "bf16", "f32", "\"\""})); break;
        case 5: args += cat(" --quant ", pick({"gptq", "awq"})); break;
        case 6: args += cat(" ", pick({"--eager", "--graph", "--pipeline", "--cpu"})); break;
        case 7: args += cat(" --gptq-kernel ", pick({"auto", "fused", "stream", "bulk", "wgmma", "x"})); break;
        case 8: args += cat(" --skinny-max-m \"", count(), "\""); break;
        case 9: args += cat(" --gptq-ctas-per-sm \"", count(), "\""); break;
        case 10: args += cat(" --dump-logits \"", pick({"", "/nonexistent/dir/x.bin"}), "\""); break;
        case 11: args += cat(" ", pick({"--no-pdl", "--pdl-chain-release", "--gemm-prefetch", "--gptq-row-sq-norms"})); break;
        case 12: args += cat(" ", pick({"--steps", "--bogus", "--model"})); break;  // a flag missing its value / unknown
        default: args += cat(" --dump-logits \"", (dir / "out.bin").string(), "\""); break;
      }
    }
    if (source != 8 && rng.below(2) == 0) args += " --cpu";  // the CPU backend also on a GPU machine (faster)
    SCOPED_TRACE(cat("ferrum_engine", args));
    const int status = run_engine("--steps 2" + args, log, 60);  // a later --steps wins
    const std::string out = read_text(log);
    if (status == 0) {
      ++ran;
    } else if (status == 1) {
      ++named;
      // A ferrum::Error, not a foreign exception main() also turns into 1.
      EXPECT_NE(out.find("ferrum_engine: ferrum ["), std::string::npos) << out;
    } else if (status == 2) {
      ++usage;
      EXPECT_NE(out.find("usage: ferrum_engine"), std::string::npos) << out;
    } else {
      ADD_FAILURE() << "exit status " << status << " (-1 or 128 + N: signal N; 124 or 137: killed after 60 s):\n" << out;
      break;
    }
  }
  EXPECT_GT(ran, 0);
  EXPECT_GT(named, 0);
  EXPECT_GT(usage, 0);
}

TEST(EngineCli, QuantFlagErrors) {
  const std::filesystem::path dir = testing::scratch_dir();
  const std::filesystem::path log = dir / "engine.log";
  EXPECT_EQ(run_engine("--random tiny-llama --cpu --quant awq", log), 1);
  EXPECT_NE(read_text(log).find("--quant takes gptq, got 'awq'"), std::string::npos) << read_text(log);
  EXPECT_EQ(run_engine("--model \"" + dir.string() + "\" --cpu --quant gptq", log), 1);
  EXPECT_NE(read_text(log).find("--quant applies to --random presets"), std::string::npos) << read_text(log);
}

}  // namespace
}  // namespace ferrum::engine
