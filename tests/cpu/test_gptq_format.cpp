// GPTQ INT4 host format (src/quant/gptq_format.hpp): the CPU reference the
// GPU kernels and CpuBackend's gemm_gptq build on.
//   * Known values: a hand-written checkpoint (nibble order, V1 / V2 zeros,
//     symmetric zero words 0x77777777 / 0x88888888) against values written out.
//   * Round trips: random q / zero / scale / g_idx -> pack -> unpack is exact
//     over group sizes 32, 64, 128, -1, V1 and V2, symmetric and asymmetric,
//     non-square k and n, with and without act-order g_idx, with g_idx written
//     or left empty; and random packed words -> unpack -> pack is bit-exact.
//   * Dequantization: equal, bit for bit, to the formula evaluated straight
//     from the packed int32 words by a nibble extractor written here.
//   * Act-order: permute_rows_for_act_order + gather_columns gives exactly
//     the product a·W (in double) of the unpermuted weight, on integer
//     activations and power-of-two scales (so every sum is exact).
//   * Bad input: each rule of validate_gptq, pack_gptq, gather_columns and
//     permute_rows_for_act_order throws the right ErrorCode with a message
//     naming the op and the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ferrum/backend.hpp"
#include "ferrum/error.hpp"
#include "quant/gptq_format.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

using detail::GptqPacked;
using detail::GptqUnpacked;

const char* format_name(GptqZeroFormat f) { return f == GptqZeroFormat::V1 ? "V1" : "V2"; }

std::size_t groups_of(std::size_t k, int group_size) {
  return group_size == -1 ? 1 : k / static_cast<std::size_t>(group_size);
}

std::int32_t default_group(std::size_t row, int group_size) {
  return group_size == -1 ? 0 : static_cast<std::int32_t>(row / static_cast<std::size_t>(group_size));
}

// Nibble `slot` of `word`, by repeated division (independent of the library's shifts and masks).
int nibble_by_division(std::int32_t word, std::size_t slot) {
  std::uint64_t u = static_cast<std::uint32_t>(word);
  for (std::size_t i = 0; i < slot; ++i) u /= 16;
  return static_cast<int>(u % 16);
}

std::int32_t random_word(Rng& rng) { return static_cast<std::int32_t>(rng.bits32()); }

// Act-order g_idx as GPTQ's desc_act writes it: every group gets exactly
// group_size rows, in a random row order (differs from k / group_size).
std::vector<std::int32_t> act_order_g_idx(std::size_t k, int group_size, Rng& rng) {
  std::vector<std::int32_t> g(k);
  for (std::size_t row = 0; row < k; ++row) g[row] = default_group(row, group_size);
  if (groups_of(k, group_size) < 2) return g;  // one group: no order to permute
  const std::vector<std::int32_t> plain = g;
  do {
    std::shuffle(g.begin(), g.end(), rng.engine());
  } while (g == plain);
  return g;
}

enum class Zeros { Symmetric, Asymmetric };

// A random weight in unpacked form (perm / act_order left for unpack to derive).
// Asymmetric zeros cover the whole range `format` can hold, both ends included.
GptqUnpacked random_unpacked(std::size_t k, std::size_t n, int group_size, Zeros zeros, GptqZeroFormat format,
                             bool act_order, Rng& rng, bool pow2_scales = false) {
  GptqUnpacked w;
  w.k = k;
  w.n = n;
  w.group_size = group_size;
  w.groups = groups_of(k, group_size);
  std::uniform_int_distribution<int> q_dist(0, 15);
  w.q.resize(k * n);
  for (auto& v : w.q) v = static_cast<std::uint8_t>(q_dist(rng.engine()));

  const int zlo = format == GptqZeroFormat::V1 ? 1 : 0;
  std::uniform_int_distribution<int> z_dist(zlo, zlo + 15);
  w.zero.resize(w.groups * n);
  for (std::size_t i = 0; i < w.zero.size(); ++i) {
    if (zeros == Zeros::Symmetric) {
      w.zero[i] = 8;
    } else {
      w.zero[i] = static_cast<std::uint8_t>(i == 0 ? zlo : i == 1 ? zlo + 15 : z_dist(rng.engine()));
    }
  }

  w.scale.resize(w.groups * n);
  std::uniform_real_distribution<float> s_dist(-0.1f, 0.1f);
  std::uniform_int_distribution<int> e_dist(0, 10);
  std::bernoulli_distribution sign(0.25);
  for (auto& s : w.scale) {
    if (pow2_scales) {
      s = std::ldexp(sign(rng.engine()) ? -1.0f : 1.0f, -e_dist(rng.engine()));
    } else {
      s = s_dist(rng.engine());
    }
  }
  if (act_order) {
    w.g_idx = act_order_g_idx(k, group_size, rng);
  } else {
    w.g_idx.resize(k);
    for (std::size_t row = 0; row < k; ++row) w.g_idx[row] = default_group(row, group_size);
  }
  return w;
}

