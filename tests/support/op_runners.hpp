// Per-op test cases and runners, shared by the CPU-vs-fp64 tests and the
// CUDA-vs-CPU tests.
//
// A *Case holds an op's sizes, scalars and host inputs (values exactly
// representable in the dtype). make_*_case draws fresh random inputs.
// run(backend, case, options) uploads the inputs (optionally at an
// unaligned start), gives the op POISONED outputs with GUARD regions,
// synchronizes, and returns every output (decoded and raw) together with the
// result of every guard check.
//
// Graph variant: RunOptions::graph records the op in a CUDA graph instead of
// running it, checks that recording ran nothing (every output still holds
// its poison or initial contents), replays the graph once and drops it; the
// result must be the eager run's, bitwise.
//
// Device-state variants: RunOptions::decode puts the backend in device-state
// mode and sets the decode state (token, step) before the op. The case's
// host arguments are still passed (tests make them decoys); the effective_*
// helpers say what the op should actually use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/test_support.hpp"

namespace ferrum::test {

struct DecodeStep {
  std::uint32_t token = 0;
  std::uint32_t step = 0;  // pos = step, kv_len = step + 1
};

struct RunOptions {
  std::size_t lead = 0;  // every input and output view starts this many elements into its buffer
  std::optional<DecodeStep> decode;
  bool graph = false;  // capture the op, then replay it (the backend must support GraphCapture)
};

struct Output {
  DType dtype = DType::F16;
  std::vector<float> values;
  std::vector<std::uint8_t> bytes;
};

struct OpResult {
  std::vector<std::pair<std::string, Output>> outputs;
  std::string guard_failures;  // empty when every guard held

  const Output& at(std::string_view name) const;
  ::testing::AssertionResult guards_ok() const;
};

// How an output must match its reference: bitwise (bit copies, and single
// correctly rounded additions, which have exactly one right answer),
// all_close per tolerance.hpp, or bitwise but for NaN, which may come out
// with any payload (equal_or_both_nan: ops fed NaN).
enum class Match { Exact, Close, ExactOrNan };

// Compares every output of `got` with the same output of `want` (`match`
// with `scale`; outputs named in `exact_outputs` bitwise regardless), and
// requires both results' guards to be intact.
void expect_same_outputs(const OpResult& got, const OpResult& want, Match match, double scale = op_scale::kUnit,
                         std::initializer_list<std::string_view> exact_outputs = {});

// ── Cases ────────────────────────────────────────────────────────────────────

struct RmsNormCase {
  std::size_t tokens, dim;
  float eps;
  HostTensor x, w;
};
struct FusedAddRmsNormCase {
  std::size_t tokens, dim;
  float eps;
  HostTensor residual, x, w;
};
struct LayerNormCase {
  std::size_t tokens, dim;
  float eps;
  HostTensor x, gamma, beta;
};
struct GeluCase {
  std::size_t len;
  GeluApproximation approx;
  HostTensor x;
};
struct AddBiasCase {
  std::size_t rows, cols;
  HostTensor data, bias;
};
struct AddInplaceCase {
  std::size_t len;
  HostTensor residual, x;
};
struct GemmCase {
  std::size_t m, n, k;
  HostTensor a, b;
};
struct EmbeddingCase {
  std::size_t tokens, dim, vocab;
  HostTensor table, ids;  // ids: i32
  bool null_ids = false;  // pass a null `ids` (legal in device-state mode with tokens == 1)
};
struct SplitQkvCase {
  std::size_t tokens, q_dim, kv_dim;
  HostTensor qkv;
};
struct SiluMulCase {
  std::size_t tokens, im;
  HostTensor gate_up;
};
struct GemmSiluMulCase {  // gemm_silu_mul: w [2*im, k] with (gate, up) rows interleaved
  std::size_t m, im, k;
  HostTensor a, w;
};
struct QkNormRopeCase {
  std::size_t tokens, heads, head_dim, pos_offset;
  float eps;
  RopeMode mode;
  HostTensor input, norm_w;  // norm_w empty in RopeOnly mode (passed as null)
  RopeTables tables;
};
struct KvAppendCase {
  std::size_t nkv, capacity, hd, cache_len, new_tokens;
  HostTensor cache_k, cache_v;  // initial contents, [nkv, capacity, hd]
  HostTensor new_k, new_v;      // [nkv, new_tokens, hd]
};
struct TransposeCase {
  std::size_t tokens, heads, dim;
  HostTensor src;  // [heads, tokens, dim]
};
struct CopySliceCase {
  std::size_t src_offset, dst_offset, len;
  HostTensor src, dst;  // dst: initial contents
};
struct FlashCase {
  std::size_t batch, q_len, kv_len, pos_offset;
  AttnConfig cfg;
  std::size_t valid_kv;  // k/v positions >= valid_kv (up to the stride) hold NaN: they must not be read
  HostTensor q, k, v;

