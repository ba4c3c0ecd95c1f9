// GPTQ INT4 checkpoints on the host: validation, unpacking into a plain
// normalized form, dequantization (the CPU reference), act-order row
// permutation (for the GPU path) and packing (the inverse, for tests and
// tools). Private to src/ (and the tests); plain scalar code, no SIMD.
//
// The on-disk format (AutoGPTQ / GPTQModel export) of a linear layer with
// k input features and n output features, groups G:
//
//   qweight  int32 [k / 8, n]   8 4-bit values packed along k, low nibble first:
//                               q(k, n) = (qweight[k / 8][n] >> (4 * (k % 8))) & 0xF
//   qzeros   int32 [G, n / 8]   packed along n, low nibble first:
//                               stored(g, n) = (qzeros[g][n / 8] >> (4 * (n % 8))) & 0xF
//   scales   f32   [G, n]
//   g_idx    int32 [k]          the group of each input row; empty means
//                               g_idx[k] = k / group_size. With desc_act
//                               (act-order) it is not monotonic.
//
//   group_size  a positive multiple of 8 dividing k (32, 64, 128 in practice),
//               or -1: one group over all of k. G = k / group_size, or 1.
//   zeros       V1 (AutoGPTQ's historical format) stores zero - 1, so the true
//               zero is stored + 1, in 1..16; V2 stores the true zero, 0..15.
//               Symmetric checkpoints still store zeros (8 as V2, 7 as V1);
//               GptqHostTensors::symmetric is informational only: the zeros
//               actually stored are always the ones used.
//
//   W[k][n] = (q(k, n) - zero(g_idx[k], n)) * scales[g_idx[k]][n]
//   out[m][n] = sum_k a[m][k] * W[k][n]
//
// Error codes (every message names the op, the argument and the value):
//   Unsupported      bits != 4; a positive group_size that is not a multiple of 8
//   InvalidArgument  k or n = 0 or above INT32_MAX; k or n not a multiple of 8;
//                    group_size 0 or below -1; a g_idx entry outside [0, G);
//                    a non-finite scale; (pack) a q or zero its format can't hold
//   ShapeMismatch    k not a multiple of group_size; a span whose size is not
//                    exactly what k, n and G say
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferrum/backend.hpp"