// perm is a permutation of 0..k-1 that sorts g_idx, keeping equal groups in row order.
void expect_stable_sorting_perm(const GptqUnpacked& w) {
  ASSERT_EQ(w.perm.size(), w.k);
  std::vector<std::int32_t> sorted = w.perm;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < w.k; ++i)
    ASSERT_EQ(sorted[i], static_cast<std::int32_t>(i)) << "perm is not a permutation";
  for (std::size_t j = 1; j < w.k; ++j) {
    const auto a = static_cast<std::size_t>(w.perm[j - 1]);
    const auto b = static_cast<std::size_t>(w.perm[j]);
    ASSERT_TRUE(w.g_idx[a] < w.g_idx[b] || (w.g_idx[a] == w.g_idx[b] && a < b))
        << "perm does not sort g_idx stably at position " << j;
  }
}

bool g_idx_is_default(const GptqUnpacked& w) {
  for (std::size_t row = 0; row < w.k; ++row) {
    if (w.g_idx[row] != default_group(row, w.group_size)) return false;
  }
  return true;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  std::size_t k;
  std::size_t n;
  int group_size;
};

const Shape kShapes[] = {
    {256, 72, 32}, {256, 72, 64}, {256, 72, 128}, {256, 72, -1}, {4096, 8, 128}, {4096, 8, 32},
    {4096, 8, -1}, {96, 16, 32},  {128, 8, -1},   {8, 8, -1},    {64, 24, 64},   {512, 40, 128},
};

// A packed checkpoint of shape s with random words (every nibble and zero
// value occurs), random scales in [-1, 1] and act-order g_idx.
GptqPacked random_packed(const Shape& s, GptqZeroFormat f, Rng& rng) {
  const std::size_t groups = groups_of(s.k, s.group_size);
  GptqPacked p;
  p.k = s.k;
  p.n = s.n;
  p.group_size = s.group_size;
  p.zero_format = f;
  p.qweight.resize(s.k / 8 * s.n);
  p.qzeros.resize(groups * s.n / 8);
  p.scales.resize(groups * s.n);
  for (auto& v : p.qweight) v = random_word(rng);
  for (auto& v : p.qzeros) v = random_word(rng);
  for (auto& v : p.scales) v = rng.uniform(-1.0f, 1.0f);
  p.g_idx = act_order_g_idx(s.k, s.group_size, rng);
  return p;
}

// ── Known values ─────────────────────────────────────────────────────────────

// k = 16, n = 8, group_size = 8 (2 groups). Packed row 0 holds q = k (0..7),
// packed row 1 holds q = k (8..15); qzeros of group 0 stores c in column c,
// group 1 stores 15 - c; scales[g][c] = (g + 1) / 2 + c / 4.
struct HandCheckpoint {
  std::vector<std::int32_t> qweight = std::vector<std::int32_t>(2 * 8);
  std::vector<std::int32_t> qzeros = {static_cast<std::int32_t>(0x76543210u), static_cast<std::int32_t>(0x89ABCDEFu)};
  std::vector<float> scales = std::vector<float>(2 * 8);
  HandCheckpoint() {
    for (std::size_t c = 0; c < 8; ++c) {
      qweight[0 * 8 + c] = static_cast<std::int32_t>(0x76543210u);
      qweight[1 * 8 + c] = static_cast<std::int32_t>(0xFEDCBA98u);
      for (std::size_t g = 0; g < 2; ++g)
        scales[g * 8 + c] = 0.5f * static_cast<float>(g + 1) + 0.25f * static_cast<float>(c);
    }
  }
  GptqHostTensors tensors(GptqZeroFormat f) const {
    GptqHostTensors t;
    t.qweight = qweight;
    t.qzeros = qzeros;
    t.scales = scales;
    t.group_size = 8;
    t.k = 16;
    t.n = 8;
    t.symmetric = false;
    t.zero_format = f;
    return t;
  }
};

