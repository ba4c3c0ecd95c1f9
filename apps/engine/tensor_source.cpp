#include "tensor_source.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_file.hpp"
#include "checkpoint_layout.hpp"
#include "engine_error.hpp"
#include "json_text.hpp"

namespace ferrum::engine {

namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Draw i (0-based) of splitmix64 seeded with `seed`: the generator's state
// only advances by kGolden, so any draw is computable on its own.
std::uint64_t splitmix64_at(std::uint64_t seed, std::uint64_t i) { return splitmix64_mix(seed + (i + 1) * kGolden); }

// fill(begin, end) over [0, count) on every core: a llama3-8b preset is
// 8e9 draws, minutes on one core. The split never changes a value (each is a
// function of its index), so the weights are the same on any machine.
template <class Fill>
void parallel_fill(std::size_t count, Fill fill) {
  constexpr std::size_t kMinPerThread = std::size_t{1} << 20;
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads = std::min(cores, std::max<std::size_t>(1, count / kMinPerThread));
  if (threads <= 1) {
    fill(std::size_t{0}, count);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t per = (count + threads - 1) / threads;
  for (std::size_t t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(count, t * per), end = std::min(count, begin + per);
    pool.emplace_back([=] { fill(begin, end); });
  }
  for (std::thread& th : pool) th.join();
}

std::uint64_t hash_name(const std::string& name) {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::uint16_t encode_half(DType dtype, float x) { return dtype == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x); }

float round_to(DType dtype, float x) {
  const std::uint16_t bits = encode_half(dtype, x);
  return dtype == DType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}

// The checks every read_half_into starts with: an F16 / BF16 request and a
// destination of exactly `numel` elements.
void check_half_request(const TensorSource& source, const std::string& name, DType dtype, std::size_t numel,
                        std::size_t out_size) {
  if (dtype != DType::F16 && dtype != DType::BF16) {
    fail(ErrorCode::DTypeMismatch, source.describe(name), ": tensor '", name, "' requested as ", to_string(dtype),
         "; read_half_into encodes F16 or BF16");
  }
  if (out_size != numel) {
    fail(ErrorCode::InvalidArgument, source.describe(name), ": tensor '", name, "' has ", numel,
         " elements but the destination holds ", out_size);
  }
}

std::size_t numel_of(const std::vector<std::size_t>& shape) {
  std::size_t numel = 1;
  for (std::size_t dim : shape) numel *= dim;
  return numel;
}

}  // namespace

// ── TensorSource ──────────────────────────────────────────────────────────

void TensorSource::read_half_into(const std::string& name, DType dtype, std::span<std::uint16_t> out) const {
  const std::vector<float> values = read_f32(name);
  check_half_request(*this, name, dtype, values.size(), out.size());
  // A finite value past the half type's range would become infinity (f16
  // tops out at 65504): refused, naming the first such element.
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::atomic<std::size_t> first_overflow{kNone};
  const std::uint16_t inf_bits = dtype == DType::F16 ? 0x7c00 : 0x7f80;
  parallel_fill(values.size(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      out[i] = encode_half(dtype, values[i]);
      if ((out[i] & 0x7fff) == inf_bits && std::isfinite(values[i])) {
        std::size_t seen = first_overflow.load(std::memory_order_relaxed);
        while (i < seen && !first_overflow.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
        }
        break;  // this share's first (the load fails, so the rest need not be written)
      }
    }
  });
  const std::size_t at = first_overflow.load();
  if (at != kNone) {
    fail(ErrorCode::DTypeMismatch, describe(name), ": tensor '", name, "' element ", at, " = ", values[at],
         " is past ", to_string(dtype), "'s range (it would load as infinity)");
  }
}

std::vector<std::uint16_t> TensorSource::read_half(const std::string& name, DType dtype) const {
  std::vector<std::uint16_t> bits(numel_of(meta(name).shape));
  read_half_into(name, dtype, bits);
  return bits;
}

