#include "memfit/core/svg_plot.h"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "memfit/core/units.h"

namespace memfit {
namespace {

constexpr int64_t MiB = 1024 * 1024;

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = s.find(needle); pos != std::string::npos;
       pos = s.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

void record(Timeline& t, EventKind kind, uint64_t id, int64_t bytes) {
  Event e;
  e.kind = kind;
  e.id = id;
  e.bytes = bytes;
  e.phase = t.current_phase();
  e.time_ns = static_cast<int64_t>(t.size());
  t.record(e);
}

// Two iterations; the peak, 12.3 MiB, is inside the first backward.
Timeline step_timeline() {
  Timeline t;
  for (int it = 0; it < 2; ++it) {
    const uint64_t base = 100 * static_cast<uint64_t>(it);
    t.begin_phase("forward", it);
    record(t, EventKind::kAlloc, base + 1, 4 * MiB);
    record(t, EventKind::kAlloc, base + 2, 4 * MiB);
    t.begin_phase("backward", it);
    record(t, EventKind::kAlloc, base + 3,
           it == 0 ? 4 * MiB + 3 * MiB / 10 : 2 * MiB);
    record(t, EventKind::kFree, base + 3, 0);
    record(t, EventKind::kFree, base + 2, 0);
    record(t, EventKind::kFree, base + 1, 0);
    t.end_phase();
  }
  return t;
}

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

TEST(MemorySvgTest, IsAWellFormedSelfContainedDocument) {
  const std::string svg = memory_svg(step_timeline());
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<svg"), count(svg, "</svg>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  EXPECT_EQ(count(svg, "<title>"), count(svg, "</title>"));
  // Bands carry a tooltip, so they are the only rects with a closing tag.
  EXPECT_EQ(count(svg, "<rect class=\"band\""), count(svg, "</rect>"));
  EXPECT_EQ(count(svg, "<script"), 0u);
  EXPECT_EQ(count(svg, "href"), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
}

TEST(MemorySvgTest, MarksThePeakWithItsExactSizeAndPhase) {
  const Timeline t = step_timeline();
  ASSERT_EQ(t.peak().bytes, 12 * MiB + 3 * MiB / 10);
  const std::string svg = memory_svg(t);
  EXPECT_EQ(format_bytes(t.peak().bytes), "12.30 MiB");
  EXPECT_NE(svg.find(">peak 12.30 MiB (backward)</text>"), std::string::npos)
      << svg;
  EXPECT_EQ(count(svg, "<circle class=\"peak\""), 1u);
}

TEST(MemorySvgTest, OneLabelledBandPerPhaseSpan) {
  const Timeline t = step_timeline();
  ASSERT_EQ(t.phase_spans().size(), 4u);
  const std::string svg = memory_svg(t);
  EXPECT_EQ(count(svg, "<rect class=\"band\""), 4u);
  for (const char* label :
       {"forward#0", "backward#0", "forward#1", "backward#1"}) {
    EXPECT_EQ(count(svg, std::string("<title>") + label + "</title>"), 1u)
        << label;
  }
}

TEST(MemorySvgTest, AxisTicksAreLabelledWithFormatBytes) {
  const std::string svg = memory_svg(step_timeline());
  for (const char* tick :
       {">0 B<", ">4.00 MiB<", ">8.00 MiB<", ">12.00 MiB<", ">16.00 MiB<"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  EXPECT_EQ(count(svg, "<text class=\"tick\""), 5u);
}

TEST(MemorySvgTest, EscapesTitleAndPhaseNames) {
  Timeline t;
  t.begin_phase("a<b&c", 0);
  record(t, EventKind::kAlloc, 1, 1000);
  t.end_phase();
  SvgOptions o;
  o.title = "memfit <profile> & \"co\"";
  const std::string svg = memory_svg(t, o);
  EXPECT_NE(svg.find("<title>memfit &lt;profile&gt; &amp; &quot;co&quot;"
                     "</title>"),
            std::string::npos);
  EXPECT_NE(svg.find("<title>a&lt;b&amp;c#0</title>"), std::string::npos);
  EXPECT_NE(svg.find(">peak 1000 B (a&lt;b&amp;c)</text>"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg.find("<profile>"), std::string::npos);
}

TEST(MemorySvgTest, EmptyTimelineStillDraws) {
  const std::string svg = memory_svg(Timeline());
  EXPECT_NE(svg.find(">no events</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(MemorySvgTest, LongTimelinesAreDownsampled) {
  Timeline t;
  for (uint64_t i = 0; i < 20000; ++i) {
    record(t, EventKind::kAlloc, i, 1000 + static_cast<int64_t>(i % 97));
    record(t, EventKind::kFree, i, 0);
  }
  SvgOptions o;
  o.max_points = 100;
  const std::string svg = memory_svg(t, o);
  const size_t begin = svg.find("points=\"");
  ASSERT_NE(begin, std::string::npos);
  const std::string points =
      svg.substr(begin + 8, svg.find('"', begin + 8) - begin - 8);
  // The start point plus at most max_points curve points.
  EXPECT_LE(count(points, ","), 101u);
  EXPECT_GE(count(points, ","), 50u);
}

TEST(MemorySvgTest, RejectsTinyPictures) {
  SvgOptions o;
  o.width = 100;
  EXPECT_THROW(memory_svg(Timeline(), o), std::invalid_argument);
  o = SvgOptions{};
  o.max_points = 2;
  EXPECT_THROW(memory_svg(Timeline(), o), std::invalid_argument);
}

}  // namespace
}  // namespace memfit
