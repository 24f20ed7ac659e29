// Memory by category over time: the picture of one recorded step that
// answers "what filled the card, when?". Live bytes are stacked by category
// (parameters at the bottom, temporaries on top), the phases shaded and
// labelled above the plot, and the peak annotated with what it holds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/model/event.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/render/text_layout.h"

namespace memfit {

// Bottom to top: what lives all step first, what lives an instant last.
inline constexpr std::array<Category, kNumCategories> kStackOrder = {
    Category::kParameter, Category::kBuffer, Category::kOptimizerState,
    Category::kGradient,  Category::kInput,  Category::kActivation,
    Category::kTemporary, Category::kOther,  Category::kWorkspace};

// How pictures name and colour a category: "optimizer state", "#59a14f".
const char* category_label(Category c);
const char* category_color(Category c);

struct NamedBytes {
  std::string name;
  int64_t bytes = 0;
};

// What the peak holds.
struct PeakSummary {
  int64_t bytes = 0;
  size_t event_index = kNoEvent;  // kNoEvent: an empty timeline
  std::string phase;              // the phase span holding the peak event
  int iteration = 0;
  std::string op;
  // Categories holding bytes at the peak, largest first (ties in
  // kStackOrder), named by category_label().
  std::vector<NamedBytes> categories;
  // Modules holding bytes at the peak (any category), largest first, ties
  // by name; bytes allocated outside every module are left out.
  std::vector<NamedBytes> modules;
};
PeakSummary peak_summary(const Timeline& timeline);

enum class PlotAxis : uint8_t {
  kTime,    // wall time of each event (when the recording has times)
  kEvents,  // event order: each event one step
};

// "time" | "events"; from_string throws std::invalid_argument naming both.
std::string_view to_string(PlotAxis axis);
PlotAxis plot_axis_from_string(std::string_view name);

struct StackedPlotOptions {
  std::string title = "memory";
  int width = 1200;          // pixels, >= 320
  int height = 500;          // pixels, >= 240
  size_t max_points = 1200;  // points kept (Timeline::curve_indices), >= 4
  PlotAxis x_axis = PlotAxis::kTime;
};

// One point of the stacked curve: live bytes by category right after an
// event (the first point is the start: nothing live).
struct PlotPoint {
  size_t event_index = kNoEvent;  // kNoEvent for the start
  int64_t time_ns = 0;
  double x = 0;                                 // pixels
  std::array<int64_t, kNumCategories> bytes{};  // indexed by Category
  int64_t total() const;
};

struct PhaseBand {
  std::string phase;
  int iteration = 0;
  size_t first_event = 0;
  size_t end_event = 0;
  Box box;            // the shaded band over the plot area
  std::string label;  // as drawn above the band; "" where none fits
};

// The picture laid out: every coordinate the SVG uses, so tests (and the
// HTML page's hover) read them instead of parsing SVG.
struct StackedPlot {
  StackedPlotOptions options;
  PlotAxis x_axis = PlotAxis::kEvents;  // the axis drawn (kEvents if asked,
                                        // or if no times were recorded)
  Box area;                             // the plotting area
  int64_t y_top = 1;                    // bytes at the top of the area
  std::vector<int64_t> y_ticks;         // axis_ticks(), the last one y_top
  std::vector<PlotPoint> points;
  std::vector<PhaseBand> bands;
  std::array<bool, kNumCategories> shown{};  // categories in the legend
  PeakSummary peak;
  double peak_x = 0, peak_y = 0;  // the peak's dot (no dot when bytes == 0)
  Box callout;                    // the peak's annotation; w == 0 when none
  std::vector<TextLabel> labels;  // every text drawn; none overlap

  double y_at(int64_t bytes) const;
  // A standalone SVG document: no scripts, no external references; bands,
  // areas and the peak carry <title> tooltips with exact bytes.
  std::string svg() const;
};

// Throws std::invalid_argument for options out of range.
StackedPlot stacked_plot(const Timeline& timeline,
                         const StackedPlotOptions& options = {});

}  // namespace memfit
