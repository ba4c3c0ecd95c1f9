#include "weights.hpp"

#include <cmath>
#include <map>

#include "engine_error.hpp"

namespace ferrum::engine {

namespace {

bool is_float_dtype(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::F16 || dtype == SafetensorsDType::BF16 || dtype == SafetensorsDType::F32;
}

SafetensorsDType safetensors_dtype_of(DType dtype) {
  return dtype == DType::F16 ? SafetensorsDType::F16 : SafetensorsDType::BF16;
}

// Host tensors stacked row-wise: [rows_a + rows_b + ..., cols].
std::vector<float> concat_rows(std::initializer_list<const std::vector<float>*> parts) {
  std::size_t total = 0;
  for (const auto* part : parts) total += part->size();
  std::vector<float> out;
  out.reserve(total);
  for (const auto* part : parts) out.insert(out.end(), part->begin(), part->end());
  return out;
}

class WeightLoader {
 public:
  WeightLoader(Backend& backend, const ModelConfig& config, const TensorSource& source, const LoadOptions& options)
      : backend_(backend), config_(config), source_(source), options_(options) {
    for (ExpectedTensor& t : expected_tensors(config)) expected_.emplace(t.name, std::move(t));
  }

  std::vector<float> host(const std::string& name) const {
    return read_checked(source_, expected_.at(name), config_.dtype, options_);
  }
  Buffer upload(const std::string& name) const { return backend_.upload(host(name), config_.dtype); }
  Buffer upload_layer(std::size_t layer, const std::string& suffix) const {
    return upload(layer_tensor_name(layer, suffix));
  }

  LayerWeights layer(std::size_t i) const {
    LayerWeights w;
    w.input_norm = upload_layer(i, "input_layernorm.weight");
    {
      const std::vector<float> q = host(layer_tensor_name(i, "self_attn.q_proj.weight"));  // [heads*hd, hidden]
      const std::vector<float> k = host(layer_tensor_name(i, "self_attn.k_proj.weight"));  // [kv*hd, hidden]
      const std::vector<float> v = host(layer_tensor_name(i, "self_attn.v_proj.weight"));  // [kv*hd, hidden]
      w.qkv_proj = backend_.upload(concat_rows({&q, &k, &v}), config_.dtype);
    }
    if (config_.has_qk_norm()) {
      w.q_norm = upload_layer(i, "self_attn.q_norm.weight");
      w.k_norm = upload_layer(i, "self_attn.k_norm.weight");
    }
    w.o_proj = upload_layer(i, "self_attn.o_proj.weight");
    w.post_attention_norm = upload_layer(i, "post_attention_layernorm.weight");
    {
      const std::vector<float> gate = host(layer_tensor_name(i, "mlp.gate_proj.weight"));  // [im, hidden]
      const std::vector<float> up = host(layer_tensor_name(i, "mlp.up_proj.weight"));      // [im, hidden]
      w.gate_up_proj = backend_.upload(concat_rows({&gate, &up}), config_.dtype);
    }
    w.down_proj = upload_layer(i, "mlp.down_proj.weight");
    return w;
  }

 private:
  Backend& backend_;
  const ModelConfig& config_;
  const TensorSource& source_;
  const LoadOptions& options_;
  std::map<std::string, ExpectedTensor> expected_;
};

}  // namespace

void make_rope_tables(const ModelConfig& config, std::size_t rows, std::vector<float>& cos, std::vector<float>& sin) {
  const std::size_t half = config.head_dim / 2;
  cos.assign(rows * half, 0.0f);
  sin.assign(rows * half, 0.0f);
  for (std::size_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(config.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(config.head_dim));
    for (std::size_t pos = 0; pos < rows; ++pos) {
      const double angle = static_cast<double>(pos) * inv_freq;
      cos[pos * half + i] = static_cast<float>(std::cos(angle));
      sin[pos * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

std::vector<float> read_checked(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                                const LoadOptions& options) {
  if (!source.contains(expected.name)) {
    fail(ErrorCode::InvalidArgument, source.describe(expected.name), ": missing tensor '", expected.name,
         "' (expected shape ", shape_to_string(expected.shape), ")");
  }
  const TensorMeta meta = source.meta(expected.name);
  if (!is_float_dtype(meta.dtype)) {
    fail(ErrorCode::DTypeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has dtype ",
         to_string(meta.dtype), "; expected F16 or BF16 (F32 is converted)");
  }
  if (!options.allow_dtype_conversion && meta.dtype != safetensors_dtype_of(config_dtype)) {
    fail(ErrorCode::DTypeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has dtype ",
         to_string(meta.dtype), " but the config's dtype is ", to_string(safetensors_dtype_of(config_dtype)),
         " (dtype conversion is off)");
  }
  if (meta.shape != expected.shape) {
    fail(ErrorCode::ShapeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has shape ",
         shape_to_string(meta.shape), " but the config needs ", shape_to_string(expected.shape));
  }
  return source.read_f32(expected.name);
}

ModelWeights load_weights(Backend& backend, const ModelConfig& config, const TensorSource& source,
                          const LoadOptions& options) {
  config.validate("load_weights: config");
  const WeightLoader loader(backend, config, source, options);
  ModelWeights w;
  w.config = config;
  w.embed_tokens = loader.upload("model.embed_tokens.weight");
  for (std::size_t i = 0; i < config.num_hidden_layers; ++i) w.layers.push_back(loader.layer(i));
  w.final_norm = loader.upload("model.norm.weight");
  if (!config.tie_word_embeddings) w.lm_head = loader.upload("lm_head.weight");
  std::vector<float> cos, sin;
  make_rope_tables(config, config.max_position_embeddings, cos, sin);
  w.rope_cos = backend.upload(cos, DType::F32);
  w.rope_sin = backend.upload(sin, DType::F32);
  return w;
}

ModelWeights load_checkpoint(Backend& backend, const std::filesystem::path& dir, const LoadOptions& options) {
  const ModelConfig config = load_model_config(dir / "config.json");
  const CheckpointDirectory source(dir);
  return load_weights(backend, config, source, options);
}

ModelWeights random_weights(Backend& backend, const ModelConfig& config, std::uint64_t seed) {
  const RandomTensorSource source(config, seed);
  return load_weights(backend, config, source);
}

}  // namespace ferrum::engine
