// Independent reference conversions for the 16-bit float formats, written
// from the format definitions with double arithmetic (frexp / ldexp /
// floor) rather than bit tricks, so they share no code or technique with
// ferrum/half.hpp. test_half.cpp checks ferrum's conversions against these;
// the fp64 op references use them to round sums "once, to nearest even".
#pragma once

#include <cmath>
#include <cstdint>

#include "ferrum/dtype.hpp"

namespace ferrum::test::ref {

// A 16-bit float format: `mant_bits` stored mantissa bits, exponent bias,
// smallest normal exponent, largest finite exponent.
struct HalfFormat {
  int mant_bits;
  int bias;
  int exp_bits;
  int min_exp() const { return 1 - bias; }
  int max_exp() const { return (1 << exp_bits) - 2 - bias; }
  std::uint16_t exp_all_ones() const { return static_cast<std::uint16_t>(((1u << exp_bits) - 1u) << mant_bits); }
};

inline constexpr HalfFormat kF16{10, 15, 5};
inline constexpr HalfFormat kBF16{7, 127, 8};

// Value of a 16-bit pattern (NaN for NaN patterns), straight from the definition.
inline double decode_half(std::uint16_t bits, const HalfFormat& f) {
  const bool negative = (bits & 0x8000u) != 0;
  const unsigned exp = (bits & 0x7fffu) >> f.mant_bits;
  const unsigned mant = bits & ((1u << f.mant_bits) - 1u);
  double v;
  if (exp == (1u << f.exp_bits) - 1u) {
    v = mant == 0 ? INFINITY : NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), f.min_exp() - f.mant_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -f.mant_bits), static_cast<int>(exp) - f.bias);
  }
  return negative ? -v : v;
}

inline bool is_nan_pattern(std::uint16_t bits, const HalfFormat& f) {
  return (bits & f.exp_all_ones()) == f.exp_all_ones() && (bits & ((1u << f.mant_bits) - 1u)) != 0;
}

// Rounds a double to the nearest representable value (ties to even), with
// overflow to infinity, and returns its bit pattern. NaN gives the canonical
// quiet NaN (callers only check NaN-ness).
inline std::uint16_t encode_half(double value, const HalfFormat& f) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isnan(value)) return static_cast<std::uint16_t>(f.exp_all_ones() | (1u << (f.mant_bits - 1)));
  const double a = std::fabs(value);
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | f.exp_all_ones());
  if (a == 0.0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1): floor(log2 a) = e2 - 1
  int e = e2 - 1;
  if (e < f.min_exp()) e = f.min_exp();  // subnormal range: fixed quantum
  // In units of the quantum 2^(e - mant_bits): exact (power-of-two scaling).
  const double q = std::ldexp(a, f.mant_bits - e);
  // Round to an integer, ties to even, spelled out (no dependence on the
  // floating-point environment). q < 2^12 here, so every step is exact.
  double r = std::floor(q);
  const double frac = q - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  const double one = std::ldexp(1.0, f.mant_bits);  // the implicit leading 1
  if (r >= 2.0 * one) {  // carried into the next binade
    r = one;
    e += 1;
  }
  if (r < one) {  // subnormal (or rounded to zero)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r));
  }
  if (e > f.max_exp()) return static_cast<std::uint16_t>(sign | f.exp_all_ones());  // overflow
  const auto exp_field = static_cast<unsigned>(e + f.bias);
  const auto mant_field = static_cast<unsigned>(r - one);
  return static_cast<std::uint16_t>(sign | (exp_field << f.mant_bits) | mant_field);
}

inline const HalfFormat& format_of(DType dtype) { return dtype == DType::BF16 ? kBF16 : kF16; }

// `value` rounded once into `dtype` (f16 / bf16 / f32), as a double.
inline double round_to_dtype(double value, DType dtype) {
  if (dtype == DType::F32) return static_cast<double>(static_cast<float>(value));
  return decode_half(encode_half(value, format_of(dtype)), format_of(dtype));
}

// SwiGLU's silu(g) * u in fp64: the reference of fused_silu_mul_split and
// gemm_silu_mul.
inline double silu_mul(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

}  // namespace ferrum::test::ref
