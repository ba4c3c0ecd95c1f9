#include "weights.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <span>

#include "engine_error.hpp"

namespace ferrum::engine {

namespace {

bool is_float_dtype(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::F16 || dtype == SafetensorsDType::BF16 || dtype == SafetensorsDType::F32;
}

SafetensorsDType safetensors_dtype_of(DType dtype) {
  return dtype == DType::F16 ? SafetensorsDType::F16 : SafetensorsDType::BF16;
}

// Row-major [rows, cols_i] matrices side by side: [rows, sum cols_i].
template <class T>
std::vector<T> concat_columns(const std::vector<const std::vector<T>*>& parts, std::size_t rows) {
  std::size_t total = 0;
  for (const auto* part : parts) total += part->size();
  std::vector<T> out;
  out.reserve(total);
  for (std::size_t r = 0; r < rows; ++r) {
    for (const auto* part : parts) {
      const std::size_t cols = part->size() / rows;
      out.insert(out.end(), part->begin() + static_cast<std::ptrdiff_t>(r * cols),
                 part->begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
    }
  }
  return out;
}

// Two row-major [rows, cols] matrices with their columns interleaved:
// [rows, 2 * cols], column 2j = a's column j, 2j + 1 = b's.
template <class T>
std::vector<T> interleave_columns(const std::vector<T>& a, const std::vector<T>& b, std::size_t rows) {
  const std::size_t cols = rows == 0 ? 0 : a.size() / rows;
  std::vector<T> out(2 * a.size());
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < cols; ++j) {
      out[r * 2 * cols + 2 * j] = a[r * cols + j];
      out[r * 2 * cols + 2 * j + 1] = b[r * cols + j];
    }
  }
  return out;
}

// The same for GPTQ's packed zeros: [rows, cols / 8] words, column c in bits
// 4 (c % 8) .. 4 (c % 8) + 3 of word c / 8.
std::vector<std::int32_t> interleave_packed_columns(const std::vector<std::int32_t>& a,
                                                    const std::vector<std::int32_t>& b, std::size_t rows) {
  const std::size_t words = rows == 0 ? 0 : a.size() / rows;  // per row, per part
  std::vector<std::uint32_t> out(2 * a.size(), 0u);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < 2 * words * 8; ++c) {
      const std::vector<std::int32_t>& part = (c & 1) != 0 ? b : a;
      const std::size_t src = c / 2;
      const std::uint32_t nibble = (static_cast<std::uint32_t>(part[r * words + src / 8]) >> (4 * (src % 8))) & 0xFu;
      out[r * 2 * words + c / 8] |= nibble << (4 * (c % 8));
    }
  }
  return {out.begin(), out.end()};
}

// Presence (InvalidArgument) and shape (ShapeMismatch) of one tensor.
TensorMeta checked_meta(const TensorSource& source, const ExpectedTensor& expected) {
  if (!source.contains(expected.name)) {
    fail(ErrorCode::InvalidArgument, source.describe(expected.name), ": missing tensor '", expected.name,
         "' (expected shape ", shape_to_string(expected.shape), ")");
  }
  const TensorMeta meta = source.meta(expected.name);
  if (meta.shape != expected.shape) {
    fail(ErrorCode::ShapeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has shape ",
         shape_to_string(meta.shape), " but the config needs ", shape_to_string(expected.shape));
  }
  return meta;
}

void check_i32_tensor(const TensorSource& source, const ExpectedTensor& expected) {
  const TensorMeta meta = checked_meta(source, expected);
  if (meta.dtype != SafetensorsDType::I32) {
    fail(ErrorCode::DTypeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has dtype ",
         to_string(meta.dtype), "; GPTQ stores it as I32");
  }
}

// GPTQ scales keep their own precision (F16 in every export): load_gptq takes floats.
void check_scales_tensor(const TensorSource& source, const ExpectedTensor& expected) {
  const TensorMeta meta = checked_meta(source, expected);
  if (!is_float_dtype(meta.dtype)) {
    fail(ErrorCode::DTypeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has dtype ",
         to_string(meta.dtype), "; expected F16, BF16 or F32 scales");
  }
}

