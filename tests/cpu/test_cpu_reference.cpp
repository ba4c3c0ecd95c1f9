// CpuBackend (the oracle of every GPU test) against an INDEPENDENT fp64
// reference written here: naive double loops over the inputs' exact dtype
// values. Fresh random inputs every run (the seed is in every failure), f16
// and bf16, odd sizes, poisoned outputs with guard regions.
//
// Arithmetic outputs: all_close per tolerance.hpp (scale 1, gemm sqrt(k)).
// Bit copies (embedding, split_qkv, transpose, kv append, copy_slice) and
// single-rounding adds (add_inplace, add_bias, the residual of
// fused_add_rms_norm: one correctly rounded addition has exactly one right
// answer): bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "support/half_reference.hpp"
#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

// ── fp64 references ──────────────────────────────────────────────────────────

std::vector<double> as_double(const HostTensor& t) { return {t.values.begin(), t.values.end()}; }

// x[row] / sqrt(mean(x[row]²) + eps) * w, for one row of `dim` values.
void ref_rms_row(const double* x, const double* w, std::size_t dim, double eps, double* out) {
  double ss = 0.0;
  for (std::size_t d = 0; d < dim; ++d) ss += x[d] * x[d];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
  for (std::size_t d = 0; d < dim; ++d) out[d] = x[d] * r * w[d];
}

std::vector<double> ref_rms_norm(const RmsNormCase& c) {
  const std::vector<double> x = as_double(c.x), w = as_double(c.w);
  std::vector<double> out(c.tokens * c.dim);
  for (std::size_t t = 0; t < c.tokens; ++t) ref_rms_row(&x[t * c.dim], w.data(), c.dim, c.eps, &out[t * c.dim]);
  return out;
}

// The stored sum round(residual + x) and the norm of it.
struct FusedRef {
  HostTensor residual;
  std::vector<double> out;
};
FusedRef ref_fused_add_rms_norm(const FusedAddRmsNormCase& c) {
  const DType dt = c.x.dtype;
  std::vector<double> s(c.tokens * c.dim);
  for (std::size_t i = 0; i < s.size(); ++i) {
    s[i] = ref::round_to_dtype(static_cast<double>(c.residual.values[i]) + c.x.values[i], dt);
  }
  const std::vector<double> w = as_double(c.w);
  FusedRef r{HostTensor{dt, std::vector<float>(s.begin(), s.end())}, std::vector<double>(s.size())};
  for (std::size_t t = 0; t < c.tokens; ++t) ref_rms_row(&s[t * c.dim], w.data(), c.dim, c.eps, &r.out[t * c.dim]);
  return r;
}

std::vector<double> ref_layer_norm(const LayerNormCase& c) {
  std::vector<double> out(c.tokens * c.dim);
  for (std::size_t t = 0; t < c.tokens; ++t) {
    const float* x = &c.x.values[t * c.dim];
    double mean = 0.0;
    for (std::size_t d = 0; d < c.dim; ++d) mean += x[d];
    mean /= static_cast<double>(c.dim);
    double var = 0.0;
    for (std::size_t d = 0; d < c.dim; ++d) var += (x[d] - mean) * (x[d] - mean);
    var /= static_cast<double>(c.dim);  // biased
    const double rstd = 1.0 / std::sqrt(var + c.eps);
    for (std::size_t d = 0; d < c.dim; ++d) {
      out[t * c.dim + d] = (x[d] - mean) * rstd * c.gamma.values[d] + c.beta.values[d];
    }
  }
  return out;
}

std::vector<double> ref_gelu(const GeluCase& c) {
  std::vector<double> out(c.len);
  const double kSqrt2OverPi = std::sqrt(2.0 / std::acos(-1.0));
  for (std::size_t i = 0; i < c.len; ++i) {
    const double x = c.x.values[i];
    out[i] = c.approx == GeluApproximation::Erf
                 ? 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)))
                 : 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
  }
  return out;
}

// round(a + b) per element, as a tensor of the dtype.
HostTensor ref_rounded_sum(const HostTensor& a, const std::function<double(std::size_t)>& b) {
  HostTensor r{a.dtype, std::vector<float>(a.size())};
  for (std::size_t i = 0; i < a.size(); ++i) {
    r.values[i] = static_cast<float>(ref::round_to_dtype(static_cast<double>(a.values[i]) + b(i), a.dtype));
  }
  return r;
}

