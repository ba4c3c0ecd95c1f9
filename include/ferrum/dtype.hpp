// Element types a Buffer can hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ferrum {

enum class DType : std::uint8_t { F16, BF16, F32, I32, U8 };

constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::U8:
      return 1;
  }
  return 0;
}

constexpr std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::F32:
      return "f32";
    case DType::I32:
      return "i32";
    case DType::U8:
      return "u8";
  }
  return "?";
}

// Activation dtypes: every activation kernel takes these two.
constexpr bool is_half_precision(DType t) noexcept {
  return t == DType::F16 || t == DType::BF16;
}

}  // namespace ferrum
