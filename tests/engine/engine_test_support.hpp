// Helpers for the engine tests: scratch directories under the build tree,
// raw safetensors files (for the error cases), tiny checkpoints on disk
// (dense and GPTQ), and the logits tolerance of the decoder tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ferrum/ferrum.hpp>

#include "support/tolerance.hpp"

#include "decoder.hpp"
#include "model_config.hpp"
#include "safetensors.hpp"
#include "tensor_source.hpp"
#include "weights.hpp"

namespace ferrum::engine::testing {

// Logits against the fp64 model: every element within
// test::engine_logit_tolerance(dtype) (tests/support/tolerance.hpp, where
// its size is measured and argued) at scale test::op_scale::logits(want).
// GPTQ models use the same entry: the reference runs on the exactly
// dequantized weights, so quantization adds no error of its own.
struct LogitCheck {
  double worst = 0.0;         // max over elements of |got - want| / bound (<= 1 passes)
  std::size_t worst_index = 0;
  std::size_t outside = 0;    // elements over their bound (or NaN)
};
// Element i's bound: atol · rms(want) + rtol · |want[i]|.
double logit_bound(const std::vector<double>& want, std::size_t i, DType dtype);
LogitCheck check_logits(const std::vector<float>& got, const std::vector<double>& want, DType dtype);
// check_logits, adding a failure that names `where` (a position or step),
// the worst element (index, got, want, bound) and how many are outside.
LogitCheck expect_logits_near(const std::vector<float>& got, const std::vector<double>& want, DType dtype,
                              const std::string& where);

double max_abs(const std::vector<double>& v);
double max_diff(const std::vector<float>& a, const std::vector<double>& b);

// A fresh, empty directory for the running test, under the build tree.
std::filesystem::path scratch_dir();

// An 8-byte little-endian length, then `header`, then `data`; `header_length`
// overrides the length field (to fake truncation).
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::uint8_t>& data, std::uint64_t header_length);
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::uint8_t>& data);

// `preset` (tiny-llama or tiny-qwen3) resized for the CUDA backend's
// attention (head_dim 64; 4 / 2 heads, hidden 256).
ModelConfig gpu_shaped_config(const std::string& preset);
// gpu_shaped_config("tiny-llama"): the model of the GPU decoder tests.
ModelConfig gpu_tiny_llama_config();

// A Hugging Face style config.json for `config` (with a "quantization_config"
// when config.gptq is set).
std::string config_json(const ModelConfig& config);

// The safetensors tensor of `expected` read from `source`: floats as `dtype`
// (GPTQ scales always F16, as exports store them), I32 tensors as I32.
SafetensorsWriteTensor write_tensor_from(const TensorSource& source, const ExpectedTensor& expected,
                                         SafetensorsDType dtype);

// Writes config.json and every tensor of `source` the config needs, as
// `dtype`, split over `shards` *.safetensors files. A GPTQ g_idx the source
// lacks is left out (as some exports do).
void write_checkpoint(const std::filesystem::path& dir, const ModelConfig& config, const TensorSource& source,
                      SafetensorsDType dtype, std::size_t shards);

// Device-state decoding (the op sequence a captured graph replays, run op
// by op) gives bit-identical logits to eager decoding: prefill `prompt`,
// then `steps` greedy steps, in a cache of `capacity` positions.
void expect_device_state_equals_eager(Backend& be, const ModelWeights& weights,
                                      const std::vector<std::int32_t>& prompt, std::size_t capacity,
                                      std::size_t steps);

// Prefill `prompt`, then `steps` greedy steps in `mode` (a cache of 64
// positions): every step's logits within the engine tolerance of the fp64
// reference (NaiveDecoder) on `reference_weights`, and the same tokens (a
// step where the reference's top two are closer than their bounds may pick
// either; the sequence then follows the engine's choice), at least
// `min_exact` steps exactly. Returns the generated tokens.
std::vector<std::int32_t> expect_decodes_like_reference(Backend& be, const ModelWeights& weights,
                                                        const TensorSource& reference_weights,
                                                        const std::vector<std::int32_t>& prompt, std::size_t steps,
                                                        std::size_t min_exact, DecodeMode mode,
                                                        const DecoderOptions& options = {});

// ── GPTQ ─────────────────────────────────────────────────────────────────

