#include "quant/gptq_repack.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string_view>
#include <vector>

#include "common/fail.hpp"
#include "common/parallel.hpp"
#include "ferrum/half.hpp"

namespace ferrum::detail {

namespace {

constexpr std::size_t kMaxDim = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

void size_is(std::string_view op, std::string_view arg, std::size_t have, std::size_t want, std::string_view shape) {
  if (have != want) {
    fail(ErrorCode::ShapeMismatch, "{}: '{}' has {} elements but {} needs exactly {}", op, arg, have, shape, want);
  }
}

// perm [k] is a permutation of [0, k).
void check_permutation(std::string_view op, std::string_view arg, const std::vector<std::int32_t>& perm,
                       std::size_t k) {
  std::vector<bool> seen(k, false);
  for (std::size_t j = 0; j < k; ++j) {
    const std::int32_t p = perm[j];
    if (p < 0 || static_cast<std::size_t>(p) >= k || seen[static_cast<std::size_t>(p)]) {
      fail(ErrorCode::InvalidArgument, "{}: '{}' entry {} = {} is out of [0, k = {}) or repeated (not a permutation)",
           op, arg, j, p, k);
    }
    seen[static_cast<std::size_t>(p)] = true;
  }
}

// The sizes the kernels index with 32-bit ints (k_pad * 8 words per column
// block and scale_rows * n_pad elements stay far below, but k and n must fit).
void check_dims(std::string_view op, std::size_t k, std::size_t n) {
  if (k == 0 || n == 0) fail(ErrorCode::InvalidArgument, "{}: 'k' = {} and 'n' = {} must both be at least 1", op, k, n);
  if (k % 8 != 0 || n % 8 != 0) {
    fail(ErrorCode::InvalidArgument, "{}: 'k' = {} and 'n' = {} must both be multiples of 8", op, k, n);
  }
  if (k > kMaxDim - kGptqTileK || n > kMaxDim - kGptqTileN) {
    fail(ErrorCode::InvalidArgument, "{}: 'k' = {} or 'n' = {} exceeds the 32-bit limit of the kernels", op, k, n);
  }
}

// Rows per scale row when the fused kernel applies, else 0.
std::size_t fused_group_rows(const std::vector<std::int32_t>& row_group, int group_size, std::size_t k,
                             std::size_t k_pad) {
  const std::size_t rows = group_size == -1 ? k_pad : static_cast<std::size_t>(group_size);
  if (rows % 16 != 0) return 0;
  if (kGptqTileK % rows != 0 && rows % kGptqTileK != 0) return 0;
  if (k_pad % rows != 0) return 0;
  for (std::size_t j = 0; j < k; ++j) {
    if (static_cast<std::size_t>(row_group[j]) != j / rows) return 0;
  }
  return rows;
}

}  // namespace

GptqNibbleAddress gptq_nibble_address(std::size_t k_pad, std::size_t row, std::size_t col) noexcept {
  const std::size_t nb = col / 64, within = col % 64;
  const std::size_t tile = within / 8, gid = within % 8;
  const std::size_t kt = row / 16, r = row % 16;
  const std::size_t r8 = r % 8;
  const std::size_t t = r8 / 2;
  const unsigned slot = (r8 % 2 != 0 ? 4u : 0u) + (r >= 8 ? 1u : 0u) + (tile % 2 != 0 ? 2u : 0u);
  const std::size_t lane = gid * 4 + t;
  const std::size_t word = ((nb * (k_pad / 16) + kt) * 32 + lane) * 4 + tile / 2;
  return {word, slot};
}

namespace {
// Checks the dims and that `groups` is what k and group_size make; returns it.
std::size_t checked_groups(std::string_view op, std::size_t k, std::size_t n, int group_size, std::size_t groups) {
  check_dims(op, k, n);
  const std::size_t want = gptq_groups(k, n, group_size, op);
  if (groups != want) {
    fail(ErrorCode::ShapeMismatch, "{}: 'groups' = {} but k = {} and group_size = {} make {} groups", op, groups, k,
         group_size, want);
  }
  return groups;
}
}  // namespace

namespace {

// Checks every array of `w` but q; returns the group count.
std::size_t checked_groups_of(const GptqUnpacked& w, std::string_view op) {
  const std::size_t groups = checked_groups(op, w.k, w.n, w.group_size, w.groups);
  const std::size_t k = w.k, n = w.n;
  size_is(op, "zero", w.zero.size(), groups * n, "[groups, n]");
  size_is(op, "scale", w.scale.size(), groups * n, "[groups, n]");
  size_is(op, "g_idx", w.g_idx.size(), k, "[k]");
  size_is(op, "perm", w.perm.size(), k, "[k]");
  for (std::size_t row = 0; row < k; ++row) {
    const std::int32_t g = w.g_idx[row];
    if (g < 0 || static_cast<std::size_t>(g) >= groups) {
      fail(ErrorCode::InvalidArgument, "{}: 'g_idx' entry {} = {} is outside [0, groups = {})", op, row, g, groups);
    }
  }
  check_permutation(op, "perm", w.perm, k);
  for (std::size_t i = 0; i < w.zero.size(); ++i) {
    if (w.zero[i] > 16) {
      fail(ErrorCode::InvalidArgument, "{}: 'zero' entry {} (group {}, column {}) = {} is above 16 (V1 15 + 1)", op, i,
           i / n, i % n, w.zero[i]);
    }
  }
  for (std::size_t i = 0; i < w.scale.size(); ++i) {
    if (!std::isfinite(w.scale[i])) {
      fail(ErrorCode::InvalidArgument, "{}: 'scale' entry {} (group {}, column {}) = {} is not finite", op, i, i / n,
           i % n, w.scale[i]);
    }
  }
  return groups;
}

// Everything of the repacked weight but qweight, which the caller sizes
// (k_pad * n_pad / 8 words) and fills.
GptqRepacked repacked_groups(const GptqUnpacked& w, std::size_t groups) {
  const std::size_t k = w.k, n = w.n;
  GptqRepacked r;
  r.k = k;
  r.n = n;
  r.k_pad = round_up(k, kGptqTileK);
  r.n_pad = round_up(n, kGptqTileN);
  r.groups = groups;
  r.group_size = w.group_size;
  r.perm = w.perm;
  r.row_group.resize(k);
  for (std::size_t j = 0; j < k; ++j) {
    r.row_group[j] = w.g_idx[static_cast<std::size_t>(w.perm[j])];
    if (w.perm[j] != static_cast<std::int32_t>(j)) r.act_order = true;
  }
  r.group_rows = fused_group_rows(r.row_group, w.group_size, k, r.k_pad);
  r.scale_rows = r.fused() ? r.k_pad / r.group_rows : groups;
  if (r.scale_rows < groups) r.scale_rows = groups;  // (never: k_pad / rows >= k / rows)

  // Scales and zeros: per group, columns permuted; padding 0.
  r.scales.assign(r.scale_rows * r.n_pad, 0.0f);
  r.zeros.assign(r.scale_rows * r.n_pad, 0);
  r.uniform_zero = true;
  r.zero_value = w.zero.empty() ? 0 : w.zero[0];
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t col = 0; col < n; ++col) {
      const std::size_t dst = g * r.n_pad + gptq_scale_position(col);
      r.scales[dst] = w.scale[g * n + col];
      r.zeros[dst] = w.zero[g * n + col];
      if (w.zero[g * n + col] != r.zero_value) r.uniform_zero = false;
    }
  }
  return r;
}

}  // namespace

