// Host-side conversions between f32 and the 16-bit float formats, bit-exact
// with the CUDA intrinsics (__float2half_rn, __float2bfloat16_rn) for every
// non-NaN input: round to nearest even, overflow goes to infinity. NaN stays
// NaN, but its bit pattern may differ from the intrinsics' canonical one.
#pragma once

#include <cstdint>
#include <cstring>

namespace ferrum {

inline float bits_to_f32(std::uint32_t bits) noexcept {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t f32_to_bits(float f) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_f32(std::uint16_t h) noexcept {
  return bits_to_f32(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t f32_to_bf16(float f) noexcept {
  std::uint32_t x = f32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  }
  const std::uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(x >> 16);
}

inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf / NaN
    return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return bits_to_f32(sign);
    // Subnormal: value = mant * 2^-24, exact in f32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = f32_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {
    // Result is subnormal or zero in f16: scale so that one f16 subnormal
    // step is one unit, and let the f32 adder round to nearest even.
    const float magic = bits_to_f32(0x4b000000u);  // 2^23
    const float scaled = bits_to_f32(ax) * 16777216.0f;  // * 2^24
    const std::uint32_t r = f32_to_bits(scaled + magic) - 0x4b000000u;
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: drop 13 mantissa bits with round to nearest even.
  const std::uint32_t lsb = (ax >> 13) & 1u;
  const std::uint32_t rounded = ax + 0xfffu + lsb;
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace ferrum