// ── CheckpointDirectory ───────────────────────────────────────────────────

namespace {

// The shard index Hugging Face writes beside sharded checkpoints; its
// weight_map names each tensor's file. Bounded like config.json.
constexpr const char* kShardIndex = "model.safetensors.index.json";
constexpr std::uint64_t kMaxShardIndexBytes = std::uint64_t{64} << 20;

// Every tensor the index names lies in the file it names: a shard missing
// from the directory is named as such (else the first tensor the load needs
// from it would be "missing"), and a tensor found in another file than the
// index says is refused (a mixed-up or stale checkpoint).
void check_shard_index(const std::filesystem::path& dir, const std::filesystem::path& index_path,
                       const std::map<std::string, std::size_t>& owner,
                       const std::vector<SafetensorsFile>& files) {
  const std::string where = concat("checkpoint '", dir.string(), "': ", kShardIndex);
  const auto quoted = [](const std::string& text) { return describe_json(nlohmann::json(text)); };
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_regular_file(index_path, where, kMaxShardIndexBytes));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::InvalidArgument, where, " is not valid JSON (", e.what(), ")");
  }
  const auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || map == index.end() || !map->is_object()) {
    fail(ErrorCode::InvalidArgument, where, " has no \"weight_map\" object (", describe_json(index), ")");
  }
  for (const auto& [name, shard] : map->items()) {
    if (!shard.is_string()) {
      fail(ErrorCode::InvalidArgument, where, ": weight_map[", quoted(name), "] is ",
           describe_json(shard), ", not a file name");
    }
    const std::string file = shard.get<std::string>();
    const auto in = owner.find(name);
    if (in != owner.end() && files[in->second].path().filename().string() == file) continue;
    const bool listed = std::any_of(files.begin(), files.end(),
                                    [&](const SafetensorsFile& f) { return f.path().filename().string() == file; });
    if (!listed) {
      fail(ErrorCode::InvalidArgument, where, " puts tensor ", quoted(name), " in ", quoted(file),
           ", which is not a *.safetensors file of the directory (a missing shard?)");
    }
    fail(ErrorCode::InvalidArgument, where, " puts tensor ", quoted(name), " in ", quoted(file),
         in == owner.end() ? std::string(", which does not hold it")
                           : concat(", but it is in '", files[in->second].path().filename().string(), "'"));
  }
}

}  // namespace

CheckpointDirectory::CheckpointDirectory(const std::filesystem::path& dir) : dir_(dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    fail(ErrorCode::InvalidArgument, "checkpoint '", dir.string(), "': not a directory");
  }
  // The error_code forms: a filesystem error (an unreadable directory, a
  // symlink loop) is a named InvalidArgument, not an escaping
  // std::filesystem::filesystem_error.
  auto refuse = [&](const std::filesystem::path& what, const std::error_code& error) {
    fail(ErrorCode::InvalidArgument, "checkpoint '", dir.string(), "': cannot read '", what.string(), "' (",
         error.message(), ")");
  };
  std::vector<std::filesystem::path> paths;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) refuse(dir, ec);
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) refuse(dir, ec);
    if (it->path().extension() != ".safetensors") continue;
    const bool regular = it->is_regular_file(ec);
    if (ec) refuse(it->path(), ec);
    if (regular) paths.push_back(it->path());
  }
  if (ec) refuse(dir, ec);
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) fail(ErrorCode::InvalidArgument, "checkpoint '", dir.string(), "': no *.safetensors file");
  for (const auto& path : paths) {
    files_.push_back(SafetensorsFile::open(path));
    for (const auto& [name, info] : files_.back().tensors()) {
      const auto [it, inserted] = owner_.emplace(name, files_.size() - 1);
      if (!inserted) {
        fail(ErrorCode::InvalidArgument, "checkpoint '", dir.string(), "': tensor '", name, "' is in both '",
             files_[it->second].path().filename().string(), "' and '", path.filename().string(), "'");
      }
    }
  }
  const std::filesystem::path index = dir / kShardIndex;
  if (std::filesystem::exists(index, ec)) check_shard_index(dir, index, owner_, files_);
}

