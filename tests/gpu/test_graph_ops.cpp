// Every op family recorded in a CUDA graph and replayed gives what it gives
// eagerly, bitwise.
//
// An engine captures whole decode steps, so each op's launch path (its
// kernel choice, workspaces, cuBLAS handle, PDL attributes, cluster launches)
// must record cleanly and read nothing at record time that it should read at
// replay time. test_graph.cpp replays one decode chain for 1000 steps; this
// file covers the rest:
//
// - CudaGraphOps: the op runners' cases (random inputs, poisoned and guarded
//   outputs) at sizes that reach each family's large-size kernels too (the
//   split-K decode, the tensor-core prefill, cuBLAS and the skinny GEMM), run
//   eagerly and then as a graph (RunOptions::graph: recording must write
//   nothing, one replay must write everything).
// - CudaGraphEveryOp: every buffer-taking op of the interface that
//   CudaBackend supports (support/op_registry: argmax, qkv_rope_append and its
//   ragged form, row_sum_squares, every GPTQ op, the collectives on a world of
//   one, advance_decode_state, ...), on the registry's small valid call with
//   random float inputs: eager against record + replay, every buffer it
//   writes compared whole; the recording runs under StrictCapture, so an op
//   that allocates or synchronizes there fails.
// test_graph_cold.cpp records the registry's ops in a fresh process, before
// any of them has run.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ferrum/cuda_backend.hpp"
#include "support/captured_launches.hpp"
#include "support/op_registry.hpp"
#include "support/op_runners.hpp"
#include "support/strict_capture.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

// Runs `c` eagerly, then recorded and replayed, and expects the same bytes
// in every output (and every guard intact in both).
template <class Case>
void expect_graph_equals_eager(Backend& be, const Case& c, RunOptions o = {}) {
  SCOPED_TRACE(describe(c) + " " + describe(o));
  const OpResult eager = run(be, c, o);
  o.graph = true;
  const OpResult graph = run(be, c, o);
  expect_same_outputs(graph, eager, Match::Exact);
}

class CudaGraphOps : public CudaParamTest<DType> {
 protected:
  DType dt() const { return GetParam(); }
  Rng rng_;
};

TEST_P(CudaGraphOps, NormsAndElementwise) {
  SCOPED_TRACE(rng_.describe());
  for (auto [tokens, dim] : {std::pair<std::size_t, std::size_t>{1, 4096}, {83, 769}, {2048, 4096}}) {
    expect_graph_equals_eager(cuda(), make_rms_norm_case(rng_, dt(), tokens, dim));
    expect_graph_equals_eager(cuda(), make_fused_add_rms_norm_case(rng_, dt(), tokens, dim));
    expect_graph_equals_eager(cuda(), make_layer_norm_case(rng_, dt(), tokens, dim));
    expect_graph_equals_eager(cuda(), make_add_bias_case(rng_, dt(), tokens, dim));
    expect_graph_equals_eager(cuda(), make_split_qkv_case(rng_, dt(), tokens, dim, kv_dim_for(dim)));
    expect_graph_equals_eager(cuda(), make_silu_mul_case(rng_, dt(), tokens, dim));
  }
  for (std::size_t len : kNonFiniteAddLens) {
    expect_graph_equals_eager(cuda(), make_add_inplace_case(rng_, dt(), len));
    expect_graph_equals_eager(cuda(), make_gelu_case(rng_, dt(), len, GeluApproximation::Erf));
    expect_graph_equals_eager(cuda(), make_gelu_case(rng_, dt(), len, GeluApproximation::Tanh));
  }
  expect_graph_equals_eager(cuda(), make_embedding_case(rng_, dt(), 83, 4096, kEmbeddingVocab));
  expect_graph_equals_eager(cuda(), make_transpose_case(rng_, dt(), 83, 32, 128));
  expect_graph_equals_eager(cuda(), make_copy_slice_case(rng_, dt(), 100003, 3, 90001, 5, 80000));
}

