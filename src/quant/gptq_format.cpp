#include "quant/gptq_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "common/fail.hpp"
#include "common/parallel.hpp"

namespace ferrum::detail {

namespace {

constexpr std::size_t kMaxDim = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

// The 4-bit value at position `slot` (0..7, low nibble first) of `word`.
std::uint8_t nibble(std::int32_t word, std::size_t slot) {
  return static_cast<std::uint8_t>((static_cast<std::uint32_t>(word) >> (4 * slot)) & 0xFu);
}

// `value` (0..15) shifted into position `slot` of an int32 word.
std::uint32_t nibble_bits(unsigned value, std::size_t slot) {
  return static_cast<std::uint32_t>(value & 0xFu) << (4 * slot);
}

// The group row k belongs to when g_idx is empty.
std::int32_t default_group(std::size_t row, int group_size) {
  return group_size == -1 ? 0 : static_cast<std::int32_t>(row / static_cast<std::size_t>(group_size));
}

bool g_idx_is_default(std::span<const std::int32_t> g_idx /*[k]*/, int group_size) {
  for (std::size_t row = 0; row < g_idx.size(); ++row) {
    if (g_idx[row] != default_group(row, group_size)) return false;
  }
  return true;
}

// Every entry of g_idx /*[k]*/ in [0, groups).
void check_g_idx_range(std::span<const std::int32_t> g_idx, std::size_t groups, int group_size, std::string_view op) {
  for (std::size_t row = 0; row < g_idx.size(); ++row) {
    const std::int32_t g = g_idx[row];
    if (g < 0 || static_cast<std::size_t>(g) >= groups) {
      if (group_size == -1) {
        fail(ErrorCode::InvalidArgument,
             "{}: argument 'g_idx' entry {} = {} is outside [0, groups = 1) (group_size = -1: one group over "
             "all of k)",
             op, row, g);
      }
      fail(ErrorCode::InvalidArgument,
           "{}: argument 'g_idx' entry {} = {} is outside [0, groups = {}) (groups = k / group_size = {} / {})", op,
           row, g, groups, g_idx.size(), group_size);
    }
  }
}

// Fills act_order and perm from w.g_idx (already range-checked).
void derive_order(GptqUnpacked& w) {
  w.act_order = !g_idx_is_default(w.g_idx, w.group_size);
  w.perm.resize(w.k);
  std::iota(w.perm.begin(), w.perm.end(), std::int32_t{0});
  const std::vector<std::int32_t>& g_idx = w.g_idx;
  std::stable_sort(w.perm.begin(), w.perm.end(), [&](std::int32_t a, std::int32_t b) {
    return g_idx[static_cast<std::size_t>(a)] < g_idx[static_cast<std::size_t>(b)];
  });
}

// The shape invariants of an unpacked weight (k, n, group_size, groups and
// every array's size; g_idx entries in range). Used by the functions that
// take a GptqUnpacked, which callers may build by hand.
void check_unpacked(const GptqUnpacked& w, std::string_view op) {
  const std::size_t groups = gptq_groups(w.k, w.n, w.group_size, op);
  if (w.groups != groups) {
    fail(ErrorCode::ShapeMismatch, "{}: 'groups' = {} but k = {} and group_size = {} make {} groups", op, w.groups, w.k,
         w.group_size, groups);
  }
  auto size_is = [&](std::string_view arg, std::size_t have, std::size_t want, std::string_view shape) {
    if (have != want) {
      fail(ErrorCode::ShapeMismatch, "{}: '{}' has {} elements but {} needs exactly {}", op, arg, have, shape, want);
    }
  };
  size_is("q", w.q.size(), w.k * w.n, "[k, n]");
  size_is("zero", w.zero.size(), groups * w.n, "[groups, n]");
  size_is("scale", w.scale.size(), groups * w.n, "[groups, n]");
  size_is("g_idx", w.g_idx.size(), w.k, "[k]");
  check_g_idx_range(w.g_idx, groups, w.group_size, op);
}

}  // namespace

std::size_t gptq_groups(std::size_t k, std::size_t n, int group_size, std::string_view op) {
  if (k == 0) fail(ErrorCode::InvalidArgument, "{}: argument 'k' = 0, must be at least 1", op);
  if (n == 0) fail(ErrorCode::InvalidArgument, "{}: argument 'n' = 0, must be at least 1", op);
  if (k > kMaxDim) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'k' = {} exceeds the 32-bit limit {}", op, k, kMaxDim);
  }
  if (n > kMaxDim) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'n' = {} exceeds the 32-bit limit {}", op, n, kMaxDim);
  }
  if (k % kGptqPack != 0) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'k' = {} is not a multiple of 8 (qweight packs 8 rows per int32)",
         op, k);
  }
  if (n % kGptqPack != 0) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'n' = {} is not a multiple of 8 (qzeros packs 8 columns per int32)",
         op, n);
  }
  if (group_size == -1) return 1;
  if (group_size <= 0) {
    fail(ErrorCode::InvalidArgument,
         "{}: argument 'group_size' = {} is invalid (must be a positive multiple of 8 dividing k, or -1 for one "
         "group)",
         op, group_size);
  }
  if (group_size % static_cast<int>(kGptqPack) != 0) {
    fail(ErrorCode::Unsupported,
         "{}: argument 'group_size' = {} is not a multiple of 8 (a group must span whole int32 rows of qweight)", op,
         group_size);
  }
  if (k % static_cast<std::size_t>(group_size) != 0) {
    fail(ErrorCode::ShapeMismatch, "{}: argument 'k' = {} is not a multiple of group_size = {}", op, k, group_size);
  }
  return k / static_cast<std::size_t>(group_size);
}