// How GptqTestSource quantizes.
struct GptqTestOptions {
  bool symmetric = true;  // true zero 8 everywhere; else random zeros the format can hold
  // Act-order: g_idx is a seeded permutation of row / group_size (every group
  // keeps group_size rows, as GPTQ exports do). q, k and v share one
  // permutation (one Hessian, as in AutoGPTQ), gate and up share one unless
  // split_gate_up, o and down have their own.
  bool act_order = false;
  bool split_gate_up = false;
  bool write_g_idx = true;  // false: no g_idx tensors (only without act-order)
};

// A GPTQ model's tensors: the projections as random 4-bit values (all 16
// codes), zeros and F16 scales packed the way AutoGPTQ exports them (config.gptq
// says group size and zero format), everything else from RandomTensorSource.
// The packing is written here from the format description, independently of
// the engine and of the library.
class GptqTestSource final : public TensorSource {
 public:
  GptqTestSource(const ModelConfig& config, std::uint64_t seed, GptqTestOptions options = {});

  bool contains(const std::string& name) const override;
  TensorMeta meta(const std::string& name) const override;
  std::vector<float> read_f32(const std::string& name) const override;
  std::vector<std::int32_t> read_i32(const std::string& name) const override;
  std::string describe(const std::string& name) const override;

 private:
  struct Packed {
    std::vector<std::int32_t> qweight, qzeros, g_idx;
    std::vector<float> scales;
  };
  // The packed tensors of projection `base` ("model.layers.0.mlp.up_proj"), or null.
  const Packed* projection(const std::string& name, std::string* suffix) const;

  ModelConfig config_;
  RandomTensorSource dense_;
  std::map<std::string, Packed> projections_;  // by base name
};

// A dense view of a GPTQ source: `<projection>.weight` [n, k] is
//   W[n][k] = (q(k, n) - zero(g_idx[k], n)) · scales[g_idx[k]][n]
// unpacked here from the source's qweight / qzeros / scales / g_idx (a missing
// g_idx means k / group_size); every other tensor comes from the source as is.
// The fp64 NaiveDecoder on this source is the oracle of GPTQ decoding.
class DequantizedSource final : public TensorSource {
 public:
  DequantizedSource(const ModelConfig& config, const TensorSource& gptq);

  bool contains(const std::string& name) const override;
  TensorMeta meta(const std::string& name) const override;
  std::vector<float> read_f32(const std::string& name) const override;
  std::vector<std::int32_t> read_i32(const std::string& name) const override { return gptq_.read_i32(name); }
  std::string describe(const std::string& name) const override { return "dequantized " + gptq_.describe(name); }

 private:
  const ProjectionShape* projection_of(const std::string& name) const;

  ModelConfig config_;
  const TensorSource& gptq_;
  std::vector<ProjectionShape> shapes_;
};

// Random edits of `bytes` for the parsers' fuzz tests: 1..4 of overwriting a
// byte (with JSON punctuation, digits and letters, or any value), inserting
// one, deleting one, or cutting the rest off.
template <class Bytes>
void mutate_for_fuzz(Bytes& bytes, std::mt19937_64& rng) {
  static constexpr char kAlphabet[] = "{}[]\":,0123456789-+.eE nulltruefalseF16BF32I64\\";
  const auto pick = [&] { return kAlphabet[rng() % (sizeof(kAlphabet) - 1)]; };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !bytes.empty(); ++e) {
    const std::size_t pos = rng() % bytes.size();
    switch (rng() % 5) {
      case 0: bytes[pos] = static_cast<char>(rng()); break;
      case 1: bytes[pos] = pick(); break;
      case 2: bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(pos), pick()); break;
      case 3: bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(pos)); break;
      default: bytes.resize(pos); break;
    }
  }
}

// Expects `statement` to throw ferrum::Error with `code` and a message
// containing every one of `needles`.
#define EXPECT_ENGINE_ERROR(statement, expected_code, ...)                                          \
  do {                                                                                              \
    try {                                                                                           \
      statement;                                                                                    \
      ADD_FAILURE() << "expected ferrum::Error from " #statement;                                   \
    } catch (const ::ferrum::Error& e) {                                                            \
      EXPECT_EQ(e.code(), expected_code) << e.what();                                               \
      for (const std::string& needle : std::vector<std::string>{__VA_ARGS__}) {                     \
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)                            \
            << "message lacks '" << needle << "': " << e.what();                                    \
      }                                                                                             \
    }                                                                                               \
  } while (0)

}  // namespace ferrum::engine::testing
