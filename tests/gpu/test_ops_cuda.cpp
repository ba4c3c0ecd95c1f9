// Every op on CudaBackend against CpuBackend (the oracle): fresh random
// inputs (seed in every failure), f16 and bf16, the odd-size sweeps of
// support/op_runners.hpp, poisoned outputs with guard regions on BOTH
// backends. Memory-bound ops also run on views that start one element into
// their buffers (2-byte aligned, never 16-byte aligned), so vectorized paths
// must fall back. Device-state variants set the same decode state on both
// backends. Bad device-side values must surface as DeviceCheck at
// synchronize() (or a download / read_bytes before it), and the backend
// must keep working afterwards.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/norm.hpp"
#include "kernels/row_sq.hpp"
#include "support/op_runners.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

// Runs `c` once on the CPU and on CUDA with every lead in `leads` (the same
// CPU result serves all: the oracle ignores alignment), comparing each.
template <class Case>
void expect_cuda_matches_cpu(Backend& cuda, Backend& cpu, const Case& c, Match match,
                             std::initializer_list<std::size_t> leads, double scale = op_scale::kUnit,
                             std::initializer_list<std::string_view> exact_outputs = {},
                             const RunOptions& base = {}) {
  SCOPED_TRACE(describe(c));
  const OpResult want = run(cpu, c, base);
  for (std::size_t lead : leads) {
    RunOptions o = base;
    o.lead = lead;
    SCOPED_TRACE(describe(o));
    expect_same_outputs(run(cuda, c, o), want, match, scale, exact_outputs);
  }
}

constexpr std::initializer_list<std::size_t> kAlignedAndNot = {0, 1};

// ── Row ops: dtype x tokens {1,7,83,4096} x dim {8,769,4096,5120} ────────────

class CudaRowOps : public RowParamTest<CudaParamTest<RowParam>> {};

TEST_P(CudaRowOps, RmsNorm) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_rms_norm_case(rng, dt(), tokens(), dim()), Match::Close, kAlignedAndNot);
}

TEST_P(CudaRowOps, FusedAddRmsNorm) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_fused_add_rms_norm_case(rng, dt(), tokens(), dim()), Match::Close,
                          kAlignedAndNot, op_scale::kUnit, {"residual"});
}

TEST_P(CudaRowOps, LayerNorm) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_layer_norm_case(rng, dt(), tokens(), dim()), Match::Close,
                          kAlignedAndNot);
}

TEST_P(CudaRowOps, GeluErf) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_gelu_case(rng, dt(), tokens() * dim(), GeluApproximation::Erf),
                          Match::Close, kAlignedAndNot);
}

TEST_P(CudaRowOps, GeluTanh) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_gelu_case(rng, dt(), tokens() * dim(), GeluApproximation::Tanh),
                          Match::Close, kAlignedAndNot);
}

TEST_P(CudaRowOps, AddBias) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_add_bias_case(rng, dt(), tokens(), dim()), Match::Exact, kAlignedAndNot);
}

TEST_P(CudaRowOps, AddInplace) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_add_inplace_case(rng, dt(), tokens() * dim()), Match::Exact,
                          kAlignedAndNot);
}

TEST_P(CudaRowOps, EmbeddingLookup) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_embedding_case(rng, dt(), tokens(), dim(), kEmbeddingVocab),
                          Match::Exact, kAlignedAndNot);
}

TEST_P(CudaRowOps, SplitQkv) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_split_qkv_case(rng, dt(), tokens(), dim(), kv_dim_for(dim())),
                          Match::Exact, kAlignedAndNot);
}

TEST_P(CudaRowOps, FusedSiluMulSplit) {
  FERRUM_SEEDED_RNG(rng);
  expect_cuda_matches_cpu(cuda(), cpu(), make_silu_mul_case(rng, dt(), tokens(), dim()), Match::Close,
                          kAlignedAndNot);
}

TEST_P(CudaRowOps, TransposeHeadToToken) {
  FERRUM_SEEDED_RNG(rng);
  const auto [heads, head_dim] = transpose_shape_for(dim_index());
  expect_cuda_matches_cpu(cuda(), cpu(), make_transpose_case(rng, dt(), tokens(), heads, head_dim), Match::Exact,
                          kAlignedAndNot);
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaRowOps, ::testing::ValuesIn(all_row_params()), row_param_name);