// The dtype rules of read_checked / read_checked_half; returns nothing, throws.
void check_float_tensor(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                        const LoadOptions& options) {
  const TensorMeta meta = checked_meta(source, expected);
  if (!is_float_dtype(meta.dtype)) {
    fail(ErrorCode::DTypeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has dtype ",
         to_string(meta.dtype), "; expected F16 or BF16 (F32 is converted)");
  }
  if (!options.allow_dtype_conversion && meta.dtype != safetensors_dtype_of(config_dtype)) {
    fail(ErrorCode::DTypeMismatch, source.describe(expected.name), ": tensor '", expected.name, "' has dtype ",
         to_string(meta.dtype), " but the config's dtype is ", to_string(safetensors_dtype_of(config_dtype)),
         " (dtype conversion is off)");
  }
}

// e's message without the "ferrum [Code] " that Error puts in front, to
// rethrow it with more context.
std::string message_of(const Error& e) {
  const std::string what = e.what();
  const std::string prefix = concat("ferrum [", to_string(e.code()), "] ");
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

// One projection as read from the source, before it goes to the backend.
struct HostProjection {
  std::string base;  // "model.layers.0.self_attn.q_proj"; of joined parts, the first part's
  std::string joined_from;  // joined parts: which, and how (for messages); empty otherwise
  std::size_t n = 0, k = 0;
  bool quantized = false;
  std::string dense;                  // the [n, k] tensor's name (dense projections; read at upload)
  std::vector<std::int32_t> qweight;  // [k / 8, n]
  std::vector<std::int32_t> qzeros;   // [groups, n / 8]
  std::vector<float> scales;          // [groups, n]
  std::vector<std::int32_t> g_idx;    // [k], always filled in (row / group_size when the checkpoint has none)
};

class WeightLoader {
 public:
  WeightLoader(Backend& backend, const ModelConfig& config, const TensorSource& source, const LoadOptions& options)
      : backend_(backend), config_(config), source_(source), options_(options) {
    // The tensors outside the layers by name, a layer's by suffix: the
    // config's with one layer, so that nothing here grows with
    // num_hidden_layers (2^24 of them passed validate(), and a table of
    // every layer's tensors took tens of GB before any was looked at).
    ModelConfig one_layer = config;
    one_layer.num_hidden_layers = 1;
    const std::string layer_prefix = layer_tensor_name(0, "");
    for (ExpectedTensor& t : expected_tensors(one_layer)) {
      if (t.name.rfind(layer_prefix, 0) == 0) {
        std::string suffix = t.name.substr(layer_prefix.size());
        layer_order_.push_back(suffix);
        layer_expected_.emplace(std::move(suffix), std::move(t));
      } else {
        (layer_order_.empty() ? outer_before_ : outer_after_).push_back(t.name);
        expected_.emplace(t.name, std::move(t));
      }
    }
    for (ProjectionShape& p : projection_shapes(config)) projections_.emplace(p.suffix, std::move(p));
  }

  // Seconds spent inside Backend calls so far (alloc, write_bytes,
  // load_gptq): the load's own share is the rest (reading, generating, joining).
  double backend_seconds() const noexcept { return backend_seconds_; }

  // Runs `call` (a Backend call) and adds its time to backend_seconds_.
  template <class Call>
  decltype(auto) in_backend(Call&& call) const {
    const auto start = std::chrono::steady_clock::now();
    struct AddOnExit {
      double& total;
      std::chrono::steady_clock::time_point start;
      ~AddOnExit() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
    } add{backend_seconds_, start};
    return call();
  }

  ExpectedTensor expected_of(const std::string& name) const {
    const auto it = expected_.find(name);
    if (it != expected_.end()) return it->second;
    if (std::optional<ExpectedTensor> t = expected_of_layer_tensor(name)) return *std::move(t);
    return dense_projection_tensor(name);
  }

  // Every tensor the load reads, checked for presence, dtype and shape from the
  // headers alone, in load order (expected_tensors): so a wrong or missing
  // tensor anywhere is named before the first allocation. Otherwise a
  // config.json whose sizes disagree with the checkpoint allocated (and
  // zero-filled host scratch) at the config's sizes first, GBs for a wrong
  // vocab x hidden, and a missing lm_head.weight came out only after every
  // layer had loaded. One layer at a time: nothing is kept.
  void check_all() const {
    // The list is expected_tensors' (the one every load reads by), so a
    // tensor added to the model is checked here without a second list.
    for (const std::string& name : outer_before_) check_float(expected_.at(name));
    for (std::size_t i = 0; i < config_.num_hidden_layers; ++i) {
      const ProjectionShape* last = nullptr;
      for (const std::string& suffix : layer_order_) {
        if (const ProjectionShape* p = projection_of(suffix)) {
          if (p != last) plan_projection(i, p->suffix);  // its tensors come together
          last = p;
        } else {
          check_float(expected_of(layer_tensor_name(i, suffix)));
        }
      }
    }
    for (const std::string& name : outer_after_) check_float(expected_.at(name));
  }

  // Float tensor `name` (checked) into dst from element `offset` on, as
  // config-dtype bits through one reused host buffer: no f32 round trip and
  // no fresh allocation per tensor (on a 16 GB model the page faults of
  // fresh buffers cost more than generating or copying the values).
  void write_tensor(const std::string& name, Buffer& dst, std::size_t offset) const {
    const std::span<const std::uint16_t> bits = read_tensor_bits(name);
    in_backend([&] { backend_.write_bytes(dst, bits.data(), bits.size_bytes(), offset * sizeof(std::uint16_t)); });
  }
  // Float tensor `name` (checked) as config-dtype bits in the reused host
  // buffer (valid until the next call).
  std::span<const std::uint16_t> read_tensor_bits(const std::string& name) const {
    const ExpectedTensor expected = expected_of(name);
    std::size_t numel = 1;
    for (std::size_t dim : expected.shape) numel *= dim;
    if (scratch_.size() < numel) scratch_.resize(numel);
    const std::span<std::uint16_t> bits(scratch_.data(), numel);
    read_checked_half_into(source_, expected, config_.dtype, bits, options_);
    return bits;
  }
  Buffer upload(const std::string& name) const {
    std::size_t numel = 1;
    for (std::size_t dim : expected_of(name).shape) numel *= dim;
    Buffer b = in_backend([&] { return backend_.alloc(config_.dtype, numel); });
    write_tensor(name, b, 0);
    return b;
  }
  Buffer upload_layer(std::size_t layer, const std::string& suffix) const {
    return upload(layer_tensor_name(layer, suffix));
  }

  LayerWeights layer(std::size_t i) const {
    LayerWeights w;
    w.input_norm = upload_layer(i, "input_layernorm.weight");
    w.qkv_proj = fuse({read_projection(i, "self_attn.q_proj"), read_projection(i, "self_attn.k_proj"),
                       read_projection(i, "self_attn.v_proj")});
    if (config_.has_qk_norm()) {
      w.q_norm = upload_layer(i, "self_attn.q_norm.weight");
      w.k_norm = upload_layer(i, "self_attn.k_norm.weight");
    }
    w.o_proj = upload_projection(read_projection(i, "self_attn.o_proj"));
    w.post_attention_norm = upload_layer(i, "post_attention_layernorm.weight");
    w.gate_up_proj = fuse_gate_up(read_projection(i, "mlp.gate_proj"), read_projection(i, "mlp.up_proj"));
    w.down_proj = upload_projection(read_projection(i, "mlp.down_proj"));
    return w;
  }

 private:
  void check_float(const ExpectedTensor& expected) const {
    check_float_tensor(source_, expected, config_.dtype, options_);
  }

  // The projection a layer tensor's suffix belongs to ("mlp.up_proj.qweight":
  // mlp.up_proj), or null for a norm.
  const ProjectionShape* projection_of(const std::string& suffix) const {
    for (const auto& [name, p] : projections_) {
      if (suffix.size() > name.size() && suffix.compare(0, name.size(), name) == 0 && suffix[name.size()] == '.') {
        return &p;
      }
    }
    return nullptr;
  }

  // "model.layers.{i}.{suffix}" with a suffix of layer_expected_.
  std::optional<ExpectedTensor> expected_of_layer_tensor(const std::string& name) const {
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return std::nullopt;
    const std::size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) return std::nullopt;
    const auto it = layer_expected_.find(name.substr(dot + 1));
    if (it == layer_expected_.end()) return std::nullopt;
    ExpectedTensor t = it->second;
    t.name = name;
    return t;
  }

  // "model.layers.0.mlp.up_proj.weight" of a GPTQ config (not in layer_expected_):
  // its shape from the projection table.
  ExpectedTensor dense_projection_tensor(const std::string& name) const {
    for (const auto& [suffix, p] : projections_) {
      const std::string tail = "." + suffix + ".weight";
      if (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0) {
        return {name, {p.n, p.k}};
      }
    }
    fail(ErrorCode::InvalidArgument, "load_weights: no tensor '", name, "' in this model");
  }

  // Projection `suffix` of layer `layer`: dense or GPTQ, each of its tensors
  // (and a bias) checked for presence, dtype and shape; no values read.
  HostProjection plan_projection(std::size_t layer, const std::string& suffix) const {
    const ProjectionShape& shape = projections_.at(suffix);
    HostProjection p;
    p.base = layer_tensor_name(layer, suffix);
    p.n = shape.n;
    p.k = shape.k;
    if (source_.contains(bias_of(p).name)) check_float(bias_of(p));
    const std::string qweight = p.base + ".qweight";
    const bool has_qweight = source_.contains(qweight);
    if (!has_qweight && (!config_.gptq || source_.contains(p.base + ".weight"))) {
      p.dense = p.base + ".weight";
      check_float(expected_of(p.dense));  // the values at upload
      return p;
    }
    if (!config_.gptq) {
      fail(ErrorCode::InvalidArgument, source_.describe(qweight), ": tensor '", qweight,
           "' is GPTQ, but the config has no \"quantization_config\" (and no quantize_config.json)");
    }
    const std::vector<ExpectedTensor> tensors = gptq_tensors(p.base, p.n, p.k, *config_.gptq);
    p.quantized = true;
    check_i32_tensor(source_, tensors[0]);
    check_i32_tensor(source_, tensors[1]);
    check_scales_tensor(source_, tensors[2]);
    if (source_.contains(tensors[3].name)) {
      check_i32_tensor(source_, tensors[3]);
    } else if (config_.gptq->desc_act) {
      // Act-order: the rows' groups are a permutation only g_idx records;
      // row / group_size in its place would pair rows with the wrong scales.
      fail(ErrorCode::InvalidArgument, source_.describe(qweight), ": tensor '", tensors[3].name,
           "' is missing, and the config's quantization has desc_act = true (act-order needs each row's group)");
    }
    return p;
  }

  // plan_projection, then the bias's and the GPTQ tensors' values (a dense
  // weight's are read at upload).
  HostProjection read_projection(std::size_t layer, const std::string& suffix) const {
    HostProjection p = plan_projection(layer, suffix);
    check_bias(p);
    if (!p.quantized) return p;
    const std::vector<ExpectedTensor> tensors = gptq_tensors(p.base, p.n, p.k, *config_.gptq);
    p.qweight = source_.read_i32(tensors[0].name);
    p.qzeros = source_.read_i32(tensors[1].name);
    p.scales = source_.read_f32(tensors[2].name);
    if (source_.contains(tensors[3].name)) {
      p.g_idx = source_.read_i32(tensors[3].name);
    } else {  // (not act-order: plan_projection refused that)
      const std::size_t group = config_.gptq->group_size < 0 ? p.k : static_cast<std::size_t>(config_.gptq->group_size);
      p.g_idx.resize(p.k);
      for (std::size_t r = 0; r < p.k; ++r) p.g_idx[r] = static_cast<std::int32_t>(r / group);
    }
    return p;
  }

  static ExpectedTensor bias_of(const HostProjection& p) { return {p.base + ".bias", {p.n}}; }

  void check_bias(const HostProjection& p) const {
    const ExpectedTensor bias = bias_of(p);
    if (!source_.contains(bias.name)) return;
    for (float b : read_checked(source_, bias, config_.dtype, options_)) {
      if (b != 0.0f) {
        fail(ErrorCode::Unsupported, source_.describe(bias.name), ": tensor '", bias.name, "' holds a nonzero bias (",
             b, "); projection biases are not supported");
      }
    }
  }

  Projection upload_projection(const HostProjection& p) const {
    Projection out;
    out.n = p.n;
    out.k = p.k;
    if (!p.quantized) {
      out.dense = in_backend([&] { return backend_.alloc(config_.dtype, p.n * p.k); });
      write_tensor(p.dense, out.dense, 0);
      return out;
    }
    GptqHostTensors t;
    t.qweight = p.qweight;
    t.qzeros = p.qzeros;
    t.scales = p.scales;
    t.g_idx = p.g_idx;
    t.bits = config_.gptq->bits;
    t.group_size = config_.gptq->group_size;
    t.k = p.k;
    t.n = p.n;
    t.symmetric = config_.gptq->sym;
    t.zero_format = config_.gptq->zero_format;
    try {
      out.gptq = in_backend([&] { return backend_.load_gptq(t); });
    } catch (const Error& e) {
      // load_gptq checks the values (g_idx in range, finite scales) but can
      // name only its argument: say which tensors, and where they live.
      const std::string what = p.joined_from.empty() ? concat("'", p.base, "'") : p.joined_from;
      fail(e.code(), source_.describe(p.base + ".qweight"), ": GPTQ projection ", what, ": ", message_of(e));
    }
    return out;
  }

  // gate | up: dense parts as one weight with their rows interleaved (gate_j,
  // up_j), for gemm_silu_mul; GPTQ parts with identical g_idx as one weight
  // with their output columns interleaved, for gemm_silu_mul_gptq; anything
  // else as fuse() joins it.
  FusedProjection fuse_gate_up(HostProjection gate, HostProjection up) const {
    if (gate.quantized && up.quantized && gate.g_idx == up.g_idx) {
      HostProjection joined;
      joined.base = gate.base;
      joined.joined_from = concat("'", gate.base, "' and '", up.base,
                                  "' (columns interleaved: column 2j is gate's j, 2j + 1 up's j)");
      joined.n = 2 * gate.n;
      joined.k = gate.k;
      joined.quantized = true;
      const std::size_t groups = config_.gptq->groups(joined.k);
      joined.qweight = interleave_columns(gate.qweight, up.qweight, joined.k / 8);  // [k / 8, n]
      joined.qzeros = interleave_packed_columns(gate.qzeros, up.qzeros, groups);
      joined.scales = interleave_columns(gate.scales, up.scales, groups);
      joined.g_idx = std::move(gate.g_idx);
      FusedProjection fused;
      fused.parts.push_back(upload_projection(joined));
      fused.interleaved_pairs = true;
      return fused;
    }
    if (gate.quantized || up.quantized) return fuse({std::move(gate), std::move(up)});  // both [im, hidden]
    const std::size_t n = gate.n, k = gate.k;
    Projection joined;
    joined.n = 2 * n;
    joined.k = k;
    joined.dense = in_backend([&] { return backend_.alloc(config_.dtype, joined.n * k); });
    if (interleaved_.size() < joined.n * k) interleaved_.resize(joined.n * k);
    for (std::size_t part = 0; part < 2; ++part) {
      const std::span<const std::uint16_t> rows = read_tensor_bits(part == 0 ? gate.dense : up.dense);
      for (std::size_t j = 0; j < n; ++j) {
        std::copy_n(rows.data() + j * k, k, interleaved_.data() + (2 * j + part) * k);
      }
    }
    in_backend([&] { backend_.write_bytes(joined.dense, interleaved_.data(), joined.n * k * sizeof(std::uint16_t)); });
    FusedProjection fused;
    fused.parts.push_back(std::move(joined));
    fused.interleaved_pairs = true;
    return fused;
  }

  // One projection over the concatenated outputs when exact (see FusedProjection).
  FusedProjection fuse(std::vector<HostProjection> parts) const {
    bool all_dense = true, all_gptq_same_g_idx = true;
    for (const HostProjection& p : parts) {
      all_dense = all_dense && !p.quantized;
      all_gptq_same_g_idx = all_gptq_same_g_idx && p.quantized && p.g_idx == parts.front().g_idx;
    }
    FusedProjection fused;
    if (!all_dense && !all_gptq_same_g_idx) {
      for (const HostProjection& p : parts) fused.parts.push_back(upload_projection(p));
      return fused;
    }
    if (all_dense) {  // W is [n, k]: each part's rows straight into its row range
      Projection joined;
      joined.k = parts.front().k;
      for (const HostProjection& p : parts) joined.n += p.n;
      joined.dense = in_backend([&] { return backend_.alloc(config_.dtype, joined.n * joined.k); });
      std::size_t row = 0;
      for (const HostProjection& p : parts) {
        write_tensor(p.dense, joined.dense, row * joined.k);
        row += p.n;
      }
      fused.parts.push_back(std::move(joined));
      return fused;
    }
    HostProjection joined;
    joined.base = parts.front().base;
    joined.joined_from = "'" + parts.front().base + "'";
    for (std::size_t i = 1; i < parts.size(); ++i) joined.joined_from += concat(", '", parts[i].base, "'");
    joined.joined_from += " (columns side by side, in that order)";
    joined.k = parts.front().k;
    joined.quantized = true;
    std::vector<const std::vector<float>*> scales;
    std::vector<const std::vector<std::int32_t>*> qweight, qzeros;
    for (const HostProjection& p : parts) {
      joined.n += p.n;
      scales.push_back(&p.scales);
      qweight.push_back(&p.qweight);
      qzeros.push_back(&p.qzeros);
    }
    const std::size_t groups = config_.gptq->groups(joined.k);
    joined.qweight = concat_columns(qweight, joined.k / 8);  // [k / 8, n]: side by side
    joined.qzeros = concat_columns(qzeros, groups);
    joined.scales = concat_columns(scales, groups);
    joined.g_idx = parts.front().g_idx;
    parts.clear();  // the host copies are no longer needed
    fused.parts.push_back(upload_projection(joined));
    return fused;
  }

  Backend& backend_;
  const ModelConfig& config_;
  const TensorSource& source_;
  const LoadOptions& options_;
  std::map<std::string, ExpectedTensor> expected_;        // outside the layers, by name
  std::map<std::string, ExpectedTensor> layer_expected_;  // a layer's, by suffix ("input_layernorm.weight")
  std::vector<std::string> layer_order_;                  // those suffixes in load order
  std::vector<std::string> outer_before_, outer_after_;   // the tensors outside the layers, in load order
  std::map<std::string, ProjectionShape> projections_;  // by suffix
  mutable std::vector<std::uint16_t> scratch_;          // write_tensor's host buffer, grown to the largest tensor
  // fuse_gate_up's joined rows, reused across layers: 2 * im * hidden halves
  // of host memory while loading (235 MB for llama3-8b, ~940 MB at 70B).
  mutable std::vector<std::uint16_t> interleaved_;
  mutable double backend_seconds_ = 0.0;  // in_backend's sum
};

}  // namespace

