// ferrum_engine: greedy decoding of a Llama / Qwen3 model on the Backend API.
//
// Usage: ferrum_engine (--model DIR | --random NAME) [--prompt-tokens "1,2,3"] [--steps N] [--batch N]
//                      [--cpu] [--eager | --graph] [--seed N] [--dtype f16|bf16] [--quant gptq]
//                      [--dump-logits FILE] [--no-pdl] [--no-pdl-trigger] [--[no-]pdl-chain-release] [--gemm-prefetch]
//                      [--[no-]gemm-early-weights] [--[no-]attention-early-kv] [--no-gptq-evict-first] [--gptq-kernel auto|fused|stream|bulk|wgmma] [--no-gptq-cluster-reduce] [--no-gptq-fuse-silu-mul]
//                      [--skinny-max-m N] [--gptq-fused-max-m N] [--gptq-ctas-per-sm N] [--pipeline]
//                      [--gptq-row-sq-norms] [--no-gptq-fuse-residual-add] [--help]
//   --model DIR      Hugging Face checkpoint: config.json + *.safetensors; a GPTQ
//                    INT4 checkpoint (quantization_config quant_method "gptq")
//                    runs its projections with gemm_gptq
//   --random NAME    seeded random weights for a preset (llama3-8b, qwen3-0.6b, tiny-llama, tiny-qwen3)
//   --prompt-tokens  comma-separated token ids (there is no tokenizer); default "1";
//                    several prompts separated by ';' ("1,2,3;4,5") decode as a batch
//   --steps N        tokens to generate per sequence (default 16)
//   --batch N        sequences decoded together (default: the number of
//                    prompts); with one prompt and N > 1, sequence b takes the
//                    prompt's first len - (b mod len) tokens, so the lengths differ.
//                    Each step runs all sequences as the rows of one forward
//                    pass (qkv_rope_append_ragged, flash_decode_ragged)
//   --dtype D        f16 or bf16: the activation/weight dtype (default: a
//                    --random preset's, bf16 as the checkpoints ship; a
//                    checkpoint's torch_dtype). A checkpoint's weights are
//                    converted at load; a float32 checkpoint needs it
//   --quant gptq     a --random preset with seeded random GPTQ INT4 projections
//                    (group 128, symmetric, no act-order; embeddings, norms and
//                    lm_head dense), e.g. to time gemm_gptq decoding
//   --cpu            CpuBackend even when a GPU is present
//   --no-pdl         CUDA kernels launched without programmatic dependent
//                    launch (CudaBackendConfig::programmatic_dependent_launch;
//                    an A/B switch, the tokens and logits are the same)
//   --no-pdl-trigger CudaBackendConfig::pdl_early_trigger = false (on by
//                    default; an A/B switch, the tokens and logits are the same)
//   --pdl-chain-release, --no-pdl-chain-release  CudaBackendConfig::
//                    pdl_chain_release (the same logits): the GPTQ streaming
//                    GEMMs release the next kernel after their wait and the
//                    norms and SiLU·mul before theirs, so a GEMM -> norm -> GEMM
//                    chain starts the second GEMM's weight stream during the
//                    first (with --gptq-ctas-per-sm N leaving it room). On by
//                    default where measured faster: a GPTQ model decoding one
//                    sequence with --graph under the promise below (with
//                    --gptq-ctas-per-sm 3: llama3-8b +2 %, session 24); off
//                    elsewhere (the library's default)
//   --gemm-prefetch  CudaBackendConfig::gemm_prefetch_before_wait (the same)
//   --no-gemm-early-weights  CudaBackendConfig::gemm_weights_before_wait =
//                    false (the same logits). The engine makes that promise by
//                    default: its weights are never written while it decodes.
//                    With it the skinny GEMM's and the GPTQ streaming kernel's
//                    first weights are requested before their PDL wait, and
//                    the GPTQ gate|up GEMM releases the down projection early
//                    (llama3-8b GPTQ +5 %, f16 level: session 22, session 6).
//                    --gemm-early-weights (the default) is still accepted
//   --attention-early-kv, --no-attention-early-kv  CudaBackendConfig::
//                    attention_kv_before_wait (the same logits): the engine's
//                    decode step appends its one new K / V row
//                    (qkv_rope_append) just before the attention, so it may
//                    make that promise; then the append releases the
//                    attention early and the attention requests its older
//                    rows before its PDL wait. On by default where measured
//                    faster: a dense model decoding one sequence with --graph
//                    (H100, session 66: qwen3-0.6b f16 +1.5 % over three
//                    rounds, llama3-8b f16 +0.6 % over two); off elsewhere
//                    (llama3-8b GPTQ -1.4 %, level, +1.8 % in three runs,
//                    sessions 65-66; eager and batch decoding not measured)
//                    (docs/design/decode_attention.md §4.23)
//   --no-gptq-evict-first  CudaBackendConfig::gptq_weights_evict_first =
//                    false (on by default; the same): the GPTQ streaming
//                    kernel's weight copies without the L2 evict-first policy
//   --skinny-max-m N CudaBackendConfig::gemm_skinny_max_m: dense GEMMs of m <= N
//                    rows take the skinny kernel, 0 = cuBLAS for all (default:
//                    the library's per-shape rule); an A/B switch
//   --gptq-kernel K  CudaBackendConfig::gptq_kernel for gemm_gptq: auto (the
//                    library's choice), fused, stream or bulk (the streaming
//                    kernel through shared-memory rings; m <= 16), wgmma
//                    (the warpgroup-MMA kernel, sm_90a); the kernels round
//                    differently, and the kernel of the launches above 16
//                    rows sets the default crossover; an A/B switch
//   --gptq-fused-max-m N  CudaBackendConfig::gptq_fused_max_m: gemm_gptq runs
//                    the INT4 kernels up to m = N rows, dequantize + cuBLAS
//                    above (default: the library's measured rule by weight
//                    size); the two paths round differently; an A/B switch
//   --gptq-ctas-per-sm N  CudaBackendConfig::gptq_stream_ctas_per_sm: the
//                    streaming GPTQ kernel plans for at most N CTAs per SM
//                    (1..16; 0: every resident slot, the library's default),
//                    leaving room for the next GEMM's early CTAs; fewer
//                    splits may round otherwise. Default: 3 where
//                    --pdl-chain-release is on by default (a GPTQ model
//                    decoding one sequence with --graph), else 0
//   --no-gptq-fuse-silu-mul  CudaBackendConfig::gptq_fuse_silu_mul = false
//                    (the GPTQ gate|up GEMM stores gate_up and the pairs
//                    kernel computes SiLU·mul; the same logits); an A/B switch
//   --gptq-row-sq-norms  DecoderOptions::gptq_row_sq_norms: o and down add
//                    the residual and leave its row_sq in their final store,
//                    and q|k|v and gate|up read their input from a norm
//                    kernel that takes the row's sum of squares from row_sq,
//                    instead of fused_add_rms_norm between them; models whose
//                    every projection is GPTQ; the norms sum in another
//                    order, so the logits differ in the last bits; off (not
//                    faster, docs/design/gptq_small_m.md §13.7)
//   --no-gptq-fuse-residual-add  CudaBackendConfig::gptq_fuse_residual_add
//                    = false (with --gptq-row-sq-norms: the residual add
//                    composed of gemm_gptq and the add-and-sum kernel; the
//                    same logits); an A/B switch
//   --no-gptq-cluster-reduce  CudaBackendConfig::gptq_cluster_reduce = false
//                    (the streaming and wgmma kernels' splits summed through
//                    the workspace, not in a cluster; the same logits); an
//                    A/B switch
//   --eager/--graph  decode steps as op calls, or one captured graph replayed
//                    per step (graph needs Op::GraphCapture; else eager)
//   --pipeline       the decode steps enqueued back to back, each step's
//                    argmax passed to the next on the device
//                    (Decoder::decode_pipelined): the host reads the tokens
//                    once, after the last step (the same tokens; one
//                    sequence, no --dump-logits; eager becomes device-state
//                    decoding, op by op)
//   --dump-logits F  writes the logits each generated token was chosen from
//                    (the prefill's last position, then every decode step):
//                    --steps rows of vocab_size float32, little-endian, no header
//                    (a batch: --steps x sequences rows, step-major)
//
// Prints "  generated: ID ID ..." (the --steps greedy token ids) on one line;
// a batch prints "  generated[b]: ID ID ..." per sequence.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

