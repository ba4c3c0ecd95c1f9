#include "safetensors.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "checkpoint_file.hpp"
#include "engine_error.hpp"
#include "json_text.hpp"

namespace ferrum::engine {

namespace {

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB.
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;
// The most items an array of the header may hold (shape's rank; data_offsets
// has 2).
constexpr std::size_t kMaxHeaderArrayItems = 64;

struct DTypeName {
  SafetensorsDType dtype;
  const char* text;
  std::size_t size;
};
constexpr std::array<DTypeName, 15> kDTypeNames{{
    {SafetensorsDType::F64, "F64", 8},      {SafetensorsDType::F32, "F32", 4},
    {SafetensorsDType::F16, "F16", 2},      {SafetensorsDType::BF16, "BF16", 2},
    {SafetensorsDType::I64, "I64", 8},      {SafetensorsDType::I32, "I32", 4},
    {SafetensorsDType::I16, "I16", 2},      {SafetensorsDType::I8, "I8", 1},
    {SafetensorsDType::U64, "U64", 8},      {SafetensorsDType::U32, "U32", 4},
    {SafetensorsDType::U16, "U16", 2},      {SafetensorsDType::U8, "U8", 1},
    {SafetensorsDType::Bool, "BOOL", 1},    {SafetensorsDType::F8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::F8E5M2, "F8_E5M2", 1},
}};

std::string where(const std::filesystem::path& path) { return concat("safetensors file '", path.string(), "'"); }

std::string where(const std::filesystem::path& path, const std::string& tensor) {
  return concat(where(path), ", tensor '", tensor, "'");
}

std::uint64_t read_u64_le(const unsigned char* bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// A JSON number that is a non-negative integer, or an error naming `what`.
std::size_t json_size(const Json& value, const std::string& what) {
  if (!value.is_number_unsigned()) {
    fail(ErrorCode::InvalidArgument, what, " must be a non-negative integer, got ", describe_json(value));
  }
  return value.get<std::size_t>();
}

SafetensorsTensorInfo parse_tensor_entry(const std::filesystem::path& path, const std::string& name,
                                         const Json& entry) {
  const std::string here = where(path, name);
  if (!entry.is_object()) {
    fail(ErrorCode::InvalidArgument, here, ": header entry must be an object, got ", describe_json(entry));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail(ErrorCode::InvalidArgument, here, ": header entry has no \"", key, "\"");
  }
  SafetensorsTensorInfo info;
  info.name = name;
  if (!entry["dtype"].is_string()) fail(ErrorCode::InvalidArgument, here, ": \"dtype\" must be a string");
  info.dtype = parse_safetensors_dtype(entry["dtype"].get<std::string>(), here);
  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    fail(ErrorCode::InvalidArgument, here, ": \"shape\" must be an array, got ", describe_json(shape));
  }
  for (const Json& dim : shape) info.shape.push_back(json_size(dim, here + ": each \"shape\" entry"));
  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(ErrorCode::InvalidArgument, here, ": \"data_offsets\" must be [begin, end], got ", describe_json(offsets));
  }
  info.begin = json_size(offsets[0], here + ": data_offsets[0]");
  info.end = json_size(offsets[1], here + ": data_offsets[1]");
  if (info.end < info.begin) {
    fail(ErrorCode::InvalidArgument, here, ": data_offsets [", info.begin, ", ", info.end, "] end before they begin");
  }
  // numel × element size, refusing overflow.
  std::size_t expected = element_size(info.dtype);
  for (std::size_t dim : info.shape) {
    if (dim != 0 && expected > std::numeric_limits<std::size_t>::max() / dim) {
      fail(ErrorCode::ShapeMismatch, here, ": shape ", shape_to_string(info.shape), " overflows the byte size");
    }
    expected *= dim;
  }
  if (info.nbytes() != expected) {
    fail(ErrorCode::ShapeMismatch, here, ": data_offsets [", info.begin, ", ", info.end, "] hold ", info.nbytes(),
         " bytes, but dtype ", to_string(info.dtype), " with shape ", shape_to_string(info.shape), " needs ", expected);
  }
  return info;
}

// Tensors must tile [0, data_bytes) exactly.
void check_layout(const std::filesystem::path& path, const std::map<std::string, SafetensorsTensorInfo>& tensors,
                  std::uint64_t data_bytes) {
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& [name, info] : tensors) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::size_t covered = 0;
  const SafetensorsTensorInfo* previous = nullptr;
  for (const SafetensorsTensorInfo* info : by_offset) {
    if (info->end > data_bytes) {
      fail(ErrorCode::InvalidArgument, where(path, info->name), ": data_offsets [", info->begin, ", ", info->end,
           "] run past the data section (", data_bytes, " bytes): the file is truncated");
    }
    if (info->begin < covered) {
      fail(ErrorCode::InvalidArgument, where(path, info->name), ": data_offsets [", info->begin, ", ", info->end,
           "] overlap tensor '", previous->name, "' [", previous->begin, ", ", previous->end, "]");
    }
    if (info->begin > covered) {
      fail(ErrorCode::InvalidArgument, where(path, info->name), ": data_offsets begin at ", info->begin,
           " leaving a hole after byte ", covered, " of the data section");
    }
    covered = info->end;
    previous = info;
  }
  if (covered != data_bytes) {
    fail(ErrorCode::InvalidArgument, where(path), ": the tensors cover ", covered, " bytes of the ", data_bytes,
         "-byte data section (trailing bytes)");
  }
}