void make_rope_tables(const ModelConfig& config, std::size_t rows, std::vector<float>& cos, std::vector<float>& sin) {
  const std::size_t half = config.head_dim / 2;
  cos.assign(rows * half, 0.0f);
  sin.assign(rows * half, 0.0f);
  // validate() refuses these configs; checked again for one not validated,
  // whose NaN or infinite values would decode garbage silently.
  const std::vector<double> inv_freqs = checked_rope_inverse_frequencies(config, "make_rope_tables");
  const double scale = rope_attention_factor(config);
  for (std::size_t i = 0; i < half; ++i) {
    const double inv_freq = inv_freqs[i];
    for (std::size_t pos = 0; pos < rows; ++pos) {
      const double angle = static_cast<double>(pos) * inv_freq;
      cos[pos * half + i] = static_cast<float>(scale * std::cos(angle));
      sin[pos * half + i] = static_cast<float>(scale * std::sin(angle));
    }
  }
}

std::vector<float> read_checked(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                                const LoadOptions& options) {
  check_float_tensor(source, expected, config_dtype, options);
  return source.read_f32(expected.name);
}

void read_checked_half_into(const TensorSource& source, const ExpectedTensor& expected, DType config_dtype,
                            std::span<std::uint16_t> out, const LoadOptions& options) {
  check_float_tensor(source, expected, config_dtype, options);
  source.read_half_into(expected.name, config_dtype, out);
}

