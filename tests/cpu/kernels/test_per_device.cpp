// PerDevice and PerDeviceAnswers (kernels/common/per_device.hpp), what the
// launchers remember per device (occupancy, cluster placement,
// shared-memory opt-ins, device attributes), checked on the CPU: one make
// (or ask) per device and key, devices and keys apart, a failed query not
// remembered, racing threads agreeing, out-of-range indices refused by
// name. The launchers' side (the GPTQ kernels exact on a second device
// after the first) is the GPU test CudaGptq.EveryKernelRunsOnASecondDevice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferrum/error.hpp"
#include "kernels/common/per_device.hpp"

namespace ferrum::test {
namespace {

using kernels::kMaxDevices;
using kernels::PerDevice;
using kernels::PerDeviceAnswers;

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

TEST(PerDeviceAnswers, EachDeviceAndKeyIsAskedOnce) {
  PerDeviceAnswers<int, 3> counts;
  int asks = 0;
  for (int round = 0; round < 3; ++round) {
    for (int device : {0, 2, kMaxDevices - 1}) {
      for (int key = 0; key < 3; ++key) {
        const std::optional<int> got = counts.get(device, key, [&]() -> std::optional<int> {
          ++asks;
          return device * 10 + key;  // 0 is an answer too (device 0, key 0)
        });
        ASSERT_TRUE(got.has_value());
        EXPECT_EQ(*got, device * 10 + key);
      }
    }
  }
  EXPECT_EQ(asks, 9) << "one ask per (device, key), however often it is asked";
}

TEST(PerDeviceAnswers, NoAnswerIsAskedAgain) {
  PerDeviceAnswers<bool, 1> fits;
  int asks = 0;
  auto flaky = [&]() -> std::optional<bool> {
    if (++asks == 1) return std::nullopt;  // the query failed
    return false;                          // "no" is an answer, remembered
  };
  EXPECT_FALSE(fits.get(4, 0, flaky).has_value());
  EXPECT_EQ(fits.get(4, 0, flaky), std::optional<bool>(false));
  EXPECT_EQ(fits.get(4, 0, flaky), std::optional<bool>(false));
  EXPECT_EQ(asks, 2);
}

TEST(PerDeviceAnswers, AThrowingAskIsAskedAgain) {
  PerDeviceAnswers<bool, 2> fits;
  int asks = 0;
  auto flaky = [&]() -> std::optional<bool> {
    if (++asks == 1) throw std::runtime_error("query failed");
    return true;
  };
  EXPECT_THROW(fits.get(1, 1, flaky), std::runtime_error);
  EXPECT_EQ(fits.get(1, 1, flaky), std::optional<bool>(true));
  EXPECT_EQ(fits.get(1, 1, flaky), std::optional<bool>(true));
  EXPECT_EQ(asks, 2);
}

TEST(PerDeviceAnswers, OutOfRangeIndicesAndAnswersAreRefusedByName) {
  PerDeviceAnswers<int, 2> counts;
  auto one = []() -> std::optional<int> { return 1; };
  auto expect_refused = [](auto&& call, const char* clause) {
    try {
      call();
      ADD_FAILURE() << "no error for " << clause;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Internal) << e.what();
      EXPECT_NE(std::string(e.what()).find(clause), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { counts.get(-1, 0, one); }, "device");
  expect_refused([&] { counts.get(kMaxDevices, 0, one); }, "device");
  expect_refused([&] { counts.get(0, 2, one); }, "key");
  expect_refused([&] { counts.get(0, -1, one); }, "key");
  expect_refused([&] { counts.get(0, 0, []() -> std::optional<int> { return -3; }); }, "answer");
  expect_refused([&] { counts.get(0, 1, [] { return std::optional<int>(std::numeric_limits<int>::max()); }); },
                 "answer");  // its + 1 would overflow the stored form
  EXPECT_EQ(counts.get(0, 0, one), std::optional<int>(1)) << "a refused answer is not remembered";
}

TEST(PerDeviceAnswers, RacingThreadsAgree) {
  PerDeviceAnswers<int, 4> counts;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  std::vector<int> seen(8, -1);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      seen[static_cast<std::size_t>(t)] = *counts.get(6, 3, []() -> std::optional<int> {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // widen the race
        return 77;
      });
    });
  }
  go.store(true);
  for (std::thread& th : threads) th.join();
  for (int v : seen) EXPECT_EQ(v, 77);
  EXPECT_EQ(counts.get(6, 3, []() -> std::optional<int> { return 0; }), std::optional<int>(77)) << "remembered";
}

}  // namespace
}  // namespace ferrum::test
