#include "naive_decoder.hpp"

#include <algorithm>
#include <cmath>

#include "checkpoint_layout.hpp"

namespace ferrum::engine::testing {

namespace {

using Vec = std::vector<double>;

Vec to_f64(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// HF LlamaRMSNorm: x * rsqrt(mean(x²) + eps) * w
Vec rms_norm(const Vec& x, const Vec& w, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w[i];
  return out;
}

// y = W x with W [n, k] row-major.
Vec matvec(const Vec& w, const Vec& x, std::size_t n) {
  const std::size_t k = x.size();
  Vec y(n, 0.0);
  for (std::size_t r = 0; r < n; ++r) {
    double acc = 0.0;
    for (std::size_t j = 0; j < k; ++j) acc += w[r * k + j] * x[j];
    y[r] = acc;
  }
  return y;
}

// Pair i's inverse frequency under yarn, in the form of transformers'
// _compute_yarn_parameters (find_correction_range, linear_ramp_factor and
// the extrapolation factor 1 - ramp), not the engine's.
double yarn_inverse_frequency(const ModelConfig& c, std::size_t i) {
  const RopeScaling& s = c.rope_scaling;
  const double dim = static_cast<double>(c.head_dim);
  const double base = c.rope_theta;
  auto find_correction_dim = [&](double num_rotations) {
    return (dim * std::log(s.original_max_position_embeddings / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
  };
  double low = find_correction_dim(s.beta_fast);
  double high = find_correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;
  const double linear_func = (static_cast<double>(i) - low) / (high - low);
  const double ramp_func = std::min(std::max(linear_func, 0.0), 1.0);
  const double pos_freq = std::pow(base, 2.0 * static_cast<double>(i) / dim);
  const double inv_freq_extrapolation = 1.0 / pos_freq;
  const double inv_freq_interpolation = 1.0 / (s.factor * pos_freq);
  const double inv_freq_extrapolation_factor = 1.0 - ramp_func;
  return inv_freq_interpolation * (1.0 - inv_freq_extrapolation_factor) +
         inv_freq_extrapolation * inv_freq_extrapolation_factor;
}

// Pair i's inverse frequency as transformers' modeling_rope_utils computes
// it for rope_type default, linear, llama3 and yarn, written in its form
// (the llama3 bands as its two torch.where, not as the engine's branches).
double inverse_frequency(const ModelConfig& c, std::size_t i) {
  const double base = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::Linear) return base / s.factor;
  if (s.type == RopeScaling::Type::Yarn) return yarn_inverse_frequency(c, i);
  if (s.type != RopeScaling::Type::Llama3) return base;
  const double low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  const double wavelen = 2.0 * M_PI / base;
  const double inv_freq_llama = wavelen > low_freq_wavelen ? base / s.factor : base;
  const double smooth_factor =
      (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const double smoothed = (1.0 - smooth_factor) * inv_freq_llama / s.factor + smooth_factor * inv_freq_llama;
  const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return is_medium_freq ? smoothed : inv_freq_llama;
}

// HF apply_rotary_pos_emb with rotate_half: x·cos + rotate_half(x)·sin,
// rotate_half(x) = [-x2, x1], cos/sin repeated over both halves and, as the
// rotary embedding's forward does, times its attention_scaling (yarn's
// attention_factor, else 1).
void rope(double* x, const ModelConfig& c, std::size_t pos) {
  const std::size_t half = c.head_dim / 2;
  const double attention_scaling =
      c.rope_scaling.type == RopeScaling::Type::Yarn ? c.rope_scaling.attention_factor : 1.0;
  for (std::size_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inverse_frequency(c, i);
    const double cos_a = std::cos(angle) * attention_scaling, sin_a = std::sin(angle) * attention_scaling;
    const double x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_a - x2 * sin_a;
    x[i + half] = x2 * cos_a + x1 * sin_a;
  }
}

}  // namespace

NaiveDecoder::NaiveDecoder(const ModelConfig& config, const TensorSource& src) : c_(config) {
  embed_ = to_f64(src.read_f32("model.embed_tokens.weight"));
  final_norm_ = to_f64(src.read_f32("model.norm.weight"));
  lm_head_ = config.tie_word_embeddings ? embed_ : to_f64(src.read_f32("lm_head.weight"));
  for (std::size_t i = 0; i < config.num_hidden_layers; ++i) {
    auto get = [&](const char* suffix) { return to_f64(src.read_f32(layer_tensor_name(i, suffix))); };
    Layer l;
    l.input_norm = get("input_layernorm.weight");
    l.q = get("self_attn.q_proj.weight");
    l.k = get("self_attn.k_proj.weight");
    l.v = get("self_attn.v_proj.weight");
    if (config.has_qk_norm()) {
      l.q_norm = get("self_attn.q_norm.weight");
      l.k_norm = get("self_attn.k_norm.weight");
    }
    l.o = get("self_attn.o_proj.weight");
    l.post_norm = get("post_attention_layernorm.weight");
    l.gate = get("mlp.gate_proj.weight");
    l.up = get("mlp.up_proj.weight");
    l.down = get("mlp.down_proj.weight");
    layers_.push_back(std::move(l));
  }
}

std::vector<std::vector<double>> NaiveDecoder::forward(const std::vector<std::int32_t>& tokens) const {
  const std::size_t n = tokens.size(), hidden = c_.hidden_size, hd = c_.head_dim;
  const std::size_t heads = c_.num_attention_heads, kv = c_.num_key_value_heads, group = heads / kv;
  std::vector<Vec> x(n);
  for (std::size_t t = 0; t < n; ++t) {
    const auto row = static_cast<std::size_t>(tokens[t]);
    x[t].assign(embed_.begin() + row * hidden, embed_.begin() + (row + 1) * hidden);
  }
  for (const Layer& l : layers_) {
    std::vector<Vec> q(n), k(n), v(n);  // [t][head * hd]
    for (std::size_t t = 0; t < n; ++t) {
      const Vec h = rms_norm(x[t], l.input_norm, c_.rms_norm_eps);
      q[t] = matvec(l.q, h, heads * hd);
      k[t] = matvec(l.k, h, kv * hd);
      v[t] = matvec(l.v, h, kv * hd);
      for (std::size_t head = 0; head < heads; ++head) {
        if (c_.has_qk_norm()) {
          const Vec normed = rms_norm(Vec(q[t].begin() + head * hd, q[t].begin() + (head + 1) * hd), l.q_norm,
                                      c_.rms_norm_eps);
          std::copy(normed.begin(), normed.end(), q[t].begin() + head * hd);
        }
        rope(q[t].data() + head * hd, c_, t);
      }
      for (std::size_t head = 0; head < kv; ++head) {
        if (c_.has_qk_norm()) {
          const Vec normed = rms_norm(Vec(k[t].begin() + head * hd, k[t].begin() + (head + 1) * hd), l.k_norm,
                                      c_.rms_norm_eps);
          std::copy(normed.begin(), normed.end(), k[t].begin() + head * hd);
        }
        rope(k[t].data() + head * hd, c_, t);
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (std::size_t t = 0; t < n; ++t) {
      Vec attn(heads * hd, 0.0);
      for (std::size_t head = 0; head < heads; ++head) {
        const std::size_t kvh = head / group;
        Vec score(t + 1);
        double max_score = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {  // causal
          double dot = 0.0;
          for (std::size_t d = 0; d < hd; ++d) dot += q[t][head * hd + d] * k[j][kvh * hd + d];
          score[j] = dot * scale;
          max_score = std::max(max_score, score[j]);
        }
        double sum = 0.0;
        for (double& s : score) sum += (s = std::exp(s - max_score));
        for (std::size_t j = 0; j <= t; ++j) {
          for (std::size_t d = 0; d < hd; ++d) attn[head * hd + d] += score[j] / sum * v[j][kvh * hd + d];
        }
      }
      const Vec o = matvec(l.o, attn, hidden);
      for (std::size_t i = 0; i < hidden; ++i) x[t][i] += o[i];
      const Vec h = rms_norm(x[t], l.post_norm, c_.rms_norm_eps);
      const Vec gate = matvec(l.gate, h, c_.intermediate_size);
      const Vec up = matvec(l.up, h, c_.intermediate_size);
      Vec act(c_.intermediate_size);
      for (std::size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const Vec down = matvec(l.down, act, hidden);
      for (std::size_t i = 0; i < hidden; ++i) x[t][i] += down[i];
    }
  }
  std::vector<Vec> logits(n);
  for (std::size_t t = 0; t < n; ++t) logits[t] = matvec(lm_head_, rms_norm(x[t], final_norm_, c_.rms_norm_eps), c_.vocab_size);
  return logits;
}

}  // namespace ferrum::engine::testing