bool ModelWeights::has_gptq() const noexcept {
  for (const LayerWeights& l : layers) {
    for (const FusedProjection* f : {&l.qkv_proj, &l.gate_up_proj}) {
      for (const Projection& p : f->parts) {
        if (p.quantized()) return true;
      }
    }
    if (l.o_proj.quantized() || l.down_proj.quantized()) return true;
  }
  return false;
}

ModelWeights load_weights(Backend& backend, const ModelConfig& config, const TensorSource& source,
                          const LoadOptions& options) {
  config.validate("load_weights: config");
  if (options.rope_positions > config.max_position_embeddings) {
    fail(ErrorCode::InvalidArgument, "load_weights: LoadOptions::rope_positions = ", options.rope_positions,
         " exceeds max_position_embeddings = ", config.max_position_embeddings);
  }
  // More layers in the checkpoint than the config runs (a config cut to
  // fewer num_hidden_layers, or the wrong config.json): another model, so
  // refused rather than decoded with the first layers only.
  const std::string next_layer = layer_tensor_name(config.num_hidden_layers, "input_layernorm.weight");
  if (source.contains(next_layer)) {
    fail(ErrorCode::ShapeMismatch, "load_weights: tensor '", next_layer, "' (", source.describe(next_layer),
         ") exists, but the config has num_hidden_layers = ", config.num_hidden_layers, " (layers 0..",
         config.num_hidden_layers - 1, ")");
  }
  // And fewer (a config with more num_hidden_layers than the checkpoint):
  // named as such here, rather than as whichever tensor check_all misses first.
  const std::string last_layer = layer_tensor_name(config.num_hidden_layers - 1, "input_layernorm.weight");
  if (!source.contains(last_layer)) {
    fail(ErrorCode::ShapeMismatch, "load_weights: the config has num_hidden_layers = ", config.num_hidden_layers,
         ", but the checkpoint has no tensor '", last_layer, "' (", source.describe(last_layer), ")");
  }
  // Per-head q / k norms in a checkpoint whose config runs none (a Qwen3
  // checkpoint under a Llama config): decoding without them would run
  // another model, so refused rather than left unread.
  if (!config.has_qk_norm()) {
    for (const char* suffix : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}) {
      const std::string name = layer_tensor_name(0, suffix);
      if (source.contains(name)) {
        fail(ErrorCode::ShapeMismatch, "load_weights: tensor '", name, "' (", source.describe(name),
             ") exists, but the config's architecture (", to_string(config.architecture),
             ") has no per-head q / k norm: is config.json's \"architectures\" right?");
      }
    }
  }
  const WeightLoader loader(backend, config, source, options);
  loader.check_all();
  ModelWeights w;
  w.config = config;
  w.embed_tokens = loader.upload("model.embed_tokens.weight");
  for (std::size_t i = 0; i < config.num_hidden_layers; ++i) w.layers.push_back(loader.layer(i));
  w.final_norm = loader.upload("model.norm.weight");
  if (!config.tie_word_embeddings) w.lm_head = loader.upload("lm_head.weight");
  std::vector<float> cos, sin;
  make_rope_tables(config, options.rope_positions != 0 ? options.rope_positions : config.max_position_embeddings, cos,
                   sin);
  w.rope_cos = loader.in_backend([&] { return backend.upload(cos, DType::F32); });
  w.rope_sin = loader.in_backend([&] { return backend.upload(sin, DType::F32); });
  w.backend_load_seconds = loader.backend_seconds();
  return w;
}

ModelWeights load_checkpoint(Backend& backend, const std::filesystem::path& dir, const LoadOptions& options) {
  const ModelConfig config = load_checkpoint_config(dir);
  const CheckpointDirectory source(dir);
  return load_weights(backend, config, source, options);
}

ModelWeights random_weights(Backend& backend, const ModelConfig& config, std::uint64_t seed,
                            const LoadOptions& options) {
  const RandomTensorSource source(config, seed);
  return load_weights(backend, config, source, options);
}

}  // namespace ferrum::engine