GptqRepacked repack_gptq(const GptqUnpacked& w, std::string_view op) {
  const std::size_t groups = checked_groups_of(w, op);
  const std::size_t k = w.k, n = w.n;
  size_is(op, "q", w.q.size(), k * n, "[k, n]");
  for (std::size_t i = 0; i < w.q.size(); ++i) {
    if (w.q[i] > 15) {
      fail(ErrorCode::InvalidArgument, "{}: 'q' entry {} (row {}, column {}) = {} does not fit in 4 bits (0..15)", op,
           i, i / n, i % n, w.q[i]);
    }
  }
  GptqRepacked r = repacked_groups(w, groups);
  r.qweight.assign(r.k_pad * r.n_pad / 8, 0u);  // the nibbles are or'ed in below
  // Weights: repacked row j is checkpoint row perm[j].
  // Rows split in whole k-tiles: a word holds nibbles of one tile only.
  parallel_for(k, kGptqTileK, kGptqTileK, 0, [&](std::size_t begin, std::size_t end) {
    for (std::size_t j = begin; j < end; ++j) {
      const std::uint8_t* src = w.q.data() + static_cast<std::size_t>(w.perm[j]) * n;
      for (std::size_t col = 0; col < n; ++col) {
        const GptqNibbleAddress at = gptq_nibble_address(r.k_pad, j, col);
        r.qweight[at.word] |= static_cast<std::uint32_t>(src[col] & 0xFu) << (4 * at.slot);
      }
    }
  });
  return r;
}