void validate_gptq(const GptqHostTensors& t, std::string_view op) {
  if (t.bits != 4) {
    fail(ErrorCode::Unsupported, "{}: argument 'bits' = {} is not supported (only 4-bit GPTQ is implemented)", op,
         t.bits);
  }
  if (t.zero_format != GptqZeroFormat::V1 && t.zero_format != GptqZeroFormat::V2) {
    fail(ErrorCode::InvalidArgument, "{}: argument 'zero_format' = {} is neither GptqZeroFormat::V1 (0) nor V2 (1)", op,
         static_cast<int>(t.zero_format));
  }
  const std::size_t groups = gptq_groups(t.k, t.n, t.group_size, op);

  auto size_is = [&](std::string_view arg, std::size_t have, std::size_t rows, std::size_t cols,
                     std::string_view shape) {
    if (have != rows * cols) {
      fail(ErrorCode::ShapeMismatch, "{}: argument '{}' has {} elements but {} = [{}, {}] needs exactly {}", op, arg,
           have, shape, rows, cols, rows * cols);
    }
  };
  size_is("qweight", t.qweight.size(), t.k / kGptqPack, t.n, "[k / 8, n]");
  size_is("qzeros", t.qzeros.size(), groups, t.n / kGptqPack, "[groups, n / 8]");
  size_is("scales", t.scales.size(), groups, t.n, "[groups, n]");
  if (!t.g_idx.empty() && t.g_idx.size() != t.k) {
    fail(ErrorCode::ShapeMismatch,
         "{}: argument 'g_idx' has {} elements but must be empty or hold exactly k = {} entries ([k])", op,
         t.g_idx.size(), t.k);
  }
  check_g_idx_range(t.g_idx, groups, t.group_size, op);

  // Within f16's range too: GPTQ checkpoints store f16 scales, and the CUDA
  // kernels keep them as f16 for f16 activations (a scale of 7e4 became inf
  // there, and 0 * inf NaN, while the CPU reference stayed finite).
  constexpr float kF16Max = 65504.0f;
  for (std::size_t i = 0; i < t.scales.size(); ++i) {
    if (!std::isfinite(t.scales[i])) {
      fail(ErrorCode::InvalidArgument, "{}: argument 'scales' entry {} (group {}, column {}) = {} is not finite", op, i,
           i / t.n, i % t.n, t.scales[i]);
    }
    if (std::fabs(t.scales[i]) > kF16Max) {
      fail(ErrorCode::InvalidArgument,
           "{}: argument 'scales' entry {} (group {}, column {}) = {} is outside f16's range (|scale| <= {})", op, i,
           i / t.n, i % t.n, t.scales[i], kF16Max);
    }
  }
}

GptqUnpacked unpack_gptq(const GptqHostTensors& t, std::string_view op, unsigned threads) {
  GptqUnpacked w = unpack_gptq_groups(t, op);
  const std::size_t k = w.k;
  const std::size_t n = w.n;

  // qweight [k / 8, n]: row r of W is nibble r % 8 of packed row r / 8.
  w.q.resize(k * n);
  parallel_for(k, 1, 256, threads, [&](std::size_t begin, std::size_t end) {
    for (std::size_t row = begin; row < end; ++row) {
      const std::int32_t* packed = t.qweight.data() + (row / kGptqPack) * n;
      for (std::size_t col = 0; col < n; ++col) w.q[row * n + col] = nibble(packed[col], row % kGptqPack);
    }
  });
  return w;
}