std::vector<double> ref_gemm(const GemmCase& c) {
  std::vector<double> a = as_double(c.a), b = as_double(c.b), out(c.m * c.n);
  for (std::size_t i = 0; i < c.m; ++i) {
    for (std::size_t j = 0; j < c.n; ++j) {
      const double* ar = &a[i * c.k];
      const double* br = &b[j * c.k];
      double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;  // independent sums: not latency bound
      std::size_t p = 0;
      for (; p + 4 <= c.k; p += 4) {
        s0 += ar[p] * br[p];
        s1 += ar[p + 1] * br[p + 1];
        s2 += ar[p + 2] * br[p + 2];
        s3 += ar[p + 3] * br[p + 3];
      }
      for (; p < c.k; ++p) s0 += ar[p] * br[p];
      out[i * c.n + j] = (s0 + s1) + (s2 + s3);
    }
  }
  return out;
}

HostTensor ref_embedding(const EmbeddingCase& c, const RunOptions& o) {
  HostTensor r{c.table.dtype, std::vector<float>(c.tokens * c.dim)};
  for (std::size_t t = 0; t < c.tokens; ++t) {
    const std::size_t id = effective_token(c, t, o);
    std::copy_n(c.table.values.begin() + static_cast<std::ptrdiff_t>(id * c.dim), c.dim,
                r.values.begin() + static_cast<std::ptrdiff_t>(t * c.dim));
  }
  return r;
}

// Columns [first, first + width) of a [rows, row_len] tensor.
HostTensor ref_columns(const HostTensor& src, std::size_t rows, std::size_t row_len, std::size_t first,
                       std::size_t width) {
  HostTensor r{src.dtype, std::vector<float>(rows * width)};
  for (std::size_t t = 0; t < rows; ++t) {
    for (std::size_t j = 0; j < width; ++j) r.values[t * width + j] = src.values[t * row_len + first + j];
  }
  return r;
}

std::vector<double> ref_silu_mul(const SiluMulCase& c) {
  std::vector<double> out(c.tokens * c.im);
  for (std::size_t t = 0; t < c.tokens; ++t) {
    for (std::size_t j = 0; j < c.im; ++j) {
      const double g = c.gate_up.values[t * 2 * c.im + j];
      const double u = c.gate_up.values[t * 2 * c.im + c.im + j];
      out[t * c.im + j] = ref::silu_mul(g, u);
    }
  }
  return out;
}

std::vector<double> ref_qk_norm_rope(const QkNormRopeCase& c, const RunOptions& o) {
  const std::size_t hd = c.head_dim, half = hd / 2;
  const std::size_t pos0 = effective_pos_offset(c, o);
  std::vector<double> out(c.tokens * c.heads * hd);
  std::vector<double> x(hd);
  const std::vector<double> w = as_double(c.norm_w);
  for (std::size_t t = 0; t < c.tokens; ++t) {
    for (std::size_t h = 0; h < c.heads; ++h) {
      for (std::size_t d = 0; d < hd; ++d) x[d] = c.input.values[(t * c.heads + h) * hd + d];
      if (c.mode == RopeMode::NormAndRope) {
        ref_rms_row(x.data(), w.data(), hd, c.eps, x.data());  // not rounded before the rotation
      }
      const std::size_t p = pos0 + t;
      double* o_row = &out[(h * c.tokens + t) * hd];
      for (std::size_t i = 0; i < half; ++i) {
        const double cs = c.tables.cos.values[p * half + i];
        const double sn = c.tables.sin.values[p * half + i];
        o_row[i] = x[i] * cs - x[i + half] * sn;
        o_row[i + half] = x[i + half] * cs + x[i] * sn;
      }
    }
  }
  return out;
}

// The caches after the append.
std::pair<HostTensor, HostTensor> ref_kv_append(const KvAppendCase& c, const RunOptions& o) {
  HostTensor k = c.cache_k, v = c.cache_v;
  const std::size_t first = effective_cache_len(c, o);
  for (std::size_t h = 0; h < c.nkv; ++h) {
    for (std::size_t t = 0; t < c.new_tokens; ++t) {
      for (std::size_t d = 0; d < c.hd; ++d) {
        k.values[(h * c.capacity + first + t) * c.hd + d] = c.new_k.values[(h * c.new_tokens + t) * c.hd + d];
        v.values[(h * c.capacity + first + t) * c.hd + d] = c.new_v.values[(h * c.new_tokens + t) * c.hd + d];
      }
    }
  }
  return {k, v};
}

