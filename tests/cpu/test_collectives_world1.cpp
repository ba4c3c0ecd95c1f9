// Collectives at world size 1 and the Communicator's argument checks, all
// without a GPU.
//
// reduce_scatter: at world size 1 output = input[0 .. len) for every op and
// dtype (bitwise, nothing written past the view), and its validation errors
// (sizes, dtypes, op). The suite is parameterized by backend: CpuBackend
// always, CudaBackend without a communicator when a GPU is present.
//
// Communicator: the factories refuse bad world sizes, ranks, devices and
// duplicate device lists with InvalidArgument before touching NCCL or CUDA;
// without a GPU (or without NCCL) create() throws a clear ferrum::Error
// instead of crashing. NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in
// every process that might create a communicator.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support/op_registry.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

constexpr ReduceOp kAllReduceOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod, ReduceOp::Avg};
constexpr DType kCollectiveDTypes[] = {DType::F16, DType::BF16, DType::F32};

// Workplace rule: NVLink multicast stays off wherever a communicator may be made.
void keep_nvls_off() {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // unless already set
}

CommUniqueId nonzero_id() {
  CommUniqueId id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<char>(i + 1);
  return id;
}

// ── reduce_scatter at world size 1 ───────────────────────────────────────────

class ReduceScatterWorld1 : public BackendTest {};

TEST_P(ReduceScatterWorld1, IsACopyOfTheFirstSlice) {
  FERRUM_SEEDED_RNG(rng);
  ASSERT_EQ(backend().world_size(), 1u);
  EXPECT_TRUE(backend().supports(Op::ReduceScatter));
  for (DType dt : kCollectiveDTypes) {
    for (std::size_t len : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      // The input is longer than [world_size * len]: only the first len elements count.
      const HostTensor input = random_uniform(rng, dt, len + 5, -4.0f, 4.0f);
      const HostTensor first = make_tensor(dt, std::vector<float>(input.values.begin(), input.values.begin() + len));
      for (ReduceOp op : kAllReduceOps) {
        SCOPED_TRACE(cat(to_string(dt), " len=", len, " op=", static_cast<int>(op)));
        const DeviceTensor in(backend(), input, 1);  // unaligned start
        GuardedOutput out(backend(), dt, len, 1);
        backend().reduce_scatter(in.view(), out.view(), len, op);
        backend().synchronize();
        EXPECT_TRUE(out.check_guard());
        EXPECT_TRUE(bitwise_equal(out.bytes(), encode_bytes(first), size_of(dt)));
      }
    }
  }
}

TEST_P(ReduceScatterWorld1, ValidationErrors) {
  Buffer in = zeros(backend(), DType::F16, 16), out = zeros(backend(), DType::F16, 16);
  Buffer in_f32 = zeros(backend(), DType::F32, 16), in_i32 = zeros(backend(), DType::I32, 16);
  Buffer out_i32 = zeros(backend(), DType::I32, 16);
  Buffer small = zeros(backend(), DType::F16, 7);
  auto& be = backend();
  expect_error(ErrorCode::InvalidArgument, "reduce_scatter", [&] { be.reduce_scatter(in, out, 0, ReduceOp::Sum); },
               "'len'");
  expect_error(ErrorCode::NullBuffer, "reduce_scatter", [&] { be.reduce_scatter(Buffer{}, out, 8, ReduceOp::Sum); },
               "'input'");
  expect_error(ErrorCode::NullBuffer, "reduce_scatter",
               [&] {
                 Buffer null;
                 be.reduce_scatter(in, null, 8, ReduceOp::Sum);
               },
               "'output'");
  expect_error(ErrorCode::DTypeMismatch, "reduce_scatter", [&] { be.reduce_scatter(in_i32, out_i32, 8, ReduceOp::Sum); },
               "'input'");
  expect_error(ErrorCode::DTypeMismatch, "reduce_scatter", [&] { be.reduce_scatter(in_f32, out, 8, ReduceOp::Sum); },
               "'output'");
  expect_error(ErrorCode::ShapeMismatch, "reduce_scatter", [&] { be.reduce_scatter(small, out, 8, ReduceOp::Sum); },
               "'input'");
  expect_error(ErrorCode::ShapeMismatch, "reduce_scatter", [&] { be.reduce_scatter(in, small, 8, ReduceOp::Sum); },
               "'output'");
  expect_error(ErrorCode::InvalidArgument, "reduce_scatter",
               [&] { be.reduce_scatter(in, out, 8, static_cast<ReduceOp>(42)); }, "'op'");
  CpuBackend other;
  Buffer foreign = zeros(other, DType::F16, 16);
  expect_error(ErrorCode::WrongBackend, "reduce_scatter", [&] { be.reduce_scatter(foreign, out, 8, ReduceOp::Sum); },
               "'input'");
}

// all_reduce refuses a bad op the same way (the shared check).
TEST_P(ReduceScatterWorld1, AllReduceNamesABadOp) {
  Buffer buf = zeros(backend(), DType::F32, 4);
  expect_error(ErrorCode::InvalidArgument, "all_reduce",
               [&] { backend().all_reduce(buf, 4, static_cast<ReduceOp>(-1)); }, "'op'");
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(ReduceScatterWorld1);

TEST(ReduceScatterOp, HasAName) { EXPECT_EQ(to_string(Op::ReduceScatter), "reduce_scatter"); }

// ── Communicator factories ───────────────────────────────────────────────────

TEST(CommunicatorFactories, CreateRefusesBadRanksAndSizes) {
  keep_nvls_off();
  const CommUniqueId id = nonzero_id();
  expect_error(ErrorCode::InvalidArgument, "Communicator::create", [&] { (void)Communicator::create(id, 0, 0, 0); },
               "'world_size'");
  expect_error(ErrorCode::InvalidArgument, "Communicator::create", [&] { (void)Communicator::create(id, -3, 0, 0); },
               "'world_size'");
  expect_error(ErrorCode::InvalidArgument, "Communicator::create", [&] { (void)Communicator::create(id, 2, 2, 0); },
               "'rank'");
  expect_error(ErrorCode::InvalidArgument, "Communicator::create", [&] { (void)Communicator::create(id, 2, -1, 0); },
               "'rank'");
  expect_error(ErrorCode::InvalidArgument, "Communicator::create", [&] { (void)Communicator::create(id, 2, 0, -1); },
               "'device'");
  expect_error(ErrorCode::InvalidArgument, "Communicator::create",
               [&] { (void)Communicator::create(CommUniqueId{}, 2, 0, 0); }, "'id'");
}

TEST(CommunicatorFactories, CreateAllRefusesBadDeviceLists) {
  keep_nvls_off();
  expect_error(ErrorCode::InvalidArgument, "Communicator::create_all",
               [&] { (void)Communicator::create_all(std::span<const int>{}); }, "'devices'");
  const std::vector<int> duplicate = {0, 1, 0};
  expect_error(ErrorCode::InvalidArgument, "Communicator::create_all",
               [&] { (void)Communicator::create_all(duplicate); }, "twice");
  const std::vector<int> negative = {0, -2};
  expect_error(ErrorCode::InvalidArgument, "Communicator::create_all",
               [&] { (void)Communicator::create_all(negative); }, "'devices[1]'");
}

// Valid arguments, but no GPU (or no NCCL): a clear ferrum::Error, never a crash or hang.
TEST(CommunicatorFactories, WithoutAGpuCreateThrowsAClearError) {
  keep_nvls_off();
  if (Communicator::available() && cuda_device_count() > 0) {
    GTEST_SKIP() << "a GPU is visible and NCCL is built in: creation is exercised by the GPU suite";
  }
  const ErrorCode want = Communicator::available() ? ErrorCode::Cuda : ErrorCode::Unsupported;
  const std::string op_hint = Communicator::available() ? "no CUDA device" : "without NCCL";
  const CommUniqueId id = nonzero_id();
  EXPECT_TRUE(throws_error(want, "Communicator::create", [&] { (void)Communicator::create(id, 2, 0, 0); }, op_hint));
  const std::vector<int> devices = {0, 1};
  EXPECT_TRUE(
      throws_error(want, "Communicator::create_all", [&] { (void)Communicator::create_all(devices); }, op_hint));
}

TEST(CommunicatorFactories, WithoutNcclEveryFactorySaysSo) {
  if (Communicator::available()) GTEST_SKIP() << "built with NCCL (FERRUM_WITH_NCCL=ON)";
  expect_error(ErrorCode::Unsupported, "Communicator::new_unique_id", [] { (void)Communicator::new_unique_id(); },
               "without NCCL");
  expect_error(ErrorCode::Unsupported, "Communicator::group_start", [] { Communicator::group_start(); },
               "without NCCL");
  expect_error(ErrorCode::Unsupported, "Communicator::group_end", [] { Communicator::group_end(); }, "without NCCL");
}

// ncclGetUniqueId needs no GPU; a machine without a usable network interface
// may still refuse it, but only with ErrorCode::Nccl.
TEST(CommunicatorFactories, NewUniqueIdNeedsNoGpu) {
  if (!Communicator::available()) GTEST_SKIP() << "built without NCCL";
  keep_nvls_off();
  try {
    const CommUniqueId a = Communicator::new_unique_id();
    const CommUniqueId b = Communicator::new_unique_id();
    EXPECT_NE(a.bytes, CommUniqueId{}.bytes);
    EXPECT_NE(a.bytes, b.bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Nccl) << e.what();
    EXPECT_NE(std::string(e.what()).find("Communicator::new_unique_id"), std::string::npos) << e.what();
  }
}

// Without a GPU a CudaBackend cannot be made at all; with one, a backend
// without a communicator is world size 1 and refuses a bad timeout.
TEST(CudaBackendCommunicator, NoCommunicatorMeansWorldSizeOne) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCudaMessage;
  CudaBackend cuda;
  EXPECT_EQ(cuda.world_size(), 1u);
  EXPECT_EQ(cuda.rank(), 0u);
  EXPECT_EQ(cuda.communicator(), nullptr);
  CudaBackendConfig config;
  config.collective_timeout = std::chrono::milliseconds(0);
  expect_error(ErrorCode::InvalidArgument, "CudaBackend", [&] { CudaBackend bad(config); }, "collective_timeout");
}

}  // namespace
}  // namespace ferrum::test