GptqUnpacked unpack_gptq_groups(const GptqHostTensors& t, std::string_view op) {
  validate_gptq(t, op);

  GptqUnpacked w;
  w.k = t.k;
  w.n = t.n;
  w.group_size = t.group_size;
  w.groups = gptq_groups(t.k, t.n, t.group_size, op);
  const std::size_t k = w.k;
  const std::size_t n = w.n;

  // qzeros [groups, n / 8]: column c of group g is nibble c % 8 of word c / 8.
  const unsigned zero_offset = t.zero_format == GptqZeroFormat::V1 ? 1u : 0u;
  w.zero.resize(w.groups * n);
  for (std::size_t g = 0; g < w.groups; ++g) {
    const std::int32_t* packed = t.qzeros.data() + g * (n / kGptqPack);
    for (std::size_t col = 0; col < n; ++col) {
      w.zero[g * n + col] = static_cast<std::uint8_t>(nibble(packed[col / kGptqPack], col % kGptqPack) + zero_offset);
    }
  }

  w.scale.assign(t.scales.begin(), t.scales.end());

  if (t.g_idx.empty()) {
    w.g_idx.resize(k);
    for (std::size_t row = 0; row < k; ++row) w.g_idx[row] = default_group(row, w.group_size);
  } else {
    w.g_idx.assign(t.g_idx.begin(), t.g_idx.end());
  }
  derive_order(w);
  return w;
}

std::vector<float> dequantize_gptq(const GptqUnpacked& w) {
  check_unpacked(w, "dequantize_gptq");
  const std::size_t n = w.n;
  std::vector<float> out(w.k * n);
  for (std::size_t row = 0; row < w.k; ++row) {
    const std::size_t g = static_cast<std::size_t>(w.g_idx[row]);
    for (std::size_t col = 0; col < n; ++col) {
      const int diff = int{w.q[row * n + col]} - int{w.zero[g * n + col]};
      out[row * n + col] = static_cast<float>(diff) * w.scale[g * n + col];
    }
  }
  return out;
}

std::vector<float> dequantize_gptq_transposed(const GptqUnpacked& w) {
  const std::vector<float> kn = dequantize_gptq(w);  // [k][n]
  std::vector<float> nk(kn.size());                  // [n][k]
  for (std::size_t row = 0; row < w.k; ++row) {
    for (std::size_t col = 0; col < w.n; ++col) nk[col * w.k + row] = kn[row * w.n + col];
  }
  return nk;
}

GptqUnpacked permute_rows_for_act_order(const GptqUnpacked& w) {
  constexpr std::string_view op = "permute_rows_for_act_order";
  check_unpacked(w, op);
  if (w.perm.size() != w.k) {
    fail(ErrorCode::ShapeMismatch, "{}: 'perm' has {} elements but [k] needs exactly {}", op, w.perm.size(), w.k);
  }
  std::vector<bool> seen(w.k, false);
  for (std::size_t j = 0; j < w.k; ++j) {
    const std::int32_t p = w.perm[j];
    if (p < 0 || static_cast<std::size_t>(p) >= w.k || seen[static_cast<std::size_t>(p)]) {
      fail(ErrorCode::InvalidArgument, "{}: 'perm' entry {} = {} is out of [0, k = {}) or repeated (not a permutation)",
           op, j, p, w.k);
    }
    seen[static_cast<std::size_t>(p)] = true;
  }

  GptqUnpacked out;
  out.k = w.k;
  out.n = w.n;
  out.groups = w.groups;
  out.group_size = w.group_size;
  out.zero = w.zero;
  out.scale = w.scale;
  out.q.resize(w.q.size());
  out.g_idx.resize(w.k);
  const std::size_t n = w.n;
  for (std::size_t j = 0; j < w.k; ++j) {
    const std::size_t src = static_cast<std::size_t>(w.perm[j]);
    std::copy_n(w.q.begin() + static_cast<std::ptrdiff_t>(src * n), n,
                out.q.begin() + static_cast<std::ptrdiff_t>(j * n));
    out.g_idx[j] = w.g_idx[src];
  }
  derive_order(out);
  return out;
}

