// Helpers for the engine tests: scratch directories under the build tree,
// raw safetensors files (for the error cases), tiny checkpoints on disk.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ferrum/ferrum.hpp>

#include "model_config.hpp"
#include "safetensors.hpp"
#include "tensor_source.hpp"

namespace ferrum::engine::testing {

// A fresh, empty directory for the running test, under the build tree.
std::filesystem::path scratch_dir();

// An 8-byte little-endian length, then `header`, then `data`; `header_length`
// overrides the length field (to fake truncation).
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::uint8_t>& data, std::uint64_t header_length);
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           const std::vector<std::uint8_t>& data);

// A Hugging Face style config.json for `config`.
std::string config_json(const ModelConfig& config);

// Writes config.json and every tensor of `source` the config needs, as
// `dtype`, split over `shards` *.safetensors files.
void write_checkpoint(const std::filesystem::path& dir, const ModelConfig& config, const TensorSource& source,
                      SafetensorsDType dtype, std::size_t shards);

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
