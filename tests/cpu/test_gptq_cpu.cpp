// CpuBackend's GPTQ path end to end: checkpoint tensors -> load_gptq ->
// gemm_gptq / gemm_quant, compared bit for bit with an exact reference.
// Integer activations and power-of-two scales make every product and sum
// exact in double, so the only rounding is the one into the output dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ferrum/cpu_backend.hpp"
#include "ferrum/half.hpp"
#include "quant/gptq_format.hpp"
#include "support/test_support.hpp"

namespace ferrum {
namespace {

struct GptqGemmCase {
  std::size_t m, k, n;
  int group_size;
  bool act_order;
  GptqZeroFormat format;
};

std::vector<GptqGemmCase> cases() {
  std::vector<GptqGemmCase> out;
  for (int gs : {32, 64, 128, -1}) {
    for (std::size_t m : {1, 3, 16, 17}) {
      for (bool act : {false, true}) {
        if (gs == -1 && act) continue;  // one group: no order to permute
        out.push_back({m, 256, 72, gs, act, act ? GptqZeroFormat::V2 : GptqZeroFormat::V1});
      }
    }
  }
  out.push_back({200, 128, 24, 32, true, GptqZeroFormat::V1});
  return out;
}

// Random q in [0, 15], zeros in [1, 15] (legal in V1 and V2), scales 2^-e.
detail::GptqUnpacked random_weight(const GptqGemmCase& c, test::Rng& rng) {
  detail::GptqUnpacked w;
  w.k = c.k;
  w.n = c.n;
  w.group_size = c.group_size;
  const std::size_t group_rows = c.group_size == -1 ? c.k : static_cast<std::size_t>(c.group_size);
  w.groups = c.k / group_rows;
  std::uniform_int_distribution<int> q(0, 15), zero(1, 15), exp(3, 8);
  w.q.resize(c.k * c.n);
  for (auto& v : w.q) v = static_cast<std::uint8_t>(q(rng.engine()));
  w.zero.resize(w.groups * c.n);
  for (auto& v : w.zero) v = static_cast<std::uint8_t>(zero(rng.engine()));
  w.scale.resize(w.groups * c.n);
  for (auto& v : w.scale) v = std::ldexp(1.0f, -exp(rng.engine()));
  w.g_idx.resize(c.k);
  for (std::size_t r = 0; r < c.k; ++r) w.g_idx[r] = static_cast<std::int32_t>(r / group_rows);
  if (c.act_order) std::shuffle(w.g_idx.begin(), w.g_idx.end(), rng.engine());  // desc_act: groups in any row order
  return w;
}

TEST(CpuGptq, GemmIsExactOnIntegerActivations) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  for (const GptqGemmCase& c : cases()) {
    const std::string case_name = test::cat("m ", c.m, " k ", c.k, " n ", c.n, " group ", c.group_size,
                                            c.act_order ? " act-order" : "",
                                            c.format == GptqZeroFormat::V1 ? " v1" : " v2");
    SCOPED_TRACE(case_name);
    const detail::GptqUnpacked w = random_weight(c, rng);
    const detail::GptqPacked packed = detail::pack_gptq(w, c.format);
    std::unique_ptr<QuantWeight> loaded = cpu.load_gptq(packed.host_tensors());
    ASSERT_EQ(loaded->k(), c.k);
    ASSERT_EQ(loaded->n(), c.n);

    std::uniform_int_distribution<int> act(-4, 4);
    std::vector<float> a(c.m * c.k);
    for (auto& v : a) v = static_cast<float>(act(rng.engine()));
    // Exact reference from the unpacked values: sum_k a[i][r] (q - zero) scale.
    std::vector<double> ref(c.m * c.n, 0.0);
    for (std::size_t i = 0; i < c.m; ++i) {
      for (std::size_t r = 0; r < c.k; ++r) {
        const std::size_t g = static_cast<std::size_t>(w.g_idx[r]);
        for (std::size_t j = 0; j < c.n; ++j) {
          ref[i * c.n + j] += static_cast<double>(a[i * c.k + r]) *
                              (static_cast<double>(w.q[r * c.n + j]) - w.zero[g * c.n + j]) * w.scale[g * c.n + j];
        }
      }
    }
    for (DType dt : {DType::F16, DType::BF16}) {
      Buffer a_buf = cpu.upload(a, dt);
      for (bool via_quant : {false, true}) {
        const char* op = via_quant ? "gemm_quant" : "gemm_gptq";
        test::GuardedOutput out(cpu, dt, c.m * c.n);  // poisoned
        if (via_quant) {
          cpu.gemm_quant(a_buf, *loaded, out.view(), c.m);
        } else {
          cpu.gemm_gptq(a_buf, *loaded, out.view(), c.m);
        }
        EXPECT_TRUE(out.check_guard(op, "out", test::cat(case_name, " ", to_string(dt))));
        const std::vector<float> got = out.values();
        std::size_t mismatches = 0;
        for (std::size_t e = 0; e < ref.size(); ++e) {
          const float exact = static_cast<float>(ref[e]);  // exact: a short sum of dyadic terms
          const float want = dt == DType::F16 ? f16_to_f32(f32_to_f16(exact)) : bf16_to_f32(f32_to_bf16(exact));
          if (!(got[e] == want)) {
            if (mismatches++ < 3) ADD_FAILURE() << "element " << e << ": got " << got[e] << ", want " << want;
          }
        }
        EXPECT_EQ(mismatches, 0u) << op << " " << to_string(dt);
      }
    }
  }
}

// gemm_silu_mul_gptq is gemm_gptq into gate_up, then silu·mul of each
// (gate, up) column pair: act equals fused_silu_mul_split of the same
// gate_up with its pairs split into [gate | up] halves (the same silu·mul of
// the same rounded values), bit for bit; gate_up is gemm_gptq's. Over
// m = 1 .. 5, groups of 32 / 128 / the whole k, v1 and v2 zeros.
TEST(CpuGptq, GemmSiluMulIsGemmThenPairs) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  for (const GptqGemmCase& c : {GptqGemmCase{1, 256, 72, 32, false, GptqZeroFormat::V1},
                                GptqGemmCase{1, 256, 72, 128, true, GptqZeroFormat::V2},
                                GptqGemmCase{1, 384, 24, -1, false, GptqZeroFormat::V1}}) {
    const std::unique_ptr<QuantWeight> w = cpu.load_gptq(detail::pack_gptq(random_weight(c, rng), c.format).host_tensors());
    const std::size_t im = c.n / 2;
    for (std::size_t m = 1; m <= 5; ++m) {
      std::uniform_real_distribution<float> value(-1.0f, 1.0f);
      std::vector<float> a(m * c.k);
      for (auto& v : a) v = value(rng.engine());
      for (DType dt : {DType::F16, DType::BF16}) {
        const std::string where = test::cat("m ", m, " k ", c.k, " n ", c.n, " group ", c.group_size, " ",
                                            to_string(dt));
        SCOPED_TRACE(where);
        const Buffer a_buf = cpu.upload(a, dt);
        Buffer gate_up_ref = cpu.alloc(dt, m * c.n);
        cpu.gemm_gptq(a_buf, *w, gate_up_ref, m);
        const std::vector<float> pairs = cpu.download(gate_up_ref);
        std::vector<float> halves(m * c.n);
        for (std::size_t t = 0; t < m; ++t) {
          for (std::size_t j = 0; j < im; ++j) {
            halves[t * c.n + j] = pairs[t * c.n + 2 * j];
            halves[t * c.n + im + j] = pairs[t * c.n + 2 * j + 1];
          }
        }
        Buffer act_ref = cpu.alloc(dt, m * im);
        cpu.fused_silu_mul_split(cpu.upload(halves, dt), act_ref, m, im);
        test::GuardedOutput gate_up(cpu, dt, m * c.n), act(cpu, dt, m * im);  // poisoned
        cpu.gemm_silu_mul_gptq(a_buf, *w, gate_up.view(), act.view(), m);
        EXPECT_TRUE(gate_up.check_guard("gemm_silu_mul_gptq", "gate_up", where));
        EXPECT_TRUE(act.check_guard("gemm_silu_mul_gptq", "act", where));
        EXPECT_EQ(act.values(), cpu.download(act_ref));
        EXPECT_EQ(gate_up.values(), pairs);
      }
    }
  }
}

