// The test machinery's own rules: FERRUM_TEST_SEED's parse.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

TEST(TestSeedOverride, ReadsDecimalHexAndOctalAsStrtoullDoes) {
  EXPECT_EQ(parse_seed_override(nullptr), std::nullopt);
  EXPECT_EQ(parse_seed_override(""), std::nullopt);
  EXPECT_EQ(parse_seed_override("0"), std::optional<std::uint64_t>(0));
  EXPECT_EQ(parse_seed_override("6884505891178264407"), std::optional<std::uint64_t>(6884505891178264407ull));
  EXPECT_EQ(parse_seed_override("0x1F"), std::optional<std::uint64_t>(31));
  EXPECT_EQ(parse_seed_override("017"), std::optional<std::uint64_t>(15));
  EXPECT_EQ(parse_seed_override("18446744073709551615"), std::optional<std::uint64_t>(UINT64_MAX));
}

TEST(TestSeedOverride, RefusesWhatIsNotAnUnsigned64BitInteger) {
  for (const char* bad : {"abc", "-1", "+1", " 1", "1 ", "12x", "0x", "18446744073709551616", "1e3"}) {
    SCOPED_TRACE(bad);
    try {
      (void)parse_seed_override(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string_view(e.what()).find(cat("FERRUM_TEST_SEED='", bad, "'")), std::string_view::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace ferrum::test