  std::size_t stride() const { return cfg.kv_seq_stride > 0 ? cfg.kv_seq_stride : kv_len; }
};
// flash_decode_ragged: one query per sequence; sequence b sees kv_lens[b]
// keys of its [num_kv_heads, kv_seq_stride, head_dim] cache; rows past
// kv_lens[b] hold NaN (they must not be read).
struct RaggedDecodeCase {
  std::size_t batch;
  AttnConfig cfg;  // kv_seq_stride = capacity
  HostTensor q, k, v, kv_lens;  // kv_lens: i32 [batch]
};

// Norm inputs have magnitude `amplitude`; with kSmallAmplitude and kSmallEps
// the eps term is as large as mean(x²) / the variance, so misusing eps shows.
RmsNormCase make_rms_norm_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim, float amplitude = 1.0f,
                               float eps = 1e-6f);
FusedAddRmsNormCase make_fused_add_rms_norm_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim,
                                                 float amplitude = 1.0f, float eps = 1e-5f);
LayerNormCase make_layer_norm_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim, float amplitude = 1.0f,
                                   float eps = 1e-5f);
GeluCase make_gelu_case(Rng& rng, DType dt, std::size_t len, GeluApproximation approx);
AddBiasCase make_add_bias_case(Rng& rng, DType dt, std::size_t rows, std::size_t cols);
AddInplaceCase make_add_inplace_case(Rng& rng, DType dt, std::size_t len);
// The same with non-finite and overflowing elements among the random ones:
// NaN, +Inf, -Inf and +- the dtype's largest finite value on both operands,
// every pair of them (so sums overflow to +-Inf and Inf + -Inf gives NaN),
// spread so that every 16-byte vector position and the tail see them.
AddBiasCase make_non_finite_add_bias_case(Rng& rng, DType dt, std::size_t rows, std::size_t cols);
AddInplaceCase make_non_finite_add_inplace_case(Rng& rng, DType dt, std::size_t len);
// Their sizes: f16 flat_map takes another kernel past 132 blocks of 4096
// elements (kernels/elementwise.cu), so each list has a size on either side
// (with a tail past the last 16-byte vector), and a bias row that is not a
// whole number of vectors (the 1-wide kernel).
inline constexpr std::size_t kNonFiniteAddLens[] = {7 * 4096 + 3, 200 * 4096 + 5};
inline constexpr std::pair<std::size_t, std::size_t> kNonFiniteBiasShapes[] = {{7, 4096}, {300, 4096}, {83, 769}};
GemmCase make_gemm_case(Rng& rng, DType dt, std::size_t m, std::size_t n, std::size_t k);
EmbeddingCase make_embedding_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim, std::size_t vocab);
SplitQkvCase make_split_qkv_case(Rng& rng, DType dt, std::size_t tokens, std::size_t q_dim, std::size_t kv_dim);
SiluMulCase make_silu_mul_case(Rng& rng, DType dt, std::size_t tokens, std::size_t im);
// a in [-1, 1], w in [-4.5, 4.5] / sqrt(k): gate and up have a standard
// deviation near 1.5, the range where silu bends.
GemmSiluMulCase make_gemm_silu_mul_case(Rng& rng, DType dt, std::size_t m, std::size_t im, std::size_t k);
// Tables cover max_pos = max(pos_offset + tokens, min_max_pos) + 3 positions.
QkNormRopeCase make_qk_norm_rope_case(Rng& rng, DType dt, std::size_t tokens, std::size_t heads,
                                      std::size_t head_dim, std::size_t pos_offset, RopeMode mode, double theta,
                                      std::size_t min_max_pos = 0, float amplitude = 1.0f, float eps = 1e-6f);
