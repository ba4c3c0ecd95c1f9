#include "engine_test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "checkpoint_layout.hpp"
#include "decoder.hpp"
#include "naive_decoder.hpp"

namespace ferrum::engine::testing {

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

double logit_bound(const std::vector<double>& want, std::size_t i, DType dtype) {
  const test::Tolerance tol = test::engine_logit_tolerance(dtype);
  return tol.atol * test::op_scale::logits(want) + tol.rtol * std::fabs(want[i]);
}

LogitCheck check_logits(const std::vector<float>& got, const std::vector<double>& want, DType dtype) {
  EXPECT_EQ(got.size(), want.size());
  const test::Tolerance tol = test::engine_logit_tolerance(dtype);
  const double scale = test::op_scale::logits(want);
  LogitCheck check;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = std::isnan(diff) ? INFINITY : diff / (tol.atol * scale + tol.rtol * std::fabs(want[i]));
    if (!(ratio <= 1.0)) ++check.outside;
    if (!(ratio <= check.worst)) {
      check.worst = ratio;
      check.worst_index = i;
    }
  }
  return check;
}

LogitCheck expect_logits_near(const std::vector<float>& got, const std::vector<double>& want, DType dtype,
                              const std::string& where) {
  const LogitCheck check = check_logits(got, want, dtype);
  if (check.outside > 0) {
    const std::size_t i = check.worst_index;
    ADD_FAILURE() << where << ": " << check.outside << " of " << want.size() << " logits outside the "
                  << ferrum::to_string(dtype) << " engine tolerance; worst at index " << i << ": got " << got[i]
                  << ", want " << want[i] << ", |diff| " << std::fabs(static_cast<double>(got[i]) - want[i])
                  << " > bound " << logit_bound(want, i, dtype) << " (rms of want " << test::op_scale::logits(want)
                  << ")";
  }
  return check;
}

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

ModelConfig gpu_shaped_config(const std::string& preset) {
  ModelConfig c = preset_config(preset);
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  return c;
}

ModelConfig gpu_tiny_llama_config() { return gpu_shaped_config("tiny-llama"); }

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
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::None: j["rope_scaling"] = nullptr; break;
    case RopeScaling::Type::Linear: j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}}; break;
    case RopeScaling::Type::Llama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
    case RopeScaling::Type::Yarn:
      j["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", c.rope_scaling.factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
                           {"beta_fast", c.rope_scaling.beta_fast},
                           {"beta_slow", c.rope_scaling.beta_slow},
                           {"attention_factor", c.rope_scaling.attention_factor},
                           {"truncate", c.rope_scaling.truncate}};
      break;
  }
  if (c.gptq) {
    j["quantization_config"] = {{"quant_method", "gptq"},
                                {"bits", c.gptq->bits},
                                {"group_size", c.gptq->group_size},
                                {"desc_act", c.gptq->desc_act},
                                {"sym", c.gptq->sym},
                                {"damp_percent", 0.01},
                                {"true_sequential", true},
                                {"checkpoint_format", c.gptq->zero_format == GptqZeroFormat::V1 ? "gptq" : "gptq_v2"}};
  }
  return j.dump(2);
}

SafetensorsWriteTensor write_tensor_from(const TensorSource& source, const ExpectedTensor& expected,
                                         SafetensorsDType dtype) {
  if (expected.kind == TensorKind::Int32) return make_write_tensor(expected.name, expected.shape, source.read_i32(expected.name));
  const bool scales = expected.name.size() > 7 && expected.name.compare(expected.name.size() - 7, 7, ".scales") == 0;
  return make_write_tensor(expected.name, scales ? SafetensorsDType::F16 : dtype, expected.shape,
                           source.read_f32(expected.name));
}

