// Tensor parallelism over NCCL, on two GPUs.
//
// (1) One process, two GPUs: Communicator::create_all({0, 1}), a CudaBackend
//     per device, every collective (all_reduce sum/max/min/prod/avg,
//     all_gather, broadcast from each root, reduce_scatter with every op) in
//     f16, bf16 and f32 run on both ranks from two threads, compared exactly
//     (gpu/nccl_checks.hpp picks values whose results are exact).
// (2) One process per GPU: the test makes the id with new_unique_id() (no
//     CUDA context needed), spawns two ferrum_nccl_worker processes that join
//     with Communicator::create and run the same checks; both must exit 0
//     within a deadline. A second pair checks that a rank whose peer vanished
//     gets ErrorCode::Nccl from synchronize() instead of hanging.
// (3) A TP=2 MLP block: column-parallel [gate|up] (each rank holds its half
//     of the gate rows and of the up rows), fused_silu_mul_split, row-parallel
//     down (its half of the columns), all_reduce(Sum) equals the TP=1 block
//     on CpuBackend within the dtype's tolerance (gemm scale over the
//     intermediate size), f16 and bf16; every intermediate starts poisoned,
//     with sentinels past its end.
// (4) A CUDA graph holding copy_slice + add_inplace + all_reduce, captured on
//     each rank's backend in its own thread and replayed 100 times with fresh
//     inputs written between replays, every result checked exactly; a held
//     graph keeps its communicator alive past the backends.
// (5) A collective whose peer never comes: synchronize() times out, aborts
//     the communicator and throws ErrorCode::Nccl; later collectives throw
//     at once.
//
// Skipped (GTEST_SKIP) when built without NCCL or with fewer than 2 GPUs.
// NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (unless set) before any
// communicator is created (a workplace safety rule on the H200 machines).
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu/nccl_checks.hpp"
#include "support/test_support.hpp"

extern char** environ;

#ifndef FERRUM_NCCL_WORKER_PATH
#error "FERRUM_NCCL_WORKER_PATH must name the ferrum_nccl_worker executable"
#endif

namespace ferrum::test {
namespace {

using nccl::keep_nvls_off;

constexpr auto kTimeout = std::chrono::milliseconds(30000);

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keep_nvls_off();
    if (!Communicator::available()) GTEST_SKIP() << "built without NCCL (FERRUM_WITH_NCCL=OFF): NCCL tests skipped";
    const int n = cuda_device_count();
    if (n < 2) GTEST_SKIP() << "NCCL tests need 2 CUDA devices, found " << n;
  }
};

// Two ranks in this process: communicators from create_all, one backend each.
struct TwoRanks {
  explicit TwoRanks(std::chrono::milliseconds timeout = kTimeout) {
    const std::array<int, 2> devices = {0, 1};
    comms = Communicator::create_all(devices);
    for (int r = 0; r < 2; ++r) {
      CudaBackendConfig config;
      config.device = r;
      config.communicator = comms[static_cast<std::size_t>(r)];
      config.collective_timeout = timeout;
      backends[static_cast<std::size_t>(r)] = std::make_unique<CudaBackend>(config);
    }
  }
  CudaBackend& be(std::size_t r) { return *backends[r]; }

  std::vector<std::shared_ptr<Communicator>> comms;
  std::array<std::unique_ptr<CudaBackend>, 2> backends;
};