HostTensor ref_transpose(const TransposeCase& c) {
  HostTensor r{c.src.dtype, std::vector<float>(c.src.size())};
  for (std::size_t h = 0; h < c.heads; ++h) {
    for (std::size_t t = 0; t < c.tokens; ++t) {
      for (std::size_t d = 0; d < c.dim; ++d) {
        r.values[(t * c.heads + h) * c.dim + d] = c.src.values[(h * c.tokens + t) * c.dim + d];
      }
    }
  }
  return r;
}

std::vector<double> ref_flash(const FlashCase& c, const RunOptions& o) {
  const std::size_t nh = c.cfg.num_heads, nkv = c.cfg.num_kv_heads, hd = c.cfg.head_dim;
  const std::size_t kv_len = effective_kv_len(c, o), pos0 = effective_pos_offset(c, o), stride = c.stride();
  const double scale = c.cfg.scale > 0.0f ? c.cfg.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> out(c.q.size());
  std::vector<double> p(kv_len);
  for (std::size_t b = 0; b < c.batch; ++b) {
    for (std::size_t h = 0; h < nh; ++h) {
      const std::size_t g = h / (nh / nkv);
      const float* kb = &c.k.values[(b * nkv + g) * stride * hd];
      const float* vb = &c.v.values[(b * nkv + g) * stride * hd];
      for (std::size_t i = 0; i < c.q_len; ++i) {
        const float* q = &c.q.values[((b * nh + h) * c.q_len + i) * hd];
        const std::size_t visible = c.cfg.causal ? std::min(kv_len, pos0 + i + 1) : kv_len;
        double mx = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < visible; ++j) {
          double s = 0.0;
          for (std::size_t d = 0; d < hd; ++d) s += static_cast<double>(q[d]) * kb[j * hd + d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double total = 0.0;
        for (std::size_t j = 0; j < visible; ++j) total += (p[j] = std::exp(p[j] - mx));
        double* o_row = &out[((b * nh + h) * c.q_len + i) * hd];
        for (std::size_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (std::size_t j = 0; j < visible; ++j) acc += p[j] * vb[j * hd + d];
          o_row[d] = acc / total;
        }
      }
    }
  }
  return out;
}

// ── Checks: run on the CPU, compare with the fp64 reference ─────────────────

void expect_exact(const OpResult& r, std::string_view name, const HostTensor& want) {
  SCOPED_TRACE(cat("output '", name, "' (bitwise)"));
  EXPECT_TRUE(bitwise_equal(r.at(name).bytes, encode_bytes(want), size_of(want.dtype)));
}

void expect_close(const OpResult& r, std::string_view name, const std::vector<double>& ref,
                  double scale = op_scale::kUnit) {
  SCOPED_TRACE(cat("output '", name, "'"));
  const Output& out = r.at(name);
  EXPECT_TRUE(all_close(out.values, ref, out.dtype, scale));
}

// Runs the case (poisoned, guarded outputs) and checks guards; the caller
// checks the outputs.
template <class Case>
OpResult checked_run(Backend& cpu, const Case& c, const RunOptions& o) {
  SCOPED_TRACE(describe(o));
  OpResult r = run(cpu, c, o);
  EXPECT_TRUE(r.guards_ok());
  return r;
}

// verify(cpu, case[, options]): one per op.
void verify(Backend& cpu, const RmsNormCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_rms_norm(c));
}
void verify(Backend& cpu, const FusedAddRmsNormCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  const OpResult r = checked_run(cpu, c, o);
  const FusedRef ref = ref_fused_add_rms_norm(c);
  expect_exact(r, "residual", ref.residual);
  expect_close(r, "out", ref.out);
}
void verify(Backend& cpu, const LayerNormCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_layer_norm(c));
}
void verify(Backend& cpu, const GeluCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_gelu(c));
}
void verify(Backend& cpu, const AddBiasCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_exact(checked_run(cpu, c, o), "data",
               ref_rounded_sum(c.data, [&](std::size_t i) { return c.bias.values[i % c.cols]; }));
}
void verify(Backend& cpu, const AddInplaceCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_exact(checked_run(cpu, c, o), "residual",
               ref_rounded_sum(c.residual, [&](std::size_t i) { return c.x.values[i]; }));
}
void verify(Backend& cpu, const GemmCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_gemm(c), op_scale::gemm(c.k));
}
void verify(Backend& cpu, const EmbeddingCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_exact(checked_run(cpu, c, o), "out", ref_embedding(c, o));
}
void verify(Backend& cpu, const SplitQkvCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  const OpResult r = checked_run(cpu, c, o);
  const std::size_t row = c.q_dim + 2 * c.kv_dim;
  expect_exact(r, "q", ref_columns(c.qkv, c.tokens, row, 0, c.q_dim));
  expect_exact(r, "k", ref_columns(c.qkv, c.tokens, row, c.q_dim, c.kv_dim));
  expect_exact(r, "v", ref_columns(c.qkv, c.tokens, row, c.q_dim + c.kv_dim, c.kv_dim));
}
void verify(Backend& cpu, const SiluMulCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_silu_mul(c));
}
// gate and up are the exact dot products rounded to the dtype (what gemm
// returns), then silu·mul in fp64.
std::vector<double> ref_gemm_silu_mul(const GemmSiluMulCase& c) {
  const std::vector<double> gate_up = ref_gemm(GemmCase{c.m, 2 * c.im, c.k, c.a, c.w});
  std::vector<double> out(c.m * c.im);
  for (std::size_t t = 0; t < c.m; ++t) {
    for (std::size_t j = 0; j < c.im; ++j) {
      const double g = ref::round_to_dtype(gate_up[t * 2 * c.im + 2 * j], c.a.dtype);
      const double u = ref::round_to_dtype(gate_up[t * 2 * c.im + 2 * j + 1], c.a.dtype);
      out[t * c.im + j] = ref::silu_mul(g, u);
    }
  }
  return out;
}
void verify(Backend& cpu, const GemmSiluMulCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "act", ref_gemm_silu_mul(c));
}
void verify(Backend& cpu, const QkNormRopeCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_qk_norm_rope(c, o));
}
void verify(Backend& cpu, const KvAppendCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  const OpResult r = checked_run(cpu, c, o);
  const auto [k, v] = ref_kv_append(c, o);
  expect_exact(r, "cache_k", k);
  expect_exact(r, "cache_v", v);
}
void verify(Backend& cpu, const TransposeCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_exact(checked_run(cpu, c, o), "out", ref_transpose(c));
}
void verify(Backend& cpu, const CopySliceCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  HostTensor want = c.dst;
  std::copy_n(c.src.values.begin() + static_cast<std::ptrdiff_t>(c.src_offset), c.len,
              want.values.begin() + static_cast<std::ptrdiff_t>(c.dst_offset));
  expect_exact(checked_run(cpu, c, o), "dst", want);
}
void verify(Backend& cpu, const FlashCase& c, const RunOptions& o = {}) {
  SCOPED_TRACE(describe(c));
  expect_close(checked_run(cpu, c, o), "out", ref_flash(c, o));
}