TEST(GptqFormat, HandWrittenCheckpointUnpacksAndDequantizes) {
  const HandCheckpoint ck;
  for (GptqZeroFormat f : {GptqZeroFormat::V1, GptqZeroFormat::V2}) {
    SCOPED_TRACE(format_name(f));
    const GptqUnpacked w = detail::unpack_gptq(ck.tensors(f));
    ASSERT_EQ(w.groups, 2u);
    const int off = f == GptqZeroFormat::V1 ? 1 : 0;
    for (std::size_t r = 0; r < 16; ++r) {
      EXPECT_EQ(w.g_idx[r], static_cast<std::int32_t>(r / 8));
      for (std::size_t c = 0; c < 8; ++c) EXPECT_EQ(w.q[r * 8 + c], r) << "row " << r << " col " << c;
    }
    for (std::size_t c = 0; c < 8; ++c) {
      EXPECT_EQ(w.zero[0 * 8 + c], static_cast<int>(c) + off);
      EXPECT_EQ(w.zero[1 * 8 + c], 15 - static_cast<int>(c) + off);
    }
    EXPECT_FALSE(w.act_order);
    const std::vector<float> W = detail::dequantize_gptq(w);
    const std::vector<float> Wt = detail::dequantize_gptq_transposed(w);
    for (std::size_t r = 0; r < 16; ++r) {
      const std::size_t g = r / 8;
      for (std::size_t c = 0; c < 8; ++c) {
        const int zero = (g == 0 ? static_cast<int>(c) : 15 - static_cast<int>(c)) + off;
        const float scale = 0.5f * static_cast<float>(g + 1) + 0.25f * static_cast<float>(c);
        const float want = static_cast<float>(static_cast<int>(r) - zero) * scale;
        EXPECT_EQ(W[r * 8 + c], want) << "row " << r << " col " << c;
        EXPECT_EQ(Wt[c * 16 + r], want) << "row " << r << " col " << c;
      }
    }
    // Packing back gives the same words.
    const GptqPacked p = detail::pack_gptq(w, f, /*write_g_idx=*/false);
    EXPECT_EQ(p.qweight, ck.qweight);
    EXPECT_EQ(p.qzeros, ck.qzeros);
    EXPECT_TRUE(p.g_idx.empty());
  }
}

TEST(GptqFormat, SymmetricZerosAreStoredAsSevenInV1AndEightInV2) {
  FERRUM_SEEDED_RNG(rng);
  const GptqUnpacked w = random_unpacked(64, 16, 32, Zeros::Symmetric, GptqZeroFormat::V2, false, rng);
  const GptqPacked v1 = detail::pack_gptq(w, GptqZeroFormat::V1);
  const GptqPacked v2 = detail::pack_gptq(w, GptqZeroFormat::V2);
  for (std::int32_t word : v1.qzeros) EXPECT_EQ(static_cast<std::uint32_t>(word), 0x77777777u);
  for (std::int32_t word : v2.qzeros) EXPECT_EQ(static_cast<std::uint32_t>(word), 0x88888888u);
  EXPECT_TRUE(v1.symmetric);
  EXPECT_TRUE(v2.symmetric);
  EXPECT_EQ(detail::unpack_gptq(v1.host_tensors()).zero, w.zero);
  EXPECT_EQ(detail::unpack_gptq(v2.host_tensors()).zero, w.zero);
}

TEST(GptqFormat, V1StoredFifteenIsZeroSixteen) {
  // All-ones qzeros words (-1) mean zero 16 in V1; V2 can't hold it.
  FERRUM_SEEDED_RNG(rng);
  GptqPacked p = detail::pack_gptq(random_unpacked(32, 16, 32, Zeros::Symmetric, GptqZeroFormat::V1, false, rng),
                                   GptqZeroFormat::V1);
  std::fill(p.qzeros.begin(), p.qzeros.end(), -1);
  const GptqUnpacked w = detail::unpack_gptq(p.host_tensors());
  for (std::uint8_t z : w.zero) EXPECT_EQ(z, 16);
  EXPECT_EQ(detail::pack_gptq(w, GptqZeroFormat::V1).qzeros, p.qzeros);
  expect_error(ErrorCode::InvalidArgument, "pack_gptq", [&] { detail::pack_gptq(w, GptqZeroFormat::V2); },
               {"'zero' entry 0 (group 0, column 0) = 16", "V2", "0..15"});
}

// ── Round trips ──────────────────────────────────────────────────────────────