namespace ferrum::detail {

// 4-bit values per int32 word of qweight (along k) and qzeros (along n).
inline constexpr std::size_t kGptqPack = 8;

// Checks every rule above on `t`; throws ferrum::Error whose message starts
// with `op` (the public op doing the check, e.g. "load_gptq").
void validate_gptq(const GptqHostTensors& t, std::string_view op);

// The number of groups G that validate_gptq would accept for these sizes
// (k / group_size, or 1 when group_size = -1). Checks k, n and group_size as
// validate_gptq does, throwing under `op`.
std::size_t gptq_groups(std::size_t k, std::size_t n, int group_size, std::string_view op);

// A GPTQ weight unpacked to one byte per value, with true zeros and a g_idx
// that is always filled in. Everything is row-major.
struct GptqUnpacked {
  std::size_t k = 0;                // input features (rows of W)
  std::size_t n = 0;                // output features (columns of W)
  std::size_t groups = 0;           // G
  int group_size = 128;             // as in the checkpoint (-1: one group)
  std::vector<std::uint8_t> q;      // [k][n]       0..15
  std::vector<std::uint8_t> zero;   // [groups][n]  true zero, 0..16 (V1 stored 15 + 1 gives 16)
  std::vector<float> scale;         // [groups][n]
  std::vector<std::int32_t> g_idx;  // [k]          group of each row, in [0, groups)
  bool act_order = false;           // g_idx differs somewhere from k / group_size (0 when group_size = -1)
  std::vector<std::int32_t> perm;   // [k] the row order that sorts g_idx stably
                                    //     (the identity when g_idx is already sorted)
};

// Validates `t` (under `op`), then unpacks it.
// threads: the host threads the unpacking may use (0: every core).
GptqUnpacked unpack_gptq(const GptqHostTensors& t, std::string_view op = "unpack_gptq", unsigned threads = 0);
// The same without the weights: validates `t`, unpacks zero, scale, g_idx and
// perm, and leaves q empty (for repack_gptq's straight path from qweight).
GptqUnpacked unpack_gptq_groups(const GptqHostTensors& t, std::string_view op = "unpack_gptq");

// W as f32, [k][n]: W[k][n] = float(q - zero) * scale[g_idx[k]][n]. Exact:
// q - zero is a small integer (exactly representable), so the only rounding
// is that of the one product.
std::vector<float> dequantize_gptq(const GptqUnpacked& w);
// The same values transposed, [n][k] (the `b` operand of gemm: out = a · bᵀ).
std::vector<float> dequantize_gptq_transposed(const GptqUnpacked& w);

// Act-order for the GPU path. Returns the same weight with its rows
// reordered by w.perm, so that each group's rows are contiguous:
//   result.q[j][:] = w.q[w.perm[j]][:],  result.g_idx[j] = w.g_idx[w.perm[j]]
// (zero and scale are per group and unchanged). At run time the activation
// columns must be gathered with the SAME permutation:
//   a_perm[m][j] = a[m][w.perm[j]]     (gather_columns(a, m, k, w.perm, a_perm))
// and then a_perm · dequant(result) == a · dequant(w), since a[m][perm[j]]
// pairs with permuted row j exactly as a[m][perm[j]] paired with row perm[j].
//
// The gather permutation is the ARGUMENT's perm; the result describes itself:
// its g_idx is sorted, so its own perm is the identity, and its act_order is
// recomputed (false when every group has exactly group_size rows, as in every
// GPTQ export; then result.g_idx[j] == j / group_size and the plain grouped
// kernel applies). A weight without act-order comes back unchanged.
GptqUnpacked permute_rows_for_act_order(const GptqUnpacked& w);

// Host reference of the run-time gather:
//   out[i][j] = a[i][perm[j]]   for i < m, j < k.
// a [m, k], perm [k] with entries in [0, k), out [m, k]; out must not alias a.
void gather_columns(const float* a /*[m, k]*/, std::size_t m, std::size_t k,
                    std::span<const std::int32_t> perm /*[k]*/, float* out /*[m, k]*/);

// A packed checkpoint that owns its arrays.
struct GptqPacked {
  std::vector<std::int32_t> qweight;  // [k / 8, n]
  std::vector<std::int32_t> qzeros;   // [groups, n / 8]
  std::vector<float> scales;          // [groups, n]
  std::vector<std::int32_t> g_idx;    // [k], or empty (g_idx[k] = k / group_size)
  int group_size = 128;
  std::size_t k = 0;
  std::size_t n = 0;
  bool symmetric = true;  // informational: set by pack_gptq when every zero is 8
  GptqZeroFormat zero_format = GptqZeroFormat::V1;

  // A view of this object's arrays (bits = 4). Valid while this object lives
  // and its vectors are not resized.
  GptqHostTensors host_tensors() const;
};

// The inverse of unpack_gptq: packs w.q / w.zero / w.scale / w.g_idx (w.perm
// and w.act_order are not used) into `format`. Each format holds 16 zeros:
//   V1 stores zero - 1, so it holds true zeros 1..16 (not 0);
//   V2 stores the zero itself, so it holds 0..15 (not 16: 4 bits end at 15).
// A zero the format can't hold, or a q above 15, throws InvalidArgument.
// write_g_idx = false leaves g_idx empty, which is only allowed when it
// equals k / group_size everywhere (InvalidArgument otherwise).
GptqPacked pack_gptq(const GptqUnpacked& w, GptqZeroFormat format, bool write_g_idx = true);

}  // namespace ferrum::detail