#include "decoder.hpp"
#include "engine_error.hpp"
#include "model_config.hpp"
#include "weights.hpp"

namespace {

using namespace ferrum;
using namespace ferrum::engine;
using Clock = std::chrono::steady_clock;

// The streaming GPTQ kernel's CTAs per SM for a GPTQ model decoding one
// sequence from a graph (see choose_backend): 2 measured slower, 4 no better (session 24).
constexpr int kEngineGptqCtasPerSm = 3;
// The most sequences one run decodes (--batch, or prompts given).
constexpr std::size_t kMaxSequences = 1024;

struct Options {
  std::string model_dir;
  std::string random_preset;
  std::vector<std::vector<std::int32_t>> prompts = {{1}};
  std::size_t steps = 16;
  std::size_t batch = 0;  // 0: one sequence per prompt
  bool force_cpu = false;
  bool pipeline = false;  // --pipeline: Decoder::decode_pipelined
  bool no_pdl = false;
  bool pdl_trigger = true;  // CudaBackendConfig's default
  // Unset: the engine's choice by model and batch (choose_backend).
  std::optional<bool> pdl_chain_release;
  bool gemm_prefetch = false;
  bool gemm_early_weights = true;  // the engine's promise (see --no-gemm-early-weights)
  // Unset: the engine's choice by model and batch (choose_backend).
  std::optional<bool> attention_early_kv;
  bool gptq_evict_first = true;  // CudaBackendConfig's default
  GptqKernel gptq_kernel = GptqKernel::Auto;
  bool gptq_cluster_reduce = true;
  bool gptq_fuse_silu_mul = true;  // CudaBackendConfig's default
  bool gptq_fuse_residual_add = true;  // CudaBackendConfig's default
  bool gptq_row_sq_norms = false;  // DecoderOptions' default
  int skinny_max_m = -1;  // CudaBackendConfig::gemm_skinny_max_m
  int gptq_fused_max_m = -1;  // CudaBackendConfig::gptq_fused_max_m
  std::optional<int> gptq_ctas_per_sm;  // CudaBackendConfig::gptq_stream_ctas_per_sm; unset: as above
  bool graph = false;
  std::uint64_t seed = 1234;
  std::string dump_logits;  // empty: no dump
  std::optional<DType> dtype;  // --dtype; unset: the preset's dtype, or the checkpoint's torch_dtype
  std::string quant;        // --random only; empty: dense, "gptq"
};

// The --dump-logits file: rows of raw float32, appended in order.
class LogitsDump {
 public:
  explicit LogitsDump(const std::string& path) : path_(path) {
    if (path_.empty()) return;
    file_ = std::fopen(path_.c_str(), "wb");
    if (file_ == nullptr) {
      fail(ErrorCode::InvalidArgument, "--dump-logits: cannot open '", path_, "' for writing (",
           std::strerror(errno), ")");
    }
  }
  LogitsDump(const LogitsDump&) = delete;
  LogitsDump& operator=(const LogitsDump&) = delete;
  ~LogitsDump() {
    if (file_ != nullptr) std::fclose(file_);
  }