TEST(GptqFormat, PackUnpackRoundTripIsExact) {
  FERRUM_SEEDED_RNG(rng);
  int cases = 0;
  for (const Shape& s : kShapes) {
    for (GptqZeroFormat f : {GptqZeroFormat::V1, GptqZeroFormat::V2}) {
      for (Zeros z : {Zeros::Symmetric, Zeros::Asymmetric}) {
        for (bool act : {false, true}) {
          if (act && groups_of(s.k, s.group_size) < 2) continue;
          for (bool write_g_idx : {true, false}) {
            if (act && !write_g_idx) continue;
            SCOPED_TRACE(testing::Message() << "k=" << s.k << " n=" << s.n << " group_size=" << s.group_size << " "
                                            << format_name(f) << (z == Zeros::Symmetric ? " sym" : " asym")
                                            << (act ? " act-order" : "") << (write_g_idx ? "" : " empty g_idx"));
            const GptqUnpacked w = random_unpacked(s.k, s.n, s.group_size, z, f, act, rng);
            const GptqPacked p = detail::pack_gptq(w, f, write_g_idx);
            ASSERT_EQ(p.qweight.size(), s.k / 8 * s.n);
            ASSERT_EQ(p.qzeros.size(), w.groups * s.n / 8);
            ASSERT_EQ(p.scales.size(), w.groups * s.n);
            ASSERT_EQ(p.g_idx.size(), write_g_idx ? s.k : 0u);
            EXPECT_EQ(p.symmetric, z == Zeros::Symmetric);

            GptqHostTensors t = p.host_tensors();
            t.symmetric = !t.symmetric;  // informational only: must change nothing
            const GptqUnpacked u = detail::unpack_gptq(t);
            EXPECT_EQ(u.k, w.k);
            EXPECT_EQ(u.n, w.n);
            EXPECT_EQ(u.groups, w.groups);
            EXPECT_EQ(u.group_size, w.group_size);
            EXPECT_EQ(u.q, w.q);
            EXPECT_EQ(u.zero, w.zero);
            EXPECT_TRUE(same_bits(u.scale, w.scale));
            EXPECT_EQ(u.g_idx, w.g_idx);
            EXPECT_EQ(u.act_order, act);
            EXPECT_EQ(u.act_order, !g_idx_is_default(u));
            expect_stable_sorting_perm(u);
            if (!act) {
              std::vector<std::int32_t> identity(s.k);
              std::iota(identity.begin(), identity.end(), 0);
              EXPECT_EQ(u.perm, identity);
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(GptqFormat, RandomPackedWordsSurviveUnpackPackBitExactly) {
  FERRUM_SEEDED_RNG(rng);
  for (const Shape& s : kShapes) {
    for (GptqZeroFormat f : {GptqZeroFormat::V1, GptqZeroFormat::V2}) {
      SCOPED_TRACE(testing::Message() << "k=" << s.k << " n=" << s.n << " group_size=" << s.group_size << " "
                                      << format_name(f));
      const GptqPacked p = random_packed(s, f, rng);
      const GptqPacked back = detail::pack_gptq(detail::unpack_gptq(p.host_tensors()), f);
      EXPECT_EQ(back.qweight, p.qweight);
      EXPECT_EQ(back.qzeros, p.qzeros);
      EXPECT_TRUE(same_bits(back.scales, p.scales));
      EXPECT_EQ(back.g_idx, p.g_idx);
    }
  }
}

// The unpacking splits rows over host threads (CpuBackendConfig::num_threads
// for CpuBackend); the result must not depend on how many.
TEST(GptqFormat, UnpackIsTheSameOnAnyNumberOfThreads) {
  FERRUM_SEEDED_RNG(rng);
  const GptqPacked p = random_packed({4096, 24, 128}, GptqZeroFormat::V1, rng);
  const detail::GptqUnpacked one = detail::unpack_gptq(p.host_tensors(), "unpack_gptq", 1);
  for (unsigned threads : {0u, 2u, 3u, 7u}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    const detail::GptqUnpacked w = detail::unpack_gptq(p.host_tensors(), "unpack_gptq", threads);
    EXPECT_EQ(w.q, one.q);
    EXPECT_EQ(w.zero, one.zero);
    EXPECT_TRUE(same_bits(w.scale, one.scale));
    EXPECT_EQ(w.perm, one.perm);
  }
}

// ── Dequantization against the packed words ────────────────────────────────

TEST(GptqFormat, DequantizeMatchesFormulaOnPackedWords) {
  FERRUM_SEEDED_RNG(rng);
  for (const Shape& s : kShapes) {
    for (GptqZeroFormat f : {GptqZeroFormat::V1, GptqZeroFormat::V2}) {
      for (int g_idx_kind = 0; g_idx_kind < 3; ++g_idx_kind) {  // 0: empty, 1: act-order, 2: random groups
        SCOPED_TRACE(testing::Message() << "k=" << s.k << " n=" << s.n << " group_size=" << s.group_size << " "
                                        << format_name(f) << " g_idx kind " << g_idx_kind);
        const std::size_t k = s.k;
        const std::size_t n = s.n;
        const std::size_t groups = groups_of(k, s.group_size);
        std::vector<std::int32_t> qweight(k / 8 * n);
        std::vector<std::int32_t> qzeros(groups * n / 8);
        std::vector<float> scales(groups * n);
        std::vector<std::int32_t> g_idx;
        for (auto& v : qweight) v = random_word(rng);
        for (auto& v : qzeros) v = random_word(rng);
        for (auto& v : scales) v = rng.uniform(-2.0f, 2.0f);
        if (g_idx_kind == 1) g_idx = act_order_g_idx(k, s.group_size, rng);
        if (g_idx_kind == 2) {
          g_idx.resize(k);
          std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(groups) - 1);
          for (auto& g : g_idx) g = d(rng.engine());
        }
        GptqHostTensors t;
        t.qweight = qweight;
        t.qzeros = qzeros;
        t.scales = scales;
        t.g_idx = g_idx;
        t.group_size = s.group_size;
        t.k = k;
        t.n = n;
        t.symmetric = true;  // a lie (zeros are random): the stored zeros must still be used
        t.zero_format = f;
        const GptqUnpacked w = detail::unpack_gptq(t);
        const std::vector<float> W = detail::dequantize_gptq(w);
        const std::vector<float> Wt = detail::dequantize_gptq_transposed(w);
        ASSERT_EQ(W.size(), k * n);
        ASSERT_EQ(Wt.size(), k * n);
        std::size_t bad = 0;
        for (std::size_t r = 0; r < k; ++r) {
          const std::size_t g = g_idx.empty() ? static_cast<std::size_t>(default_group(r, s.group_size))
                                              : static_cast<std::size_t>(g_idx[r]);
          for (std::size_t c = 0; c < n; ++c) {
            const int q = nibble_by_division(qweight[(r / 8) * n + c], r % 8);
            const int zero = nibble_by_division(qzeros[g * (n / 8) + c / 8], c % 8) + (f == GptqZeroFormat::V1 ? 1 : 0);
            const float want = static_cast<float>(q - zero) * scales[g * n + c];
            if (std::memcmp(&W[r * n + c], &want, sizeof(float)) != 0 ||
                std::memcmp(&Wt[c * k + r], &want, sizeof(float)) != 0) {
              if (++bad <= 5) ADD_FAILURE() << "W[" << r << "][" << c << "] = " << W[r * n + c] << ", want " << want;
            }
          }
        }
        EXPECT_EQ(bad, 0u);
      }
    }
  }
}

// ── Act-order ────────────────────────────────────────────────────────────────

// out[i][c] = sum_r a[i][r] * W[r][c] in double; a [m, k], W [k, n].
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& W, std::size_t m, std::size_t k,
                            std::size_t n) {
  std::vector<double> out(m * n, 0.0);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t r = 0; r < k; ++r) {
      const double av = a[i * k + r];
      for (std::size_t c = 0; c < n; ++c) out[i * n + c] += av * static_cast<double>(W[r * n + c]);
    }
  }
  return out;
}

TEST(GptqFormat, ActOrderPermutationAndGatherKeepTheProductExactly) {
  FERRUM_SEEDED_RNG(rng);
  const Shape shapes[] = {{256, 24, 32}, {256, 72, 64}, {4096, 8, 128}, {96, 16, 32}, {512, 40, 128}};
  for (const Shape& s : shapes) {
    for (bool uniform_groups : {true, false}) {
      SCOPED_TRACE(testing::Message() << "k=" << s.k << " n=" << s.n << " group_size=" << s.group_size
                                      << (uniform_groups ? " desc_act g_idx" : " random g_idx"));
      const std::size_t k = s.k;
      const std::size_t n = s.n;
      const std::size_t m = 5;
      GptqUnpacked w0 = random_unpacked(k, n, s.group_size, Zeros::Asymmetric, GptqZeroFormat::V2, true, rng,
                                        /*pow2_scales=*/true);
      if (!uniform_groups) {  // groups of unequal sizes, still every group in range
        std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(w0.groups) - 1);
        for (auto& g : w0.g_idx) g = d(rng.engine());
      }
      const GptqUnpacked w = detail::unpack_gptq(detail::pack_gptq(w0, GptqZeroFormat::V2).host_tensors());
      ASSERT_TRUE(w.act_order);

      std::vector<float> a(m * k);
      std::uniform_int_distribution<int> ad(-8, 8);
      for (auto& v : a) v = static_cast<float>(ad(rng.engine()));

      const std::vector<double> want = product(a, detail::dequantize_gptq(w), m, k, n);

      const GptqUnpacked wp = detail::permute_rows_for_act_order(w);
      std::vector<float> a_perm(m * k);
      detail::gather_columns(a.data(), m, k, w.perm, a_perm.data());
      const std::vector<double> got = product(a_perm, detail::dequantize_gptq(wp), m, k, n);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "out[" << i / n << "][" << i % n << "]";

      // The permuted weight: rows moved with perm, g_idx sorted, its own perm the identity.
      for (std::size_t j = 0; j < k; ++j) {
        const auto src = static_cast<std::size_t>(w.perm[j]);
        ASSERT_EQ(wp.g_idx[j], w.g_idx[src]);
        ASSERT_TRUE(std::equal(wp.q.begin() + static_cast<std::ptrdiff_t>(j * n),
                               wp.q.begin() + static_cast<std::ptrdiff_t>((j + 1) * n),
                               w.q.begin() + static_cast<std::ptrdiff_t>(src * n)));
        ASSERT_EQ(a_perm[j], a[src]);
      }
      EXPECT_TRUE(std::is_sorted(wp.g_idx.begin(), wp.g_idx.end()));
      std::vector<std::int32_t> identity(k);
      std::iota(identity.begin(), identity.end(), 0);
      EXPECT_EQ(wp.perm, identity);
      EXPECT_EQ(wp.zero, w.zero);
      EXPECT_TRUE(same_bits(wp.scale, w.scale));
      if (uniform_groups) {
        // Every group has group_size rows: the permuted weight is a plain grouped one.
        EXPECT_FALSE(wp.act_order);
        EXPECT_TRUE(g_idx_is_default(wp));
        const GptqPacked plain = detail::pack_gptq(wp, GptqZeroFormat::V2, /*write_g_idx=*/false);
        EXPECT_EQ(detail::unpack_gptq(plain.host_tensors()).q, wp.q);
      } else {
        EXPECT_EQ(wp.act_order, !g_idx_is_default(wp));
      }
    }
  }
}

TEST(GptqFormat, PermuteWithoutActOrderChangesNothing) {
  FERRUM_SEEDED_RNG(rng);
  const GptqUnpacked w = detail::unpack_gptq(
      detail::pack_gptq(random_unpacked(256, 16, 64, Zeros::Asymmetric, GptqZeroFormat::V1, false, rng),
                        GptqZeroFormat::V1)
          .host_tensors());
  ASSERT_FALSE(w.act_order);
  const GptqUnpacked wp = detail::permute_rows_for_act_order(w);
  EXPECT_EQ(wp.q, w.q);
  EXPECT_EQ(wp.zero, w.zero);
  EXPECT_TRUE(same_bits(wp.scale, w.scale));
  EXPECT_EQ(wp.g_idx, w.g_idx);
  EXPECT_EQ(wp.perm, w.perm);
  EXPECT_FALSE(wp.act_order);
}

TEST(GptqFormat, GatherColumnsKnownValuesAndBadPerm) {
  const std::vector<float> a = {1, 2, 3, 4, 10, 20, 30, 40};  // [2, 4]
  const std::vector<std::int32_t> perm = {2, 0, 3, 1};
  std::vector<float> out(8);
  detail::gather_columns(a.data(), 2, 4, perm, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 1, 4, 2, 30, 10, 40, 20}));

  const std::vector<std::int32_t> short_perm = {0, 1, 2};
  expect_error(ErrorCode::ShapeMismatch, "gather_columns",
               [&] { detail::gather_columns(a.data(), 2, 4, short_perm, out.data()); },
               {"'perm' has 3 elements", "k = 4"});
  const std::vector<std::int32_t> bad_perm = {0, 1, 4, 2};
  expect_error(ErrorCode::InvalidArgument, "gather_columns",
               [&] { detail::gather_columns(a.data(), 2, 4, bad_perm, out.data()); },
               {"'perm' entry 2 = 4", "[0, k = 4)"});
  std::vector<float> inplace = a;
  expect_error(ErrorCode::InvalidArgument, "gather_columns",
               [&] { detail::gather_columns(inplace.data(), 2, 4, perm, inplace.data()); }, {"aliases"});
}