const SafetensorsFile& CheckpointDirectory::file_of(const std::string& name) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) {
    fail(ErrorCode::InvalidArgument, "checkpoint '", dir_.string(), "': missing tensor '", name, "' (", owner_.size(),
         " tensors in ", files_.size(), " file(s))");
  }
  return files_[it->second];
}

TensorMeta CheckpointDirectory::meta(const std::string& name) const {
  const SafetensorsTensorInfo& info = file_of(name).info(name);
  return {info.dtype, info.shape};
}

std::vector<float> CheckpointDirectory::read_f32(const std::string& name) const { return file_of(name).read_f32(name); }

std::vector<std::int32_t> CheckpointDirectory::read_i32(const std::string& name) const {
  return file_of(name).read_i32(name);
}

void CheckpointDirectory::read_half_into(const std::string& name, DType dtype, std::span<std::uint16_t> out) const {
  const SafetensorsFile& file = file_of(name);
  const SafetensorsTensorInfo& info = file.info(name);
  check_half_request(*this, name, dtype, info.numel(), out.size());
  if (info.dtype != (dtype == DType::F16 ? SafetensorsDType::F16 : SafetensorsDType::BF16)) {
    TensorSource::read_half_into(name, dtype, out);  // converted through f32
    return;
  }
  // Safetensors data is little-endian, as is every host we build for.
  static_assert(std::endian::native == std::endian::little, "read_half_into copies little-endian bytes as they are");
  file.read_bytes_into(name, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(out.data()), out.size_bytes()));
}

std::string CheckpointDirectory::describe(const std::string& name) const {
  const auto it = owner_.find(name);
  const std::string file = it == owner_.end() ? "" : concat(" (file '", files_[it->second].path().filename().string(), "')");
  return concat("checkpoint '", dir_.string(), "'", file);
}

// ── RandomTensorSource ────────────────────────────────────────────────────


RandomTensorSource::RandomTensorSource(const ModelConfig& config, std::uint64_t seed) : config_(config), seed_(seed) {
  for (ExpectedTensor& t : expected_tensors(config)) shapes_.emplace(t.name, std::move(t));
}

const ExpectedTensor& RandomTensorSource::tensor_of(const std::string& name) const {
  const auto it = shapes_.find(name);
  if (it == shapes_.end()) fail(ErrorCode::InvalidArgument, describe(name), ": no tensor '", name, "' in this model");
  return it->second;
}

TensorMeta RandomTensorSource::meta(const std::string& name) const {
  const ExpectedTensor& t = tensor_of(name);
  if (t.kind == TensorKind::Int32) return {SafetensorsDType::I32, t.shape};
  if (ends_with(name, ".scales")) return {SafetensorsDType::F16, t.shape};  // as GPTQ exports store them
  return {config_.dtype == DType::F16 ? SafetensorsDType::F16 : SafetensorsDType::BF16, t.shape};
}

std::size_t RandomTensorSource::float_numel(const std::string& name) const {
  const ExpectedTensor& t = tensor_of(name);
  if (t.kind != TensorKind::Float) {
    fail(ErrorCode::DTypeMismatch, describe(name), ": tensor '", name, "' is I32, not floats");
  }
  return numel_of(t.shape);
}

