// The test binaries' main (in place of gtest_main): reads the suite's one
// documented override, FERRUM_TEST_SEED, once, here, then runs gtest.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "support/test_support.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    ferrum::test::set_seed_override(ferrum::test::parse_seed_override(std::getenv("FERRUM_TEST_SEED")));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return RUN_ALL_TESTS();
}
