// The items of a comma-separated command-line list ("1,4,16" -> {"1", "4",
// "16"}), shared by the benchmark tools that take lists.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

inline std::vector<std::string> comma_items(const std::string& list) {
  std::vector<std::string> items;
  for (std::size_t at = 0; at < list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    items.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

// The same list as ints (std::atoi of each item).
inline std::vector<int> comma_ints(const std::string& list) {
  std::vector<int> out;
  for (const std::string& item : comma_items(list)) out.push_back(std::atoi(item.c_str()));
  return out;
}