// Runs body(rank, backend) on both ranks at once, one thread each (NCCL needs
// both ranks' calls concurrently). Returns each rank's failures; an exception
// is a failure of its rank.
std::array<std::vector<std::string>, 2> on_both_ranks(
    TwoRanks& ranks, const std::function<void(std::size_t, CudaBackend&, std::vector<std::string>&)>& body) {
  std::array<std::vector<std::string>, 2> failures;
  std::array<std::thread, 2> threads;
  for (std::size_t r = 0; r < 2; ++r) {
    threads[r] = std::thread([&, r] {
      try {
        body(r, ranks.be(r), failures[r]);
      } catch (const std::exception& e) {
        failures[r].push_back(cat("rank ", r, " threw: ", e.what()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return failures;
}

void expect_no_failures(const std::array<std::vector<std::string>, 2>& failures) {
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(failures[r].empty()) << "rank " << r << ": " << failures[r].size() << " failure(s), first: "
                                     << (failures[r].empty() ? "" : failures[r].front());
    for (std::size_t i = 1; i < failures[r].size() && i < 10; ++i) ADD_FAILURE() << failures[r][i];
  }
}

// ── (1) one process, two GPUs ────────────────────────────────────────────────

TEST_F(NcclTest, CreateAllGivesRanksAndWorldSize) {
  TwoRanks ranks;
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.comms[r]->rank(), static_cast<int>(r));
    EXPECT_EQ(ranks.comms[r]->world_size(), 2);
    EXPECT_EQ(ranks.comms[r]->device(), static_cast<int>(r));
    EXPECT_FALSE(ranks.comms[r]->aborted());
    EXPECT_NE(ranks.comms[r]->native_handle(), nullptr);
    EXPECT_EQ(ranks.be(r).world_size(), 2u);
    EXPECT_EQ(ranks.be(r).rank(), r);
    EXPECT_TRUE(ranks.be(r).supports(Op::ReduceScatter));
  }
  // A communicator must live on the backend's device.
  CudaBackendConfig wrong;
  wrong.device = 1;
  wrong.communicator = ranks.comms[0];
  expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend be(wrong); }, "config.communicator");
}

TEST_F(NcclTest, EveryCollectiveOpAndDTypeOneProcessTwoGpus) {
  TwoRanks ranks;
  expect_no_failures(on_both_ranks(ranks, [](std::size_t, CudaBackend& be, std::vector<std::string>& failures) {
    failures = nccl::run_collective_checks(be);
  }));
}

// The same through group calls from one thread.
TEST_F(NcclTest, GroupCallsFromOneThread) {
  TwoRanks ranks;
  const std::size_t len = 4099;
  for (DType dt : nccl::kCollectiveDTypes) {
    SCOPED_TRACE(to_string(dt));
    std::array<Buffer, 2> bufs;
    for (std::size_t r = 0; r < 2; ++r) {
      std::vector<float> in(len);
      for (std::size_t i = 0; i < len; ++i) in[i] = nccl::reduce_input(ReduceOp::Sum, r, i);
      bufs[r] = ranks.be(r).upload(in, dt);
    }
    Communicator::group_start();
    for (std::size_t r = 0; r < 2; ++r) ranks.be(r).all_reduce(bufs[r], len, ReduceOp::Sum);
    Communicator::group_end();
    for (std::size_t r = 0; r < 2; ++r) {
      ranks.be(r).synchronize();
      const std::vector<float> got = ranks.be(r).download(bufs[r], len);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < len; ++i) bad += got[i] != nccl::reduce_expect(ReduceOp::Sum, 2, i) ? 1 : 0;
      EXPECT_EQ(bad, 0u) << "rank " << r;
    }
  }
}

// ── (2) one process per GPU ──────────────────────────────────────────────────

