// GPTQ INT4 weights repacked for the CUDA kernels (kernels/gptq_gemm.cu).
// Host code, private to src/ (and the tests, and bench/bench_gptq.cpp).
//
// The kernel multiplies with mma.sync m16n8k16: a = activations (the A
// operand, row-major m x 16), W = the B operand (16 x 8, k x n). For one
// B fragment, lane L (gid = L / 4, t = L % 4) holds W at rows
// {2t, 2t+1, 2t+8, 2t+9} of the 16-row k tile and column gid of the 8-wide
// n tile. The repacked layout puts exactly what a lane needs for one k16 step
// of a warp's 64 columns (8 n tiles) into one 16-byte word group:
//
//   qweight  u32 [n_pad / 64][k_pad / 16][32 lanes][4 words]
//            (one 512-byte block per 16 x 64 tile; a block column of 64
//            output features is one contiguous stream over all of k)
//   word j of lane L in tile (nb, kt) covers n tiles 2j and 2j+1, i.e. the
//   columns c0 = nb*64 + 16j + gid and c1 = c0 + 8, rows r = kt*16 + ...:
//       nibble slot (bits)   row      column
//       0  (0..3)            2t       c0      \ low nibble of each 16-bit
//       4  (16..19)          2t+1     c0      / half: B fragment b0,b1 of tile 2j
//       1  (4..7)            2t+8     c0      \ second nibble:
//       5  (20..23)          2t+9     c0      / b2,b3 of tile 2j
//       2  (8..11)           2t       c1        b0,b1 of tile 2j+1
//       6  (24..27)          2t+1     c1
//       3  (12..15)          2t+8     c1        b2,b3 of tile 2j+1
//       7  (28..31)          2t+9     c1
//   so (word >> 4i) & 0x000F000F holds, in its two 16-bit halves, the two
//   k-consecutive values of B-register i (i = 0..3: tile 2j b0b1, tile 2j
//   b2b3, tile 2j+1 b0b1, tile 2j+1 b2b3) — the shape the magic-number
//   dequantization (0x6400 | x for f16, 0x4300 | x for bf16) wants.
//
//   scales   [scale_rows][n_pad]  per group, columns permuted within each
//   zeros    [scale_rows][n_pad]  64-block: column nb*64 + 8*tile + gid sits
//                                 at nb*64 + 8*gid + tile, so a lane reads
//                                 the scales of its 8 n tiles as one 16-byte
//                                 load (zeros: one 8-byte load). Zeros are
//                                 the TRUE zeros (0..16, V1 already +1).
//
// Rows are in the act-order permuted order: repacked row j is checkpoint row
// perm[j] (perm sorts g_idx stably; the identity without act-order), so each
// group's rows are contiguous and the activation columns must be gathered
// with the same perm at run time (a_perm[i][j] = a[i][perm[j]]).
//
// Padding: k_pad = k rounded up to kGptqTileK (one pipeline stage), n_pad =
// n rounded up to kGptqTileN (one warp's columns). Padded q, scales and zeros
// are 0. The kernel zero-fills activation columns >= k, so padded rows
// contribute exactly 0.
//
// Two families of weights:
//   * fused: every repacked row j < k is in group j / group_rows, with
//     group_rows = group_size (k_pad for group_size -1), a multiple of 16 that
//     divides kGptqTileK or is a multiple of it. All standard checkpoints
//     (group sizes 32, 64, 128, -1, with or without act-order) are fused.
//     scale_rows = k_pad / group_rows; the fused kernel finds the group of a
//     row by division.
//   * general (anything else validate_gptq accepts: group sizes 8, 24, 40,
//     ...; act-order whose groups have uneven sizes): group_rows = 0,
//     scale_rows = the checkpoint's groups, and row_group[j] says the group
//     of each repacked row. Only the dequantize + cuBLAS path runs these.
//
// Error codes (messages start with the op name): ShapeMismatch when an
// array's size disagrees with k / n / groups; InvalidArgument for q > 15,
// a zero > 16, a non-finite scale, a g_idx entry outside [0, groups), a perm
// that is not a permutation of [0, k), or sizes the kernels cannot index
// (32-bit limits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "ferrum/dtype.hpp"
#include "quant/gptq_format.hpp"

