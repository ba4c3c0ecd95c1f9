// libFuzzer harness: CpuBackend::load_gptq on arbitrary GPTQ tensors and
// sizes, then gemm_gptq with what it accepted (scripts/fuzz.sh builds and runs
// it under ASan / UBSan). Every input must either load and multiply, or throw
// ferrum::Error; a crash, a sanitizer report or any other exception is a bug.
//
// Input: 12 header bytes, then the payload (int32 words little-endian, then
// one byte per scale; past the input's end the words are 0x5a5a5a5a).
//   [0] k % 80   [1] n % 40   [2] group choice: -1, 8, 16, 32, 64, or [3] as int8
//   [4] bits (4 unless % 8 == 0: 3)   [5] bit 0 v2 zeros, bit 1 symmetric
//   [6] bit 7: tensor lengths follow k, n and the group count exactly (the
//       words then mostly reach the repack and the GEMM); else [6..9] give
//       the lengths of qweight, qzeros, scales, g_idx
//   [10] m - 1 (% 3)   [11] bit 0: no g_idx
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ferrum/cpu_backend.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 12) return 0;
  ferrum::GptqHostTensors t;
  t.k = data[0] % 80;
  t.n = data[1] % 40;
  constexpr int kGroups[] = {-1, 8, 16, 32, 64};
  t.group_size = data[2] % 6 == 5 ? static_cast<int>(static_cast<std::int8_t>(data[3])) : kGroups[data[2] % 6];
  t.bits = data[4] % 8 == 0 ? 3 : 4;
  t.zero_format = (data[5] & 1) != 0 ? ferrum::GptqZeroFormat::V2 : ferrum::GptqZeroFormat::V1;
  t.symmetric = (data[5] & 2) != 0;
  std::size_t qweight_len = data[6] % 200, qzeros_len = data[7] % 40, scales_len = data[8] % 200,
              g_idx_len = data[9] % 100;
  if ((data[6] & 0x80) != 0) {
    const std::size_t groups = t.group_size > 0 ? t.k / static_cast<std::size_t>(t.group_size) : 1;
    qweight_len = t.k / 8 * t.n;
    qzeros_len = groups * (t.n / 8);
    scales_len = groups * t.n;
    g_idx_len = t.k;
  }
  const std::size_t m = 1 + data[10] % 3;
  std::size_t at = 12;
  auto words = [&](std::size_t len) {
    std::vector<std::int32_t> v(len);
    for (std::int32_t& x : v) {
      std::uint32_t w = 0;
      for (int b = 0; b < 4; ++b) w |= static_cast<std::uint32_t>(at < size ? data[at++] : 0x5a) << (8 * b);
      x = static_cast<std::int32_t>(w);
    }
    return v;
  };
  const std::vector<std::int32_t> qweight = words(qweight_len), qzeros = words(qzeros_len), g_idx = words(g_idx_len);
  std::vector<float> scales(scales_len);
  for (float& s : scales) s = static_cast<float>((at < size ? data[at++] : 8) % 16) / 8.0f;
  t.qweight = qweight;
  t.qzeros = qzeros;
  t.scales = scales;
  if ((data[11] & 1) == 0) t.g_idx = g_idx;
  try {
    ferrum::CpuBackend backend;
    const std::unique_ptr<ferrum::QuantWeight> w = backend.load_gptq(t);
    ferrum::Buffer a = backend.upload(std::vector<float>(m * t.k, 0.5f), ferrum::DType::F16);
    ferrum::Buffer out = backend.alloc(ferrum::DType::F16, m * t.n);
    backend.gemm_gptq(a, *w, out, m);
    (void)backend.download(out);
  } catch (const ferrum::Error&) {
  }
  return 0;
}