// ── Bad input ────────────────────────────────────────────────────────────────

// A valid checkpoint to break one rule at a time: k = 256, n = 16,
// group_size = 64 (4 groups), act-order g_idx, V1. Drawn from rng_, whose
// seed every test traces (a SCOPED_TRACE in SetUp ends with SetUp).
class GptqBadInput : public testing::Test {
 protected:
  void SetUp() override {
    SCOPED_TRACE(rng_.describe());
    packed_ = detail::pack_gptq(random_unpacked(256, 16, 64, Zeros::Asymmetric, GptqZeroFormat::V1, true, rng_),
                                GptqZeroFormat::V1);
    ASSERT_NO_THROW(detail::validate_gptq(valid(), "load_gptq"));
  }
  GptqHostTensors valid() const { return packed_.host_tensors(); }

  // validate_gptq and unpack_gptq both refuse `t` with `code` and `parts`, under the op they are given.
  void expect_invalid(const GptqHostTensors& t, ErrorCode code, std::initializer_list<std::string_view> parts) {
    expect_error(
        code, "load_gptq", [&] { detail::validate_gptq(t, "load_gptq"); }, parts);
    expect_error(
        code, "unpack_gptq", [&] { detail::unpack_gptq(t); }, parts);
  }

  Rng rng_;
  GptqPacked packed_;
};