namespace ferrum::detail {

inline constexpr std::size_t kGptqTileK = 128;  // k padding: rows per pipeline stage
inline constexpr std::size_t kGptqTileN = 64;   // n padding: columns per warp

// The allocator of GptqRepacked::qweight: a resize leaves the new words
// uninitialized, so that the threads that fill a large weight touch its pages
// first (a zero fill on one thread was a third of the straight repack's time).
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

struct GptqRepacked {
  std::size_t k = 0, n = 0;          // the checkpoint's sizes
  std::size_t k_pad = 0, n_pad = 0;  // padded (see above)
  std::size_t groups = 0;            // the checkpoint's G
  int group_size = 128;              // the checkpoint's (-1: one group)
  std::size_t group_rows = 0;        // fused: rows per scale row; 0: general layout
  std::size_t scale_rows = 0;        // rows of scales / zeros (>= groups)
  bool act_order = false;            // perm is not the identity
  bool uniform_zero = false;         // every real zero equals zero_value
  std::uint8_t zero_value = 0;

  std::vector<std::uint32_t, UninitializedAllocator<std::uint32_t>> qweight;  // [n_pad / 64][k_pad / 16][32][4]
  std::vector<float> scales;           // [scale_rows][n_pad], permuted columns
  std::vector<std::uint8_t> zeros;     // [scale_rows][n_pad], permuted columns, true zeros
  std::vector<std::int32_t> perm;      // [k] checkpoint row of repacked row j
  std::vector<std::int32_t> row_group; // [k] group (scale row) of repacked row j

  bool fused() const noexcept { return group_rows != 0; }
};

// Position of column `col` (< n_pad) in the permuted scale / zero rows.
constexpr std::size_t gptq_scale_position(std::size_t col) noexcept {
  const std::size_t base = col & ~std::size_t{63};
  const std::size_t within = col & 63;
  return base + (within % 8) * 8 + within / 8;
}

// Word index in `qweight` and nibble slot of value (row, col), row < k_pad
// and col < n_pad in the repacked (permuted) row order.
struct GptqNibbleAddress {
  std::size_t word;
  unsigned slot;
};
GptqNibbleAddress gptq_nibble_address(std::size_t k_pad, std::size_t row, std::size_t col) noexcept;

// Repacks an unpacked weight (its perm says the act-order row order: the
// identity or the stable sort of g_idx, as unpack_gptq makes it). Checks
// every array (see the error codes above) under `op`.
GptqRepacked repack_gptq(const GptqUnpacked& w, std::string_view op = "repack_gptq");
// Validates and repacks a checkpoint: the same result as
// repack_gptq(unpack_gptq(t)), with the weights taken straight from qweight
// (no byte per weight in between: load_gptq's path).
GptqRepacked repack_gptq(const GptqHostTensors& t, std::string_view op = "repack_gptq");

// The inverse, for tests and tools: back to the checkpoint's row order, true
// zeros, f32 scales and g_idx (perm / act_order recomputed as unpack_gptq
// does). Checks that the padding is zero (InvalidArgument otherwise) and the
// array sizes (ShapeMismatch).
GptqUnpacked unpack_repacked(const GptqRepacked& r, std::string_view op = "unpack_repacked");

// The scales as 16-bit patterns of `dtype` (F16 or BF16, round to nearest
// even), [scale_rows][n_pad] in the permuted column order. Other dtypes:
// InvalidArgument.
std::vector<std::uint16_t> gptq_scales_as(const GptqRepacked& r, DType dtype);

}  // namespace ferrum::detail