// ── Eps-dominated norms: eps comparable to mean(x²) / the variance ───────────

class CudaSmallNorms : public CudaParamTest<DType> {};
TEST_P(CudaSmallNorms, EpsMatters) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  for (const auto& [tokens, dim] : kSmallNormShapes) {
    expect_cuda_matches_cpu(cuda(), cpu(), make_rms_norm_case(rng, dt, tokens, dim, kSmallAmplitude, kSmallEps),
                            Match::Close, kAlignedAndNot);
    expect_cuda_matches_cpu(cuda(), cpu(),
                            make_fused_add_rms_norm_case(rng, dt, tokens, dim, kSmallAmplitude, kSmallEps),
                            Match::Close, kAlignedAndNot, op_scale::kUnit, {"residual"});
    expect_cuda_matches_cpu(cuda(), cpu(), make_layer_norm_case(rng, dt, tokens, dim, kSmallAmplitude, kSmallEps),
                            Match::Close, kAlignedAndNot);
  }
  // Each group size of the 16-byte path sums the norm its own way.
  for (std::size_t hd : {16, 64, 128, 256, 512}) {
    expect_cuda_matches_cpu(cuda(), cpu(),
                            make_qk_norm_rope_case(rng, dt, 7, 7, hd, 3, RopeMode::NormAndRope, kRopeTheta10k, 0,
                                                   kSmallAmplitude, kSmallEps),
                            Match::Close, kAlignedAndNot);
  }
}
INSTANTIATE_TEST_SUITE_P(DTypes, CudaSmallNorms, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Non-finite inputs through the adds: NaN where the oracle has NaN (any
// payload), every other element bitwise ────────────────────────────────────

class CudaNonFinite : public CudaParamTest<DType> {};
TEST_P(CudaNonFinite, AddsPropagateNanAndInf) {
  FERRUM_SEEDED_RNG(rng);
  const DType dt = GetParam();
  for (std::size_t len : kNonFiniteAddLens) {
    expect_cuda_matches_cpu(cuda(), cpu(), make_non_finite_add_inplace_case(rng, dt, len), Match::ExactOrNan,
                            kAlignedAndNot);
  }
  for (const auto& [rows, cols] : kNonFiniteBiasShapes) {
    expect_cuda_matches_cpu(cuda(), cpu(), make_non_finite_add_bias_case(rng, dt, rows, cols), Match::ExactOrNan,
                            kAlignedAndNot);
  }
}
INSTANTIATE_TEST_SUITE_P(DTypes, CudaNonFinite, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Ops with hand-picked size lists ──────────────────────────────────────────

class CudaCaseOps : public CaseParamTest<CudaParamTest<DTypeCaseParam>> {};

class CudaGemm : public CudaCaseOps {};
TEST_P(CudaGemm, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const GemmShape s = gemm_shapes()[index()];
  expect_cuda_matches_cpu(cuda(), cpu(), make_gemm_case(rng, dt(), s.m, s.n, s.k), Match::Close, {0},
                          op_scale::gemm(s.k));
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm, ::testing::ValuesIn(dtype_case_params(gemm_shapes().size())),
                         dtype_case_param_name);

class CudaQkNormRope : public CudaCaseOps {};
TEST_P(CudaQkNormRope, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const RopeSpec s = rope_specs()[index()];
  expect_cuda_matches_cpu(cuda(), cpu(),
                          make_qk_norm_rope_case(rng, dt(), s.tokens, s.heads, s.head_dim, s.pos_offset, s.mode, s.theta),
                          Match::Close, kAlignedAndNot);
}
INSTANTIATE_TEST_SUITE_P(Specs, CudaQkNormRope, ::testing::ValuesIn(dtype_case_params(rope_specs().size())),
                         dtype_case_param_name);

class CudaKvAppend : public CudaCaseOps {};
TEST_P(CudaKvAppend, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const KvAppendSpec s = kv_append_specs()[index()];
  expect_cuda_matches_cpu(cuda(), cpu(), make_kv_append_case(rng, dt(), s.nkv, s.capacity, s.hd, s.cache_len, s.new_tokens),
                          Match::Exact, kAlignedAndNot);
}
INSTANTIATE_TEST_SUITE_P(Specs, CudaKvAppend, ::testing::ValuesIn(dtype_case_params(kv_append_specs().size())),
                         dtype_case_param_name);

class CudaFlashAttention : public CudaCaseOps {
 protected:
  void SetUp() override {
    CudaCaseOps::SetUp();
    if (IsSkipped()) return;
    if (!cuda().supports(Op::FlashAttention)) {
      // Consistent with supports(): the op is refused, not silently wrong.
      AttnConfig cfg;
      cfg.num_heads = cfg.num_kv_heads = 1;
      cfg.head_dim = 64;
      Rng rng(1);
      const auto c = make_flash_case(rng, DType::F16, 1, 1, 1, 0, cfg);
      expect_error(ErrorCode::Unsupported, "flash_attention", [&] { run(cuda(), c); });
      GTEST_SKIP() << "CudaBackend::supports(Op::FlashAttention) is false: no CUDA attention kernel to compare yet";
    }
  }
};
TEST_P(CudaFlashAttention, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const FlashSpec s = flash_specs()[index()];
  expect_cuda_matches_cpu(cuda(), cpu(), make_flash_case(rng, dt(), s.batch, s.q_len, s.kv_len, s.pos_offset, s.cfg),
                          Match::Close, {0});
}
INSTANTIATE_TEST_SUITE_P(Specs, CudaFlashAttention, ::testing::ValuesIn(dtype_case_params(flash_specs().size())),
                         dtype_case_param_name);

class CudaFlashDecodeRagged : public CudaCaseOps {};
TEST_P(CudaFlashDecodeRagged, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const RaggedDecodeSpec s = ragged_decode_specs()[index()];
  expect_cuda_matches_cpu(cuda(), cpu(), make_ragged_decode_case(rng, dt(), s.cfg, s.kv_lens), Match::Close, {0});
}
INSTANTIATE_TEST_SUITE_P(Specs, CudaFlashDecodeRagged,
                         ::testing::ValuesIn(dtype_case_params(ragged_decode_specs().size())), dtype_case_param_name);

class CudaCopySlice : public CudaParamTest<std::size_t> {};
TEST_P(CudaCopySlice, MatchesCpu) {
  FERRUM_SEEDED_RNG(rng);
  const CopySliceSpec s = copy_slice_specs()[GetParam()];
  expect_cuda_matches_cpu(cuda(), cpu(),
                          make_copy_slice_case(rng, s.dtype, s.src_size, s.src_offset, s.dst_size, s.dst_offset, s.len),
                          Match::Exact, kAlignedAndNot);
}
INSTANTIATE_TEST_SUITE_P(Specs, CudaCopySlice, ::testing::Range<std::size_t>(0, copy_slice_specs().size()));

class CudaUnaligned : public CudaParamTest<DType> {};
TEST_P(CudaUnaligned, Gemm) {
  // cuBLAS on operands that start 2 bytes past an allocation's alignment.
  FERRUM_SEEDED_RNG(rng);
  for (const GemmShape s : {GemmShape{7, 769, 769}, GemmShape{83, 4096, 512}, GemmShape{1, 5120, 4096}}) {
    expect_cuda_matches_cpu(cuda(), cpu(), make_gemm_case(rng, GetParam(), s.m, s.n, s.k), Match::Close, {1, 3},
                            op_scale::gemm(s.k));
  }
}
INSTANTIATE_TEST_SUITE_P(DTypes, CudaUnaligned, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Device-state mode: the same decode state on both backends ────────────────

class CudaDeviceState : public CudaParamTest<DType> {
 protected:
  // Every state case at every one of its steps, CUDA against the CPU.
  template <class Case>
  void expect_state_cases_match(const std::vector<StateCase<Case>>& cases, Match match,
                                std::initializer_list<std::size_t> leads) {
    for (const StateCase<Case>& sc : cases) {
      for (const DecodeStep& step : sc.steps) {
        expect_cuda_matches_cpu(cuda(), cpu(), sc.c, match, leads, op_scale::kUnit, {}, RunOptions{0, step});
      }
    }
  }
};

TEST_P(CudaDeviceState, EmbeddingLookup) {
  FERRUM_SEEDED_RNG(rng);
  expect_state_cases_match(embedding_state_cases(rng, GetParam()), Match::Exact, kAlignedAndNot);
}

TEST_P(CudaDeviceState, QkNormRope) {
  FERRUM_SEEDED_RNG(rng);
  expect_state_cases_match(rope_state_cases(rng, GetParam()), Match::Close, kAlignedAndNot);
}

TEST_P(CudaDeviceState, KvAppend) {
  FERRUM_SEEDED_RNG(rng);
  expect_state_cases_match(kv_append_state_cases(rng, GetParam()), Match::Exact, kAlignedAndNot);
}

TEST_P(CudaDeviceState, FlashAttentionDecode) {
  if (!cuda().supports(Op::FlashAttention)) {
    GTEST_SKIP() << "CudaBackend::supports(Op::FlashAttention) is false: no CUDA attention kernel to compare yet";
  }
  FERRUM_SEEDED_RNG(rng);
  expect_state_cases_match(flash_state_cases(rng, GetParam()), Match::Close, {0});
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaDeviceState, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Bad device-side values: DeviceCheck at synchronize() or a read, then business as usual ──

class CudaDeviceCheck : public CudaTest {
 protected:
  // synchronize() throws DeviceCheck naming each of `clauses` (the op, the
  // offending value and the limit it broke, in the log's words) and no
  // other kind.
  void expect_device_check(const std::vector<std::string>& clauses) {
    try {
      cuda().synchronize();
      ADD_FAILURE() << "synchronize() threw nothing; expected DeviceCheck";
    } catch (const Error& e) {
      const std::string_view msg = e.what();
      EXPECT_EQ(e.code(), ErrorCode::DeviceCheck) << msg;
      for (const std::string& clause : clauses) {
        EXPECT_NE(msg.find(clause), std::string_view::npos) << "missing \"" << clause << "\" in: " << msg;
      }
      std::size_t kinds = 1;
      for (std::size_t at = msg.find("; "); at != std::string_view::npos; at = msg.find("; ", at + 2)) ++kinds;
      EXPECT_EQ(kinds, clauses.size()) << msg;
    }
  }

  static std::string rope_clause(long long pos, std::size_t max_pos) {
    return cat("qk_norm_rope / qkv_rope_append(_ragged): position ", pos, " outside the cos/sin tables' [0, max_pos = ",
               max_pos, ")");
  }
  static std::string cache_clause(long long row, std::size_t capacity) {
    return cat("kv_cache_append_head_major / qkv_rope_append(_ragged): cache row ", row, " outside [0, capacity = ",
               capacity, ")");
  }

  // After a reported DeviceCheck: the error is not reported twice and ops
  // still give the CPU's results.
  void expect_backend_still_works(Rng& rng) {
    EXPECT_NO_THROW(cuda().synchronize()) << "the device error must be reported once";
    expect_backend_works(cuda(), cpu(), rng);
  }

  // qkv_rope_append (8 q heads, 2 kv heads, head_dim 128, one token) at each
  // decode-state position in `steps`, each past the rope table (max_pos rows)
  // or past the caches (capacity rows): no row writes (q_out keeps its
  // contents, neither cache changes, nothing past any of them), and
  // synchronize() names the op. With `ragged`, qkv_rope_append_ragged over
  // three sequences at positions {1, step, 0}: the good sequences are refused
  // with the bad one.
  void expect_qkv_rope_append_refused(Rng& rng, DType dtype, std::size_t capacity, std::size_t max_pos,
                                      std::initializer_list<std::uint32_t> steps, bool ragged) {
    constexpr std::size_t kHeads = 8, kKv = 2, kHd = 128;
    const std::size_t seqs = ragged ? 3 : 1;
    const RopeTables tables = make_rope_tables(max_pos, kHd, kRopeTheta10k);
    const DeviceTensor qkv(cuda(), random_normal(rng, dtype, seqs * (kHeads + 2 * kKv) * kHd)),
        cos(cuda(), tables.cos), sin(cuda(), tables.sin);
    const HostTensor initial = random_normal(rng, dtype, seqs * kKv * capacity * kHd);
    const HostTensor q_initial = random_normal(rng, dtype, seqs * kHeads * kHd);
    GuardedOutput k_cache(cuda(), initial), v_cache(cuda(), initial), q_out(cuda(), q_initial);
    Buffer positions = cuda().alloc(DType::I32, seqs);
    const QkvRopeAppendConfig cfg{
        .heads = kHeads, .kv_heads = kKv, .head_dim = kHd, .capacity = capacity, .max_pos = max_pos};
    for (std::uint32_t step : steps) {
      SCOPED_TRACE(cat("step ", step, ", rope table rows ", max_pos, ", cache capacity ", capacity,
                       ragged ? ", ragged" : ""));
      if (ragged) {
        const std::int32_t p[] = {1, static_cast<std::int32_t>(step), 0};
        cuda().write_bytes(positions, p, sizeof p);
        EXPECT_NO_THROW(cuda().qkv_rope_append_ragged(qkv.view(), nullptr, nullptr, cos.view(), sin.view(),
                                                      q_out.view(), k_cache.view(), v_cache.view(), positions, seqs,
                                                      cfg));
      } else {
        DeviceStateScope scope(cuda(), true);
        cuda().set_decode_state(0, step);
        EXPECT_NO_THROW(cuda().qkv_rope_append(qkv.view(), nullptr, nullptr, cos.view(), sin.view(), q_out.view(),
                                               k_cache.view(), v_cache.view(), 1, 0, cfg));
      }
      const long long pos = static_cast<std::int32_t>(step);  // positions and the decode state hold i32
      std::vector<std::string> clauses;
      if (pos < 0 || pos >= static_cast<long long>(max_pos)) clauses.push_back(rope_clause(pos, max_pos));
      if (pos < 0 || pos >= static_cast<long long>(capacity)) clauses.push_back(cache_clause(pos, capacity));
      expect_device_check(clauses);
      EXPECT_TRUE(k_cache.check_guard());
      EXPECT_TRUE(v_cache.check_guard());
      EXPECT_TRUE(q_out.check_guard());
      EXPECT_TRUE(bitwise_equal(k_cache.bytes(), encode_bytes(initial), 2));
      EXPECT_TRUE(bitwise_equal(v_cache.bytes(), encode_bytes(initial), 2));
      EXPECT_TRUE(bitwise_equal(q_out.bytes(), encode_bytes(q_initial), 2));
      expect_backend_still_works(rng);
    }
  }
};

TEST_F(CudaDeviceCheck, OutOfRangeDecodeStateToken) {
  FERRUM_SEEDED_RNG(rng);
  const auto c = make_embedding_case(rng, DType::F16, 1, 64, kEmbeddingVocab);
  const DeviceTensor table(cuda(), c.table);
  for (std::uint32_t bad : {static_cast<std::uint32_t>(kEmbeddingVocab), 0x7fffffffu}) {
    SCOPED_TRACE(cat("token ", bad));
    GuardedOutput out(cuda(), DType::F16, 64);
    {
      DeviceStateScope scope(cuda(), true);
      cuda().set_decode_state(bad, 0);
      EXPECT_NO_THROW(cuda().embedding_lookup(table.view(), Buffer{}, out.view(), 1, 64, kEmbeddingVocab))
          << "the bad id is a device-side value: reported at synchronize(), not at the call";
    }
    // The log's value field is 32 bits wide: at its top it says so.
    expect_device_check({cat("embedding_lookup: token id ", bad, bad == 0x7fffffffu ? " or more" : "",
                             " outside [0, vocab = ", kEmbeddingVocab, ")")});
    EXPECT_TRUE(out.check_guard());
    expect_backend_still_works(rng);
  }
}

TEST_F(CudaDeviceCheck, OutOfRangeIdInBuffer) {
  FERRUM_SEEDED_RNG(rng);
  auto c = make_embedding_case(rng, DType::BF16, 7, 64, kEmbeddingVocab);
  for (float bad : {static_cast<float>(kEmbeddingVocab), -1.0f}) {
    c.ids.values[4] = bad;
    SCOPED_TRACE(cat("ids[4] = ", bad));
    const DeviceTensor table(cuda(), c.table), ids(cuda(), c.ids);
    GuardedOutput out(cuda(), DType::BF16, 7 * 64);
    EXPECT_NO_THROW(cuda().embedding_lookup(table.view(), ids.view(), out.view(), 7, 64, kEmbeddingVocab));
    expect_device_check(
        {cat("embedding_lookup: token id ", static_cast<int>(bad), " outside [0, vocab = ", kEmbeddingVocab, ")")});
    EXPECT_TRUE(out.check_guard());
    expect_backend_still_works(rng);
  }
}

// A read of results waits for the device too, so download and read_bytes
// report a bad device-side value there, naming themselves and the kernel's
// clause, after their copy (read_bytes' host bytes hold the zero row); a
// read of nothing does not; the value is then reported no more, and the
// backend works on.
TEST_F(CudaDeviceCheck, ReadsReportBadValuesTheyWaitedFor) {
  FERRUM_SEEDED_RNG(rng);
  const auto c = make_embedding_case(rng, DType::F16, 3, 64, kEmbeddingVocab);
  const DeviceTensor table(cuda(), c.table);
  const std::string clause = cat("embedding_lookup: token id ", kEmbeddingVocab, " outside [0, vocab = ",
                                 kEmbeddingVocab, ")");
  for (const bool by_download : {true, false}) {
    SCOPED_TRACE(by_download ? "download" : "read_bytes");
    auto bad = c.ids;
    bad.values[1] = static_cast<float>(kEmbeddingVocab);
    const DeviceTensor ids(cuda(), bad);
    GuardedOutput out(cuda(), DType::F16, 3 * 64);
    EXPECT_NO_THROW(cuda().embedding_lookup(table.view(), ids.view(), out.view(), 3, 64, kEmbeddingVocab));
    std::vector<std::uint16_t> host(3 * 64, 0xffffu);
    if (by_download) {
      EXPECT_NO_THROW((void)cuda().download(out.view(), 0)) << "a read of nothing neither waits nor reports";
      expect_error(ErrorCode::DeviceCheck, "download", [&] { (void)cuda().download(out.view()); }, clause);
    } else {
      expect_error(ErrorCode::DeviceCheck, "read_bytes",
                   [&] { cuda().read_bytes(out.view(), host.data(), host.size() * sizeof(std::uint16_t)); }, clause);
      for (std::size_t i = 64; i < 128; ++i) ASSERT_EQ(host[i], 0u) << "the refused id's row, element " << i;
    }
    EXPECT_TRUE(out.check_guard());
    expect_backend_still_works(rng);
  }
}

TEST_F(CudaDeviceCheck, DecodeStatePositionPastRopeTable) {
  FERRUM_SEEDED_RNG(rng);
  const auto c = make_qk_norm_rope_case(rng, DType::F16, 1, 8, 128, 0, RopeMode::NormAndRope, kRopeTheta10k, 20);
  const DeviceTensor input(cuda(), c.input), norm_w(cuda(), c.norm_w), cos(cuda(), c.tables.cos),
      sin(cuda(), c.tables.sin);
  GuardedOutput out(cuda(), DType::F16, 8 * 128);
  {
    DeviceStateScope scope(cuda(), true);
    cuda().set_decode_state(0, static_cast<std::uint32_t>(c.tables.max_pos));
    EXPECT_NO_THROW(cuda().qk_norm_rope(input.view(), &norm_w.view(), cos.view(), sin.view(), out.view(), 1, 8, 128,
                                        0, c.tables.max_pos, c.eps, c.mode));
  }
  expect_device_check({rope_clause(static_cast<long long>(c.tables.max_pos), c.tables.max_pos)});
  EXPECT_TRUE(out.check_guard());
  expect_backend_still_works(rng);
}

// Past the 128-row tables, inside the 256-row caches (v is refused with its
// token's k).
TEST_F(CudaDeviceCheck, QkvRopeAppendPastRopeTable) {
  FERRUM_SEEDED_RNG(rng);
  expect_qkv_rope_append_refused(rng, DType::BF16, 256, 128, {128u, 200u}, /*ragged=*/false);
  expect_qkv_rope_append_refused(rng, DType::BF16, 256, 128, {128u, 200u}, /*ragged=*/true);
}

// Past the 64-row caches, inside the 128-row tables.
TEST_F(CudaDeviceCheck, QkvRopeAppendPastKvCapacity) {
  FERRUM_SEEDED_RNG(rng);
  expect_qkv_rope_append_refused(rng, DType::F16, 64, 128, {64u, 100u}, /*ragged=*/false);
  expect_qkv_rope_append_refused(rng, DType::F16, 64, 128, {64u, 100u, 0xffffffffu}, /*ragged=*/true);  // and -1
}

TEST_F(CudaDeviceCheck, DecodeStatePositionPastKvCapacity) {
  FERRUM_SEEDED_RNG(rng);
  const auto c = make_kv_append_case(rng, DType::BF16, 4, 64, 128, 0, 1);
  GuardedOutput cache_k(cuda(), c.cache_k), cache_v(cuda(), c.cache_v);
  const DeviceTensor new_k(cuda(), c.new_k), new_v(cuda(), c.new_v);
  for (std::uint32_t step : {64u, 65u, 100000u}) {
    SCOPED_TRACE(cat("step ", step, " capacity 64"));
    {
      DeviceStateScope scope(cuda(), true);
      cuda().set_decode_state(0, step);
      EXPECT_NO_THROW(
          cuda().kv_cache_append_head_major(cache_k.view(), cache_v.view(), 0, 64, new_k.view(), new_v.view(), 1, 4, 128));
    }
    expect_device_check({cache_clause(step, 64)});
    // Nothing written: not past the capacity (guards) and not inside the cache.
    EXPECT_TRUE(cache_k.check_guard());
    EXPECT_TRUE(cache_v.check_guard());
    EXPECT_TRUE(bitwise_equal(cache_k.bytes(), encode_bytes(c.cache_k), 2));
    EXPECT_TRUE(bitwise_equal(cache_v.bytes(), encode_bytes(c.cache_v), 2));
    expect_backend_still_works(rng);
  }
}

// Buffer::wrap on CudaBackend: memory its kernels cannot reach is refused
// at the wrap (before, a kernel would fault and leave the device's context
// unusable); device, pinned and managed memory are taken.
class CudaWrap : public CudaTest {};
TEST_F(CudaWrap, RefusesMemoryItsKernelsCannotReach) {
  Backend& be = cuda();
  std::vector<std::uint16_t> pageable(64);
  expect_error(ErrorCode::InvalidArgument, "Buffer::wrap",
               [&] { (void)Buffer::wrap(be, pageable.data(), DType::F16, pageable.size()); }, "pageable");
  void *device = nullptr, *pinned = nullptr, *managed = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 128), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 128), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&managed, 128), cudaSuccess);
  // One element past the 128-byte allocation (the driver knows its extent).
  expect_error(ErrorCode::InvalidArgument, "Buffer::wrap", [&] { (void)Buffer::wrap(be, device, DType::F16, 65); },
               "past the end");
  expect_error(ErrorCode::InvalidArgument, "Buffer::wrap",
               [&] { (void)Buffer::wrap(be, static_cast<char*>(device) + 64, DType::F16, 33); }, "past the end");
  for (void* ptr : {device, pinned, managed}) {
    Buffer w = Buffer::wrap(be, ptr, DType::F16, 64);
    be.write(w, std::vector<float>(64, 2.0f));
    Buffer ones = be.upload(std::vector<float>(64, 1.0f), DType::F16);
    be.add_inplace(w, ones, 64);
    EXPECT_EQ(be.download(w), std::vector<float>(64, 3.0f));
  }
  be.synchronize();
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(managed), cudaSuccess);
}