KvAppendCase make_kv_append_case(Rng& rng, DType dt, std::size_t nkv, std::size_t capacity, std::size_t hd,
                                 std::size_t cache_len, std::size_t new_tokens);
TransposeCase make_transpose_case(Rng& rng, DType dt, std::size_t tokens, std::size_t heads, std::size_t dim);
CopySliceCase make_copy_slice_case(Rng& rng, DType dt, std::size_t src_size, std::size_t src_offset,
                                   std::size_t dst_size, std::size_t dst_offset, std::size_t len);
// valid_kv = 0 means kv_len.
FlashCase make_flash_case(Rng& rng, DType dt, std::size_t batch, std::size_t q_len, std::size_t kv_len,
                          std::size_t pos_offset, const AttnConfig& cfg, std::size_t valid_kv = 0);
RaggedDecodeCase make_ragged_decode_case(Rng& rng, DType dt, const AttnConfig& cfg,
                                         const std::vector<std::size_t>& kv_lens);
// Scores at the edge of the range the attention ops promise exact weights
// over (kAttentionExactLogit): every finite nonzero q and k entry of `c` set
// to ±`magnitude` by its sign, and cfg.scale such that a query and key of
// matching signs give |q·k| · scale = kAttentionExactLogit (random signs stay
// below it).
FlashCase with_scores_at_the_exact_edge(FlashCase c, float magnitude);
// Success iff every element of `out` is finite and within the largest |v| a
// query can see (softmax weights sum to 1, so out is a convex combination of
// v rows; the tolerance table's rtol for out's dtype covers the rounding).
::testing::AssertionResult convex_in_v(const FlashCase& c, const Output& out);

// An AttnConfig with the given heads / head_dim / kv_seq_stride (causal,
// default scale).
AttnConfig attn_config(std::size_t num_heads, std::size_t num_kv_heads, std::size_t head_dim,
                       std::size_t kv_seq_stride = 0);

// Runs `c` on `be`, then each sequence alone as a batch-1 flash_attention
// decode over its own kv_len; success iff every sequence's output is
// bitwise the same (nothing may depend on the batch) and guards held.
::testing::AssertionResult ragged_equals_single_decodes(Backend& be, const RaggedDecodeCase& c);

std::string describe(const RmsNormCase& c);
std::string describe(const FusedAddRmsNormCase& c);
std::string describe(const LayerNormCase& c);
std::string describe(const GeluCase& c);
std::string describe(const AddBiasCase& c);
std::string describe(const AddInplaceCase& c);
std::string describe(const GemmCase& c);
std::string describe(const EmbeddingCase& c);
std::string describe(const SplitQkvCase& c);
std::string describe(const SiluMulCase& c);
std::string describe(const GemmSiluMulCase& c);
std::string describe(const QkNormRopeCase& c);
std::string describe(const KvAppendCase& c);
std::string describe(const TransposeCase& c);
std::string describe(const CopySliceCase& c);
std::string describe(const FlashCase& c);
std::string describe(const RaggedDecodeCase& c);
std::string describe(const RunOptions& o);

// Outputs: "out" for single-output ops; fused_add_rms_norm also "residual";
// add_bias "data"; add_inplace "residual"; split_qkv "q", "k", "v";
// kv append "cache_k", "cache_v"; copy_slice "dst".
OpResult run(Backend& be, const RmsNormCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const FusedAddRmsNormCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const LayerNormCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const GeluCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const AddBiasCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const AddInplaceCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const GemmCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const EmbeddingCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const SplitQkvCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const SiluMulCase& c, const RunOptions& o = {});
// Output "act"; the gate_up workspace is poisoned and guarded but not returned
// (its contents are unspecified).
OpResult run(Backend& be, const GemmSiluMulCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const QkNormRopeCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const KvAppendCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const TransposeCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const CopySliceCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const FlashCase& c, const RunOptions& o = {});
OpResult run(Backend& be, const RaggedDecodeCase& c, const RunOptions& o = {});