  bool enabled() const noexcept { return file_ != nullptr; }
  void write(const std::vector<float>& row) {
    static_assert(std::endian::native == std::endian::little, "--dump-logits writes host floats as little-endian");
    if (file_ == nullptr) return;
    if (std::fwrite(row.data(), sizeof(float), row.size(), file_) != row.size()) {
      fail(ErrorCode::InvalidArgument, "--dump-logits: writing '", path_, "' failed (", std::strerror(errno), ")");
    }
  }
  void close() {
    if (file_ == nullptr) return;
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) {
      fail(ErrorCode::InvalidArgument, "--dump-logits: closing '", path_, "' failed (", std::strerror(errno), ")");
    }
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ferrum_engine (--model DIR | --random NAME) [--prompt-tokens \"1,2,3[;4,5]\"] [--steps N] [--batch N]\n"
               "                     [--cpu] [--eager | --graph] [--seed N] [--dtype f16|bf16] [--quant gptq]\n"
               "                     [--dump-logits FILE] [--no-pdl] [--no-pdl-trigger] [--[no-]pdl-chain-release] [--gemm-prefetch]\n"
               "                     [--[no-]gemm-early-weights] [--[no-]attention-early-kv] [--no-gptq-evict-first] [--gptq-kernel auto|fused|stream|bulk|wgmma] [--no-gptq-cluster-reduce] [--no-gptq-fuse-silu-mul]\n"
               "                     [--skinny-max-m N] [--gptq-fused-max-m N] [--gptq-ctas-per-sm N] [--pipeline]\n"
               "                     [--gptq-row-sq-norms] [--no-gptq-fuse-residual-add] [--help]\n"
               "presets:");
  for (const std::string& name : preset_names()) std::fprintf(out, " %s", name.c_str());
  std::fprintf(out, "\n");
}

// --help: usage, then what the everyday flags do and their defaults (read
// from Options, so they cannot drift). The other flags are launch and
// kernel switches for A/B runs, each explained at the top of this file.
void help(std::FILE* out) {
  const Options defaults{};
  usage(out);
  std::fprintf(out,
               "\n"
               "  --model DIR          Hugging Face checkpoint: config.json + *.safetensors (f16 or bf16, f32\n"
               "                       with --dtype; GPTQ INT4 when its config says so)\n"
               "  --random NAME        seeded random weights for a preset (above)\n"
               "  --prompt-tokens IDS  comma-separated token ids, ';' between prompts of a batch (default \"1\";\n"
               "                       there is no tokenizer)\n"
               "  --steps N            tokens to generate per sequence (default %zu)\n"
               "  --batch N            sequences decoded together (default: one per prompt)\n"
               "  --dtype f16|bf16     activation and weight dtype (default: the preset's or the checkpoint's)\n"
               "  --quant gptq         a --random preset with GPTQ INT4 projections (group 128)\n"
               "  --seed N             the --random weights' seed (default %llu)\n"
               "  --cpu                CpuBackend even when a GPU is present (default: the GPU when one can\n"
               "                       run the model, else the CPU)\n"
               "  --eager | --graph    decode steps launched one by one (default), or each replayed from one\n"
               "                       captured CUDA graph\n"
               "  --pipeline           one sequence, tokens fed back on the device (no read between steps)\n"
               "  --dump-logits FILE   every step's logits as raw f32, one row per step and sequence\n"
               "  the other flags      launch and kernel switches for A/B runs (CudaBackendConfig, and\n"
               "                       --gptq-row-sq-norms a decoder option): most leave the tokens and logits\n"
               "                       bit-identical; --gptq-kernel, --gptq-fused-max-m, --gptq-ctas-per-sm and\n"
               "                       --gptq-row-sq-norms may round differently (apps/engine/main.cpp explains\n"
               "                       each)\n",
               defaults.steps, static_cast<unsigned long long>(defaults.seed));
}

std::size_t parse_count(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  // Digits only: strtoull alone also takes leading spaces and a sign (" -1"
  // read as 2^64 - 1) and saturates past its range.
  if (text.empty() || text[0] < '0' || text[0] > '9' || *end != '\0') {
    fail(ErrorCode::InvalidArgument, flag, " takes a non-negative integer, got '", text, "'");
  }
  if (errno == ERANGE || value > std::numeric_limits<std::size_t>::max()) {
    fail(ErrorCode::InvalidArgument, flag, " = '", text, "' is out of range");
  }
  return static_cast<std::size_t>(value);
}

std::vector<std::int32_t> parse_tokens(const std::string& text) {
  std::vector<std::int32_t> tokens;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::size_t id = parse_count("--prompt-tokens", text.substr(start, comma - start));
    if (id > 0x7fffffff) fail(ErrorCode::InvalidArgument, "--prompt-tokens: token id ", id, " does not fit an i32");
    tokens.push_back(static_cast<std::int32_t>(id));
    start = comma + 1;
  }
  return tokens;
}

