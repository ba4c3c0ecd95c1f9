// Host work split over the machine's cores: CpuBackend's ops, and the
// load-time GPTQ unpack and repack (billions of nibbles for a whole model:
// minutes on one core). CudaBackend's ops never use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace ferrum::detail {

// Calls body(begin, end) over disjoint ranges covering [0, count) on up to
// max_threads threads (0: hardware_concurrency()), the calling thread taking
// the first range. Every range starts at a multiple of `align` (so ranges
// never share an output word that `align` items fill together) and holds at
// least `min_items` items except the last. The result never depends on the
// split. A thread that cannot be started leaves its ranges to the calling
// thread. The exception of the lowest failing range is rethrown here after
// every thread has joined. CpuBackend's ops and the load-time GPTQ work both
// run on it.
template <class Body>
void parallel_for(std::size_t count, std::size_t align, std::size_t min_items, unsigned max_threads, Body&& body) {
  align = std::max<std::size_t>(align, 1);
  const std::size_t cores = max_threads != 0 ? max_threads : std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads = std::min(cores, std::max<std::size_t>(1, count / std::max<std::size_t>(min_items, 1)));
  if (threads <= 1) {
    body(std::size_t{0}, count);
    return;
  }
  const std::size_t per = ((count + threads - 1) / threads + align - 1) / align * align;
  std::vector<std::exception_ptr> errors(threads);
  auto run = [&](std::size_t t) {
    const std::size_t begin = std::min(count, t * per), end = std::min(count, begin + per);
    if (begin == end) return;
    try {
      body(begin, end);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  std::size_t started = 1;
  for (; started < threads; ++started) {
    try {
      pool.emplace_back(run, started);
    } catch (const std::system_error&) {
      break;  // out of threads: the ranges not started run on this thread below
    }
  }
  for (std::size_t t = started; t < threads; ++t) run(t);
  run(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace ferrum::detail