// What an op uses in device-state mode (single token / single query) or,
// without o.decode, the case's own host arguments.
std::size_t effective_token(const EmbeddingCase& c, std::size_t t, const RunOptions& o);
std::size_t effective_pos_offset(const QkNormRopeCase& c, const RunOptions& o);
std::size_t effective_cache_len(const KvAppendCase& c, const RunOptions& o);
std::size_t effective_kv_len(const FlashCase& c, const RunOptions& o);
std::size_t effective_pos_offset(const FlashCase& c, const RunOptions& o);

// ── Shared size lists ────────────────────────────────────────────────────────

// Eps-dominated norm cases: inputs of magnitude ~4e-3 (normal numbers in
// f16), so mean(x²) ~ 5e-6 and the variance ~ 2e-5 are comparable to eps.
inline constexpr float kSmallAmplitude = 4e-3f;
inline constexpr float kSmallEps = 1e-5f;
inline constexpr std::pair<std::size_t, std::size_t> kSmallNormShapes[] = {{1, 8}, {7, 769}, {83, 4096}};

inline constexpr std::size_t kEmbeddingVocab = 1001;
// split_qkv kv_dim for a q_dim of the dim sweep: odd, and a quarter-ish of q_dim.
inline std::size_t kv_dim_for(std::size_t q_dim) { return q_dim / 4 + 1; }
// transpose_head_to_token (heads, dim) for each entry of the dim sweep.
std::pair<std::size_t, std::size_t> transpose_shape_for(std::size_t dim_index);

struct GemmShape {
  std::size_t m, n, k;
};
// m in {1, 7, 83, 4096}, odd n / k (769), m*n*k <= 2e9.
std::vector<GemmShape> gemm_shapes();

struct RopeSpec {
  std::size_t tokens, heads, head_dim, pos_offset;
  RopeMode mode;
  double theta;
};
// tokens {1, 7, 83, 4096} x head_dim {16, 64, 128, 256, 512} x both modes,
// both thetas (head_dim 512 not at 4096 tokens).
std::vector<RopeSpec> rope_specs();

struct KvAppendSpec {
  std::size_t nkv, capacity, hd, cache_len, new_tokens;
};
std::vector<KvAppendSpec> kv_append_specs();

struct FlashSpec {
  std::size_t batch, q_len, kv_len, pos_offset;
  AttnConfig cfg;
};
// kv_len {1, 7, 129} x GQA ratio {1, 4, 8} x causal / not x {decode query,
// full prefill, queries at pos_offset > 0}, kv_seq_stride > kv_len in most;
// head_dim 64 / 128 and the default / a custom scale vary independently of
// causal.
std::vector<FlashSpec> flash_specs();

// Ragged decode batches: kv lengths 1, 7, 129, 1000 and across several
// 512-key slices, GQA 1 / 4 / 8, head dims 64 / 128 / 256.
struct RaggedDecodeSpec {
  AttnConfig cfg;
  std::vector<std::size_t> kv_lens;
};
std::vector<RaggedDecodeSpec> ragged_decode_specs();

// Device-state variants: a case whose host arguments are decoys (another
// id, position 0, kv_len 1) and the decode steps to run it at.
template <class Case>
struct StateCase {
  Case c;
  std::vector<DecodeStep> steps;
};
// Single tokens of dim 8 / 769 / 4096, with a decoy id and with null ids.
std::vector<StateCase<EmbeddingCase>> embedding_state_cases(Rng& rng, DType dt);
// head_dim 64 / 128 / 256 x both modes, steps from 0 to the table's end.
std::vector<StateCase<QkNormRopeCase>> rope_state_cases(Rng& rng, DType dt);
// head_dim 64 / 128 / 256, steps from 0 to the last row of the cache.
std::vector<StateCase<KvAppendCase>> kv_append_state_cases(Rng& rng, DType dt);
// GQA 1 / 4 / 8, steps 0 .. stride - 1; keys past step + 1 hold NaN.
std::vector<StateCase<FlashCase>> flash_state_cases(Rng& rng, DType dt);

// `test` still gives `ref`'s results (rms_norm and embedding_lookup), after
// something went wrong on it.
void expect_backend_works(Backend& test, Backend& ref, Rng& rng);

struct CopySliceSpec {
  DType dtype;
  std::size_t src_size, src_offset, dst_size, dst_offset, len;
};
std::vector<CopySliceSpec> copy_slice_specs();

}  // namespace ferrum::test