// "1,2,3;4,5": one prompt per ';'-separated list.
std::vector<std::vector<std::int32_t>> parse_prompts(const std::string& text) {
  std::vector<std::vector<std::int32_t>> prompts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t semi = std::min(text.find(';', start), text.size());
    prompts.push_back(parse_tokens(text.substr(start, semi - start)));
    start = semi + 1;
  }
  return prompts;
}

// Returns false when the program should exit (help or a usage error printed).
bool parse_options(int argc, char** argv, Options& opt, int& exit_code) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(ErrorCode::InvalidArgument, arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--model") {
      opt.model_dir = value();
    } else if (arg == "--random") {
      opt.random_preset = value();
    } else if (arg == "--prompt-tokens") {
      opt.prompts = parse_prompts(value());
    } else if (arg == "--batch") {
      opt.batch = parse_count(arg, value());
      if (opt.batch == 0 || opt.batch > kMaxSequences) {
        fail(ErrorCode::InvalidArgument, "--batch takes 1..", kMaxSequences, ", got ", opt.batch);
      }
    } else if (arg == "--steps") {
      opt.steps = parse_count(arg, value());
    } else if (arg == "--seed") {
      opt.seed = parse_count(arg, value());
    } else if (arg == "--dump-logits") {
      opt.dump_logits = value();
      if (opt.dump_logits.empty()) fail(ErrorCode::InvalidArgument, "--dump-logits needs a file name");
    } else if (arg == "--dtype") {
      const std::string dtype = value();
      if (dtype == "f16") {
        opt.dtype = DType::F16;
      } else if (dtype == "bf16") {
        opt.dtype = DType::BF16;
      } else {
        fail(ErrorCode::InvalidArgument, "--dtype takes f16 or bf16, got '", dtype, "'");
      }
    } else if (arg == "--quant") {
      opt.quant = value();
      if (opt.quant != "gptq") fail(ErrorCode::InvalidArgument, "--quant takes gptq, got '", opt.quant, "'");
    } else if (arg == "--cpu") {
      opt.force_cpu = true;
    } else if (arg == "--no-pdl") {
      opt.no_pdl = true;
    } else if (arg == "--no-pdl-trigger") {
      opt.pdl_trigger = false;
    } else if (arg == "--pdl-chain-release") {
      opt.pdl_chain_release = true;
    } else if (arg == "--no-pdl-chain-release") {
      opt.pdl_chain_release = false;
    } else if (arg == "--gemm-prefetch") {
      opt.gemm_prefetch = true;
    } else if (arg == "--gemm-early-weights") {
      opt.gemm_early_weights = true;
    } else if (arg == "--no-gemm-early-weights") {
      opt.gemm_early_weights = false;
    } else if (arg == "--attention-early-kv") {
      opt.attention_early_kv = true;
    } else if (arg == "--no-attention-early-kv") {
      opt.attention_early_kv = false;
    } else if (arg == "--no-gptq-evict-first") {
      opt.gptq_evict_first = false;
    } else if (arg == "--no-gptq-cluster-reduce") {
      opt.gptq_cluster_reduce = false;
    } else if (arg == "--no-gptq-fuse-silu-mul") {
      opt.gptq_fuse_silu_mul = false;
    } else if (arg == "--no-gptq-fuse-residual-add") {
      opt.gptq_fuse_residual_add = false;
    } else if (arg == "--gptq-row-sq-norms") {
      opt.gptq_row_sq_norms = true;
    } else if (arg == "--gptq-kernel") {
      const std::string kernel = value();
      if (kernel == "auto") {
        opt.gptq_kernel = GptqKernel::Auto;
      } else if (kernel == "fused") {
        opt.gptq_kernel = GptqKernel::Fused;
      } else if (kernel == "stream") {
        opt.gptq_kernel = GptqKernel::Stream;
      } else if (kernel == "bulk") {
        opt.gptq_kernel = GptqKernel::StreamBulk;
      } else if (kernel == "wgmma") {
        opt.gptq_kernel = GptqKernel::Wgmma;
      } else {
        fail(ErrorCode::InvalidArgument, "--gptq-kernel takes auto, fused, stream, bulk or wgmma, got '", kernel, "'");
      }
    } else if (arg == "--skinny-max-m") {
      const std::size_t m = parse_count(arg, value());
      if (m > static_cast<std::size_t>(kGemmSkinnyMaxM)) {
        fail(ErrorCode::InvalidArgument, "--skinny-max-m takes 0..", kGemmSkinnyMaxM, ", got ", m);
      }
      opt.skinny_max_m = static_cast<int>(m);
    } else if (arg == "--gptq-fused-max-m") {
      const std::size_t m = parse_count(arg, value());
      if (m > 65536) fail(ErrorCode::InvalidArgument, "--gptq-fused-max-m takes 0..65536, got ", m);
      opt.gptq_fused_max_m = static_cast<int>(m);
    } else if (arg == "--gptq-ctas-per-sm") {
      const std::size_t n = parse_count(arg, value());
      if (n > static_cast<std::size_t>(kGptqStreamMaxCtasPerSm)) {
        fail(ErrorCode::InvalidArgument, "--gptq-ctas-per-sm takes 0..", kGptqStreamMaxCtasPerSm, ", got ", n);
      }
      opt.gptq_ctas_per_sm = static_cast<int>(n);
    } else if (arg == "--eager") {
      opt.graph = false;
    } else if (arg == "--graph") {
      opt.graph = true;
    } else if (arg == "--pipeline") {
      opt.pipeline = true;
    } else if (arg == "--help" || arg == "-h") {
      help(stdout);
      exit_code = 0;
      return false;
    } else {
      std::fprintf(stderr, "ferrum_engine: %s '%s'\n", arg.rfind("-", 0) == 0 ? "unknown option" : "unexpected argument",
                   arg.c_str());
      usage(stderr);
      exit_code = 2;
      return false;
    }
  }
  if (opt.model_dir.empty() == opt.random_preset.empty()) {
    std::fprintf(stderr, "ferrum_engine: give exactly one of --model DIR or --random NAME\n");
    usage(stderr);
    exit_code = 2;
    return false;
  }

  if (!opt.quant.empty() && opt.random_preset.empty()) {
    fail(ErrorCode::InvalidArgument,
         "--quant applies to --random presets; a checkpoint's config.json says how it is quantized");
  }
  if (opt.prompts.size() > kMaxSequences) {
    fail(ErrorCode::InvalidArgument, "--prompt-tokens gives ", opt.prompts.size(), " prompts, past the ", kMaxSequences,
         " sequences of a batch");
  }
  if (opt.batch == 0) opt.batch = opt.prompts.size();
  if (opt.pipeline && (opt.batch > 1 || opt.prompts.size() > 1)) {
    fail(ErrorCode::InvalidArgument, "--pipeline decodes one sequence; got a batch of ",
         std::max(opt.batch, opt.prompts.size()));
  }
  if (opt.pipeline && !opt.dump_logits.empty()) {
    fail(ErrorCode::InvalidArgument, "--pipeline reads no logits back between steps, so it cannot --dump-logits");
  }
  if (opt.prompts.size() == 1 && opt.batch > 1) {  // ragged lengths from one prompt
    const std::vector<std::int32_t> prompt = opt.prompts[0];
    opt.prompts.clear();
    for (std::size_t b = 0; b < opt.batch; ++b) {
      opt.prompts.emplace_back(prompt.begin(), prompt.end() - static_cast<std::ptrdiff_t>(b % prompt.size()));
    }
  }
  if (opt.prompts.size() != opt.batch) {
    fail(ErrorCode::InvalidArgument, "--batch ", opt.batch, " needs one prompt or ", opt.batch,
         " of them in --prompt-tokens, got ", opt.prompts.size());
  }
  return true;
}