void write_checkpoint(const std::filesystem::path& dir, const ModelConfig& config, const TensorSource& source,
                      SafetensorsDType dtype, std::size_t shards) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config_json(config);
  std::vector<ExpectedTensor> expected = expected_tensors(config);
  std::erase_if(expected, [&](const ExpectedTensor& t) { return !source.contains(t.name); });  // e.g. no g_idx
  const std::size_t per_shard = (expected.size() + shards - 1) / shards;
  for (std::size_t s = 0; s < shards; ++s) {
    std::vector<SafetensorsWriteTensor> tensors;
    for (std::size_t i = s * per_shard; i < std::min(expected.size(), (s + 1) * per_shard); ++i) {
      tensors.push_back(write_tensor_from(source, expected[i], dtype));
    }
    write_safetensors(dir / ("model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors"),
                      tensors, {{"format", "pt"}});
  }
}

// ── GPTQ ─────────────────────────────────────────────────────────────────

namespace {

std::uint64_t name_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ seed;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool has_suffix(const std::string& text, const std::string& suffix) {
  return text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The act-order permutation group of a projection (q/k/v share one Hessian).
std::string perm_key(std::size_t layer, const std::string& suffix, const GptqTestOptions& options) {
  std::string group = suffix;
  if (suffix == "self_attn.q_proj" || suffix == "self_attn.k_proj" || suffix == "self_attn.v_proj") group = "qkv";
  if (!options.split_gate_up && (suffix == "mlp.gate_proj" || suffix == "mlp.up_proj")) group = "gate_up";
  return "perm." + std::to_string(layer) + "." + group;
}

}  // namespace

GptqTestSource::GptqTestSource(const ModelConfig& config, std::uint64_t seed, GptqTestOptions options)
    : config_(config), dense_(config, seed) {
  if (!config.gptq) throw std::invalid_argument("GptqTestSource needs config.gptq");
  const GptqConfig& gptq = *config.gptq;
  for (std::size_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (const ProjectionShape& shape : projection_shapes(config)) {
      const std::string base = layer_tensor_name(layer, shape.suffix);
      const std::size_t k = shape.k, n = shape.n, groups = gptq.groups(k);
      const std::size_t group_rows = k / groups;
      std::mt19937_64 rng(name_seed(seed, base));
      std::vector<int> q(k * n), zero(groups * n);
      std::vector<float> scales(groups * n);
      for (int& v : q) v = static_cast<int>(rng() % 16);
      const int zero_low = gptq.zero_format == GptqZeroFormat::V1 ? 1 : 0;  // v1 holds zeros 1..16, v2 0..15
      for (int& z : zero) z = options.symmetric ? 8 : zero_low + static_cast<int>(rng() % 16);
      const double base_scale = 1.0 / std::sqrt(21.5 * static_cast<double>(k));
      for (float& sc : scales) {
        const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
        sc = f16_to_f32(f32_to_f16(static_cast<float>(base_scale * (0.75 + 0.5 * u))));
      }
      std::vector<std::int32_t> g_idx(k);
      if (options.act_order) {
        std::vector<std::size_t> perm(k);
        std::iota(perm.begin(), perm.end(), 0);
        std::mt19937_64 perm_rng(name_seed(seed, perm_key(layer, shape.suffix, options)));
        std::shuffle(perm.begin(), perm.end(), perm_rng);
        for (std::size_t j = 0; j < k; ++j) g_idx[perm[j]] = static_cast<std::int32_t>(j / group_rows);
      } else {
        for (std::size_t r = 0; r < k; ++r) g_idx[r] = static_cast<std::int32_t>(r / group_rows);
      }
      // qweight [k / 8, n]: 8 rows per word, row 8w + j in bits 4j .. 4j + 3.
      // qzeros [groups, n / 8]: 8 columns per word, stored zero (v1: zero - 1).
      Packed packed;
      packed.qweight.assign(k / 8 * n, 0);
      for (std::size_t r = 0; r < k; ++r) {
        for (std::size_t c = 0; c < n; ++c) {
          auto& word = reinterpret_cast<std::uint32_t&>(packed.qweight[r / 8 * n + c]);
          word |= static_cast<std::uint32_t>(q[r * n + c]) << (4 * (r % 8));
        }
      }
      packed.qzeros.assign(groups * n / 8, 0);
      for (std::size_t g = 0; g < groups; ++g) {
        for (std::size_t c = 0; c < n; ++c) {
          const auto stored = static_cast<std::uint32_t>(zero[g * n + c] - zero_low);
          reinterpret_cast<std::uint32_t&>(packed.qzeros[g * n / 8 + c / 8]) |= stored << (4 * (c % 8));
        }
      }
      packed.scales = std::move(scales);
      if (options.write_g_idx) packed.g_idx = std::move(g_idx);
      projections_.emplace(base, std::move(packed));
    }
  }
}

const GptqTestSource::Packed* GptqTestSource::projection(const std::string& name, std::string* suffix) const {
  for (const char* tail : {".qweight", ".qzeros", ".scales", ".g_idx"}) {
    if (!has_suffix(name, tail)) continue;
    const auto it = projections_.find(name.substr(0, name.size() - std::string(tail).size()));
    if (it == projections_.end()) return nullptr;
    *suffix = tail;
    return &it->second;
  }
  return nullptr;
}

bool GptqTestSource::contains(const std::string& name) const {
  std::string suffix;
  const Packed* p = projection(name, &suffix);
  if (p == nullptr) return dense_.contains(name);
  return suffix != ".g_idx" || !p->g_idx.empty();
}

TensorMeta GptqTestSource::meta(const std::string& name) const {
  std::string suffix;
  if (projection(name, &suffix) != nullptr && !contains(name)) {
    throw Error(ErrorCode::InvalidArgument, "GptqTestSource: no tensor '" + name + "'");
  }
  return dense_.meta(name);  // same names, shapes and dtypes (I32, F16 scales)
}

std::vector<float> GptqTestSource::read_f32(const std::string& name) const {
  std::string suffix;
  const Packed* p = projection(name, &suffix);
  if (p == nullptr) return dense_.read_f32(name);
  if (suffix != ".scales") throw Error(ErrorCode::DTypeMismatch, "GptqTestSource: '" + name + "' is I32");
  return p->scales;
}

std::vector<std::int32_t> GptqTestSource::read_i32(const std::string& name) const {
  std::string suffix;
  const Packed* p = projection(name, &suffix);
  if (p == nullptr || suffix == ".scales" || !contains(name)) {
    throw Error(ErrorCode::DTypeMismatch, "GptqTestSource: '" + name + "' is not an I32 tensor");
  }
  return suffix == ".qweight" ? p->qweight : suffix == ".qzeros" ? p->qzeros : p->g_idx;
}

std::string GptqTestSource::describe(const std::string&) const { return "GPTQ test weights"; }

DequantizedSource::DequantizedSource(const ModelConfig& config, const TensorSource& gptq)
    : config_(config), gptq_(gptq), shapes_(projection_shapes(config)) {
  if (!config.gptq) throw std::invalid_argument("DequantizedSource needs config.gptq");
}

const ProjectionShape* DequantizedSource::projection_of(const std::string& name) const {
  for (const ProjectionShape& p : shapes_) {
    if (has_suffix(name, "." + p.suffix + ".weight") && gptq_.contains(name.substr(0, name.size() - 7) + ".qweight")) {
      return &p;
    }
  }
  return nullptr;
}

bool DequantizedSource::contains(const std::string& name) const {
  return projection_of(name) != nullptr || gptq_.contains(name);
}

TensorMeta DequantizedSource::meta(const std::string& name) const {
  if (const ProjectionShape* p = projection_of(name)) return {SafetensorsDType::F32, {p->n, p->k}};
  return gptq_.meta(name);
}

std::vector<float> DequantizedSource::read_f32(const std::string& name) const {
  const ProjectionShape* p = projection_of(name);
  if (p == nullptr) return gptq_.read_f32(name);
  const std::string base = name.substr(0, name.size() - 7);  // drop ".weight"
  const std::size_t k = p->k, n = p->n;
  const GptqConfig& gptq = *config_.gptq;
  const std::vector<std::int32_t> qweight = gptq_.read_i32(base + ".qweight");
  const std::vector<std::int32_t> qzeros = gptq_.read_i32(base + ".qzeros");
  const std::vector<float> scales = gptq_.read_f32(base + ".scales");
  std::vector<std::int32_t> g_idx(k);
  if (gptq_.contains(base + ".g_idx")) {
    g_idx = gptq_.read_i32(base + ".g_idx");
  } else {
    for (std::size_t r = 0; r < k; ++r) g_idx[r] = static_cast<std::int32_t>(r / (k / gptq.groups(k)));
  }
  const int zero_offset = gptq.zero_format == GptqZeroFormat::V1 ? 1 : 0;
  std::vector<float> w(n * k);  // [n, k]
  for (std::size_t r = 0; r < k; ++r) {
    const auto g = static_cast<std::size_t>(g_idx[r]);
    for (std::size_t c = 0; c < n; ++c) {
      const auto qw = static_cast<std::uint32_t>(qweight[r / 8 * n + c]);
      const auto qz = static_cast<std::uint32_t>(qzeros[g * (n / 8) + c / 8]);
      const int q = static_cast<int>((qw >> (4 * (r % 8))) & 15u);
      const int zero = static_cast<int>((qz >> (4 * (c % 8))) & 15u) + zero_offset;
      w[c * k + r] = static_cast<float>(q - zero) * scales[g * n + c];  // exact: a small integer times an f16
    }
  }
  return w;
}

void expect_device_state_equals_eager(Backend& be, const ModelWeights& weights,
                                      const std::vector<std::int32_t>& prompt, std::size_t capacity,
                                      std::size_t steps) {
  Decoder eager(be, weights, capacity, prompt.size(), DecodeMode::Eager);
  Decoder state(be, weights, capacity, prompt.size(), DecodeMode::DeviceState);
  std::vector<float> a = eager.prefill(prompt), b = state.prefill(prompt);
  for (std::size_t step = 0; step < steps; ++step) {
    ASSERT_EQ(a, b) << "step " << step;
    a = eager.decode(argmax(a));
    b = state.decode(argmax(b));
  }
  EXPECT_EQ(a, b);
}

std::vector<std::int32_t> expect_decodes_like_reference(Backend& be, const ModelWeights& weights,
                                                        const TensorSource& reference_weights,
                                                        const std::vector<std::int32_t>& prompt, std::size_t steps,
                                                        std::size_t min_exact, DecodeMode mode,
                                                        const DecoderOptions& options) {
  const NaiveDecoder reference(weights.config, reference_weights);
  Decoder decoder(be, weights, 64, prompt.size(), mode, 1, options);
  std::vector<std::int32_t> sequence = prompt;
  std::vector<std::int32_t> generated;
  std::vector<float> logits = decoder.prefill(prompt);
  std::size_t exact = 0;
  const DType dtype = weights.config.dtype;
  for (std::size_t step = 0; step < steps; ++step) {
    const std::vector<double> ref = reference.forward(sequence).back();
    EXPECT_GT(max_abs(ref), 0.5) << "step " << step << ": logits trivially small";
    const double worst = expect_logits_near(logits, ref, dtype, "step " + std::to_string(step)).worst;
    const std::int32_t token = argmax(logits);
    const auto ref_token = static_cast<std::int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
    if (token == ref_token) {
      ++exact;
    } else {
      EXPECT_LE(ref[ref_token] - ref[token], logit_bound(ref, ref_token, dtype) + logit_bound(ref, token, dtype))
          << "step " << step << ": engine " << token << ", reference " << ref_token;
    }
    if (step == 0) {
      std::printf("[ info ] prefill: max |engine - fp64| = %.5f (%.2f of the tolerance), max |ref| = %.3f\n",
                  max_diff(logits, ref), worst, max_abs(ref));
    }
    sequence.push_back(token);
    generated.push_back(token);
    if (step + 1 < steps) logits = decoder.decode(token);
  }
  EXPECT_GE(exact, min_exact) << exact << " of " << steps << " steps gave the reference's token";
  return generated;
}

}  // namespace ferrum::engine::testing