TEST_P(CudaGraphOps, RopeAndKvCache) {
  SCOPED_TRACE(rng_.describe());
  expect_graph_equals_eager(cuda(),
                            make_qk_norm_rope_case(rng_, dt(), 83, 8, 128, 5, RopeMode::NormAndRope, kRopeTheta1M));
  expect_graph_equals_eager(cuda(),
                            make_qk_norm_rope_case(rng_, dt(), 1, 32, 64, 1000, RopeMode::RopeOnly, kRopeTheta10k));
  expect_graph_equals_eager(cuda(), make_kv_append_case(rng_, dt(), 8, 1024, 128, 100, 83));
  expect_graph_equals_eager(cuda(), make_kv_append_case(rng_, dt(), 8, 1024, 256, 1023, 1));
}

TEST_P(CudaGraphOps, Gemm) {
  SCOPED_TRACE(rng_.describe());
  // m = 1 and 8: the skinny kernel under the default policy (the SIMT and
  // the mma form); 16 (cuBLAS by default), 83 and 1024: cuBLAS (odd n and k
  // too).
  const std::vector<GemmShape> shapes = {{1, 4096, 4096}, {8, 4096, 4096}, {16, 4096, 4096}, {83, 769, 769},
                                         {1024, 2048, 1024}};
  for (const GemmShape& s : shapes) expect_graph_equals_eager(cuda(), make_gemm_case(rng_, dt(), s.m, s.n, s.k));
  for (std::size_t m : {1, 16, 100}) expect_graph_equals_eager(cuda(), make_gemm_silu_mul_case(rng_, dt(), m, 1024, 4096));
  // The skinny kernel at 9..16 rows (two groups of 8), where only
  // gemm_skinny_max_m = 16 takes it.
  CudaBackendConfig config;
  config.gemm_skinny_max_m = 16;
  CudaBackend skinny16(config);
  {
    const Buffer a = skinny16.alloc(dt(), 16 * 4096), b = skinny16.alloc(dt(), 4096 * 4096);
    Buffer out = skinny16.alloc(dt(), 16 * 4096);
    const std::vector<CapturedLaunch> launches =
        captured_launches(skinny16, [&] { skinny16.gemm(a, b, out, 16, 4096, 4096); });
    ASSERT_TRUE(launched(launches, "gemm_skinny_")) << describe_launches(launches);
  }
  expect_graph_equals_eager(skinny16, make_gemm_case(rng_, dt(), 16, 4096, 4096));
  expect_graph_equals_eager(skinny16, make_gemm_case(rng_, dt(), 11, 769, 1000));
  expect_graph_equals_eager(skinny16, make_gemm_silu_mul_case(rng_, dt(), 16, 1024, 4096));
}

TEST_P(CudaGraphOps, Attention) {
  SCOPED_TRACE(rng_.describe());
  // Prefill: causal and not, GQA 32/8, a chunk at pos_offset > 0 read from a
  // strided cache, every head dim; 2048 x 2048 for the large-grid kernels.
  for (std::size_t hd : {64, 128, 256}) {
    AttnConfig cfg = attn_config(32, 8, hd);
    expect_graph_equals_eager(cuda(), make_flash_case(rng_, dt(), 2, 300, 300, 0, cfg));
    cfg.causal = false;
    expect_graph_equals_eager(cuda(), make_flash_case(rng_, dt(), 1, 77, 300, 0, cfg));
    AttnConfig strided = attn_config(32, 8, hd, 1024);
    expect_graph_equals_eager(cuda(), make_flash_case(rng_, dt(), 1, 100, 1000, 900, strided));
  }
  expect_graph_equals_eager(cuda(), make_flash_case(rng_, dt(), 1, 2048, 2048, 0, attn_config(32, 8, 128)));
  // Decode: one query over a long cache (split over blocks), a batch, and
  // ragged lengths across several slices.
  const AttnConfig decode = attn_config(32, 8, 128, 8192);
  expect_graph_equals_eager(cuda(), make_flash_case(rng_, dt(), 1, 1, 5000, 4999, decode, 5000));
  expect_graph_equals_eager(cuda(), make_flash_case(rng_, dt(), 4, 1, 2049, 2048, decode, 2049));
  expect_graph_equals_eager(cuda(), make_ragged_decode_case(rng_, dt(), decode, {1, 129, 1000, 5000, 8192}));
}