TEST_F(GptqBadInput, BitsOtherThanFourAreUnsupported) {
  SCOPED_TRACE(rng_.describe());
  for (int bits : {3, 2, 8, 0, -4}) {
    SCOPED_TRACE(bits);
    GptqHostTensors t = valid();
    t.bits = bits;
    const std::string want = "'bits' = " + std::to_string(bits) + " is not supported";
    expect_invalid(t, ErrorCode::Unsupported, {want, "only 4-bit"});
  }
}

TEST_F(GptqBadInput, ZeroFormatOutsideTheEnum) {
  SCOPED_TRACE(rng_.describe());
  GptqHostTensors t = valid();
  t.zero_format = static_cast<GptqZeroFormat>(7);
  expect_invalid(t, ErrorCode::InvalidArgument, {"'zero_format' = 7", "V1 (0) nor V2 (1)"});
}

TEST_F(GptqBadInput, ZeroOrHugeSizes) {
  SCOPED_TRACE(rng_.describe());
  GptqHostTensors t = valid();
  t.k = 0;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'k' = 0", "at least 1"});
  t = valid();
  t.n = 0;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'n' = 0", "at least 1"});
  t = valid();
  t.k = std::size_t{1} << 31;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'k' = 2147483648", "32-bit limit"});
  t = valid();
  t.n = std::size_t{1} << 40;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'n' = 1099511627776", "32-bit limit"});
}