// Every state case at every one of its steps.
template <class Case>
void verify_state_cases(Backend& cpu, const std::vector<StateCase<Case>>& cases) {
  for (const StateCase<Case>& sc : cases) {
    for (const DecodeStep& step : sc.steps) verify(cpu, sc.c, RunOptions{0, step});
  }
}

// ── Row ops: dtype x tokens {1,7,83,4096} x dim {8,769,4096,5120} ────────────

class CpuRowOps : public RowParamTest<::testing::TestWithParam<RowParam>> {
 protected:
  CpuBackend cpu_;
};

TEST_P(CpuRowOps, RmsNorm) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_rms_norm_case(rng, dt(), tokens(), dim()));
}

TEST_P(CpuRowOps, FusedAddRmsNorm) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_fused_add_rms_norm_case(rng, dt(), tokens(), dim()));
}

TEST_P(CpuRowOps, LayerNorm) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_layer_norm_case(rng, dt(), tokens(), dim()));
}

TEST_P(CpuRowOps, Gelu) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_gelu_case(rng, dt(), tokens() * dim(), GeluApproximation::Erf));
  verify(cpu_, make_gelu_case(rng, dt(), tokens() * dim(), GeluApproximation::Tanh));
}

TEST_P(CpuRowOps, AddBias) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_add_bias_case(rng, dt(), tokens(), dim()));
}