// And on CpuBackend, whose ops run on the host: device memory is refused,
// naming its device (before, the first op dereferenced it and crashed);
// pinned and managed memory, which the host reads, are taken.
TEST_F(CudaWrap, CpuBackendRefusesDeviceMemory) {
  CpuBackend cpu;
  void *device = nullptr, *pinned = nullptr, *managed = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 128), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 128), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&managed, 128), cudaSuccess);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  expect_error(ErrorCode::InvalidArgument, "Buffer::wrap", [&] { (void)Buffer::wrap(cpu, device, DType::F16, 64); },
               cat("memory of CUDA device ", current));
  for (void* ptr : {pinned, managed}) {
    Buffer w = Buffer::wrap(cpu, ptr, DType::F16, 64);
    cpu.write(w, std::vector<float>(64, 2.0f));
    EXPECT_EQ(cpu.download(w), std::vector<float>(64, 2.0f));
  }
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(managed), cudaSuccess);
}

// Collectives refuse host memory without a communicator too (world size 1:
// identities and copies), as they do with one (test_nccl.cpp, the same
// helper), so a call that works at one rank does not start failing at two.
class CudaCollectives : public CudaTest {};
TEST_F(CudaCollectives, HostMemoryIsRefusedAtWorldSizeOne) {
  Backend& be = cuda();
  constexpr std::size_t len = 64;
  ASSERT_EQ(be.world_size(), 1u);
  expect_collectives_refuse_host_memory(be, len);
  Buffer dev = be.upload(std::vector<float>(len, 1.0f), DType::F32);
  be.all_reduce(dev, len, ReduceOp::Sum);  // device memory: the identity
  EXPECT_EQ(be.download(dev), std::vector<float>(len, 1.0f));
}