// The GPU backend when present and complete enough for the model, else CpuBackend.
std::unique_ptr<Backend> choose_backend(const Options& opt, const ModelConfig& model, DecodeMode& mode) {
  const bool gptq = model.gptq.has_value();
  const bool batch = opt.batch > 1;
  std::unique_ptr<Backend> backend;
  if (opt.force_cpu) {
    backend = std::make_unique<CpuBackend>();
  } else {
    CudaBackendConfig config;
    config.programmatic_dependent_launch = !opt.no_pdl;
    config.pdl_early_trigger = opt.pdl_trigger;
    // A GPTQ model decoding one sequence from a graph: its GEMM -> norm ->
    // GEMM chains released ahead, the streaming splits planned for 3 CTAs
    // per SM so the next GEMM's early CTAs find room (llama3-8b GPTQ graph
    // decode 458-468 -> 473-477 tok/s, session 24; either alone gains
    // nothing). Only with the promise (without it the early CTAs have
    // nothing to do); elsewhere (dense weights, batch decoding, eager
    // steps) the library's defaults: not measured with them.
    const bool gptq_graph_single = gptq && !batch && opt.graph && opt.gemm_early_weights;
    config.pdl_chain_release = opt.pdl_chain_release.value_or(gptq_graph_single);
    config.gemm_prefetch_before_wait = opt.gemm_prefetch;
    config.gemm_weights_before_wait = opt.gemm_early_weights;
    // A dense model decoding one sequence from a graph: the append releases
    // the attention early and the attention requests its older K / V rows
    // before its wait (qwen3-0.6b f16 graph +1.5 %, llama3-8b f16 +0.6 %,
    // session 66; GPTQ within its noise, -1.4 to +1.8 %, so off there, as
    // in eager and batch steps, which were not measured).
    config.attention_kv_before_wait = opt.attention_early_kv.value_or(!gptq && !batch && opt.graph);
    config.gptq_weights_evict_first = opt.gptq_evict_first;
    config.gptq_kernel = opt.gptq_kernel;
    config.gptq_cluster_reduce = opt.gptq_cluster_reduce;
    config.gptq_fuse_silu_mul = opt.gptq_fuse_silu_mul;
    config.gptq_fuse_residual_add = opt.gptq_fuse_residual_add;
    config.gptq_fused_max_m = opt.gptq_fused_max_m;
    config.gptq_stream_ctas_per_sm = opt.gptq_ctas_per_sm.value_or(gptq_graph_single ? kEngineGptqCtasPerSm : 0);
    config.gemm_skinny_max_m = opt.skinny_max_m;
    // The GPU when one is visible and this build's kernels run on it, else
    // the CPU, saying why (the library's rule: make_default_backend).
    std::string why;
    backend = make_default_backend(config, &why);
    if (backend->kind() == BackendKind::Cuda) {
      std::printf("ferrum_engine: attention launches: attention_kv_before_wait %s\n",
                  config.attention_kv_before_wait ? "on" : "off");
      if (gptq) {  // the chain release needs PDL (the runtime drops it without)
        const bool chain = config.pdl_chain_release && config.programmatic_dependent_launch;
        std::printf("ferrum_engine: GPTQ launches: pdl_chain_release %s, gptq_stream_ctas_per_sm %d\n",
                    chain ? "on" : config.pdl_chain_release ? "off (no PDL)" : "off", config.gptq_stream_ctas_per_sm);
      }
    } else {
      std::printf("ferrum_engine: %s; running on the CPU backend\n", why.c_str());
    }
    const std::vector<Op> missing = missing_ops(*backend, DecodeMode::Eager, gptq, batch);
    if (!missing.empty()) {
      std::printf("ferrum_engine: the %s backend lacks %s; falling back to the CPU backend\n",
                  backend->name().c_str(), op_names(missing).c_str());
      backend = std::make_unique<CpuBackend>();
    } else if (const std::vector<Op> refusing =
                   ops_refusing_head_dim(*backend, model.head_dim, DecodeMode::Eager, gptq, batch);
               !refusing.empty()) {
      // E.g. the CUDA attention kernels take head_dim 64, 128 or 256; the tiny presets have 16.
      std::printf("ferrum_engine: the %s backend does not run %s on heads of head_dim = %zu; falling back to the CPU "
                  "backend\n",
                  backend->name().c_str(), op_names(refusing).c_str(), model.head_dim);
      backend = std::make_unique<CpuBackend>();
    }
  }
  if (mode == DecodeMode::Graph && !missing_ops(*backend, DecodeMode::Graph, gptq, batch).empty()) {
    std::printf("ferrum_engine: the %s backend lacks %s; decoding eagerly instead of with a graph\n",
                backend->name().c_str(), op_names(missing_ops(*backend, DecodeMode::Graph, gptq, batch)).c_str());
    mode = DecodeMode::Eager;
  }
  return backend;
}

