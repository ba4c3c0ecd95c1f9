// libFuzzer harness: the engine's parsers on arbitrary bytes (scripts/fuzz.sh
// builds and runs it under ASan / UBSan). The first byte picks the parser,
// the rest is its input:
//   0  config.json: parse_model_config, then its RoPE tables
//   1  quantization_config: parse_gptq_config
//   2  a .safetensors file: SafetensorsFile::open, then every tensor (up to
//      1 MiB) read as bytes, as f32 and as i32
// Every input must parse or throw ferrum::Error; a crash, a sanitizer report
// or any other exception is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "model_config.hpp"
#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 3) {
      case 0: {
        const ferrum::engine::ModelConfig config = ferrum::engine::parse_model_config(text, "fuzz");
        (void)ferrum::engine::checked_rope_inverse_frequencies(config, "fuzz");
        (void)ferrum::engine::rope_attention_factor(config);
        break;
      }
      case 1:
        (void)ferrum::engine::parse_gptq_config(text, "fuzz");
        break;
      default: {
        // SafetensorsFile reads a path: one file per process, rewritten per input.
        static const std::string path = "/tmp/ferrum_fuzz_" + std::to_string(getpid()) + ".safetensors";
        {
          std::ofstream file(path, std::ios::binary | std::ios::trunc);
          file.write(text.data(), static_cast<std::streamsize>(text.size()));
        }
        const ferrum::engine::SafetensorsFile file = ferrum::engine::SafetensorsFile::open(path);
        for (const auto& [name, info] : file.tensors()) {
          if (info.nbytes() > (std::size_t{1} << 20)) continue;
          (void)file.read_bytes(name);
          try {
            (void)file.read_f32(name);
          } catch (const ferrum::Error&) {
          }
          try {
            (void)file.read_i32(name);
          } catch (const ferrum::Error&) {
          }
        }
      }
    }
  } catch (const ferrum::Error&) {
  }
  return 0;
}
