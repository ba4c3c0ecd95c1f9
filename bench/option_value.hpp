// The value after a command-line option (argv[i + 1], and i moves past it);
// without one the tool says so and exits with status 2. Shared by the
// benchmark tools' argument loops.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

inline std::string option_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[i]);
    std::exit(2);
  }
  return argv[++i];
}