TEST_F(GptqBadInput, KAndNMustBeMultiplesOfEight) {
  SCOPED_TRACE(rng_.describe());
  GptqHostTensors t = valid();
  t.k = 100;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'k' = 100 is not a multiple of 8", "qweight packs 8 rows per int32"});
  t = valid();
  t.n = 12;
  expect_invalid(t, ErrorCode::InvalidArgument,
                 {"'n' = 12 is not a multiple of 8", "qzeros packs 8 columns per int32"});
}

TEST_F(GptqBadInput, GroupSizeDomainAndDivisibility) {
  SCOPED_TRACE(rng_.describe());
  GptqHostTensors t = valid();
  t.group_size = 96;  // a multiple of 8 that does not divide k = 256
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'k' = 256 is not a multiple of group_size = 96"});
  t.group_size = 512;  // larger than k
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'k' = 256 is not a multiple of group_size = 512"});
  for (int gs : {0, -2, -128}) {
    SCOPED_TRACE(gs);
    t.group_size = gs;
    const std::string want = "'group_size' = " + std::to_string(gs) + " is invalid";
    expect_invalid(t, ErrorCode::InvalidArgument, {want, "positive multiple of 8", "or -1"});
  }
  t.group_size = 20;  // positive but not a multiple of 8: legal GPTQ, not implemented
  expect_invalid(t, ErrorCode::Unsupported, {"'group_size' = 20 is not a multiple of 8"});
}

TEST_F(GptqBadInput, ArraySizesMustBeExact) {
  SCOPED_TRACE(rng_.describe());
  const GptqHostTensors base = valid();
  std::vector<std::int32_t> longer_words(base.qweight.begin(), base.qweight.end());
  longer_words.push_back(0);

  GptqHostTensors t = base;
  t.qweight = base.qweight.first(base.qweight.size() - 1);
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'qweight' has 511 elements", "[k / 8, n] = [32, 16]", "exactly 512"});
  t = base;
  t.qweight = longer_words;
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'qweight' has 513 elements", "exactly 512"});
  t = base;
  t.qweight = {};
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'qweight' has 0 elements"});

  t = base;
  t.qzeros = base.qzeros.first(7);
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'qzeros' has 7 elements", "[groups, n / 8] = [4, 2]", "exactly 8"});

  t = base;
  t.scales = base.scales.first(63);
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'scales' has 63 elements", "[groups, n] = [4, 16]", "exactly 64"});

  t = base;
  t.group_size = 128;  // arrays sized for 4 groups, group_size says 2
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'qzeros' has 8 elements", "[groups, n / 8] = [2, 2]"});
  t.group_size = -1;
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'qzeros' has 8 elements", "[groups, n / 8] = [1, 2]"});

  t = base;
  t.g_idx = base.g_idx.first(255);
  expect_invalid(t, ErrorCode::ShapeMismatch, {"'g_idx' has 255 elements", "empty or hold exactly k = 256"});
}

TEST_F(GptqBadInput, GIdxEntriesMustNameAGroup) {
  SCOPED_TRACE(rng_.describe());
  const GptqHostTensors base = valid();
  std::vector<std::int32_t> g(base.g_idx.begin(), base.g_idx.end());
  GptqHostTensors t = base;
  t.g_idx = g;
  g[37] = 4;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'g_idx' entry 37 = 4", "[0, groups = 4)", "256 / 64"});
  g[37] = 0;
  g[200] = -1;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'g_idx' entry 200 = -1", "[0, groups = 4)"});

  // group_size = -1: one group, so every entry must be 0.
  const GptqPacked one = detail::pack_gptq(
      random_unpacked(64, 8, -1, Zeros::Symmetric, GptqZeroFormat::V2, false, rng_), GptqZeroFormat::V2);
  std::vector<std::int32_t> g1(64, 0);
  g1[63] = 1;
  GptqHostTensors t1 = one.host_tensors();
  t1.g_idx = g1;
  expect_invalid(t1, ErrorCode::InvalidArgument, {"'g_idx' entry 63 = 1", "groups = 1", "group_size = -1"});
}

TEST_F(GptqBadInput, ScalesMustBeFinite) {
  SCOPED_TRACE(rng_.describe());
  const GptqHostTensors base = valid();
  std::vector<float> s(base.scales.begin(), base.scales.end());
  GptqHostTensors t = base;
  t.scales = s;
  s[21] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(t, ErrorCode::InvalidArgument, {"'scales' entry 21 (group 1, column 5) = nan", "not finite"});
  s[21] = 1.0f;
  s[63] = -std::numeric_limits<float>::infinity();
  expect_invalid(t, ErrorCode::InvalidArgument, {"'scales' entry 63 (group 3, column 15) = -inf", "not finite"});
  // Finite but past f16 (the CUDA kernels' scales for f16 activations); f16's largest is taken.
  s[63] = 70000.0f;
  expect_invalid(t, ErrorCode::InvalidArgument, {"'scales' entry 63 (group 3, column 15) = 70000", "outside f16's range"});
  s[63] = -65504.0f;
  EXPECT_NO_THROW(detail::validate_gptq(t, "load_gptq"));
}