// The header's structural checks, made on the parse's events in O(1)
// each; the DOM is built afterwards by a plain parse. (nlohmann's callback
// parser, which made them before, rescans the parent object at every
// object's end: O(N^2) in the entries, minutes for a 5 MB header and hours
// for one at the 100 MB limit.)
//
// A key given twice: nlohmann keeps the last one silently (an F32 tensor
// could become I32, or an entry's "dtype" another dtype), so the guard
// notes the first repeated tensor name and the first repeated field of an
// entry. And it stops at the first container a header cannot hold (an
// object below an entry, an array outside one, an array longer than any
// shape), before a nested or flat run of them fills memory: the header is
// the root object (depth 0), its entries (objects at depth 1) and their
// shape and data_offsets (arrays at depth 2 of numbers at depth 3). Depth
// is the number of containers open around the event.
class HeaderGuard final : public nlohmann::json_sax<Json> {
 public:
  explicit HeaderGuard(const std::filesystem::path& path) : path_(path) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(Json::number_integer_t) override { return value(); }
  bool number_unsigned(Json::number_unsigned_t) override { return value(); }
  bool number_float(Json::number_float_t, const Json::string_t&) override { return value(); }
  bool string(Json::string_t&) override { return value(); }
  bool binary(Json::binary_t&) override { return value(); }

