#include "memfit/core/render/text_table.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace memfit {
namespace {

TEST(TextTableTest, PadsColumnsToTheWidestCellWithTwoSpaces) {
  TextTable t({"phase", "iter", "peak"},
              {Align::kLeft, Align::kRight, Align::kRight});
  t.add_row({"forward", "0", "3.00 GiB"});
  t.add_row({"optimizer_step", "12", "512 B"});
  EXPECT_EQ(t.str(),
            "phase           iter      peak\n"
            "--------------  ----  --------\n"
            "forward            0  3.00 GiB\n"
            "optimizer_step    12     512 B\n");
}

TEST(TextTableTest, SeparatorAndNoTrailingSpaces) {
  TextTable t({"module", "bytes", "note"},
              {Align::kLeft, Align::kRight, Align::kLeft});
  t.add_row({"fc1", "10", ""});
  t.add_row({"fc2", "5", "big"});
  t.add_separator();
  t.add_row({"total", "15", ""});
  EXPECT_EQ(t.str(),
            "module  bytes  note\n"
            "------  -----  ----\n"
            "fc1        10\n"
            "fc2         5  big\n"
            "------  -----  ----\n"
            "total      15\n");
  EXPECT_EQ(t.num_rows(), 4u);
}

TEST(TextTableTest, HeaderOnlyTable) {
  TextTable t({"a", "bb"}, {Align::kRight, Align::kLeft});
  EXPECT_EQ(t.str(),
            "a  bb\n"
            "-  --\n");
}

TEST(TextTableTest, WidthCountsCodePointsNotBytes) {
  TextTable t({"unit", "x"}, {Align::kLeft, Align::kRight});
  t.add_row({"\xc2\xb5s", "1"});  // "µs": 2 code points, 3 bytes
  t.add_row({"ms", "22"});
  EXPECT_EQ(t.str(),
            "unit   x\n"
            "----  --\n"
            "\xc2\xb5s     1\n"
            "ms    22\n");
}

TEST(TextTableTest, WrongCellCountsThrow) {
  EXPECT_THROW(TextTable({}, {}), std::invalid_argument);
  EXPECT_THROW(TextTable({"a", "b"}, {Align::kLeft}), std::invalid_argument);
  TextTable t({"a", "b"}, {Align::kLeft, Align::kLeft});
  try {
    t.add_row({"1"});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "[TextTable::add_row] 1 cells for 2 columns: give one cell per "
              "column (\"\" for none)");
  }
}

}  // namespace
}  // namespace memfit