TEST_F(GptqBadInput, EmptyGIdxAndGroupSizeMinusOneAreValid) {
  SCOPED_TRACE(rng_.describe());
  GptqHostTensors t = valid();
  t.g_idx = {};
  EXPECT_NO_THROW(detail::validate_gptq(t, "load_gptq"));
  const GptqPacked one = detail::pack_gptq(
      random_unpacked(4096, 8, -1, Zeros::Asymmetric, GptqZeroFormat::V1, false, rng_), GptqZeroFormat::V1);
  EXPECT_NO_THROW(detail::validate_gptq(one.host_tensors(), "load_gptq"));
}

TEST(GptqFormat, PackRefusesWhatTheFormatCannotHold) {
  FERRUM_SEEDED_RNG(rng);
  GptqUnpacked w = random_unpacked(64, 16, 32, Zeros::Symmetric, GptqZeroFormat::V2, false, rng);

  GptqUnpacked z16 = w;
  z16.zero[17] = 16;
  expect_error(ErrorCode::InvalidArgument, "pack_gptq", [&] { detail::pack_gptq(z16, GptqZeroFormat::V2); },
               {"'zero' entry 17 (group 1, column 1) = 16", "V2", "only zeros 0..15 fit"});
  EXPECT_NO_THROW(detail::pack_gptq(z16, GptqZeroFormat::V1));

  GptqUnpacked z0 = w;
  z0.zero[3] = 0;
  expect_error(ErrorCode::InvalidArgument, "pack_gptq", [&] { detail::pack_gptq(z0, GptqZeroFormat::V1); },
               {"'zero' entry 3 (group 0, column 3) = 0", "V1", "only zeros 1..16 fit"});
  EXPECT_NO_THROW(detail::pack_gptq(z0, GptqZeroFormat::V2));

  GptqUnpacked q16 = w;
  q16.q[40] = 16;
  expect_error(ErrorCode::InvalidArgument, "pack_gptq", [&] { detail::pack_gptq(q16, GptqZeroFormat::V2); },
               {"'q' entry 40 (row 2, column 8) = 16", "4 bits"});

  GptqUnpacked act = w;
  std::swap(act.g_idx.front(), act.g_idx.back());
  expect_error(ErrorCode::InvalidArgument, "pack_gptq",
               [&] { detail::pack_gptq(act, GptqZeroFormat::V2, /*write_g_idx=*/false); }, {"write_g_idx = false"});

  GptqUnpacked short_q = w;
  short_q.q.pop_back();
  expect_error(ErrorCode::ShapeMismatch, "pack_gptq", [&] { detail::pack_gptq(short_q, GptqZeroFormat::V2); },
               {"'q' has 1023 elements", "[k, n]", "exactly 1024"});

  GptqUnpacked wrong_groups = w;
  wrong_groups.groups = 3;
  expect_error(ErrorCode::ShapeMismatch, "pack_gptq", [&] { detail::pack_gptq(wrong_groups, GptqZeroFormat::V2); },
               {"'groups' = 3", "make 2 groups"});

  GptqUnpacked bad_n = w;
  bad_n.n = 12;
  expect_error(ErrorCode::InvalidArgument, "pack_gptq", [&] { detail::pack_gptq(bad_n, GptqZeroFormat::V2); },
               {"'n' = 12 is not a multiple of 8"});
}

TEST(GptqFormat, UnpackedConsumersCheckTheirInput) {
  FERRUM_SEEDED_RNG(rng);
  GptqUnpacked w = detail::unpack_gptq(
      detail::pack_gptq(random_unpacked(64, 16, 32, Zeros::Asymmetric, GptqZeroFormat::V2, true, rng),
                        GptqZeroFormat::V2)
          .host_tensors());

  GptqUnpacked bad_g = w;
  bad_g.g_idx[5] = 2;
  expect_error(ErrorCode::InvalidArgument, "dequantize_gptq", [&] { detail::dequantize_gptq(bad_g); },
               {"'g_idx' entry 5 = 2", "[0, groups = 2)"});
  GptqUnpacked short_scale = w;
  short_scale.scale.pop_back();
  expect_error(ErrorCode::ShapeMismatch, "dequantize_gptq", [&] { detail::dequantize_gptq_transposed(short_scale); },
               {"'scale' has 31 elements", "exactly 32"});

  GptqUnpacked repeated = w;
  repeated.perm[1] = repeated.perm[0];
  expect_error(ErrorCode::InvalidArgument, "permute_rows_for_act_order",
               [&] { detail::permute_rows_for_act_order(repeated); }, {"'perm' entry 1", "not a permutation"});
  GptqUnpacked no_perm = w;
  no_perm.perm.clear();
  expect_error(ErrorCode::ShapeMismatch, "permute_rows_for_act_order",
               [&] { detail::permute_rows_for_act_order(no_perm); }, {"'perm' has 0 elements"});
}

}  // namespace
}  // namespace ferrum::test