ModelConfig random_config(const Options& opt) {
  ModelConfig cfg = preset_config(opt.random_preset);
  if (opt.dtype) cfg.dtype = *opt.dtype;
  if (opt.quant == "gptq") cfg.gptq = random_gptq_config(cfg);
  return cfg;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes of one projection's weights a decode step reads: dense, the stored
// elements; GPTQ, the INT4 nibbles, one scale (activation dtype) per group
// and column and, unless symmetric, one zero byte per group and column (what
// the INT4 kernels read; kernels/gptq_gemm.hpp).
double projection_bytes(const ModelConfig& c, const Projection& p) {
  if (!p.quantized()) return static_cast<double>(p.dense.nbytes());
  const double groups = static_cast<double>(c.gptq ? c.gptq->groups(p.k) : 1);
  const double cols = static_cast<double>(p.n);
  const bool zeros = c.gptq && !c.gptq->sym;
  return static_cast<double>(p.k) * cols / 2.0 + groups * cols * (static_cast<double>(size_of(c.dtype)) + (zeros ? 1.0 : 0.0));
}

// What one decode step must read from device memory at a KV length of
// kv_len: every layer's norms and projections, the final norm and the
// lm_head, and the K and V rows attention reads (activations and the one
// embedding row are left out: kilobytes).
struct StepBytes {
  double weights = 0.0, kv = 0.0;
};
StepBytes step_bytes(const ModelWeights& w, std::size_t kv_len) {  // kv_len: summed over the sequences
  const ModelConfig& c = w.config;
  StepBytes b;
  for (const LayerWeights& l : w.layers) {
    for (const Buffer* norm : {&l.input_norm, &l.q_norm, &l.k_norm, &l.post_attention_norm}) {
      if (!norm->is_null()) b.weights += static_cast<double>(norm->nbytes());
    }
    for (const Projection& p : l.qkv_proj.parts) b.weights += projection_bytes(c, p);
    b.weights += projection_bytes(c, l.o_proj);
    for (const Projection& p : l.gate_up_proj.parts) b.weights += projection_bytes(c, p);
    b.weights += projection_bytes(c, l.down_proj);
  }
  b.weights += static_cast<double>(w.final_norm.nbytes() + w.output_projection().nbytes());
  b.kv = 2.0 * static_cast<double>(c.num_hidden_layers * c.kv_dim() * kv_len * size_of(c.dtype));
  return b;
}

// The device's copy bandwidth now (read + write bytes per second, the
// convention of bench/bench_ops.cpp), through the public API: copy_slice
// between two buffers, after warm-up copies, timed over a batch.
constexpr std::size_t kCopyProbeBytes = std::size_t{512} << 20;  // per buffer on a GPU (past its L2)

double measure_copy_gbps(Backend& be) {
  const bool gpu = be.kind() == BackendKind::Cuda;
  const std::size_t bytes = gpu ? kCopyProbeBytes : std::size_t{32} << 20;
  const int reps = gpu ? 20 : 3;
  Buffer src = be.alloc(DType::U8, bytes);
  Buffer dst = be.alloc(DType::U8, bytes);
  for (int i = 0; i < 3; ++i) be.copy_slice(src, 0, dst, 0, bytes);
  be.synchronize();
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) be.copy_slice(src, 0, dst, 0, bytes);
  be.synchronize();
  return 2.0 * static_cast<double>(bytes) * reps / seconds_since(start) / 1e9;
}

