// Load-time host work split over the machine's cores (GPTQ unpack and repack
// of a whole model is billions of nibbles: minutes on one core). Never used
// by an op in the hot path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace ferrum::detail {

// Calls body(begin, end) over disjoint ranges covering [0, count) on up to
// max_threads threads (0: hardware_concurrency()). Every range starts at a multiple of
// `align` (so ranges never share an output word that `align` items fill
// together) and holds at least `min_items` items except the last. The result
// never depends on the split. The first exception thrown by a body is
// rethrown here after every thread has joined.
template <class Body>
void parallel_for(std::size_t count, std::size_t align, std::size_t min_items, unsigned max_threads, Body body) {
  align = std::max<std::size_t>(align, 1);
  const std::size_t cores = max_threads != 0 ? max_threads : std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads = std::min(cores, std::max<std::size_t>(1, count / std::max<std::size_t>(min_items, 1)));
  if (threads <= 1) {
    body(std::size_t{0}, count);
    return;
  }
  const std::size_t per = ((count + threads - 1) / threads + align - 1) / align * align;
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  try {
    for (std::size_t t = 0; t < threads; ++t) {
      const std::size_t begin = std::min(count, t * per), end = std::min(count, begin + per);
      if (begin == end) break;
      pool.emplace_back([&body, &errors, t, begin, end] {
        try {
          body(begin, end);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
  } catch (...) {  // a thread could not be started: never destroy joinable ones
    for (std::thread& th : pool) th.join();
    throw;
  }
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace ferrum::detail
