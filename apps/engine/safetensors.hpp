// safetensors reader and writer.
//
// File layout: an 8-byte little-endian u64 header length N, N bytes of JSON
// (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]},
// plus an optional "__metadata__" object of strings), then the data section.
// Offsets are relative to the start of the data section; the tensors must
// tile it exactly (no overlap, no hole, nothing past its end).
//
// Every problem becomes a ferrum::Error naming the file and the tensor:
//   InvalidArgument  truncated file, malformed JSON, unknown dtype string,
//                    missing tensor, offsets past the data section, overlap/hole
//   ShapeMismatch    data_offsets disagree with dtype size × product(shape)
//   DTypeMismatch    read_f32 of a tensor that is not F16/BF16/F32,
//                    read_i32 of a tensor that is not I32
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace ferrum::engine {

// The dtype strings of the safetensors format.
enum class SafetensorsDType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, Bool, F8E4M3, F8E5M2 };

std::size_t element_size(SafetensorsDType dtype) noexcept;
std::string to_string(SafetensorsDType dtype);
// Throws InvalidArgument naming `context` for an unknown string.
SafetensorsDType parse_safetensors_dtype(const std::string& text, const std::string& context);

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  std::vector<std::size_t> shape;
  std::size_t begin = 0;  // byte offsets into the data section
  std::size_t end = 0;

  std::size_t numel() const noexcept;
  std::size_t nbytes() const noexcept { return end - begin; }
};

std::string shape_to_string(const std::vector<std::size_t>& shape);

// One opened file: the header is parsed and validated at open; tensor data is
// read on demand with std::ifstream.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return path_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const std::map<std::string, SafetensorsTensorInfo>& tensors() const noexcept { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws InvalidArgument (naming the file and the tensor) when absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;

  // The tensor's bytes as stored (little-endian elements).
  std::vector<std::uint8_t> read_bytes(const std::string& name) const;
  // The same into `out`, which must hold exactly info(name).nbytes()
  // (InvalidArgument otherwise): no allocation per tensor.
  void read_bytes_into(const std::string& name, std::span<std::uint8_t> out) const;
  // F16 / BF16 / F32 tensors converted to f32; other dtypes throw DTypeMismatch.
  std::vector<float> read_f32(const std::string& name) const;
  // I32 tensors (GPTQ qweight / qzeros / g_idx); other dtypes throw DTypeMismatch.
  std::vector<std::int32_t> read_i32(const std::string& name) const;

 private:
  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, std::string> metadata_;
  std::map<std::string, SafetensorsTensorInfo> tensors_;
};

// A tensor to write: `data` holds numel × element_size bytes, little-endian.
struct SafetensorsWriteTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  std::vector<std::size_t> shape;
  std::vector<std::uint8_t> data;
};

// Encodes f32 values as F16 / BF16 / F32 (round to nearest even).
SafetensorsWriteTensor make_write_tensor(std::string name, SafetensorsDType dtype,
                                         std::vector<std::size_t> shape, const std::vector<float>& values);
// An I32 tensor (little-endian).
SafetensorsWriteTensor make_write_tensor(std::string name, std::vector<std::size_t> shape,
                                         const std::vector<std::int32_t>& values);

// Writes a valid file: tensors laid out in the given order, header padded
// with spaces to a multiple of 8 bytes (as the reference implementation does).
void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ferrum::engine