// A request larger than the whole device: OutOfMemory naming the op, the
// size and the device's free and total memory (so a reader tells a full
// device from an impossible request), and the backend goes on working.
class CudaAlloc : public CudaTest {};
TEST_F(CudaAlloc, OutOfMemoryNamesTheSizeAndTheDevicesMemory) {
  Backend& be = cuda();
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const std::size_t bytes = 2 * total_bytes;
  try {
    (void)be.alloc(DType::U8, bytes);
    ADD_FAILURE() << "alloc of " << bytes << " bytes did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
    const std::string what = e.what();
    for (const std::string& part : {std::string("alloc: "), cat("cudaMalloc of ", bytes, " bytes"),
                                    cat("of the device's ", total_bytes, " bytes free")}) {
      EXPECT_NE(what.find(part), std::string::npos) << "missing '" << part << "' in: " << what;
    }
  }
  // sums poisoned: the check below must see this call's values.
  Buffer ones = be.upload(std::vector<float>(64, 1.0f), DType::F16),
         sums = be.upload(std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()), DType::F32);
  be.row_sum_squares(ones, sums, 1, 64);
  EXPECT_EQ(be.download(sums), std::vector<float>(4, 16.0f));
}

// Sizes the public checks take but a CUDA kernel's grid or indices cannot:
// a named Unsupported before any launch, a capture in progress ended with
// the stream usable; never a hang (the norm plan looped forever near 2^31
// columns), a grid truncated to 32 bits or a partial result. (qk_norm_rope's
// and qkv_rope_append's limit, past 2^33 head rows, would need 34 GiB per
// buffer to reach: not run.)
class CudaSizeLimits : public CudaTest {};
TEST_F(CudaSizeLimits, NamedBeforeAnyLaunch) {
  Backend& be = cuda();
  {  // A row past kernels::kNormMaxDim: 2 GiB of f16 per buffer.
    const std::size_t dim = std::size_t{kernels::kNormMaxDim} + 8;
    Buffer x = be.alloc(DType::F16, dim), w = be.alloc(DType::F16, dim), out = be.alloc(DType::F16, dim);
    expect_error(ErrorCode::Unsupported, "rms_norm", [&] { be.rms_norm(x, w, 1e-6f, out, 1, dim); }, "dim");
  }
  {  // row_sum_squares past kernels::kRowSqMaxCols, also inside a capture.
    const std::size_t cols = std::size_t{kernels::kRowSqMaxCols} + 1;
    Buffer x = be.alloc(DType::F16, cols), sq = be.alloc(DType::F32, (cols + 15) / 16);
    expect_error(ErrorCode::Unsupported, "row_sum_squares", [&] { be.row_sum_squares(x, sq, 1, cols); }, "cols");
    be.begin_graph_capture();
    expect_error(ErrorCode::Unsupported, "row_sum_squares", [&] { be.row_sum_squares(x, sq, 1, cols); }, "cols");
    EXPECT_FALSE(be.is_capturing());
  }
  // sums poisoned: the check below must see this call's values.
  Buffer ones = be.upload(std::vector<float>(64, 1.0f), DType::F16),
         sums = be.upload(std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()), DType::F32);
  be.row_sum_squares(ones, sums, 1, 64);
  EXPECT_EQ(be.download(sums), std::vector<float>(4, 16.0f));
}

}  // namespace
}  // namespace ferrum::test