// row_sq per 16 columns of rows x cols values, each group summed in double.
std::vector<float> row_sq_reference(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
  std::vector<float> sq(rows * row_sq_groups(cols));
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t g = 0; g < row_sq_groups(cols); ++g) {
      double sum = 0.0;
      for (std::size_t c = g * kRowSqColumns; c < std::min(cols, (g + 1) * kRowSqColumns); ++c) {
        sum += static_cast<double>(x[r * cols + c]) * x[r * cols + c];
      }
      sq[r * row_sq_groups(cols) + g] = static_cast<float>(sum);
    }
  }
  return sq;
}

TEST(CpuGptq, RowSumSquaresSumsEachSixteenColumns) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  std::normal_distribution<float> value(0.0f, 2.0f);
  for (std::size_t cols : {std::size_t{8}, std::size_t{769}, std::size_t{4096}}) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{7}}) {
      for (DType dt : {DType::F16, DType::BF16}) {
        const std::string where = test::cat(rows, " x ", cols, " ", to_string(dt));
        SCOPED_TRACE(where);
        std::vector<float> x(rows * cols);
        for (auto& v : x) v = value(rng.engine());
        const Buffer x_buf = cpu.upload(x, dt);
        test::GuardedOutput row_sq(cpu, DType::F32, rows * row_sq_groups(cols));  // poisoned
        cpu.row_sum_squares(x_buf, row_sq.view(), rows, cols);
        EXPECT_TRUE(row_sq.check_guard("row_sum_squares", "row_sq", where));
        EXPECT_EQ(row_sq.values(), row_sq_reference(cpu.download(x_buf), rows, cols));
      }
    }
  }
}

