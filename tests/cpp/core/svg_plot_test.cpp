#include "memfit/core/render/svg_plot.h"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/model/units.h"

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

TEST(XAxisTicksTest, MostTicksWhoseLabelsKeepApartUnderTheArea) {
  const Box area{50, 40, 300, 200};
  const XAxisTicks wide = x_axis_ticks(
      area, 1000, [](int64_t v, int64_t) { return std::to_string(v); });
  ASSERT_GE(wide.values.size(), 2u);
  EXPECT_EQ(wide.values.front(), 0);
  EXPECT_EQ(wide.step, wide.values[1]);
  ASSERT_EQ(wide.labels.size(), wide.values.size());
  for (size_t i = 0; i < wide.labels.size(); ++i) {
    const TextLabel& l = wide.labels[i];
    EXPECT_DOUBLE_EQ(l.x, area.x + area.w * double(wide.values[i]) / 1000);
    EXPECT_DOUBLE_EQ(l.y, area.bottom() + 16);
    EXPECT_EQ(l.role, "tick");
    if (i > 0) {
      EXPECT_FALSE(overlaps(inflate(wide.labels[i - 1].box(), 4), l.box()));
    }
  }
  // Long labels: fewer ticks.
  const XAxisTicks longer =
      x_axis_ticks(area, 1000, [](int64_t v, int64_t step) {
        return std::to_string(v) + " of step " + std::to_string(step);
      });
  EXPECT_LT(longer.values.size(), wide.values.size());
  EXPECT_EQ(longer.labels.front().text,
            "0 of step " + std::to_string(longer.step));
}

TEST(SvgGridTest, OneGridLinePerTickThenTheAxesOnTheAreaEdges) {
  const Box area{10, 20, 100, 50};
  EXPECT_EQ(svg_grid(area, {20, 45}),
            "<line class=\"grid\" x1=\"10.0\" y1=\"20.0\" x2=\"110.0\" "
            "y2=\"20.0\" stroke=\"#cfd6df\" stroke-width=\"0.7\"/>\n"
            "<line class=\"grid\" x1=\"10.0\" y1=\"45.0\" x2=\"110.0\" "
            "y2=\"45.0\" stroke=\"#cfd6df\" stroke-width=\"0.7\"/>\n");
  EXPECT_EQ(svg_axes(area),
            "<path class=\"axis\" d=\"M10.0 20.0 L10.0 70.0 L110.0 70.0\" "
            "fill=\"none\" stroke=\"#333333\"/>\n");
}

}  // namespace
}  // namespace memfit