  bool start_object(std::size_t) override {
    if (depth_ == 1) {
      fields_.clear();
    } else if (depth_ > 1) {
      fail(ErrorCode::InvalidArgument, at(), ": the header nests an object at depth ", depth_,
           " (an entry holds strings and arrays of numbers)");
    }
    ++depth_;
    return true;
  }
  bool key(Json::string_t& name) override {
    if (depth_ == 1) {
      entry_name_ = name;
      if (repeated_.empty() && !names_.insert(entry_name_).second) repeated_ = entry_name_;
    } else if (depth_ == 2) {
      field_name_ = name;
      // (__metadata__ is free text: a repeated key there, as in the
      // reference reader, keeps its last value.)
      if (repeated_field_.empty() && entry_name_ != "__metadata__" && !fields_.insert(field_name_).second) {
        repeated_field_ = concat("'", entry_name_, "' field \"", field_name_, "\"");
      }
    }
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 0) fail(ErrorCode::InvalidArgument, where(path_), ": the header must be a JSON object, not an array");
    if (depth_ != 2) {
      fail(ErrorCode::InvalidArgument, at(), ": the header holds an array at depth ", depth_,
           " (only an entry's fields are arrays)");
    }
    array_items_ = 0;
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(ErrorCode::InvalidArgument, where(path_), ": the header is not valid JSON (", e.what(), ")");
  }

  // After a complete parse: a tensor name or an entry's field given twice.
  void check_repeats() const {
    if (!repeated_.empty()) {
      fail(ErrorCode::InvalidArgument, where(path_, repeated_), ": the header names it more than once");
    }
    if (!repeated_field_.empty()) {
      fail(ErrorCode::InvalidArgument, where(path_), ": the header gives ", repeated_field_, " more than once");
    }
  }

 private:
  std::string at() const { return entry_name_.empty() ? where(path_) : where(path_, entry_name_); }

  bool value() {
    if (depth_ == 3 && ++array_items_ > kMaxHeaderArrayItems) {
      fail(ErrorCode::InvalidArgument, at(), ": its \"", field_name_, "\" runs past ", kMaxHeaderArrayItems,
           " items (no shape has that many dimensions)");
    }
    return true;
  }

  const std::filesystem::path& path_;
  std::size_t depth_ = 0;
  std::unordered_set<std::string> names_, fields_;
  std::string repeated_, repeated_field_, entry_name_, field_name_;
  std::size_t array_items_ = 0;
};

}  // namespace

std::size_t element_size(SafetensorsDType dtype) noexcept {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.size;
  }
  return 0;
}

std::string to_string(SafetensorsDType dtype) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.text;
  }
  return "?";
}

SafetensorsDType parse_safetensors_dtype(const std::string& text, const std::string& context) {
  for (const DTypeName& entry : kDTypeNames) {
    if (text == entry.text) return entry.dtype;
  }
  fail(ErrorCode::InvalidArgument, context, ": unknown dtype \"", text,
       "\" (known: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2)");
}

std::size_t SafetensorsTensorInfo::numel() const noexcept {
  std::size_t n = 1;
  for (std::size_t dim : shape) n *= dim;
  return n;
}

std::string shape_to_string(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  // Before opening it as a stream: a directory opens as one with no size to
  // seek to, and opening a FIFO blocks until a writer comes.
  check_regular_file(path, where(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::InvalidArgument, where(path), ": cannot open it for reading");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0);
  if (!in || end < 0) fail(ErrorCode::InvalidArgument, where(path), ": cannot find its size");
  const auto file_bytes = static_cast<std::uint64_t>(end);
  if (file_bytes < 8) {
    fail(ErrorCode::InvalidArgument, where(path), ": ", file_bytes,
         " bytes is too short for the 8-byte header length: the file is truncated");
  }
  unsigned char length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  if (!in) fail(ErrorCode::InvalidArgument, where(path), ": cannot read the 8-byte header length");
  const std::uint64_t header_bytes = read_u64_le(length_bytes);
  if (header_bytes > kMaxHeaderBytes) {
    fail(ErrorCode::InvalidArgument, where(path), ": header length ", header_bytes, " exceeds the ", kMaxHeaderBytes,
         "-byte limit (not a safetensors file?)");
  }
  if (header_bytes > file_bytes - 8) {
    fail(ErrorCode::InvalidArgument, where(path), ": header length ", header_bytes, " runs past the end of the file (",
         file_bytes, " bytes): the file is truncated");
  }
  std::string header(header_bytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) fail(ErrorCode::InvalidArgument, where(path), ": reading the ", header_bytes, "-byte header failed");

  // nlohmann's lexer takes a NUL byte for the end of the input, so
  // `{...}\0anything` would parse; the reference reader refuses any byte
  // after the JSON but its whitespace (the format pads with spaces), and
  // a NUL inside a JSON string is invalid anyway.
  if (const std::size_t nul = header.find('\0'); nul != std::string::npos) {
    fail(ErrorCode::InvalidArgument, where(path), ": the header holds a NUL byte at offset ", nul,
         " (only spaces may pad the JSON)");
  }
  HeaderGuard guard(path);
  Json json;
  try {
    // The guard's pass first: it stops at the first container a header
    // cannot hold, before the DOM parse would build it.
    Json::sax_parse(header, &guard);
    guard.check_repeats();
    json = Json::parse(header);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past a double
    fail(ErrorCode::InvalidArgument, where(path), ": the header is not valid JSON (", e.what(), ")");
  }
  if (!json.is_object()) fail(ErrorCode::InvalidArgument, where(path), ": the header must be a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  file.data_start_ = 8 + header_bytes;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(ErrorCode::InvalidArgument, where(path), ": \"__metadata__\" must be an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          fail(ErrorCode::InvalidArgument, where(path), ": \"__metadata__\" value of '", key, "' must be a string");
        }
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    file.tensors_.emplace(name, parse_tensor_entry(path, name, entry));
  }
  check_layout(path, file.tensors_, file_bytes - file.data_start_);
  return file;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    fail(ErrorCode::InvalidArgument, where(path_, name), ": no such tensor (the file holds ", tensors_.size(),
         " tensors)");
  }
  return it->second;
}