// Straight from the checkpoint's qweight (no byte per weight in between, as
// unpack_gptq + the overload above make), each repacked word written once:
// one 64-column block per task, one k16 tile at a time (its 16 rows' 64
// columns, 4 KB of the checkpoint, stay in L1 while its 512 bytes are
// written in order). gptq_nibble_address inverted: word (tile kt, lane
// 4 gid + t, w) holds rows 2t, 2t + 1, 2t + 8, 2t + 9 of the tile and
// columns 16 w + gid, 16 w + 8 + gid of the block, value (r, tile) in slot
// 4 (r % 2) + (r >= 8) + 2 (tile % 2). The bits are those of the two-step
// path (GptqRepack.StraightPathGivesTheTwoStepBits).
GptqRepacked repack_gptq(const GptqHostTensors& t, std::string_view op) {
  // unpack_gptq_groups validated t, and what it derives holds by construction
  // (zeros of 4 bits + 1, perm a stable sort): checked_groups_of would check
  // the same arrays again.
  const GptqUnpacked w = unpack_gptq_groups(t, op);
  GptqRepacked r = repacked_groups(w, w.groups);
  const std::size_t k = w.k, n = w.n;
  const std::size_t k_tiles = r.k_pad / 16;
  r.qweight.resize(r.k_pad * r.n_pad / 8);  // uninitialized: every word is written below, padding included
  parallel_for(r.n_pad / kGptqTileN, 1, 1, 0, [&](std::size_t begin, std::size_t end) {
    for (std::size_t nb = begin; nb < end; ++nb) {
      const std::size_t col0 = nb * kGptqTileN;
      for (std::size_t kt = 0; kt < k_tiles; ++kt) {
        // The tile's rows: checkpoint row perm[j] as (packed row pointer at
        // the block, shift); rows past k read as zero.
        const std::int32_t* rows[16];
        unsigned shift[16];
        for (std::size_t rr = 0; rr < 16; ++rr) {
          const std::size_t j = kt * 16 + rr;
          const std::size_t row = j < k ? static_cast<std::size_t>(w.perm[j]) : 0;
          rows[rr] = j < k ? t.qweight.data() + (row / kGptqPack) * n : nullptr;
          shift[rr] = static_cast<unsigned>(4 * (row % kGptqPack));
        }
        std::uint32_t* out = r.qweight.data() + (nb * k_tiles + kt) * 128;
        for (std::size_t lane = 0; lane < 32; ++lane) {
          const std::size_t gid = lane / 4, tq = lane % 4;
          for (std::size_t word = 0; word < 4; ++word) {
            std::uint32_t v = 0;
            for (std::size_t odd_tile = 0; odd_tile < 2; ++odd_tile) {
              const std::size_t col = col0 + (2 * word + odd_tile) * 8 + gid;
              if (col >= n) continue;  // n_pad's padding stays zero
              for (std::size_t hi = 0; hi < 2; ++hi) {
                for (std::size_t odd_row = 0; odd_row < 2; ++odd_row) {
                  const std::size_t rr = hi * 8 + 2 * tq + odd_row;
                  if (rows[rr] == nullptr) continue;  // k_pad's padding stays zero
                  const std::uint32_t q = (static_cast<std::uint32_t>(rows[rr][col]) >> shift[rr]) & 0xFu;
                  v |= q << (4 * (4 * odd_row + hi + 2 * odd_tile));
                }
              }
            }
            out[lane * 4 + word] = v;
          }
        }
      }
    }
  });
  return r;
}

