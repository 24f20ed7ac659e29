#include "memfit/core/render/stacked_plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "memfit/core/model/units.h"
#include "training_step.h"

namespace memfit {
namespace {

using testing::kKiB;
using testing::count;
using testing::kMiB;
using testing::training_step;

std::string describe(const TextLabel& l) {
  const Box b = l.box();
  return "'" + l.text + "' (" + l.role + ") at " + std::to_string(b.x) + "," +
         std::to_string(b.y) + " " + std::to_string(b.w) + "x" +
         std::to_string(b.h);
}

// Every label inside the picture, none over another; phase labels above
// the plot; the peak's annotation inside the plot and above every point
// beneath it (a point's step runs to the next point).
void expect_readable(const StackedPlot& p) {
  const Box picture{0, 0, double(p.options.width), double(p.options.height)};
  const auto clash = first_overlap(p.labels);
  EXPECT_FALSE(clash.has_value())
      << describe(p.labels[clash->first]) << " overlaps "
      << describe(p.labels[clash->second]);
  for (const TextLabel& l : p.labels) {
    EXPECT_TRUE(contains(picture, l.box())) << describe(l);
    EXPECT_FALSE(l.text.empty()) << l.role;
    if (l.role == "phase") {
      EXPECT_LE(l.box().bottom(), p.area.y) << describe(l);
    }
    if (l.role == "peak") {
      EXPECT_TRUE(contains(p.callout, l.box())) << describe(l);
    }
  }
  if (p.callout.w > 0) {
    EXPECT_TRUE(contains(p.area, p.callout));
    for (size_t i = 0; i < p.points.size(); ++i) {
      const double end =
          i + 1 < p.points.size() ? p.points[i + 1].x : p.area.right();
      if (end < p.callout.x || p.points[i].x > p.callout.right()) continue;
      EXPECT_LT(p.callout.bottom(), p.y_at(p.points[i].total()))
          << p.points[i].event_index;
    }
    // The peak's dot is not under the box.
    EXPECT_FALSE(overlaps(p.callout, Box{p.peak_x - 5, p.peak_y - 5, 10, 10}));
  }
}

TEST(StackedPlotTest, NoLabelOverlapsAnotherAtAnySize) {
  const Timeline t = training_step();
  for (int width : {320, 480, 640, 800, 1200, 1920}) {
    for (int height : {240, 360, 500, 800}) {
      for (PlotAxis axis : {PlotAxis::kTime, PlotAxis::kEvents}) {
        SCOPED_TRACE(std::to_string(width) + "x" + std::to_string(height) +
                     (axis == PlotAxis::kTime ? " time" : " events"));
        StackedPlotOptions o;
        o.title = "memfit profile: gpt, batch 16, adam";
        o.width = width;
        o.height = height;
        o.x_axis = axis;
        expect_readable(stacked_plot(t, o));
      }
    }
  }
}

TEST(StackedPlotTest, PeakIsAnnotatedWithItsTopTwoCategoriesAndModules) {
  const StackedPlot p = stacked_plot(training_step());
  EXPECT_EQ(p.peak.bytes, 29 * kMiB + 544 * kKiB + 8);
  EXPECT_EQ(p.peak.phase, "backward");
  EXPECT_EQ(p.peak.iteration, 2);
  EXPECT_EQ(p.peak.op, "aten::_log_softmax_backward_data");
  ASSERT_GE(p.peak.categories.size(), 2u);
  EXPECT_EQ(p.peak.categories[0].name, "activations");
  EXPECT_EQ(p.peak.categories[0].bytes, 16 * kMiB + 8);
  EXPECT_EQ(p.peak.categories[1].name, "optimizer state");
  EXPECT_EQ(p.peak.categories[1].bytes, 6 * kMiB);
  ASSERT_EQ(p.peak.modules.size(), 3u);
  EXPECT_EQ(p.peak.modules[0].name, "head");
  EXPECT_EQ(p.peak.modules[0].bytes, 8 * kMiB);
  EXPECT_EQ(p.peak.modules[1].name, "blocks.0");  // ties by name
  EXPECT_EQ(p.peak.modules[1].bytes, 6 * kMiB);

  std::vector<std::string> lines;
  for (const TextLabel& l : p.labels) {
    if (l.role == "peak") lines.push_back(l.text);
  }
  EXPECT_EQ(lines, (std::vector<std::string>{
                       "peak 29.53 MiB in backward 2 at "
                       "aten::_log_softmax_backward_data",
                       "activations 16.00 MiB, optimizer state 6.00 MiB",
                       "modules: head 8.00 MiB, blocks.0 6.00 MiB"}));
  // The dot is at the peak event's point, on top of the stack.
  const auto at =
      std::find_if(p.points.begin(), p.points.end(), [&](const PlotPoint& pt) {
        return pt.event_index == p.peak.event_index;
      });
  ASSERT_NE(at, p.points.end());
  EXPECT_DOUBLE_EQ(p.peak_x, at->x);
  EXPECT_DOUBLE_EQ(p.peak_y, p.y_at(p.peak.bytes));
  EXPECT_EQ(at->total(), p.peak.bytes);
  const std::string svg = p.svg();
  EXPECT_EQ(count(svg, "<circle class=\"peak\""), 1u);
  EXPECT_NE(svg.find(">peak 29.53 MiB in backward 2 at "), std::string::npos);
}

TEST(StackedPlotTest, StacksEveryCategoryAndSumsToTheLiveBytes) {
  const Timeline t = training_step();
  const StackedPlot p = stacked_plot(t);
  ASSERT_GT(p.points.size(), 2u);
  EXPECT_EQ(p.points.front().total(), 0);
  for (size_t i = 1; i < p.points.size(); ++i) {
    const PlotPoint& pt = p.points[i];
    EXPECT_EQ(pt.total(), t.live_after(pt.event_index)) << pt.event_index;
    EXPECT_EQ(pt.bytes, t.breakdown_after(pt.event_index).by_category);
    EXPECT_GE(pt.x, p.points[i - 1].x);
  }
  const std::string svg = p.svg();
  for (const char* c : {"parameter", "input", "activation", "gradient",
                        "optimizer_state", "temporary"}) {
    EXPECT_EQ(count(svg, std::string("<path class=\"area\" data-category=\"") +
                             c + "\""),
              1u)
        << c;
  }
  EXPECT_EQ(count(svg, "data-category=\"buffer\""), 0u);  // none recorded
  for (const char* legend : {">parameters<", ">optimizer state<", ">gradients<",
                             ">inputs<", ">activations<", ">temporaries<"}) {
    EXPECT_EQ(count(svg, legend), 1u) << legend;
  }
}

TEST(StackedPlotTest, TheLongPhasesAreNamedAtTheDemoSize) {
  for (PlotAxis axis : {PlotAxis::kTime, PlotAxis::kEvents}) {
    StackedPlotOptions o;
    o.x_axis = axis;
    const StackedPlot p = stacked_plot(training_step(), o);
    ASSERT_EQ(p.bands.size(), 13u);
    for (const PhaseBand& b : p.bands) {
      if (b.phase == "forward" || b.phase == "backward" ||
          b.phase == "optimizer_step") {
        EXPECT_EQ(
            b.label.rfind(
                b.phase == "optimizer_step" ? "optim" : b.phase.substr(0, 1),
                0),
            0u)
            << b.phase << " " << b.iteration << ": '" << b.label << "'";
      }
    }
    size_t phase_labels = 0;
    for (const TextLabel& l : p.labels) phase_labels += l.role == "phase";
    size_t named = 0;
    for (const PhaseBand& b : p.bands) named += !b.label.empty();
    EXPECT_EQ(phase_labels, named);
  }
}

TEST(StackedPlotTest, WallTimeUnlessAskedForEventsOrNoTimesWereRecorded) {
  StackedPlotOptions o;
  StackedPlot p = stacked_plot(training_step(), o);
  EXPECT_EQ(p.x_axis, PlotAxis::kTime);
  // 50 us before each phase: the first forward starts later in time than
  // in event order.
  o.x_axis = PlotAxis::kEvents;
  const StackedPlot by_events = stacked_plot(training_step(), o);
  EXPECT_EQ(by_events.x_axis, PlotAxis::kEvents);
  EXPECT_NE(p.bands[2].box.x, by_events.bands[2].box.x);
  EXPECT_NE(by_events.svg().find("allocations and frees in order ("),
            std::string::npos);
  EXPECT_NE(p.svg().find("time since the first allocation (\u00b5s)"),
            std::string::npos);

  o.x_axis = PlotAxis::kTime;
  p = stacked_plot(training_step(/*with_times=*/false), o);
  EXPECT_EQ(p.x_axis, PlotAxis::kEvents);
  EXPECT_NE(p.svg().find("no times were recorded"), std::string::npos);
}

TEST(StackedPlotTest, IsAWellFormedSelfContainedDocument) {
  const std::string svg = stacked_plot(training_step()).svg();
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<svg"), count(svg, "</svg>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  EXPECT_EQ(count(svg, "<title>"), count(svg, "</title>"));
  EXPECT_EQ(count(svg, "<rect class=\"band\""), 13u);
  EXPECT_EQ(count(svg, "<script"), 0u);
  EXPECT_EQ(count(svg, "href"), 0u);
}

TEST(StackedPlotTest, EscapesTitleAndPhaseNames) {
  Timeline t;
  t.begin_phase("a<b&c", 1);
  Event e;
  e.bytes = 1000;
  e.id = 1;
  e.phase = t.current_phase();
  t.record(e);
  t.end_phase();
  StackedPlotOptions o;
  o.title = "memfit <profile> & \"co\"";
  const std::string svg = stacked_plot(t, o).svg();
  EXPECT_NE(
      svg.find("<title>memfit &lt;profile&gt; &amp; &quot;co&quot;</title>"),
      std::string::npos);
  EXPECT_NE(svg.find(">peak 1000 B in a&lt;b&amp;c 1</text>"),
            std::string::npos);
  EXPECT_NE(svg.find(">modules: none (allocated outside every module)</text>"),
            std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg.find("<profile>"), std::string::npos);
}

TEST(StackedPlotTest, EmptyTimelineStillDraws) {
  const StackedPlot p = stacked_plot(Timeline());
  const std::string svg = p.svg();
  EXPECT_NE(svg.find(">no events</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 0u);
  EXPECT_EQ(p.callout.w, 0.0);
  expect_readable(p);
}

TEST(StackedPlotTest, LongTimelinesAreDownsampledKeepingThePeak) {
  Timeline t;
  for (uint64_t i = 0; i < 20000; ++i) {
    Event e;
    e.id = i;
    e.bytes = 1000 + static_cast<int64_t>(i % 97) + (i == 12345 ? 5000 : 0);
    e.time_ns = static_cast<int64_t>(i);
    e.category = Category::kActivation;
    t.record(e);
    e.kind = EventKind::kFree;
    t.record(e);
  }
  StackedPlotOptions o;
  o.max_points = 100;
  const StackedPlot p = stacked_plot(t, o);
  EXPECT_LE(p.points.size(), 101u);
  EXPECT_GE(p.points.size(), 50u);
  int64_t top = 0;
  for (const PlotPoint& pt : p.points) top = std::max(top, pt.total());
  EXPECT_EQ(top, 6000 + 12345 % 97);
  expect_readable(p);
}

TEST(StackedPlotTest, RejectsTinyPictures) {
  StackedPlotOptions o;
  o.width = 100;
  EXPECT_THROW(stacked_plot(Timeline(), o), std::invalid_argument);
  o = StackedPlotOptions{};
  o.height = 200;
  EXPECT_THROW(stacked_plot(Timeline(), o), std::invalid_argument);
  o = StackedPlotOptions{};
  o.max_points = 2;
  EXPECT_THROW(stacked_plot(Timeline(), o), std::invalid_argument);
}

TEST(PlotAxisTest, NamesRoundTripAndOthersAreRefused) {
  for (PlotAxis a : {PlotAxis::kTime, PlotAxis::kEvents}) {
    EXPECT_EQ(plot_axis_from_string(to_string(a)), a);
  }
  EXPECT_THROW(plot_axis_from_string("wall"), std::invalid_argument);
}

TEST(CategoryLabelTest, EveryCategoryHasANameAndAColour) {
  for (Category c : kStackOrder) {
    EXPECT_STRNE(category_label(c), "");
    EXPECT_EQ(std::string(category_color(c)).size(), 7u);
  }
}

}  // namespace
}  // namespace memfit