std::vector<std::uint8_t> SafetensorsFile::read_bytes(const std::string& name) const {
  std::vector<std::uint8_t> bytes(info(name).nbytes());
  read_bytes_into(name, bytes);
  return bytes;
}

void SafetensorsFile::read_bytes_into(const std::string& name, std::span<std::uint8_t> out) const {
  const SafetensorsTensorInfo& tensor = info(name);
  if (out.size() != tensor.nbytes()) {
    fail(ErrorCode::InvalidArgument, where(path_, name), ": destination holds ", out.size(), " bytes, the tensor ",
         tensor.nbytes());
  }
  // Reopened by name: checked again (a FIFO put in its place would block).
  check_regular_file(path_, where(path_, name));
  std::ifstream in(path_, std::ios::binary);
  if (!in) fail(ErrorCode::InvalidArgument, where(path_, name), ": cannot reopen the file for reading");
  in.seekg(static_cast<std::streamoff>(data_start_ + tensor.begin));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!in) {
    fail(ErrorCode::InvalidArgument, where(path_, name), ": reading ", out.size(),
         " bytes failed (the file changed since it was opened?)");
  }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsTensorInfo& tensor = info(name);
  if (tensor.dtype != SafetensorsDType::F16 && tensor.dtype != SafetensorsDType::BF16 &&
      tensor.dtype != SafetensorsDType::F32) {
    fail(ErrorCode::DTypeMismatch, where(path_, name), ": dtype ", to_string(tensor.dtype),
         " cannot be read as floats (F16, BF16 or F32 expected)");
  }
  const std::vector<std::uint8_t> bytes = read_bytes(name);
  std::vector<float> values(tensor.numel());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint8_t* p = bytes.data() + i * element_size(tensor.dtype);
    if (tensor.dtype == SafetensorsDType::F32) {
      values[i] = bits_to_f32(static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                              static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    } else {
      const auto half = static_cast<std::uint16_t>(p[0] | p[1] << 8);
      values[i] = tensor.dtype == SafetensorsDType::F16 ? f16_to_f32(half) : bf16_to_f32(half);
    }
  }
  return values;
}

std::vector<std::int32_t> SafetensorsFile::read_i32(const std::string& name) const {
  const SafetensorsTensorInfo& tensor = info(name);
  if (tensor.dtype != SafetensorsDType::I32) {
    fail(ErrorCode::DTypeMismatch, where(path_, name), ": dtype ", to_string(tensor.dtype),
         " cannot be read as int32 (I32 expected)");
  }
  const std::vector<std::uint8_t> bytes = read_bytes(name);
  std::vector<std::int32_t> values(tensor.numel());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint8_t* p = bytes.data() + i * 4;
    values[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                                          static_cast<std::uint32_t>(p[2]) << 16 |
                                          static_cast<std::uint32_t>(p[3]) << 24);
  }
  return values;
}