TEST_P(CpuRowOps, AddInplace) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_add_inplace_case(rng, dt(), tokens() * dim()));
}

TEST_P(CpuRowOps, EmbeddingLookup) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_embedding_case(rng, dt(), tokens(), dim(), kEmbeddingVocab));
}

TEST_P(CpuRowOps, SplitQkv) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_split_qkv_case(rng, dt(), tokens(), dim(), kv_dim_for(dim())));
}

TEST_P(CpuRowOps, FusedSiluMulSplit) {
  FERRUM_SEEDED_RNG(rng);
  verify(cpu_, make_silu_mul_case(rng, dt(), tokens(), dim()));
}

TEST_P(CpuRowOps, TransposeHeadToToken) {
  FERRUM_SEEDED_RNG(rng);
  const auto [heads, head_dim] = transpose_shape_for(dim_index());
  verify(cpu_, make_transpose_case(rng, dt(), tokens(), heads, head_dim));
}

INSTANTIATE_TEST_SUITE_P(Sweep, CpuRowOps, ::testing::ValuesIn(all_row_params()), row_param_name);

// ── Eps-dominated norms: eps comparable to mean(x²) / the variance ───────────

class CpuDTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  CpuBackend cpu_;
};

class CpuSmallNorms : public CpuDTypeTest {};
TEST_P(CpuSmallNorms, EpsMatters) {
  FERRUM_SEEDED_RNG(rng);
  for (const auto& [tokens, dim] : kSmallNormShapes) {
    verify(cpu_, make_rms_norm_case(rng, dt(), tokens, dim, kSmallAmplitude, kSmallEps));
    verify(cpu_, make_fused_add_rms_norm_case(rng, dt(), tokens, dim, kSmallAmplitude, kSmallEps));
    verify(cpu_, make_layer_norm_case(rng, dt(), tokens, dim, kSmallAmplitude, kSmallEps));
  }
  verify(cpu_, make_qk_norm_rope_case(rng, dt(), 7, 7, 128, 3, RopeMode::NormAndRope, kRopeTheta10k, 0,
                                      kSmallAmplitude, kSmallEps));
}
INSTANTIATE_TEST_SUITE_P(DTypes, CpuSmallNorms, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Non-finite inputs: NaN, +-Inf and overflowing sums through the adds ─────

// The reference sum must hold finite operands that overflowed to +Inf and
// to -Inf and non-NaN operands that gave NaN (Inf + -Inf), or the case
// proves nothing about them.
void expect_overflow_and_invalid(const HostTensor& a, const std::function<float(std::size_t)>& b,
                                 const HostTensor& sum) {
  std::size_t up = 0, down = 0, invalid = 0;
  for (std::size_t i = 0; i < sum.size(); ++i) {
    const float x = a.values[i], y = b(i), s = sum.values[i];
    if (std::isfinite(x) && std::isfinite(y) && std::isinf(s)) ++(s > 0 ? up : down);
    if (!std::isnan(x) && !std::isnan(y) && std::isnan(s)) ++invalid;
  }
  EXPECT_GT(up, 0u);
  EXPECT_GT(down, 0u);
  EXPECT_GT(invalid, 0u);
}

// Not verify(): its bitwise comparison fails on NaN alone, since CpuBackend's
// NaN keeps the host's sign (x86's default NaN is negative) and the
// reference rounding gives the canonical positive one.
class CpuNonFinite : public CpuDTypeTest {};
TEST_P(CpuNonFinite, AddsPropagateNanAndInf) {
  FERRUM_SEEDED_RNG(rng);
  for (std::size_t len : kNonFiniteAddLens) {
    const AddInplaceCase c = make_non_finite_add_inplace_case(rng, dt(), len);
    SCOPED_TRACE(describe(c));
    const auto x = [&](std::size_t i) { return c.x.values[i]; };
    const HostTensor want = ref_rounded_sum(c.residual, x);
    expect_overflow_and_invalid(c.residual, x, want);
    EXPECT_TRUE(equal_or_both_nan(checked_run(cpu_, c, {}).at("residual").values, want.values));
  }
  for (const auto& [rows, cols] : kNonFiniteBiasShapes) {
    const AddBiasCase c = make_non_finite_add_bias_case(rng, dt(), rows, cols);
    SCOPED_TRACE(describe(c));
    const auto bias = [&](std::size_t i) { return c.bias.values[i % c.cols]; };
    const HostTensor want = ref_rounded_sum(c.data, bias);
    expect_overflow_and_invalid(c.data, bias, want);
    EXPECT_TRUE(equal_or_both_nan(checked_run(cpu_, c, {}).at("data").values, want.values));
  }
}
INSTANTIATE_TEST_SUITE_P(DTypes, CpuNonFinite, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Ops with hand-picked size lists ──────────────────────────────────────────

class CpuCaseOps : public CaseParamTest<::testing::TestWithParam<DTypeCaseParam>> {
 protected:
  CpuBackend cpu_;
};

class CpuGemm : public CpuCaseOps {};
TEST_P(CpuGemm, MatchesFp64) {
  FERRUM_SEEDED_RNG(rng);
  const GemmShape s = gemm_shapes()[index()];
  verify(cpu_, make_gemm_case(rng, dt(), s.m, s.n, s.k));
}
INSTANTIATE_TEST_SUITE_P(Shapes, CpuGemm, ::testing::ValuesIn(dtype_case_params(gemm_shapes().size())),
                         dtype_case_param_name);

// The gemm shapes with n read as 2 * im (odd n: im = n / 2, at least 1).
class CpuGemmSiluMul : public CpuCaseOps {};
TEST_P(CpuGemmSiluMul, MatchesFp64) {
  FERRUM_SEEDED_RNG(rng);
  const GemmShape s = gemm_shapes()[index()];
  verify(cpu_, make_gemm_silu_mul_case(rng, dt(), s.m, std::max<std::size_t>(1, s.n / 2), s.k));
}
INSTANTIATE_TEST_SUITE_P(Shapes, CpuGemmSiluMul, ::testing::ValuesIn(dtype_case_params(gemm_shapes().size())),
                         dtype_case_param_name);

class CpuQkNormRope : public CpuCaseOps {};
TEST_P(CpuQkNormRope, MatchesFp64) {
  FERRUM_SEEDED_RNG(rng);
  const RopeSpec s = rope_specs()[index()];
  verify(cpu_, make_qk_norm_rope_case(rng, dt(), s.tokens, s.heads, s.head_dim, s.pos_offset, s.mode, s.theta));
}
INSTANTIATE_TEST_SUITE_P(Specs, CpuQkNormRope, ::testing::ValuesIn(dtype_case_params(rope_specs().size())),
                         dtype_case_param_name);

class CpuKvAppend : public CpuCaseOps {};
TEST_P(CpuKvAppend, MatchesCopy) {
  FERRUM_SEEDED_RNG(rng);
  const KvAppendSpec s = kv_append_specs()[index()];
  verify(cpu_, make_kv_append_case(rng, dt(), s.nkv, s.capacity, s.hd, s.cache_len, s.new_tokens));
}
INSTANTIATE_TEST_SUITE_P(Specs, CpuKvAppend, ::testing::ValuesIn(dtype_case_params(kv_append_specs().size())),
                         dtype_case_param_name);

class CpuFlashAttention : public CpuCaseOps {};
TEST_P(CpuFlashAttention, MatchesFp64) {
  FERRUM_SEEDED_RNG(rng);
  const FlashSpec s = flash_specs()[index()];
  verify(cpu_, make_flash_case(rng, dt(), s.batch, s.q_len, s.kv_len, s.pos_offset, s.cfg));
}
INSTANTIATE_TEST_SUITE_P(Specs, CpuFlashAttention, ::testing::ValuesIn(dtype_case_params(flash_specs().size())),
                         dtype_case_param_name);

// At the edge of the exact range (kAttentionExactLogit), with q and k at
// f16's largest (a tiny scale) and at 2^-4 (scale up to kMaxAttentionScale,
// the largest taken): every output finite and a convex combination of v, as
// CudaAttentionExactEdge checks on CUDA.
class CpuFlashAttentionExactEdge : public ::testing::TestWithParam<DType> {};
TEST_P(CpuFlashAttentionExactEdge, OutputsStayConvexInV) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  for (float magnitude : {65504.0f, 0.0625f}) {
    for (std::size_t hd : {64, 256}) {
      for (std::size_t q_len : {1, 9}) {
        const FlashCase c = with_scores_at_the_exact_edge(
            make_flash_case(rng, GetParam(), 2, q_len, 40, 40 - q_len, attn_config(8, 2, hd, 47)), magnitude);
        SCOPED_TRACE(describe(c));
        // 2^-4 at head_dim 64 is the largest scale taken: run, not refused.
        if (magnitude == 0.0625f && hd == 64) EXPECT_EQ(c.cfg.scale, kMaxAttentionScale);
        const OpResult r = run(cpu, c);
        EXPECT_TRUE(r.guards_ok());
        EXPECT_TRUE(convex_in_v(c, r.at("out")));
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(DTypes, CpuFlashAttentionExactEdge, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// CpuBackend takes head dims the CUDA kernels do not (those take 64 / 128 /
// 256, which flash_specs covers): the others against fp64 too, a decode query
// past a longer stride, a causal chunk at pos_offset > 0 in a batch of two,
// and a non-causal prefill.
std::vector<FlashSpec> cpu_only_head_dim_flash_specs() {
  std::vector<FlashSpec> specs;
  for (std::size_t hd : {8, 48, 96, 384}) {
    AttnConfig cfg = attn_config(8, 2, hd, 150);
    cfg.causal = true;
    specs.push_back({1, 1, 129, 128, cfg});
    cfg.kv_seq_stride = 0;
    specs.push_back({2, 5, 129, 60, cfg});
    cfg.causal = false;
    specs.push_back({1, 7, 7, 0, cfg});
  }
  return specs;
}

class CpuFlashAttentionOtherHeadDims : public CpuCaseOps {};
TEST_P(CpuFlashAttentionOtherHeadDims, MatchesFp64) {
  FERRUM_SEEDED_RNG(rng);
  const FlashSpec s = cpu_only_head_dim_flash_specs()[index()];
  verify(cpu_, make_flash_case(rng, dt(), s.batch, s.q_len, s.kv_len, s.pos_offset, s.cfg));
}
INSTANTIATE_TEST_SUITE_P(Specs, CpuFlashAttentionOtherHeadDims,
                         ::testing::ValuesIn(dtype_case_params(cpu_only_head_dim_flash_specs().size())),
                         dtype_case_param_name);

// flash_decode_ragged is, per sequence, the single-query flash_attention
// decode checked above: bitwise, so the fp64 check carries over.
class CpuFlashDecodeRagged : public CpuCaseOps {};
TEST_P(CpuFlashDecodeRagged, EachSequenceEqualsItsOwnDecode) {
  FERRUM_SEEDED_RNG(rng);
  const RaggedDecodeSpec s = ragged_decode_specs()[index()];
  const RaggedDecodeCase c = make_ragged_decode_case(rng, dt(), s.cfg, s.kv_lens);
  SCOPED_TRACE(describe(c));
  EXPECT_TRUE(ragged_equals_single_decodes(cpu_, c));
}
INSTANTIATE_TEST_SUITE_P(Specs, CpuFlashDecodeRagged,
                         ::testing::ValuesIn(dtype_case_params(ragged_decode_specs().size())), dtype_case_param_name);

TEST(CpuFlashDecodeRaggedErrors, KvLensOutOfRangeThrows) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  const AttnConfig cfg = attn_config(4, 2, 64, 9);
  for (float bad : {0.0f, -1.0f, 10.0f}) {
    RaggedDecodeCase c = make_ragged_decode_case(rng, DType::F16, cfg, {9, 3});
    c.kv_lens.values[1] = bad;
    expect_error(ErrorCode::CapacityExceeded, "flash_decode_ragged", [&] { run(cpu, c); }, "kv_lens[1]");
  }
}

class CpuCopySlice : public ::testing::TestWithParam<std::size_t> {};
TEST_P(CpuCopySlice, MatchesCopy) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  const CopySliceSpec s = copy_slice_specs()[GetParam()];
  verify(cpu, make_copy_slice_case(rng, s.dtype, s.src_size, s.src_offset, s.dst_size, s.dst_offset, s.len));
}
INSTANTIATE_TEST_SUITE_P(Specs, CpuCopySlice, ::testing::Range<std::size_t>(0, copy_slice_specs().size()));

// ── Device-state mode: token / pos / kv_len from set_decode_state ────────────
// The host arguments are decoys (a different id, position 0, kv_len 1): the
// result must follow the decode state.

class CpuDeviceState : public CpuDTypeTest {};

TEST_P(CpuDeviceState, EmbeddingLookupReadsStateToken) {
  FERRUM_SEEDED_RNG(rng);
  verify_state_cases(cpu_, embedding_state_cases(rng, dt()));
}

TEST_P(CpuDeviceState, QkNormRopeReadsStatePosition) {
  FERRUM_SEEDED_RNG(rng);
  verify_state_cases(cpu_, rope_state_cases(rng, dt()));
}

TEST_P(CpuDeviceState, KvAppendWritesStateRow) {
  FERRUM_SEEDED_RNG(rng);
  verify_state_cases(cpu_, kv_append_state_cases(rng, dt()));
}

TEST_P(CpuDeviceState, FlashAttentionDecodeReadsStateKvLen) {
  FERRUM_SEEDED_RNG(rng);
  verify_state_cases(cpu_, flash_state_cases(rng, dt()));
}

// ── CpuBackend refuses bad device-side values immediately ────────────────────

TEST_P(CpuDeviceState, OutOfRangeTokenThrows) {
  FERRUM_SEEDED_RNG(rng);
  auto c = make_embedding_case(rng, dt(), 1, 64, kEmbeddingVocab);
  expect_error(ErrorCode::InvalidArgument, "embedding_lookup",
               [&] { run(cpu_, c, RunOptions{0, DecodeStep{kEmbeddingVocab, 0}}); },
               cat("token id ", kEmbeddingVocab, " (decode-state token)"));
  expect_error(ErrorCode::InvalidArgument, "embedding_lookup",
               [&] { run(cpu_, c, RunOptions{0, DecodeStep{0x7fffffffu, 0}}); }, "(decode-state token)");
  EXPECT_FALSE(cpu_.device_state_mode()) << "device-state mode must be restored after the throw";
  // Out-of-range ids from the ids buffer, too (-1 and vocab).
  auto multi = make_embedding_case(rng, dt(), 7, 64, kEmbeddingVocab);
  multi.ids.values[3] = static_cast<float>(kEmbeddingVocab);
  expect_error(ErrorCode::InvalidArgument, "embedding_lookup", [&] { run(cpu_, multi); },
               cat("token id ", kEmbeddingVocab, " (ids[3])"));
  multi.ids.values[3] = -1.0f;
  expect_error(ErrorCode::InvalidArgument, "embedding_lookup", [&] { run(cpu_, multi); }, "token id -1 (ids[3])");
}

TEST_P(CpuDeviceState, StatePositionPastCapacityThrows) {
  FERRUM_SEEDED_RNG(rng);
  const auto kv = make_kv_append_case(rng, dt(), 2, 16, 64, 0, 1);
  expect_error(ErrorCode::CapacityExceeded, "kv_cache_append_head_major",
               [&] { run(cpu_, kv, RunOptions{0, DecodeStep{0, 16}}); }, "decode-state position 16");
  const auto rope = make_qk_norm_rope_case(rng, dt(), 1, 4, 64, 0, RopeMode::RopeOnly, kRopeTheta10k, 20);
  expect_error(ErrorCode::CapacityExceeded, "qk_norm_rope",
               [&] { run(cpu_, rope, RunOptions{0, DecodeStep{0, static_cast<std::uint32_t>(rope.tables.max_pos)}}); },
               cat("decode-state position ", rope.tables.max_pos, " is outside the ", rope.tables.max_pos, " positions"));
  AttnConfig cfg;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.kv_seq_stride = 32;
  const auto attn = make_flash_case(rng, dt(), 1, 1, 1, 0, cfg);
  expect_error(ErrorCode::CapacityExceeded, "flash_attention",
               [&] { run(cpu_, attn, RunOptions{0, DecodeStep{0, 32}}); },  // kv_len 33 > stride 32
               "decode-state kv_len 33 is outside [1, 32]");
  // The last legal step of each still works.
  EXPECT_NO_THROW(run(cpu_, kv, RunOptions{0, DecodeStep{0, 15}}));
  EXPECT_NO_THROW(run(cpu_, attn, RunOptions{0, DecodeStep{0, 31}}));
}

INSTANTIATE_TEST_SUITE_P(DTypes, CpuDeviceState, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

}  // namespace
}  // namespace ferrum::test