template <class Store>
void RandomTensorSource::generate_floats(const std::string& name, Store store) const {
  const ExpectedTensor& t = tensor_of(name);
  const std::size_t numel = float_numel(name);
  const std::uint64_t seed = seed_ ^ hash_name(name);
  auto unit = [seed](std::size_t i) {  // draw i as a double in [0, 1)
    return static_cast<double>(splitmix64_at(seed, i) >> 11) * 0x1.0p-53;
  };
  if (ends_with(name, ".scales")) {
    // k from the sibling qweight [k / 8, n].
    const std::string base = name.substr(0, name.size() - std::string(".scales").size());
    const double k = 8.0 * static_cast<double>(tensor_of(base + ".qweight").shape[0]);
    const double base_scale = 1.0 / std::sqrt(21.5 * k);
    parallel_fill(numel, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        store(i, static_cast<float>(base_scale * (0.75 + 0.5 * unit(i))), DType::F16);
      }
    });
    return;
  }
  // Norm weights: 1 + U(-0.2, 0.2). Embeddings: U(-1, 1).
  // Projections [n, k]: U(-a, a) with a = sqrt(3 / k), unit-variance outputs.
  float center = 0.0f;
  float half_width = 1.0f;
  if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight")) {
    center = 1.0f;
    half_width = 0.2f;
  } else if (name != "model.embed_tokens.weight") {
    half_width = static_cast<float>(std::sqrt(3.0 / static_cast<double>(t.shape.back())));
  }
  const DType dtype = config_.dtype;
  parallel_fill(numel, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      store(i, center + half_width * static_cast<float>(2.0 * unit(i) - 1.0), dtype);
    }
  });
}

std::vector<float> RandomTensorSource::read_f32(const std::string& name) const {
  std::vector<float> values(float_numel(name));
  generate_floats(name, [&values](std::size_t i, float x, DType rounding) { values[i] = round_to(rounding, x); });
  return values;
}

void RandomTensorSource::read_half_into(const std::string& name, DType dtype, std::span<std::uint16_t> out) const {
  check_half_request(*this, name, dtype, float_numel(name), out.size());
  // One conversion per value where the value's own dtype is the one asked
  // for (encode(round(x)) == encode(x)); two otherwise.
  generate_floats(name, [out, dtype](std::size_t i, float x, DType rounding) {
    out[i] = encode_half(dtype, rounding == dtype ? x : round_to(rounding, x));
  });
}

std::vector<std::int32_t> RandomTensorSource::read_i32(const std::string& name) const {
  const ExpectedTensor& t = tensor_of(name);
  if (t.kind != TensorKind::Int32 || !config_.gptq) {
    fail(ErrorCode::DTypeMismatch, describe(name), ": tensor '", name, "' is floats, not I32");
  }
  std::size_t numel = 1;
  for (std::size_t dim : t.shape) numel *= dim;
  std::vector<std::int32_t> values(numel);
  if (ends_with(name, ".qweight")) {
    // Every bit pattern is 8 valid 4-bit values: uniform words are uniform q.
    // Word i is the low (even i) or high (odd i) half of draw i / 2.
    const std::uint64_t seed = seed_ ^ hash_name(name);
    parallel_fill(numel, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const std::uint64_t bits = splitmix64_at(seed, i / 2);
        values[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(i % 2 == 0 ? bits : bits >> 32));
      }
    });
  } else if (ends_with(name, ".qzeros")) {
    // Symmetric: true zero 8, stored as 7 (v1 stores zero - 1) or 8 (v2) in every nibble.
    const std::uint32_t word = config_.gptq->zero_format == GptqZeroFormat::V1 ? 0x77777777u : 0x88888888u;
    std::fill(values.begin(), values.end(), static_cast<std::int32_t>(word));
  } else {  // g_idx: row / group (no act-order)
    const std::size_t group = config_.gptq->group_size < 0 ? numel : static_cast<std::size_t>(config_.gptq->group_size);
    for (std::size_t i = 0; i < numel; ++i) values[i] = static_cast<std::int32_t>(i / group);
  }
  return values;
}

std::string RandomTensorSource::describe(const std::string&) const {
  return concat("random weights (", to_string(config_.architecture), config_.gptq ? ", gptq" : "", ", seed ", seed_,
                ")");
}

}  // namespace ferrum::engine