void gather_columns(const float* a /*[m, k]*/, std::size_t m, std::size_t k,
                    std::span<const std::int32_t> perm /*[k]*/, float* out /*[m, k]*/) {
  constexpr std::string_view op = "gather_columns";
  if (perm.size() != k) {
    fail(ErrorCode::ShapeMismatch, "{}: argument 'perm' has {} elements but [k] needs exactly k = {}", op, perm.size(),
         k);
  }
  if (m == 0 || k == 0) return;
  if (a == nullptr) fail(ErrorCode::InvalidArgument, "{}: argument 'a' is null", op);
  if (out == nullptr) fail(ErrorCode::InvalidArgument, "{}: argument 'out' is null", op);
  if (a == out) fail(ErrorCode::InvalidArgument, "{}: argument 'out' aliases 'a' (the gather is not in place)", op);
  for (std::size_t j = 0; j < k; ++j) {
    if (perm[j] < 0 || static_cast<std::size_t>(perm[j]) >= k) {
      fail(ErrorCode::InvalidArgument, "{}: argument 'perm' entry {} = {} is outside [0, k = {})", op, j, perm[j], k);
    }
  }
  for (std::size_t i = 0; i < m; ++i) {
    const float* src = a + i * k;
    float* dst = out + i * k;
    for (std::size_t j = 0; j < k; ++j) dst[j] = src[static_cast<std::size_t>(perm[j])];
  }
}

GptqHostTensors GptqPacked::host_tensors() const {
  GptqHostTensors t;
  t.qweight = qweight;
  t.qzeros = qzeros;
  t.scales = scales;
  t.g_idx = g_idx;
  t.bits = 4;
  t.group_size = group_size;
  t.k = k;
  t.n = n;
  t.symmetric = symmetric;
  t.zero_format = zero_format;
  return t;
}

GptqPacked pack_gptq(const GptqUnpacked& w, GptqZeroFormat format, bool write_g_idx) {
  constexpr std::string_view op = "pack_gptq";
  check_unpacked(w, op);
  const std::size_t k = w.k;
  const std::size_t n = w.n;

  for (std::size_t i = 0; i < w.q.size(); ++i) {
    if (w.q[i] > 15) {
      fail(ErrorCode::InvalidArgument, "{}: 'q' entry {} (row {}, column {}) = {} does not fit in 4 bits (0..15)", op,
           i, i / n, i % n, w.q[i]);
    }
  }
  const bool v1 = format == GptqZeroFormat::V1;
  for (std::size_t i = 0; i < w.zero.size(); ++i) {
    const unsigned z = w.zero[i];
    if (v1 && (z < 1 || z > 16)) {
      fail(ErrorCode::InvalidArgument,
           "{}: 'zero' entry {} (group {}, column {}) = {} can't be stored as V1 (V1 stores zero - 1 in 4 bits, so "
           "only zeros 1..16 fit)",
           op, i, i / n, i % n, z);
    }
    if (!v1 && z > 15) {
      fail(ErrorCode::InvalidArgument,
           "{}: 'zero' entry {} (group {}, column {}) = {} can't be stored as V2 (V2 stores the zero itself in 4 "
           "bits, so only zeros 0..15 fit)",
           op, i, i / n, i % n, z);
    }
  }
  if (!write_g_idx && !g_idx_is_default(w.g_idx, w.group_size)) {
    fail(ErrorCode::InvalidArgument,
         "{}: write_g_idx = false, but 'g_idx' is not k / group_size everywhere (act-order needs its g_idx)", op);
  }

  GptqPacked p;
  p.k = k;
  p.n = n;
  p.group_size = w.group_size;
  p.zero_format = format;

  p.qweight.assign((k / kGptqPack) * n, 0);
  for (std::size_t row = 0; row < k; ++row) {
    for (std::size_t col = 0; col < n; ++col) {
      std::int32_t& word = p.qweight[(row / kGptqPack) * n + col];
      word = static_cast<std::int32_t>(static_cast<std::uint32_t>(word) | nibble_bits(w.q[row * n + col], row % kGptqPack));
    }
  }

  const unsigned zero_offset = v1 ? 1u : 0u;
  p.qzeros.assign(w.groups * (n / kGptqPack), 0);
  p.symmetric = true;
  for (std::size_t g = 0; g < w.groups; ++g) {
    for (std::size_t col = 0; col < n; ++col) {
      const unsigned z = w.zero[g * n + col];
      if (z != 8) p.symmetric = false;
      std::int32_t& word = p.qzeros[g * (n / kGptqPack) + col / kGptqPack];
      word = static_cast<std::int32_t>(static_cast<std::uint32_t>(word) | nibble_bits(z - zero_offset, col % kGptqPack));
    }
  }

  p.scales = w.scale;
  if (write_g_idx) p.g_idx = w.g_idx;
  return p;
}

}  // namespace ferrum::detail
