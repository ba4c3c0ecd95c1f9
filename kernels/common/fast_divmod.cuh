// Division by a divisor fixed at launch, for index math in memory-bound
// kernels: n / d as one multiply-high, one add and one shift (Granlund and
// Montgomery's round-up method) instead of a division routine, which costs a
// thread that moves 16-32 bytes a large share of its instructions.
//
// Exact for every numerator n in [0, 2^31) and divisor d in [1, 2^31), with
// s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1:
// - m < 2^32, since 2^s - d < d;
// - the effective multiplier m' = 2^32 + m = floor(2^(32+s) / d) + 1 has the
//   error e = m' d - 2^(32+s) in [1, d] within [1, 2^s], so n e < 2^(32+s)
//   and floor(n m' / 2^(32+s)) = floor(n / d) (for any n < 2^32);
// - n m' / 2^(32+s) = (n m / 2^32 + n) / 2^s, and umulhi(n, m) + n < 2^32
//   because umulhi(n, m) < n < 2^31.
// The launcher builds it on the host (it checks its own sizes against
// kFastDivmodMax); tests/cpu/kernels/test_fast_divmod.cpp checks it on the CPU.
// Host-compilable: the device's __umulhi, on the host the same 64-bit product.
#pragma once

#include <cstdint>

#include "kernels/common/check.hpp"

#if defined(__CUDACC__)
#define FERRUM_FAST_DIVMOD_HD __host__ __device__ __forceinline__
#else
#define FERRUM_FAST_DIVMOD_HD inline
#endif

namespace ferrum::kernels {

// The largest numerator and divisor FastDivmod takes: 2^31 - 1.
inline constexpr std::uint32_t kFastDivmodMax = 0x7fffffffu;

struct FastDivmod {
  std::uint32_t divisor = 1;
  std::uint32_t multiplier = 1;  // d = 1: s = 0, m = 1, (n * 1 >> 32) + n = n
  std::uint32_t shift = 0;

  FastDivmod() = default;
  // d in [1, kFastDivmodMax] (launchers check their sizes and throw their own
  // named errors first; outside it, an Internal ferrum::Error).
  explicit FastDivmod(std::uint32_t d) : divisor(d) {
    if (d < 1 || d > kFastDivmodMax) throw_bad_dispatch("FastDivmod", "divisor (1 .. 2^31 - 1)", d);
    while ((std::uint64_t{1} << shift) < d) ++shift;
    multiplier =
        static_cast<std::uint32_t>((((std::uint64_t{1} << shift) - d) << 32) / d + 1);
  }

  // n / divisor, for n in [0, kFastDivmodMax].
  FERRUM_FAST_DIVMOD_HD std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t hi = __umulhi(n, multiplier);
#else
    const auto hi = static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * multiplier) >> 32);
#endif
    return (hi + n) >> shift;
  }
  // n / divisor and n % divisor.
  FERRUM_FAST_DIVMOD_HD void divmod(std::uint32_t n, std::uint32_t& quotient, std::uint32_t& remainder) const {
    quotient = div(n);
    remainder = n - quotient * divisor;
  }
};

// n / divisor for the 64-bit indices n in [0, limit) of one launch, where a
// launch may be larger than FastDivmod's range: through FastDivmod when the
// divisor and limit - 1 are within it (decided on the host, so the branch is
// uniform across the launch), else the 64-bit division. Built by the
// launcher, for a divisor of at least 1.
struct IndexDivider {
  long long divisor = 1;
  FastDivmod fast{};
  bool fast_ok = false;

  IndexDivider() = default;
  IndexDivider(long long d, long long limit)
      : divisor(d), fast_ok(d >= 1 && d <= kFastDivmodMax && limit >= 0 && limit - 1 <= kFastDivmodMax) {
    if (fast_ok) fast = FastDivmod(static_cast<std::uint32_t>(d));
  }

  FERRUM_FAST_DIVMOD_HD long long div(long long n) const {
    return fast_ok ? static_cast<long long>(fast.div(static_cast<std::uint32_t>(n))) : n / divisor;
  }
};

}  // namespace ferrum::kernels

#undef FERRUM_FAST_DIVMOD_HD