// gemm_gptq_add_residual = gemm_gptq, then fused_add_rms_norm's residual add,
// and row_sq of the result (its out is a workspace); rms_norm_gemm_gptq (and its SiLU·mul form) =
// rms_norm from that row_sq, then the GEMM on the normalized rows.
TEST(CpuGptq, RowSqOpsAreTheirCompositions) {
  FERRUM_SEEDED_RNG(rng);
  CpuBackend cpu;
  const float eps = 1e-5f;
  for (const GptqGemmCase& c : {GptqGemmCase{1, 256, 72, 128, false, GptqZeroFormat::V1},
                                GptqGemmCase{3, 256, 256, 32, false, GptqZeroFormat::V1},
                                GptqGemmCase{17, 384, 72, -1, false, GptqZeroFormat::V1}}) {
    // The producer's n is the consumer's k: a square-ish pair of weights.
    const std::unique_ptr<QuantWeight> w_out =
        cpu.load_gptq(detail::pack_gptq(random_weight(c, rng), c.format).host_tensors());  // [k, n]
    const GptqGemmCase c_in{c.m, c.n, c.n, -1, false, GptqZeroFormat::V1};
    const std::unique_ptr<QuantWeight> w_in =
        cpu.load_gptq(detail::pack_gptq(random_weight(c_in, rng), c_in.format).host_tensors());  // [n, n]
    const std::size_t m = c.m, k = c.k, n = c.n;
    std::normal_distribution<float> value(0.0f, 1.0f);
    std::vector<float> a(m * k), residual(m * n), norm_w(n);
    for (auto& v : a) v = value(rng.engine());
    for (auto& v : residual) v = value(rng.engine());
    for (auto& v : norm_w) v = 1.0f + 0.1f * value(rng.engine());
    for (DType dt : {DType::F16, DType::BF16}) {
      const std::string where = test::cat("m ", m, " k ", k, " n ", n, " ", to_string(dt));
      SCOPED_TRACE(where);
      const Buffer a_buf = cpu.upload(a, dt), norm_buf = cpu.upload(norm_w, dt);
      // The compositions.
      Buffer out_ref = cpu.alloc(dt, m * n), residual_ref = cpu.upload(residual, dt), normed_ref = cpu.alloc(dt, m * n);
      cpu.gemm_gptq(a_buf, *w_out, out_ref, m);
      cpu.fused_add_rms_norm(residual_ref, out_ref, norm_buf, eps, normed_ref, m, n);
      // The ops, on poisoned, guarded outputs (residual: in and out).
      test::GuardedOutput out(cpu, dt, m * n), residual_buf(cpu, test::make_tensor(dt, residual));
      test::GuardedOutput row_sq(cpu, DType::F32, m * row_sq_groups(n));
      cpu.gemm_gptq_add_residual(a_buf, *w_out, out.view(), residual_buf.view(), row_sq.view(), m);  // out: a workspace
      EXPECT_TRUE(out.check_guard("gemm_gptq_add_residual", "out", where));
      EXPECT_TRUE(residual_buf.check_guard("gemm_gptq_add_residual", "residual", where));
      EXPECT_TRUE(row_sq.check_guard("gemm_gptq_add_residual", "row_sq", where));
      EXPECT_EQ(residual_buf.values(), cpu.download(residual_ref));
      EXPECT_EQ(row_sq.values(), row_sq_reference(cpu.download(residual_ref), m, n));

      test::GuardedOutput normed(cpu, dt, m * n), y(cpu, dt, m * n);
      cpu.rms_norm_gemm_gptq(residual_buf.view(), row_sq.view(), norm_buf, eps, *w_in, normed.view(), y.view(), m);
      EXPECT_TRUE(normed.check_guard("rms_norm_gemm_gptq", "normed", where));
      EXPECT_TRUE(y.check_guard("rms_norm_gemm_gptq", "out", where));
      // The norm from row_sq differs from rms_norm's only in the f32 group sums.
      const std::vector<float> normed_f = normed.values();
      EXPECT_TRUE(test::all_close(normed_f, cpu.download(normed_ref), dt));
      Buffer y_ref = cpu.alloc(dt, m * n);
      cpu.gemm_gptq(normed.view(), *w_in, y_ref, m);
      EXPECT_EQ(y.values(), cpu.download(y_ref));

      test::GuardedOutput normed2(cpu, dt, m * n), gate_up(cpu, dt, m * n), act(cpu, dt, m * n / 2);
      cpu.rms_norm_gemm_silu_mul_gptq(residual_buf.view(), row_sq.view(), norm_buf, eps, *w_in, normed2.view(),
                                      gate_up.view(), act.view(), m);
      EXPECT_TRUE(normed2.check_guard("rms_norm_gemm_silu_mul_gptq", "normed", where));
      EXPECT_TRUE(gate_up.check_guard("rms_norm_gemm_silu_mul_gptq", "gate_up", where));
      EXPECT_TRUE(act.check_guard("rms_norm_gemm_silu_mul_gptq", "act", where));
      Buffer gate_up_ref = cpu.alloc(dt, m * n), act_ref = cpu.alloc(dt, m * n / 2);
      cpu.gemm_silu_mul_gptq(normed.view(), *w_in, gate_up_ref, act_ref, m);
      EXPECT_EQ(normed2.values(), normed_f);
      EXPECT_EQ(act.values(), cpu.download(act_ref));
    }
  }
}

TEST(CpuGptq, WeightFromAnotherBackendIsRefused) {
  CpuBackend a, b;
  FERRUM_SEEDED_RNG(rng);
  const GptqGemmCase c{2, 64, 16, 32, false, GptqZeroFormat::V1};
  const detail::GptqPacked packed = detail::pack_gptq(random_weight(c, rng), c.format);
  std::unique_ptr<QuantWeight> w = a.load_gptq(packed.host_tensors());
  Buffer x = b.upload(std::vector<float>(c.m * c.k, 1.0f), DType::F16);
  Buffer out = b.alloc(DType::F16, c.m * c.n);
  try {
    b.gemm_gptq(x, *w, out, c.m);
    FAIL() << "a weight of another backend was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::WrongBackend);
    EXPECT_NE(std::string(e.what()).find("gemm_gptq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferrum
