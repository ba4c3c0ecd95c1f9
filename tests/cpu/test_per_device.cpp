// PerDevice (kernels/common/per_device.hpp), what the launchers remember per
// device (occupancy, cluster placement, shared-memory opt-ins), checked on
// the CPU through at(device, make): one make per device, devices apart, a
// throwing make not remembered, racing threads making once. The launchers'
// side (the GPTQ kernels exact on a second device after the first) is the
// GPU test CudaGptq.EveryKernelRunsOnASecondDevice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/common/per_device.hpp"

namespace ferrum::test {
namespace {

using kernels::kMaxDevices;
using kernels::PerDevice;

TEST(PerDevice, EachDeviceMakesItsOwnValueOnce) {
  PerDevice<int> table;
  int makes = 0;
  auto make = [&](int device) {
    ++makes;
    return 100 + device;
  };
  for (int round = 0; round < 3; ++round) {
    for (int device : {0, 1, 7, kMaxDevices - 1}) EXPECT_EQ(table.at(device, make), 100 + device);
  }
  EXPECT_EQ(makes, 4) << "one make per device, however often it is asked";
}

TEST(PerDevice, AThrowingMakeIsAskedAgain) {
  PerDevice<int> table;
  int calls = 0;
  auto flaky = [&](int) {
    if (++calls == 1) throw std::runtime_error("query failed");
    return 42;
  };
  EXPECT_THROW(table.at(3, flaky), std::runtime_error);
  EXPECT_EQ(table.at(3, flaky), 42) << "a failed query is not an answer";
  EXPECT_EQ(table.at(3, flaky), 42);
  EXPECT_EQ(calls, 2);
}

TEST(PerDevice, RacingThreadsMakeOnce) {
  PerDevice<std::vector<int>> table;
  std::atomic<int> makes{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  std::vector<int> sums(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      const std::vector<int>& v = table.at(5, [&](int device) {
        makes.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // widen the race
        return std::vector<int>(1000, device);
      });
      for (int x : v) sums[static_cast<std::size_t>(t)] += x;
    });
  }
  go.store(true);
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(makes.load(), 1);
  for (int s : sums) EXPECT_EQ(s, 5000) << "every thread reads the whole value";
}

}  // namespace
}  // namespace ferrum::test
