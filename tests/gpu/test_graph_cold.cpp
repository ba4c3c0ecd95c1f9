// The registry's ops (support/op_registry: every buffer-taking op that
// CudaBackend supports) recorded into one graph in a fresh process, before
// any of them has run there (only the setup runs first: allocations,
// uploads, load_gptq for the GPTQ ops' weights, and set_decode_state's
// kernel). Whatever an op sets up on its first call
// (module loading, shared-memory opt-ins, occupancy and cluster queries,
// cuBLAS's own) then happens inside the backend's capture, as in an engine
// that captures its first decode step without an eager one. Every other graph
// test runs its ops eagerly first. The replay must write what the same ops
// then write eagerly, bitwise.
//
// A fresh process: a death test in the "threadsafe" style re-executes this
// binary with only this test selected, so no earlier test warms anything.
// The child prints one verdict line and exits 0; the parent matches it.
//
// Skipped (GTEST_SKIP) when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "ferrum/cuda_backend.hpp"
#include "support/op_registry.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

struct ColdEntry {
  const OpSpec* spec;
  OpArgs args;
  std::vector<std::vector<std::uint8_t>> initial;
};

// The child's work: returns its verdict line.
std::string record_registry_cold() {
  CudaBackend be;
  Rng rng;
  std::vector<ColdEntry> entries;
  // Buffers and inputs first (allocations, uploads and load_gptq's repack
  // are no op of the chain and never run inside a capture). advance_decode_state
  // moves the decode state the others read, so it goes last.
  for (int last = 0; last < 2; ++last) {
    for (const OpSpec& s : op_specs()) {
      if (!be.supports(s.op) || (s.op == Op::AdvanceDecodeState) != (last == 1)) continue;
      ColdEntry e{&s, make_args(be, s), {}};
      fill_random(be, s, e.args, rng);
      e.initial = read_all(be, s, e.args);
      entries.push_back(std::move(e));
    }
  }
  be.synchronize();

  be.set_decode_state(1, 0);
  be.begin_graph_capture();
  for (ColdEntry& e : entries) call_capturable(be, *e.spec, e.args);
  be.end_graph_capture();
  for (ColdEntry& e : entries) {
    if (read_all(be, *e.spec, e.args) != e.initial) return cat("FAIL: recording ran ", e.spec->name);
  }
  if (!be.replay_last_graph()) return "FAIL: replay_last_graph() returned false";
  be.synchronize();
  std::vector<std::vector<std::vector<std::uint8_t>>> replayed;
  for (ColdEntry& e : entries) replayed.push_back(read_all(be, *e.spec, e.args));
  be.reset_graph();

  for (ColdEntry& e : entries) write_all(be, *e.spec, e.args, e.initial);
  be.set_decode_state(1, 0);
  for (ColdEntry& e : entries) call_capturable(be, *e.spec, e.args);
  be.synchronize();

  std::string mismatches;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const OpSpec& s = *entries[i].spec;
    const std::vector<std::vector<std::uint8_t>> eager = read_all(be, s, entries[i].args);
    for (std::size_t b = 0; b < s.buffers.size(); ++b) {
      const ::testing::AssertionResult same = bitwise_equal(replayed[i][b], eager[b], size_of(s.buffers[b].dtype));
      if (!same) mismatches += cat(" ", s.name, "'s '", s.buffers[b].name, "' (", same.message(), ");");
    }
  }
  if (!mismatches.empty()) return cat("FAIL: replay differs from eager:", mismatches, " ", rng.describe());
  return cat("cold capture: ", entries.size(), " ops recorded before their first run, replay equals eager");
}

void cold_child() {
  std::string verdict;
  try {
    verdict = record_registry_cold();
  } catch (const std::exception& e) {
    verdict = cat("FAIL: ", e.what());
  }
  std::fprintf(stderr, "%s\n", verdict.c_str());
  std::fflush(stderr);
  std::_Exit(0);
}

TEST(CudaGraphColdDeathTest, EveryOpRecordedBeforeItsFirstRunReplaysAsEager) {
  if (!have_cuda()) GTEST_SKIP() << kNoCudaMessage;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(cold_child(), ::testing::ExitedWithCode(0),
              "cold capture: [0-9]+ ops recorded before their first run, replay equals eager");
}

}  // namespace
}  // namespace ferrum::test