// Spawns one worker per rank and waits for all of them (SIGKILL past the
// deadline). Returns "" when every worker exited 0, else what went wrong.
std::string run_workers(const std::string& mode, std::chrono::seconds deadline) {
  const CommUniqueId id = Communicator::new_unique_id();
  const std::string hex = nccl::id_to_hex(id);
  const std::string path = FERRUM_NCCL_WORKER_PATH;
  std::array<pid_t, 2> pids{};
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {path, mode, std::to_string(r), "2", std::to_string(r), hex};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int err = posix_spawn(&pids[static_cast<std::size_t>(r)], path.c_str(), nullptr, nullptr, argv.data(), environ);
    if (err != 0) {
      for (int q = 0; q < r; ++q) {
        kill(pids[static_cast<std::size_t>(q)], SIGKILL);
        waitpid(pids[static_cast<std::size_t>(q)], nullptr, 0);
      }
      return cat("posix_spawn(", path, ") failed: error ", err);
    }
  }
  std::string problems;
  std::array<bool, 2> done{};
  std::array<int, 2> status{};
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!(done[0] && done[1])) {
    for (std::size_t r = 0; r < 2; ++r) {
      if (!done[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) done[r] = true;
    }
    if (std::chrono::steady_clock::now() > until) {
      for (std::size_t r = 0; r < 2; ++r) {
        if (done[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status[r], 0);
        done[r] = true;
        problems += cat("worker rank ", r, " did not finish within ", deadline.count(), " s (killed); ");
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (std::size_t r = 0; r < 2; ++r) {
    if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
    if (WIFEXITED(status[r])) {
      problems += cat("worker rank ", r, " exited with ", WEXITSTATUS(status[r]), "; ");
    } else if (WIFSIGNALED(status[r])) {
      problems += cat("worker rank ", r, " died of signal ", WTERMSIG(status[r]), "; ");
    }
  }
  return problems;
}

TEST_F(NcclTest, EveryCollectiveOpAndDTypeOneProcessPerGpu) {
  const std::string problems = run_workers("checks", std::chrono::seconds(300));
  EXPECT_TRUE(problems.empty()) << problems << "(the workers' stderr above says more)";
}

TEST_F(NcclTest, PeerGoneIsAnErrorNotAHang) {
  const std::string problems = run_workers("peer-gone", std::chrono::seconds(120));
  EXPECT_TRUE(problems.empty()) << problems << "(the workers' stderr above says more)";
}

// ── (3) TP=2 MLP block ───────────────────────────────────────────────────────

TEST_F(NcclTest, TensorParallelMlpMatchesCpuBackend) {
  FERRUM_SEEDED_RNG(rng);
  constexpr std::size_t T = 7, H = 256, I = 512, Ih = I / 2;
  TwoRanks ranks;
  for (DType dt : kHalfDTypes) {
    SCOPED_TRACE(to_string(dt));
    const HostTensor x = random_uniform(rng, dt, T * H);
    const HostTensor gate_up = random_uniform(rng, dt, 2 * I * H, -0.1f, 0.1f);  // [2I, H] = [gate | up]
    const HostTensor down = random_uniform(rng, dt, H * I, -0.1f, 0.1f);          // [H, I]

    // TP=1 on CpuBackend (fp32 accumulation), the full weights: the reference.
    std::vector<float> ref;
    {
      CpuBackend one;
      Buffer xb = one.upload(x.values, dt), gu = one.upload(gate_up.values, dt), dn = one.upload(down.values, dt);
      Buffer gu_out = one.alloc(dt, T * 2 * I), act = one.alloc(dt, T * I), out = one.alloc(dt, T * H);
      one.gemm(xb, gu, gu_out, T, 2 * I, H);
      one.fused_silu_mul_split(gu_out, act, T, I);
      one.gemm(act, dn, out, T, H, I);
      ref = one.download(out, T * H);
    }
    // TP=2: rank r holds gate rows and up rows [r*Ih, (r+1)*Ih) as its own
    // [gate_half | up_half] block, and down columns [r*Ih, (r+1)*Ih).
    std::array<std::vector<float>, 2> gate_up_half, down_half;
    for (std::size_t r = 0; r < 2; ++r) {
      for (std::size_t part = 0; part < 2; ++part) {  // gate, then up
        const std::size_t row0 = part * I + r * Ih;
        gate_up_half[r].insert(gate_up_half[r].end(), gate_up.values.begin() + static_cast<std::ptrdiff_t>(row0 * H),
                               gate_up.values.begin() + static_cast<std::ptrdiff_t>((row0 + Ih) * H));
      }
      for (std::size_t h = 0; h < H; ++h) {
        const auto row = down.values.begin() + static_cast<std::ptrdiff_t>(h * I + r * Ih);
        down_half[r].insert(down_half[r].end(), row, row + static_cast<std::ptrdiff_t>(Ih));
      }
    }
    std::array<std::vector<float>, 2> got;
    expect_no_failures(on_both_ranks(ranks, [&](std::size_t r, CudaBackend& be, std::vector<std::string>& failures) {
      Buffer xb = be.upload(x.values, dt), gu = be.upload(gate_up_half[r], dt), dn = be.upload(down_half[r], dt);
      // Every intermediate and the output poisoned, with sentinels past
      // their ends: an element a step leaves unwritten shows in the result,
      // and one written past the end in the guard.
      GuardedOutput gu_out(be, dt, T * I), act(be, dt, T * Ih), out(be, dt, T * H);
      be.gemm(xb, gu, gu_out.view(), T, I, H);                  // [T, Ih gate | Ih up]
      be.fused_silu_mul_split(gu_out.view(), act.view(), T, Ih);  // [T, Ih]
      be.gemm(act.view(), dn, out.view(), T, H, Ih);             // partial [T, H]
      be.all_reduce(out.view(), T * H, ReduceOp::Sum);
      be.synchronize();
      const std::string where = cat("rank ", r, " ", to_string(dt));
      for (const auto& [output, op, name] : {std::tuple{&gu_out, "gemm", "gate_up"},
                                             std::tuple{&act, "fused_silu_mul_split", "act"},
                                             std::tuple{&out, "gemm + all_reduce", "out"}}) {
        const ::testing::AssertionResult guard = output->check_guard(op, name, where);
        if (!guard) failures.push_back(guard.message());
      }
      got[r] = out.values();
    }));
    for (std::size_t r = 0; r < 2; ++r) {
      SCOPED_TRACE(cat("rank ", r));
      ASSERT_EQ(got[r].size(), ref.size());
      EXPECT_TRUE(all_close(got[r], ref, dt, op_scale::gemm(I)));
    }
    EXPECT_EQ(got[0], got[1]) << "the ranks' all_reduce results differ";
  }
}

// ── (4) a collective inside a CUDA graph ─────────────────────────────────────

TEST_F(NcclTest, GraphWithAllReduceReplays100Times) {
  constexpr std::size_t len = 3001, kReplays = 100;
  auto init = [](std::size_t r, std::size_t i) { return static_cast<float>(static_cast<int>(i % 13) - 6 + static_cast<int>(r)); };
  auto inc = [](std::size_t r, std::size_t k, std::size_t i) {
    return static_cast<float>(static_cast<int>((i + 3 * k + r) % 7) - 3);
  };
  TwoRanks ranks;
  for (DType dt : kHalfDTypes) {  // add_inplace takes f16 / bf16
    SCOPED_TRACE(to_string(dt));
    expect_no_failures(on_both_ranks(ranks, [&](std::size_t r, CudaBackend& be, std::vector<std::string>& failures) {
      std::vector<float> init_host(len), inc_host(len);
      for (std::size_t i = 0; i < len; ++i) init_host[i] = init(r, i);
      Buffer init_b = be.upload(init_host, dt), inc_b = be.alloc(dt, len), acc = be.alloc(dt, len);
      auto fill_inc = [&](std::size_t k) {
        for (std::size_t i = 0; i < len; ++i) inc_host[i] = inc(r, k, i);
        be.write(inc_b, inc_host);
      };
      // One eager step first, so NCCL has set up its connections before capture.
      fill_inc(0);
      be.copy_slice(init_b, 0, acc, 0, len);
      be.add_inplace(acc, inc_b, len);
      be.all_reduce(acc, len, ReduceOp::Sum);
      be.synchronize();

      be.begin_graph_capture();
      be.copy_slice(init_b, 0, acc, 0, len);
      be.add_inplace(acc, inc_b, len);
      be.all_reduce(acc, len, ReduceOp::Sum);
      be.end_graph_capture();
      for (std::size_t k = 0; k < kReplays; ++k) {
        fill_inc(k);
        if (!be.replay_last_graph()) {
          failures.push_back(cat("rank ", r, ": replay_last_graph() returned false"));
          return;
        }
        be.synchronize();
        const std::vector<float> got = be.download(acc, len);
        std::size_t bad = 0, first = 0;
        for (std::size_t i = 0; i < len; ++i) {
          const float want = init(0, i) + inc(0, k, i) + init(1, i) + inc(1, k, i);
          if (got[i] != want && bad++ == 0) first = i;
        }
        if (bad != 0) {
          failures.push_back(cat("rank ", r, " replay ", k, ": ", bad, " wrong element(s), first at ", first, ": got ",
                                 got[first], ", want ", init(0, first) + inc(0, k, first) + init(1, first) + inc(1, k, first)));
          return;
        }
      }
      be.reset_graph();
    }));
  }
}

// The graph's collectives use its communicator: the device's graph slot
// keeps it alive past the backends (and the test's own references) until
// the graph is dropped, here by a new backend on each device. (Without the
// keepalive NCCL's destroy would wait on the held graphs: the test would
// fail by ctest's timeout.)
TEST_F(NcclTest, HeldGraphKeepsItsCommunicator) {
  constexpr std::size_t len = 1024;
  std::array<std::weak_ptr<Communicator>, 2> comms;
  {
    TwoRanks ranks;
    expect_no_failures(on_both_ranks(ranks, [&](std::size_t r, CudaBackend& be, std::vector<std::string>&) {
      Buffer acc = be.upload(std::vector<float>(len, 1.0f), DType::F32);
      be.all_reduce(acc, len, ReduceOp::Sum);  // NCCL connects before the capture
      be.synchronize();
      be.begin_graph_capture();
      be.all_reduce(acc, len, ReduceOp::Sum);
      be.end_graph_capture();
      comms[r] = be.communicator();
    }));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(comms[static_cast<std::size_t>(r)].expired()) << "rank " << r << ": freed under its held graph";
    CudaBackendConfig config;
    config.device = r;
    CudaBackend be(config);
    EXPECT_NE(be.held_graph(), 0u) << "rank " << r;
    be.reset_graph();  // whatever the checks above said, so no later test inherits the graph
    EXPECT_TRUE(comms[static_cast<std::size_t>(r)].expired()) << "rank " << r << ": kept after its graph went";
  }
}

// A replayed collective whose peer never comes: synchronize() times out,
// destroys the held graph first (NCCL's abort waits until every graph
// holding the communicator's collectives is gone, so aborting with the graph
// held never returned) and aborts the communicator; the backend works on.
// Rank 1 resets its own graph before its communicator, the group's last, is
// aborted (Communicator::abort's rule).
TEST_F(NcclTest, AReplayPastTheTimeoutDropsTheGraphAndAborts) {
  constexpr std::size_t len = 1024;
  TwoRanks ranks(std::chrono::milliseconds(2000));
  std::array<Buffer, 2> acc;
  expect_no_failures(on_both_ranks(ranks, [&](std::size_t r, CudaBackend& be, std::vector<std::string>&) {
    acc[r] = be.upload(std::vector<float>(len, 1.0f), DType::F32);
    be.all_reduce(acc[r], len, ReduceOp::Sum);  // NCCL connects before the capture
    be.synchronize();
    be.begin_graph_capture();
    be.all_reduce(acc[r], len, ReduceOp::Sum);
    be.end_graph_capture();
  }));
  CudaBackend& be = ranks.be(0);
  ASSERT_NE(be.held_graph(), 0u);
  ASSERT_TRUE(be.replay_last_graph());  // rank 1 never replays its half
  const auto start = std::chrono::steady_clock::now();
  expect_error(ErrorCode::Nccl, "synchronize", [&] { be.synchronize(); }, "timeout");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_TRUE(ranks.comms[0]->aborted());
  EXPECT_EQ(be.held_graph(), 0u) << "the graph goes before the abort";
  EXPECT_FALSE(be.replay_last_graph());
  EXPECT_NO_THROW(be.reset_graph());
  EXPECT_EQ(be.graph_retained_allocations(), 0u) << "freed once the aborted collectives returned";
  // A graph of local ops captures and replays on that backend.
  Buffer one = be.upload(std::vector<float>(len, 1.0f), DType::F32);
  Buffer local = be.upload(std::vector<float>(len, 0.0f), DType::F32);
  be.begin_graph_capture();
  be.add_inplace(local, one, len);
  be.end_graph_capture();
  EXPECT_TRUE(be.replay_last_graph());
  EXPECT_EQ(be.download(local), std::vector<float>(len, 1.0f));
  be.reset_graph();
  ranks.be(1).reset_graph();
  ranks.comms[1]->abort();
  EXPECT_TRUE(ranks.comms[1]->aborted());
}

// NCCL reads device memory: host memory (alloc_host) in any collective's
// buffer is a named InvalidArgument before anything reaches NCCL (so one
// rank alone sees it, with no peer waiting), and the communicator works on.
TEST_F(NcclTest, HostMemoryIsRefusedBeforeNccl) {
  constexpr std::size_t len = 256;
  TwoRanks ranks;
  ASSERT_EQ(ranks.be(0).world_size(), 2u);
  expect_collectives_refuse_host_memory(ranks.be(0), len);
  std::array<Buffer, 2> acc;
  expect_no_failures(on_both_ranks(ranks, [&](std::size_t r, CudaBackend& rank_be, std::vector<std::string>& failures) {
    acc[r] = rank_be.upload(std::vector<float>(len, static_cast<float>(r + 1)), DType::F32);
    rank_be.all_reduce(acc[r], len, ReduceOp::Sum);
    if (rank_be.download(acc[r]) != std::vector<float>(len, 3.0f)) failures.push_back(cat("rank ", r, ": wrong sum"));
  }));
}

// ── (5) a peer that never comes ──────────────────────────────────────────────

TEST_F(NcclTest, TimeoutAbortsTheCommunicator) {
  TwoRanks ranks(std::chrono::milliseconds(2000));
  // NCCL connects lazily (on a collective's first use, with both ranks): warm
  // the same collective up on both ranks, so the lone call below cannot
  // block in connection setup.
  std::array<Buffer, 2> bufs;
  expect_no_failures(on_both_ranks(ranks, [&](std::size_t r, CudaBackend& be, std::vector<std::string>&) {
    bufs[r] = be.upload(std::vector<float>(1024, 1.0f), DType::F32);
    be.all_reduce(bufs[r], 1024, ReduceOp::Sum);
    be.synchronize();
  }));
  CudaBackend& be = ranks.be(0);
  Buffer& buf = bufs[0];
  be.all_reduce(buf, 1024, ReduceOp::Sum);  // rank 1 never issues its half
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_error(ErrorCode::Nccl, "synchronize", [&] { be.synchronize(); }, "timeout"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_TRUE(ranks.comms[0]->aborted());
  EXPECT_NE(ranks.comms[0]->abort_reason().find("collective_timeout"), std::string::npos)
      << ranks.comms[0]->abort_reason();
  expect_error(ErrorCode::Nccl, "all_reduce", [&] { be.all_reduce(buf, 1024, ReduceOp::Sum); }, "aborted");
  expect_error(ErrorCode::Nccl, "reduce_scatter", [&] { be.reduce_scatter(buf, buf, 512, ReduceOp::Sum); },
               "aborted");
  // The stream drained once the kernels returned: synchronize works again.
  EXPECT_NO_THROW(be.synchronize());
  ranks.comms[1]->abort();
  EXPECT_TRUE(ranks.comms[1]->aborted());
  EXPECT_EQ(ranks.comms[1]->native_handle(), nullptr);
}

}  // namespace
}  // namespace ferrum::test