SafetensorsWriteTensor make_write_tensor(std::string name, std::vector<std::size_t> shape,
                                         const std::vector<std::int32_t>& values) {
  SafetensorsWriteTensor tensor{std::move(name), SafetensorsDType::I32, std::move(shape), {}};
  std::size_t numel = 1;
  for (std::size_t dim : tensor.shape) numel *= dim;
  if (values.size() != numel) {
    fail(ErrorCode::ShapeMismatch, "make_write_tensor: tensor '", tensor.name, "' has ", values.size(),
         " values but shape ", shape_to_string(tensor.shape), " holds ", numel);
  }
  tensor.data.resize(numel * 4);
  for (std::size_t i = 0; i < numel; ++i) {
    const auto bits = static_cast<std::uint32_t>(values[i]);
    for (int b = 0; b < 4; ++b) tensor.data[i * 4 + b] = static_cast<std::uint8_t>(bits >> (8 * b));
  }
  return tensor;
}

SafetensorsWriteTensor make_write_tensor(std::string name, SafetensorsDType dtype, std::vector<std::size_t> shape,
                                         const std::vector<float>& values) {
  SafetensorsWriteTensor tensor{std::move(name), dtype, std::move(shape), {}};
  std::size_t numel = 1;
  for (std::size_t dim : tensor.shape) numel *= dim;
  if (values.size() != numel) {
    fail(ErrorCode::ShapeMismatch, "make_write_tensor: tensor '", tensor.name, "' has ", values.size(),
         " values but shape ", shape_to_string(tensor.shape), " holds ", numel);
  }
  if (dtype != SafetensorsDType::F16 && dtype != SafetensorsDType::BF16 && dtype != SafetensorsDType::F32) {
    fail(ErrorCode::DTypeMismatch, "make_write_tensor: tensor '", tensor.name, "': dtype ", to_string(dtype),
         " is not F16, BF16 or F32");
  }
  tensor.data.resize(numel * element_size(dtype));
  for (std::size_t i = 0; i < numel; ++i) {
    std::uint8_t* p = tensor.data.data() + i * element_size(dtype);
    if (dtype == SafetensorsDType::F32) {
      const std::uint32_t bits = f32_to_bits(values[i]);
      for (int b = 0; b < 4; ++b) p[b] = static_cast<std::uint8_t>(bits >> (8 * b));
    } else {
      const std::uint16_t bits = dtype == SafetensorsDType::F16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      p[0] = static_cast<std::uint8_t>(bits);
      p[1] = static_cast<std::uint8_t>(bits >> 8);
    }
  }
  return tensor;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const SafetensorsWriteTensor& tensor : tensors) {
    std::size_t numel = 1;
    for (std::size_t dim : tensor.shape) numel *= dim;
    if (tensor.data.size() != numel * element_size(tensor.dtype)) {
      fail(ErrorCode::ShapeMismatch, "write_safetensors: ", where(path, tensor.name), ": ", tensor.data.size(),
           " data bytes, but dtype ", to_string(tensor.dtype), " with shape ", shape_to_string(tensor.shape),
           " needs ", numel * element_size(tensor.dtype));
    }
    if (header.contains(tensor.name)) {
      fail(ErrorCode::InvalidArgument, "write_safetensors: ", where(path, tensor.name), ": duplicate tensor name");
    }
    header[tensor.name] = {{"dtype", to_string(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(ErrorCode::InvalidArgument, "write_safetensors: ", where(path), ": cannot open it for writing");
  unsigned char length_bytes[8];
  for (int b = 0; b < 8; ++b) length_bytes[b] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * b));
  out.write(reinterpret_cast<const char*>(length_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const SafetensorsWriteTensor& tensor : tensors) {
    out.write(reinterpret_cast<const char*>(tensor.data.data()), static_cast<std::streamsize>(tensor.data.size()));
  }
  if (!out) fail(ErrorCode::InvalidArgument, "write_safetensors: ", where(path), ": writing failed");
}

}  // namespace ferrum::engine