GptqUnpacked unpack_repacked(const GptqRepacked& r, std::string_view op) {
  const std::size_t groups = checked_groups(op, r.k, r.n, r.group_size, r.groups);
  if (r.k_pad != round_up(r.k, kGptqTileK) || r.n_pad != round_up(r.n, kGptqTileN)) {
    fail(ErrorCode::ShapeMismatch, "{}: 'k_pad' = {} / 'n_pad' = {} are not k = {} / n = {} rounded up to {} / {}", op,
         r.k_pad, r.n_pad, r.k, r.n, kGptqTileK, kGptqTileN);
  }
  if (r.scale_rows < groups) {
    fail(ErrorCode::ShapeMismatch, "{}: 'scale_rows' = {} is below groups = {}", op, r.scale_rows, groups);
  }
  size_is(op, "qweight", r.qweight.size(), r.k_pad * r.n_pad / 8, "[n_pad / 64][k_pad / 16][32][4]");
  size_is(op, "scales", r.scales.size(), r.scale_rows * r.n_pad, "[scale_rows, n_pad]");
  size_is(op, "zeros", r.zeros.size(), r.scale_rows * r.n_pad, "[scale_rows, n_pad]");
  size_is(op, "perm", r.perm.size(), r.k, "[k]");
  size_is(op, "row_group", r.row_group.size(), r.k, "[k]");
  check_permutation(op, "perm", r.perm, r.k);

  const std::size_t k = r.k, n = r.n;
  GptqUnpacked w;
  w.k = k;
  w.n = n;
  w.groups = groups;
  w.group_size = r.group_size;
  w.q.assign(k * n, 0);
  w.g_idx.assign(k, 0);
  for (std::size_t j = 0; j < r.k_pad; ++j) {
    for (std::size_t col = 0; col < r.n_pad; ++col) {
      const GptqNibbleAddress at = gptq_nibble_address(r.k_pad, j, col);
      const auto q = static_cast<std::uint8_t>((r.qweight[at.word] >> (4 * at.slot)) & 0xFu);
      if (j < k && col < n) {
        w.q[static_cast<std::size_t>(r.perm[j]) * n + col] = q;
      } else if (q != 0) {
        fail(ErrorCode::InvalidArgument, "{}: padding value at repacked row {}, column {} is {}, not 0", op, j, col, q);
      }
    }
  }
  for (std::size_t j = 0; j < k; ++j) {
    const std::int32_t g = r.row_group[j];
    if (g < 0 || static_cast<std::size_t>(g) >= groups) {
      fail(ErrorCode::InvalidArgument, "{}: 'row_group' entry {} = {} is outside [0, groups = {})", op, j, g, groups);
    }
    if (r.fused() && static_cast<std::size_t>(g) != j / r.group_rows) {
      fail(ErrorCode::InvalidArgument, "{}: 'row_group' entry {} = {} but the fused layout has it in group {}", op, j, g,
           j / r.group_rows);
    }
    w.g_idx[static_cast<std::size_t>(r.perm[j])] = g;
  }
  w.zero.assign(groups * n, 0);
  w.scale.assign(groups * n, 0.0f);
  for (std::size_t g = 0; g < r.scale_rows; ++g) {
    for (std::size_t col = 0; col < r.n_pad; ++col) {
      const std::size_t src = g * r.n_pad + gptq_scale_position(col);
      if (g < groups && col < n) {
        w.zero[g * n + col] = r.zeros[src];
        w.scale[g * n + col] = r.scales[src];
      } else if (r.zeros[src] != 0 || r.scales[src] != 0.0f) {
        fail(ErrorCode::InvalidArgument, "{}: padding scale / zero at group {}, column {} is not 0", op, g, col);
      }
    }
  }
  // perm and act_order as unpack_gptq derives them.
  w.act_order = false;
  for (std::size_t row = 0; row < k; ++row) {
    const std::int32_t def =
        r.group_size == -1 ? 0 : static_cast<std::int32_t>(row / static_cast<std::size_t>(r.group_size));
    if (w.g_idx[row] != def) w.act_order = true;
  }
  w.perm.resize(k);
  std::iota(w.perm.begin(), w.perm.end(), std::int32_t{0});
  std::stable_sort(w.perm.begin(), w.perm.end(), [&](std::int32_t a, std::int32_t b) {
    return w.g_idx[static_cast<std::size_t>(a)] < w.g_idx[static_cast<std::size_t>(b)];
  });
  return w;
}

std::vector<std::uint16_t> gptq_scales_as(const GptqRepacked& r, DType dtype) {
  if (dtype != DType::F16 && dtype != DType::BF16) {
    fail(ErrorCode::InvalidArgument, "gptq_scales_as: argument 'dtype' = {} is not f16 or bf16", to_string(dtype));
  }
  std::vector<std::uint16_t> out(r.scales.size());
  for (std::size_t i = 0; i < r.scales.size(); ++i) {
    out[i] = dtype == DType::F16 ? f32_to_f16(r.scales[i]) : f32_to_bf16(r.scales[i]);
  }
  return out;
}

}  // namespace ferrum::detail
