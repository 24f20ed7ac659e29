#include "memfit/core/model/units.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace memfit {
namespace {

std::string parse_error(std::string_view text) {
  try {
    parse_size(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(ParseSizeTest, PlainByteCount) {
  EXPECT_EQ(parse_size("0"), 0);
  EXPECT_EQ(parse_size("17179869184"), 17179869184);
  EXPECT_EQ(parse_size("9223372036854775807"),
            std::numeric_limits<int64_t>::max());
}

TEST(ParseSizeTest, BinaryUnits) {
  EXPECT_EQ(parse_size("100B"), 100);
  EXPECT_EQ(parse_size("1KiB"), 1024);
  EXPECT_EQ(parse_size("512MiB"), 536870912);
  EXPECT_EQ(parse_size("16GiB"), 17179869184);
  EXPECT_EQ(parse_size("2TiB"), 2199023255552);
}

TEST(ParseSizeTest, FractionsRoundDownToWholeBytes) {
  EXPECT_EQ(parse_size("1.5GiB"), 1610612736);
  EXPECT_EQ(parse_size("0.5KiB"), 512);
  EXPECT_EQ(parse_size("1.5B"), 1);
  EXPECT_EQ(parse_size("0.001KiB"), 1);           // 1.024 bytes
  EXPECT_EQ(parse_size("0.0009KiB"), 0);          // 0.9216 bytes
  EXPECT_EQ(parse_size("3.999999MiB"), 4194302);  // 4194302.95 bytes
  // Exact: 2^-40 TiB is one byte, though it needs 40 decimals.
  EXPECT_EQ(parse_size("0.0000000000009094947017729282379150390625TiB"), 1);
  EXPECT_EQ(parse_size("0.0000000000009094947017729282379150390624TiB"), 0);
}

TEST(ParseSizeTest, WhitespaceIsRejectedWithTheExpectedForm) {
  EXPECT_EQ(parse_error("16 GB"),
            "[parse_size] cannot read '16 GB' as a size: use a byte count "
            "(17179869184) or a number with KiB, MiB, GiB or TiB and no space "
            "(16GiB)");
  EXPECT_NE(parse_error(" 16GiB").find("cannot read ' 16GiB'"),
            std::string::npos);
  EXPECT_NE(parse_error("16GiB\n").find("cannot read"), std::string::npos);
}

TEST(ParseSizeTest, DecimalUnitsAreAmbiguous) {
  EXPECT_EQ(parse_error("16GB"),
            "[parse_size] 'GB' in '16GB' is ambiguous (powers of 1000 or of "
            "1024): use GiB (16GiB)");
  EXPECT_EQ(parse_error("1.5MB"),
            "[parse_size] 'MB' in '1.5MB' is ambiguous (powers of 1000 or of "
            "1024): use MiB (1.5MiB)");
  EXPECT_NE(parse_error("4K").find("use KiB (4KiB)"), std::string::npos);
  EXPECT_NE(parse_error("1TB").find("use TiB"), std::string::npos);
}

TEST(ParseSizeTest, RejectsNegativeGarbageAndEmpty) {
  EXPECT_EQ(parse_error("-1"),
            "[parse_size] '-1' is negative: a size is a byte count >= 0 (0, "
            "512MiB, 16GiB)");
  EXPECT_NE(parse_error("abc").find("cannot read 'abc'"), std::string::npos);
  EXPECT_NE(parse_error("").find("the size is empty"), std::string::npos);
  EXPECT_NE(parse_error("+5").find("cannot read"), std::string::npos);
  EXPECT_NE(parse_error("1.GiB").find("cannot read"), std::string::npos);
  EXPECT_NE(parse_error(".5GiB").find("cannot read"), std::string::npos);
  EXPECT_NE(parse_error("1e9").find("cannot read"), std::string::npos);
  EXPECT_NE(parse_error("16gib").find("cannot read"), std::string::npos);
  EXPECT_EQ(parse_error("1.5"),
            "[parse_size] '1.5' has a fraction but no unit: write whole "
            "bytes (1) or add a unit (1.5GiB)");
}

TEST(ParseSizeTest, RejectsOverflow) {
  const std::string too_large =
      "[parse_size] '9223372036854775808' is too large: the largest size is "
      "9223372036854775807 bytes (just under 8 EiB)";
  EXPECT_EQ(parse_error("9223372036854775808"), too_large);
  EXPECT_NE(parse_error("8388608TiB").find("too large"), std::string::npos);
  EXPECT_NE(parse_error("99999999999999999999999").find("too large"),
            std::string::npos);
  // Just under the limit in TiB is fine: 8388607 TiB.
  EXPECT_EQ(parse_size("8388607TiB"), int64_t{8388607} << 40);
  // A fraction never pushes a unit count that fits past the limit.
  EXPECT_EQ(parse_size("8388607.9999999999999999999TiB"),
            std::numeric_limits<int64_t>::max());
}

TEST(FormatBytesTest, BytesBelowOneKiBAreWhole) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
}

TEST(FormatBytesTest, TwoDecimalsInBinaryUnits) {
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(4000000000), "3.73 GiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 40), "3.00 TiB");
  EXPECT_EQ(format_bytes(int64_t{5000} << 40), "5000.00 TiB");
}

TEST(ParseSizeTest, AnExponentIsNamedNotCalledUnreadable) {
  for (const char* text : {"1e30GiB", "2E9", "1e+3MiB"}) {
    try {
      parse_size(text);
      ADD_FAILURE() << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("has an exponent"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_size("16eGiB"), std::invalid_argument);  // still unreadable
}

TEST(FormatBytesTest, RoundsHalfUpAndCarriesIntoTheNextUnit) {
  EXPECT_EQ(format_bytes(1029), "1.00 KiB");     // 1.0049
  EXPECT_EQ(format_bytes(1030), "1.01 KiB");     // 1.0059
  EXPECT_EQ(format_bytes(1048575), "1.00 MiB");  // 1023.999 KiB
}

TEST(FormatBytesTest, NegativeDeltasGetAMinus) {
  EXPECT_EQ(format_bytes(-512), "-512 B");
  EXPECT_EQ(format_bytes(-(int64_t{3} << 30)), "-3.00 GiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<int64_t>::min()),
            "-8388608.00 TiB");
}

}  // namespace
}  // namespace memfit