TEST_P(CudaGraphOps, DeviceStateDecodeOps) {
  SCOPED_TRACE(rng_.describe());
  // The ops that read token / pos / kv_len from the decode state: recorded
  // in device-state mode, the replay reads the state set before it.
  for (const auto& s : embedding_state_cases(rng_, dt())) {
    expect_graph_equals_eager(cuda(), s.c, {.decode = s.steps.back()});
  }
  for (const auto& s : rope_state_cases(rng_, dt())) expect_graph_equals_eager(cuda(), s.c, {.decode = s.steps.back()});
  for (const auto& s : kv_append_state_cases(rng_, dt())) {
    expect_graph_equals_eager(cuda(), s.c, {.decode = s.steps.back()});
  }
  for (const auto& s : flash_state_cases(rng_, dt())) expect_graph_equals_eager(cuda(), s.c, {.decode = s.steps.back()});
}

INSTANTIATE_TEST_SUITE_P(DTypes, CudaGraphOps, ::testing::ValuesIn(kHalfDTypes), dtype_param_name);

// ── Every op of the registry ─────────────────────────────────────────────────

class CudaGraphEveryOp : public CudaParamTest<std::size_t> {
 protected:
  const OpSpec& spec() const { return op_specs()[GetParam()]; }
};

TEST_P(CudaGraphEveryOp, ReplayWritesWhatTheEagerCallWrites) {
  const OpSpec& s = spec();
  if (!cuda().supports(s.op)) GTEST_SKIP() << s.name << " is not supported by CudaBackend";
  Rng rng;
  SCOPED_TRACE(cat(s.name, " ", rng.describe()));
  OpArgs a = make_args(cuda(), s);
  fill_random(cuda(), s, a, rng);
  // Each run starts from the same decode state, set outside the capture.
  const std::vector<std::vector<std::uint8_t>> initial = read_all(cuda(), s, a);

  cuda().set_decode_state(1, 0);
  call_capturable(cuda(), s, a);
  cuda().synchronize();
  const std::vector<std::vector<std::uint8_t>> eager = read_all(cuda(), s, a);
  // (all_reduce and broadcast on a world of one change nothing, by contract.)
  if (s.op != Op::AllReduce && s.op != Op::Broadcast) {
    EXPECT_NE(eager, initial) << "the eager call wrote nothing: the comparison below would prove nothing";
  }

  write_all(cuda(), s, a, initial);
  cuda().set_decode_state(1, 0);
  {
    // The op's recording (after the eager call above did its first-call
    // setup) under StrictCapture: no allocation or synchronization of any
    // kind on this thread.
    StrictCapture strict;
    ASSERT_TRUE(strict.began());
    cuda().begin_graph_capture();
    call_capturable(cuda(), s, a);
    EXPECT_TRUE(strict.finish()) << "the op made a call a capture forbids (an allocation or a synchronization)";
    cuda().end_graph_capture();
  }
  EXPECT_EQ(read_all(cuda(), s, a), initial) << "recording ran the op";
  ASSERT_TRUE(cuda().replay_last_graph());
  cuda().synchronize();
  const std::vector<std::vector<std::uint8_t>> replayed = read_all(cuda(), s, a);
  cuda().reset_graph();

  for (std::size_t i = 0; i < s.buffers.size(); ++i) {
    SCOPED_TRACE(cat("buffer '", s.buffers[i].name, "'"));
    EXPECT_TRUE(bitwise_equal(replayed[i], eager[i], size_of(s.buffers[i].dtype)));
  }
}

std::vector<std::size_t> spec_indices() {
  std::vector<std::size_t> v(op_specs().size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaGraphEveryOp, ::testing::ValuesIn(spec_indices()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) { return op_specs()[info.param].name; });

}  // namespace
}  // namespace ferrum::test
