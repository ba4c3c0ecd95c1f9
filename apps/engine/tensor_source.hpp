// Where a model's tensors come from, by Hugging Face name: a checkpoint
// directory of *.safetensors files, or seeded random values for a config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "checkpoint_layout.hpp"
#include "model_config.hpp"
#include "safetensors.hpp"

namespace ferrum::engine {

struct TensorMeta {
  SafetensorsDType dtype = SafetensorsDType::F32;
  std::vector<std::size_t> shape;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  // These throw InvalidArgument naming the source and the tensor when absent.
  virtual TensorMeta meta(const std::string& name) const = 0;
  // Float tensors (F16 / BF16 / F32) as f32; DTypeMismatch for other dtypes.
  virtual std::vector<float> read_f32(const std::string& name) const = 0;
  // I32 tensors (GPTQ qweight / qzeros / g_idx); DTypeMismatch for other dtypes.
  virtual std::vector<std::int32_t> read_i32(const std::string& name) const = 0;
  // Float tensors encoded as `dtype` (F16 or BF16) bit patterns into `out`
  // (exactly numel elements, InvalidArgument otherwise), ready for
  // Backend::write_bytes: what the weight upload uses, so a 16 GB model never
  // passes through f32 nor through a fresh buffer per tensor. The default
  // encodes read_f32's values on every core; sources that hold the bits
  // already copy them as they are.
  virtual void read_half_into(const std::string& name, DType dtype, std::span<std::uint16_t> out) const;
  // read_half_into a new vector sized from meta(name).
  std::vector<std::uint16_t> read_half(const std::string& name, DType dtype) const;
  // "checkpoint '/dir' (file 'x.safetensors')": where a tensor lives, for messages.
  virtual std::string describe(const std::string& name) const = 0;
};

// Every *.safetensors file of a directory (sharded checkpoints included).
class CheckpointDirectory final : public TensorSource {
 public:
  // Throws InvalidArgument when the directory has no *.safetensors file or
  // two files hold the same tensor name.
  explicit CheckpointDirectory(const std::filesystem::path& dir);

  bool contains(const std::string& name) const override { return owner_.count(name) != 0; }
  TensorMeta meta(const std::string& name) const override;
  std::vector<float> read_f32(const std::string& name) const override;
  std::vector<std::int32_t> read_i32(const std::string& name) const override;
  // The stored bytes when the file's dtype is `dtype` (little-endian host).
  void read_half_into(const std::string& name, DType dtype, std::span<std::uint16_t> out) const override;
  std::string describe(const std::string& name) const override;
  const std::vector<SafetensorsFile>& files() const noexcept { return files_; }

 private:
  const SafetensorsFile& file_of(const std::string& name) const;

  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t> owner_;  // tensor name -> index into files_
};

// Seeded random weights for a config, every value already rounded to the
// config's dtype. Projections are scaled by sqrt(3 / fan_in) (unit-variance
// outputs for unit-variance inputs), norms are 1 ± 0.2, embeddings ±1, so
// activations and logits stay O(1). A tensor's values depend only on the
// seed and its name, so they can be regenerated one at a time.
//
// With config.gptq the projections are GPTQ tensors instead (what
// expected_tensors lists): uniform random 4-bit values, the stored zeros of a
// symmetric checkpoint (true zero 8), F16 scales of (0.75 .. 1.25) / sqrt(21.5 k)
// (E[(q - 8)²] = 21.5, so outputs again have unit variance), and g_idx = row / group.
class RandomTensorSource final : public TensorSource {
 public:
  RandomTensorSource(const ModelConfig& config, std::uint64_t seed);

  bool contains(const std::string& name) const override { return shapes_.count(name) != 0; }
  TensorMeta meta(const std::string& name) const override;
  std::vector<float> read_f32(const std::string& name) const override;
  std::vector<std::int32_t> read_i32(const std::string& name) const override;
  // Generated straight into `dtype` bits (the same values as read_f32).
  void read_half_into(const std::string& name, DType dtype, std::span<std::uint16_t> out) const override;
  std::string describe(const std::string& name) const override;

 private:
  const ExpectedTensor& tensor_of(const std::string& name) const;
  // The element count of float tensor `name` (DTypeMismatch for an I32 one).
  std::size_t float_numel(const std::string& name) const;
  // Calls store(i, x, rounding) for every element of float tensor `name`, on
  // every core: the element is x rounded to `rounding` (the config's dtype;
  // F16 for scales), which store does (once, in the dtype it writes).
  template <class Store>
  void generate_floats(const std::string& name, Store store) const;

  ModelConfig config_;
  std::uint64_t seed_;
  std::map<std::string, ExpectedTensor> shapes_;
};

}  // namespace ferrum::engine