int run(const Options& opt) {
  // The config first: whether the backend needs the GPTQ ops depends on it,
  // and the lengths and token ids are checked against it before anything
  // loads.
  const ModelConfig config =
      opt.model_dir.empty() ? random_config(opt) : load_checkpoint_config(opt.model_dir, opt.dtype);
  const std::size_t batch = opt.prompts.size();
  std::size_t longest = 0, prompt_tokens = 0;
  for (const auto& p : opt.prompts) {
    longest = std::max(longest, p.size());
    prompt_tokens += p.size();
    for (std::int32_t id : p) {
      if (static_cast<std::size_t>(id) >= config.vocab_size) {
        fail(ErrorCode::InvalidArgument, "--prompt-tokens: token id ", id, " is past the vocabulary (vocab_size = ",
             config.vocab_size, ")");
      }
    }
  }
  // Positions the caches hold: the prompt and every generated token but the
  // last, which is never fed back (written so that nothing wraps).
  if (longest > config.max_position_embeddings) {
    fail(ErrorCode::InvalidArgument, "prompt (", longest, " tokens) exceeds max_position_embeddings = ",
         config.max_position_embeddings);
  }
  if (opt.steps > 0 && opt.steps - 1 > config.max_position_embeddings - longest) {
    fail(ErrorCode::InvalidArgument, "prompt (", longest, " tokens) + --steps ", opt.steps,
         " - 1 exceed max_position_embeddings = ", config.max_position_embeddings);
  }
  const std::size_t total = longest + (opt.steps > 0 ? opt.steps - 1 : 0);
  LogitsDump dump(opt.dump_logits);  // after the checks (it truncates the file), before the model loads
  DecodeMode mode = opt.graph ? DecodeMode::Graph : DecodeMode::Eager;
  std::unique_ptr<Backend> backend = choose_backend(opt, config, mode);
  if (opt.pipeline && mode == DecodeMode::Eager) mode = DecodeMode::DeviceState;  // tokens through the decode state
  std::printf("ferrum_engine: backend %s, %s decoding%s\n", backend->name().c_str(), to_string(mode).c_str(),
              opt.pipeline ? ", pipelined" : "");

  const auto load_start = Clock::now();
  // RoPE tables for the positions this run reaches, not the config's whole context.
  const LoadOptions load{.rope_positions = total};
  ModelWeights weights = opt.model_dir.empty()
                             ? random_weights(*backend, config, opt.seed, load)
                             : load_weights(*backend, config, CheckpointDirectory(opt.model_dir), load);
  const ModelConfig& c = weights.config;
  std::string quant;
  if (c.gptq) {
    quant = concat(", gptq int4 group ", c.gptq->group_size, c.gptq->desc_act ? " act-order" : "",
                   c.gptq->zero_format == GptqZeroFormat::V2 ? " v2" : "", weights.has_gptq() ? "" : " (no GPTQ tensors)");
  }
  const std::string rope =
      c.rope_scaling.type == RopeScaling::Type::None ? "" : ", rope scaling " + to_string(c.rope_scaling);
  std::printf("  model: %s (%s), %zu layers, hidden %zu, heads %zu/%zu, head_dim %zu, intermediate %zu, vocab %zu, %s%s%s%s\n",
              opt.model_dir.empty() ? ("random " + opt.random_preset).c_str() : opt.model_dir.c_str(),
              to_string(c.architecture).c_str(), c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
              c.num_key_value_heads, c.head_dim, c.intermediate_size, c.vocab_size,
              std::string(ferrum::to_string(c.dtype)).c_str(), quant.c_str(),
              c.tie_word_embeddings ? ", tied embeddings" : "", rope.c_str());
  std::printf("  loaded in %.2f s (%.2f s of it in Backend calls: alloc, write_bytes, upload, load_gptq)\n",
              seconds_since(load_start), weights.backend_load_seconds);

  Decoder decoder(*backend, weights, total, longest, mode, batch, {.gptq_row_sq_norms = opt.gptq_row_sq_norms});
  if (opt.gptq_row_sq_norms) std::printf("  norms: in the GPTQ projections (--gptq-row-sq-norms)\n");
  if (batch > 1) std::printf("  batch: %zu sequences\n", batch);

  // Greedy tokens come from Backend::argmax on the device (4 bytes per
  // sequence and step), dumping or not; the logits are only read back for
  // --dump-logits. Each sequence's prompt is its own prefill.
  std::vector<std::int32_t> next(batch);
  std::vector<float> prefill_logits;
  double prefill_s = 0.0;  // the prefills alone, not the --dump-logits read-backs
  for (std::size_t b = 0; b < batch; ++b) {
    const auto prefill_start = Clock::now();
    next[b] = decoder.prefill_next(b, opt.prompts[b]);
    prefill_s += seconds_since(prefill_start);
    if (dump.enabled()) {
      const std::vector<float> row = decoder.logits();
      prefill_logits.insert(prefill_logits.end(), row.begin(), row.end());
    }
  }
  std::printf("  prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt_tokens, prefill_s,
              static_cast<double>(prompt_tokens) / prefill_s);

  std::vector<std::vector<std::int32_t>> generated(batch);
  // The decode calls alone, as prefill_s: not the --dump-logits read-backs
  // and writes, nor the printing.
  double decode_s = 0.0;
  // --pipeline: every decode step enqueued before any token is read; the
  // loop below then only prints them.
  auto decode_start = Clock::now();
  const std::vector<std::int32_t> pipelined =
      opt.pipeline && opt.steps > 1 ? decoder.decode_pipelined(next[0], opt.steps - 1) : std::vector<std::int32_t>{};
  decode_s += seconds_since(decode_start);
  for (std::size_t step = 0; step < opt.steps; ++step) {
    if (step > 0) {
      decode_start = Clock::now();
      if (opt.pipeline) {
        next[0] = pipelined[step - 1];
      } else if (batch == 1) {
        next[0] = decoder.decode_next(next[0]);
      } else {
        next = decoder.decode_batch_next(next);
      }
      decode_s += seconds_since(decode_start);
    }
    if (dump.enabled()) dump.write(step == 0 ? prefill_logits : decoder.logits());
    std::printf("  step %zu: token%s", step, batch > 1 ? "s" : "");
    for (std::size_t b = 0; b < batch; ++b) {
      generated[b].push_back(next[b]);
      std::printf(" %d", next[b]);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  dump.close();
  for (std::size_t b = 0; b < batch; ++b) {
    if (batch == 1) {
      std::printf("  generated:");
    } else {
      std::printf("  generated[%zu]:", b);
    }
    for (std::int32_t t : generated[b]) std::printf(" %d", t);
    std::printf("\n");
  }
  if (opt.steps > 1) {
    const double tok_s = static_cast<double>((opt.steps - 1) * batch) / decode_s;
    std::printf("  decode: %zu step%s%s in %.3f s (%.1f tokens/s)\n", opt.steps - 1, opt.steps == 2 ? "" : "s",
                batch > 1 ? concat(" x ", batch, " sequences").c_str() : "", decode_s, tok_s);
    // The bandwidth bound of this run: bytes per step (at the mean KV length
    // of the decode steps, summed over the sequences) over the copy bandwidth
    // measured now; a step yields one token per sequence.
    const StepBytes b = step_bytes(weights, prompt_tokens + batch * (opt.steps / 2));
    double copy_gbps = 0.0;
    try {
      copy_gbps = measure_copy_gbps(*backend);
    } catch (const ferrum::Error& e) {  // e.g. no room left for the two copy buffers: the run itself succeeded
      if (e.code() != ErrorCode::OutOfMemory) throw;
    }
    if (copy_gbps > 0.0) {
      const double bound = static_cast<double>(batch) * copy_gbps * 1e9 / (b.weights + b.kv);
      std::printf("  bound: %.1f MB per step (weights %.1f, KV %.1f); %s memory copy %.0f GB/s now -> %.1f tokens/s; "
                  "decode at %.1f %% of it\n",
                  (b.weights + b.kv) / 1e6, b.weights / 1e6, b.kv / 1e6, backend->name().c_str(), copy_gbps, bound,
                  100.0 * tok_s / bound);
    } else {
      std::printf("  bound: %.1f MB per step; the copy bandwidth was not measured (no memory left for its buffers)\n",
                  (b.weights + b.kv) / 1e6);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options opt;
    int exit_code = 0;
    if (!parse_options(argc, argv, opt, exit_code)) return exit_code;
    return run(opt);
  } catch (const std::exception& e) {  // ferrum::Error, or a library's own (nlohmann, std): a message, not an abort
    std::fflush(stdout);
    const bool host_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    std::fprintf(stderr, "ferrum_engine: %s\n", host_memory ? "out of host memory" : e.what());
    return 1;
  }
}
