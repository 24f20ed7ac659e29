#include "memfit/core/svg_plot.h"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/units.h"

namespace memfit {
namespace {

constexpr int64_t MiB = 1024 * 1024;

TEST(AxisTicksTest, FourToSixTicksOnPowerOfTwoSteps) {
  EXPECT_EQ(axis_ticks(12 * MiB + 3 * MiB / 10),
            (std::vector<int64_t>{0, 4 * MiB, 8 * MiB, 12 * MiB, 16 * MiB}));
  EXPECT_EQ(axis_ticks(1000), (std::vector<int64_t>{0, 256, 512, 768, 1024}));
  EXPECT_EQ(axis_ticks(1025),
            (std::vector<int64_t>{0, 256, 512, 768, 1024, 1280}));
  EXPECT_EQ(axis_ticks(6), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(axis_ticks(int64_t{16} << 30),
            (std::vector<int64_t>{0, int64_t{4} << 30, int64_t{8} << 30,
                                  int64_t{12} << 30, int64_t{16} << 30}));
  EXPECT_EQ(axis_ticks(0), (std::vector<int64_t>{0, 1}));
  // Labels stay exact across a unit boundary.
  std::string labels;
  for (int64_t tick : axis_ticks(2030 * MiB))
    labels += format_bytes(tick) + ";";
  EXPECT_EQ(labels, "0 B;512.00 MiB;1.00 GiB;1.50 GiB;2.00 GiB;");
  for (int64_t max :
       {int64_t{6}, int64_t{999}, int64_t{123456789}, int64_t{1} << 45,
        int64_t{7} << 50, std::numeric_limits<int64_t>::max()}) {
    const std::vector<int64_t> ticks = axis_ticks(max);
    EXPECT_GE(ticks.size(), 4u) << max;
    EXPECT_LE(ticks.size(), 6u) << max;
    EXPECT_GE(ticks.back(), max) << max;
  }
}

TEST(XmlEscapeTest, EscapesMarkupCharacters) {
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
}

TEST(DecimalTicksTest, StepsOfOneTwoOrFiveTimesAPowerOfTen) {
  EXPECT_EQ(decimal_ticks(3, 8), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(decimal_ticks(1000, 10),
            (std::vector<int64_t>{0, 100, 200, 300, 400, 500, 600, 700, 800,
                                  900, 1000}));
  EXPECT_EQ(decimal_ticks(1234, 5), (std::vector<int64_t>{0, 500, 1000}));
  EXPECT_EQ(decimal_ticks(0, 4), (std::vector<int64_t>{0, 1}));
  const std::vector<int64_t> huge =
      decimal_ticks(std::numeric_limits<int64_t>::max(), 6);
  EXPECT_GE(huge.size(), 2u);
  EXPECT_LE(huge.size(), 7u);
  EXPECT_THROW(decimal_ticks(10, 0), std::invalid_argument);
}

TEST(SvgTextTest, DrawsTheLabelEscapedWithItsAnchorAndClass) {
  TextLabel l;
  l.text = "a<b";
  l.x = 10;
  l.y = 20.25;
  l.anchor = Anchor::kEnd;
  l.role = "tick";
  EXPECT_EQ(svg_text(l),
            "<text class=\"tick\" x=\"10.0\" y=\"20.2\" text-anchor=\"end\" "
            "fill=\"#333333\">a&lt;b</text>\n");
}

TEST(SvgOpenTest, SizedTitledAndInTheMeasuredFonts) {
  const std::string s = svg_open(400, 300, "a & b", "memfit-x");
  EXPECT_EQ(
      s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"memfit-x\" "
              "width=\"400\" height=\"300\" viewBox=\"0 0 400 300\"",
              0),
      0u);
  EXPECT_NE(s.find(std::string("font-family=\"") + kFontFamily + "\""),
            std::string::npos);
  EXPECT_NE(s.find("<title>a &amp; b</title>"), std::string::npos);
}

}  // namespace
}  // namespace memfit
