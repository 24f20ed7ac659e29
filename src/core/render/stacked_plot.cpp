#include "memfit/core/render/stacked_plot.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "memfit/core/model/units.h"
#include "memfit/core/render/svg_plot.h"

namespace memfit {
namespace {

constexpr double kStackMargin = 12;  // picture edge to text
constexpr double kTitleSize = 15;
constexpr double kPhaseRow = 16;  // one row of phase labels
constexpr int kPhaseRows = 2;
constexpr double kCalloutSize = 12;
constexpr double kCalloutLine = 17;
constexpr double kCalloutPad = 6;
constexpr double kLabelGap = 4;  // least room between two labels

std::string short_phase(const std::string& phase) {
  if (phase == "parameters") return "params";
  if (phase == "inputs") return "in";
  if (phase == "forward") return "fwd";
  if (phase == "backward") return "bwd";
  if (phase == "optimizer_step") return "optim";
  if (phase == "zero_grad") return "zero";
  return phase.substr(0, 5);
}

// Whether `b`, kept `gap` px from its neighbours in its row, meets one of
// `placed`.
bool collides(const Box& b, const std::vector<TextLabel>& placed, double gap) {
  const Box wide{b.x - gap, b.y, b.w + 2 * gap, b.h};
  for (const TextLabel& l : placed) {
    if (overlaps(wide, l.box())) return true;
  }
  return false;
}

// Note [Placing phase labels]
// A step has phases of very different lengths: an input copy is one event,
// Adam's step hundreds. Each band's label goes centred over the band (moved
// inside the plot's width at its edges), in the first of two rows where it
// meets no other label; widest bands first, so the phases that matter most
// get their names. A band that has room for none of "forward 1", "fwd 1"
// and "fwd" keeps its name in its tooltip only.
void place_phase_labels(StackedPlot& p, double first_baseline) {
  std::vector<size_t> order(p.bands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return p.bands[a].box.w > p.bands[b].box.w;
  });
  std::vector<TextLabel> placed;
  for (size_t i : order) {
    PhaseBand& band = p.bands[i];
    const std::string iter = " " + std::to_string(band.iteration);
    const std::string full = band.phase.empty() ? "(no phase)" : band.phase;
    const std::vector<std::string> candidates = {
        full + iter, short_phase(full) + iter, short_phase(full)};
    bool done = false;
    for (const std::string& text : candidates) {
      const double w = text_width(text, 11);
      if (w > p.area.w) continue;
      const double centre =
          std::clamp(band.box.x + band.box.w / 2, p.area.x + w / 2,
                     p.area.right() - w / 2);
      for (int row = 0; row < kPhaseRows && !done; ++row) {
        TextLabel l;
        l.text = text;
        l.x = centre;
        l.y = first_baseline + kPhaseRow * row;
        l.anchor = Anchor::kMiddle;
        l.role = "phase";
        l.fill = "#445566";
        if (collides(l.box(), placed, kLabelGap)) continue;
        placed.push_back(l);
        band.label = text;
        done = true;
      }
      if (done) break;
    }
  }
  p.labels.insert(p.labels.end(), placed.begin(), placed.end());
}

std::string peak_headline(const PeakSummary& s) {
  std::string line = "peak " + format_bytes(s.bytes);
  if (!s.phase.empty()) {
    line += " in " + s.phase + " " + std::to_string(s.iteration);
  }
  if (!s.op.empty()) line += " at " + s.op;
  return line;
}

std::string top_two(const std::vector<NamedBytes>& items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < 2; ++i) {
    out += (i ? ", " : "") + items[i].name + " " + format_bytes(items[i].bytes);
  }
  return out;
}

// The unit a time axis with ticks `step` ns apart is labelled in.
std::pair<int64_t, const char*> time_unit(int64_t step) {
  if (step >= 1000000000) return {1000000000, "s"};
  if (step >= 1000000) return {1000000, "ms"};
  if (step >= 1000) return {1000, "\u00b5s"};
  return {1, "ns"};
}

// Note [Placing the peak's annotation]
// The annotation (three lines) sits at the top of the area, over no data:
// its box ends above the highest point beneath it. Centred over the peak
// when there is room there; else the nearest place along the top that has
// it, a leader line joining it to the peak's dot. Where no place has room
// the caller raises the y axis one tick and tries again; the peak is the
// highest point, so room appears.
double highest_under(const StackedPlot& p, double x0, double x1) {
  int64_t top = 0;
  for (size_t i = 0; i < p.points.size(); ++i) {
    const double a = p.points[i].x;
    const double b =
        i + 1 < p.points.size() ? p.points[i + 1].x : p.area.right();
    if (b >= x0 && a <= x1) top = std::max(top, p.points[i].total());
  }
  return p.y_at(top);
}

// Sets the peak's dot and its annotation's place; false if none has room.
bool place_callout(StackedPlot& p) {
  for (const PlotPoint& pt : p.points) {
    if (pt.event_index == p.peak.event_index) p.peak_x = pt.x;
  }
  p.peak_y = p.y_at(p.peak.bytes);
  const double lo = p.area.x + 4;
  const double hi = std::max(lo, p.area.right() - 4 - p.callout.w);
  const double ideal = std::clamp(p.peak_x - p.callout.w / 2, lo, hi);
  p.callout.y = p.area.y + 4;
  auto fits = [&](double x) {
    return p.callout.bottom() + 8 <=
           highest_under(p, x - 6, x + p.callout.w + 6);
  };
  std::vector<double> candidates = {ideal};
  for (double x = lo; x <= hi; x += 4) candidates.push_back(x);
  candidates.push_back(hi);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](double a, double b) {
                     return std::abs(a - ideal) < std::abs(b - ideal);
                   });
  for (double x : candidates) {
    if (fits(x)) {
      p.callout.x = x;
      return true;
    }
  }
  p.callout.x = ideal;
  return false;
}

// The options' checks: a picture big enough to draw in.
void check_options(const StackedPlotOptions& o) {
  if (o.width < 320 || o.height < 240) {
    throw std::invalid_argument(
        "[stacked_plot] a " + std::to_string(o.width) + "x" +
        std::to_string(o.height) +
        " picture is too small: use at least 320x240 pixels");
  }
  if (o.max_points < 4) {
    throw std::invalid_argument("[stacked_plot] max_points " +
                                std::to_string(o.max_points) +
                                " is too small: use at least 4");
  }
}

// Whether the events carry times, in order, over a span: the time axis can
// be drawn.
bool timed(const std::vector<Event>& events) {
  const size_t n = events.size();
  bool in_order = n > 1 && events.back().time_ns > events.front().time_ns;
  for (size_t i = 1; in_order && i < n; ++i) {
    in_order = events[i].time_ns >= events[i - 1].time_ns;
  }
  return in_order;
}

// The title, then the legend in as many rows as it needs; returns the
// last legend row's baseline.
double place_title_and_legend(StackedPlot& p) {
  const double W = p.options.width;
  const TextLabel title = title_label(p.options.title, W, kStackMargin, kTitleSize);
  if (!title.text.empty()) p.labels.push_back(title);
  double lx = kStackMargin, ly = 42;
  for (Category c : kStackOrder) {
    if (!p.shown[static_cast<int>(c)]) continue;
    const double w = 14 + text_width(category_label(c), 11);
    if (lx > kStackMargin && lx + w > W - kStackMargin) lx = kStackMargin, ly += 16;
    TextLabel l;
    l.text = category_label(c);
    l.x = lx + 14;
    l.y = ly;
    l.role = "legend";
    p.labels.push_back(l);
    lx += w + 16;
  }
  return ly;
}

// The area's height: phase rows above, x axis below; returns the first
// phase row's baseline.
double place_area(StackedPlot& p, double legend_baseline) {
  const StackedPlotOptions& o = p.options;
  const double phase_baseline = legend_baseline + 8 + kPhaseRow;
  p.area.y = phase_baseline + kPhaseRow * (kPhaseRows - 1) + 8;
  p.area.h = o.height - 40 - p.area.y;
  if (p.area.h < 60) {
    throw std::invalid_argument("[stacked_plot] a " + std::to_string(o.width) +
                                "x" + std::to_string(o.height) +
                                " picture leaves no room for the plot: make "
                                "it taller");
  }
  return phase_baseline;
}

// The peak's annotation: the headline, its top two categories and modules,
// its box's size in p.callout. Its place comes with the y axis
// (place_y_axis); none without a peak.
std::vector<TextLabel> peak_callout(StackedPlot& p) {
  std::vector<TextLabel> callout;
  if (p.peak.bytes <= 0) return callout;
  const std::string modules = top_two(p.peak.modules);
  const std::vector<std::string> lines = {
      peak_headline(p.peak), top_two(p.peak.categories),
      "modules: " + (modules.empty() ? "none (allocated outside every module)"
                                     : modules)};
  double widest = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    TextLabel l;
    l.text = fit_text(lines[i], p.options.width - 160, kCalloutSize, i == 0);
    l.size = kCalloutSize;
    l.bold = i == 0;
    l.role = "peak";
    l.fill = i == 0 ? "#a5281b" : "#333333";
    widest = std::max(widest, text_width(l.text, l.size, l.bold));
    callout.push_back(l);
  }
  const TextLabel& last = callout.back();
  p.callout.w = widest + 2 * kCalloutPad;
  p.callout.h = 2 * kCalloutPad + kCalloutLine * double(lines.size() - 1) +
                last.box().h;
  return callout;
}

// The x axis's scale: event order, or nanoseconds since the first event.
struct XScale {
  bool by_time = false;
  int64_t t0 = 0;
  int64_t span = 0;
  bool fell_back = false;  // times were asked for and not recorded

  double x(const Box& area, double position) const {
    return area.x +
           area.w * position / static_cast<double>(std::max<int64_t>(span, 1));
  }
};

XScale x_scale(const StackedPlot& p, const std::vector<Event>& events) {
  const size_t n = events.size();
  XScale xs;
  xs.by_time = p.x_axis == PlotAxis::kTime;
  xs.fell_back = p.options.x_axis == PlotAxis::kTime && !xs.by_time;
  xs.t0 = n ? events.front().time_ns : 0;
  const int64_t t1 = n ? events.back().time_ns : 0;
  xs.span = xs.by_time ? t1 - xs.t0 : static_cast<int64_t>(n);
  return xs;
}

// Points: live bytes by category after the kept events; returns each
// point's position along the x axis (its x comes with the y axis).
std::vector<double> add_points(StackedPlot& p, const Timeline& t,
                               const XScale& xs) {
  const std::vector<Event>& events = t.events();
  const size_t n = events.size();
  std::vector<double> positions = {0.0};
  PlotPoint start;
  start.time_ns = xs.t0;
  p.points.push_back(start);
  if (n == 0) return positions;
  const std::vector<size_t> keep = t.curve_indices(p.options.max_points);
  std::array<int64_t, kNumCategories> live{};
  size_t k = 0;
  for (size_t i = 0; i < n && k < keep.size(); ++i) {
    const Event& e = events[i];
    live[static_cast<int>(e.category)] +=
        e.kind == EventKind::kAlloc ? e.bytes : -e.bytes;
    if (keep[k] != i) continue;
    PlotPoint pt;
    pt.event_index = i;
    pt.time_ns = e.time_ns;
    pt.bytes = live;
    p.points.push_back(pt);
    // Where event i's step is drawn.
    positions.push_back(xs.by_time ? double(e.time_ns - xs.t0) : double(i + 1));
    ++k;
  }
  return positions;
}

// The y axis, and with it the width of the tick labels, the area's left
// edge and every x: extended until the peak's annotation has room above
// the points beneath it. See Note [Placing the peak's annotation].
void place_y_axis(StackedPlot& p, const std::vector<double>& positions,
                  const XScale& xs) {
  const double W = p.options.width;
  std::vector<int64_t> yticks = axis_ticks(p.peak.bytes);
  for (int attempt = 0;; ++attempt) {
    p.y_top = yticks.back();
    p.area.x = kStackMargin + byte_ticks_width(yticks) + 8;
    p.area.w = W - kStackMargin - 8 - p.area.x;
    for (size_t i = 0; i < p.points.size(); ++i) {
      p.points[i].x = xs.x(p.area, positions[i]);
    }
    if (p.callout.w == 0 || place_callout(p) || attempt == 63) break;
    yticks = axis_ticks(p.y_top + 1);
  }
  p.y_ticks = yticks;
  for (int64_t v : yticks) {
    p.labels.push_back(byte_tick_label(v, p.area.x - 6, p.y_at(v) + 4));
  }
}

// The x axis: its ticks and its title.
void place_x_axis(StackedPlot& p, const XScale& xs,
                  const std::vector<Event>& events) {
  const size_t n = events.size();
  const XAxisTicks xt =
      x_axis_ticks(p.area, xs.span, [&](int64_t v, int64_t step) {
        return std::to_string(xs.by_time ? v / time_unit(step).first : v);
      });
  p.labels.insert(p.labels.end(), xt.labels.begin(), xt.labels.end());
  p.labels.push_back(x_axis_title(
      xs.by_time
          ? std::string("time since the first allocation (") +
                time_unit(xt.step).second + ")"
          : "allocations and frees in order (" + std::to_string(n) + " events" +
                (xs.fell_back ? "; no times were recorded" : "") + ")",
      p.area));
}

// Phase bands and their labels.
void place_phase_bands(StackedPlot& p, const Timeline& t, const XScale& xs,
                       const std::vector<Event>& events,
                       double phase_baseline) {
  const size_t n = events.size();
  auto x_of_boundary = [&](size_t k) {  // where a span starting at k begins
    if (!xs.by_time) return xs.x(p.area, double(k));
    if (k == 0) return p.area.x;
    return k >= n ? p.area.right()
                  : xs.x(p.area, double(events[k].time_ns - xs.t0));
  };
  for (const PhaseSpan& s : t.phase_spans()) {
    PhaseBand b;
    b.phase = t.phase_name(s.phase);
    b.iteration = s.iteration;
    b.first_event = s.first_event;
    b.end_event = s.end_event;
    const double x0 = x_of_boundary(s.first_event);
    const double x1 = x_of_boundary(s.end_event);
    b.box = Box{x0, p.area.y, std::max(0.0, x1 - x0), p.area.h};
    p.bands.push_back(b);
  }
  place_phase_labels(p, phase_baseline);
}

// The peak's annotation at its place (p.callout), or a word in the middle
// of an empty plot.
void place_peak_labels(StackedPlot& p, std::vector<TextLabel>& callout,
                       size_t n) {
  if (p.peak.bytes > 0) {
    for (size_t i = 0; i < callout.size(); ++i) {
      callout[i].x = p.callout.x + kCalloutPad;
      // The baseline: the box's top is one em above it (TextLabel::box).
      callout[i].y = p.callout.y + kCalloutPad + kCalloutSize +
                     kCalloutLine * static_cast<double>(i);
      if (!callout[i].text.empty()) p.labels.push_back(callout[i]);
    }
  } else {
    TextLabel l;
    l.text = n == 0 ? "no events" : "nothing was live";
    l.x = p.area.x + p.area.w / 2;
    l.y = p.area.y + p.area.h / 2;
    l.anchor = Anchor::kMiddle;
    l.role = "empty";
    l.fill = "#555555";
    p.labels.push_back(l);
  }
}

}  // namespace

const char* category_label(Category c) {
  switch (c) {
    case Category::kParameter:
      return "parameters";
    case Category::kBuffer:
      return "buffers";
    case Category::kInput:
      return "inputs";
    case Category::kActivation:
      return "activations";
    case Category::kGradient:
      return "gradients";
    case Category::kOptimizerState:
      return "optimizer state";
    case Category::kTemporary:
      return "temporaries";
    case Category::kOther:
      return "other";
    case Category::kWorkspace:
      return "workspaces";
  }
  return "other";
}

const char* category_color(Category c) {
  switch (c) {
    case Category::kParameter:
      return "#4e79a7";
    case Category::kBuffer:
      return "#76b7b2";
    case Category::kInput:
      return "#edc948";
    case Category::kActivation:
      return "#f28e2b";
    case Category::kGradient:
      return "#e15759";
    case Category::kOptimizerState:
      return "#59a14f";
    case Category::kTemporary:
      return "#b07aa1";
    case Category::kOther:
      return "#9c9c9c";
    case Category::kWorkspace:
      return "#bab0ac";
  }
  return "#9c9c9c";
}

std::string_view to_string(PlotAxis axis) {
  return axis == PlotAxis::kTime ? "time" : "events";
}

PlotAxis plot_axis_from_string(std::string_view name) {
  if (name == "time") return PlotAxis::kTime;
  if (name == "events") return PlotAxis::kEvents;
  throw std::invalid_argument(
      "[plot_axis] the x axis is 'time' or 'events', got '" +
      std::string(name) + "'");
}

PeakSummary peak_summary(const Timeline& t) {
  PeakSummary s;
  if (t.empty()) return s;
  const Timeline::Peak peak = t.peak();
  s.bytes = peak.bytes;
  s.event_index = peak.event_index;
  s.op = t.op_name(peak.op);
  s.phase = t.phase_name(peak.phase);
  for (const PhaseSpan& span : t.phase_spans()) {
    if (span.first_event <= peak.event_index &&
        peak.event_index < span.end_event) {
      s.phase = t.phase_name(span.phase);
      s.iteration = span.iteration;
    }
  }
  const Timeline::Breakdown b = t.breakdown_after(peak.event_index);
  for (Category c : kStackOrder) {
    const int64_t bytes = b.by_category[static_cast<int>(c)];
    if (bytes > 0) s.categories.push_back({category_label(c), bytes});
  }
  std::stable_sort(s.categories.begin(), s.categories.end(),
                   [](const NamedBytes& a, const NamedBytes& b) {
                     return a.bytes > b.bytes;
                   });
  for (const auto& [path, bytes] : b.by_module) {
    if (!path.empty() && bytes > 0) s.modules.push_back({path, bytes});
  }
  return s;
}

int64_t PlotPoint::total() const {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return sum;
}

double StackedPlot::y_at(int64_t bytes) const {
  return area.bottom() -
         area.h * static_cast<double>(bytes) / static_cast<double>(y_top);
}

StackedPlot stacked_plot(const Timeline& t, const StackedPlotOptions& o) {
  check_options(o);
  StackedPlot p;
  p.options = o;
  const std::vector<Event>& events = t.events();
  p.x_axis = o.x_axis == PlotAxis::kTime && timed(events) ? PlotAxis::kTime
                                                          : PlotAxis::kEvents;
  for (const Event& e : events) p.shown[static_cast<int>(e.category)] = true;
  p.peak = peak_summary(t);
  const double phase_baseline = place_area(p, place_title_and_legend(p));
  std::vector<TextLabel> callout = peak_callout(p);
  const XScale xs = x_scale(p, events);
  place_y_axis(p, add_points(p, t, xs), xs);
  place_x_axis(p, xs, events);
  place_phase_bands(p, t, xs, events, phase_baseline);
  place_peak_labels(p, callout, events.size());
  return p;
}

std::string StackedPlot::svg() const {
  const StackedPlot& p = *this;
  std::string s =
      svg_open(options.width, options.height, options.title, "memfit-stacked");
  // Bands, alternating shades, each with its tooltip.
  for (size_t i = 0; i < bands.size(); ++i) {
    const PhaseBand& b = bands[i];
    const std::string name = (b.phase.empty() ? "(no phase)" : b.phase) + " " +
                             std::to_string(b.iteration) + ": events " +
                             std::to_string(b.first_event) + "-" +
                             std::to_string(b.end_event);
    s += "<rect class=\"band\" x=\"" + svg_number(b.box.x) + "\" y=\"" +
         svg_number(b.box.y) + "\" width=\"" + svg_number(b.box.w) +
         "\" height=\"" + svg_number(b.box.h) + "\" fill=\"" +
         (i % 2 == 0 ? "#f1f4f8" : "#e3e9f1") + "\"><title>" +
         xml_escape(name) + "</title></rect>\n";
  }
  // Grid lines under the areas.
  std::vector<double> grid;
  for (int64_t v : y_ticks) grid.push_back(y_at(v));
  s += svg_grid(area, grid);
  // One stacked area per category, drawn as steps.
  std::array<int64_t, kNumCategories> max_bytes{};
  std::vector<int64_t> below(points.size(), 0);
  for (Category c : kStackOrder) {
    const int k = static_cast<int>(c);
    std::vector<int64_t> above(points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      above[i] = below[i] + points[i].bytes[k];
      max_bytes[k] = std::max(max_bytes[k], points[i].bytes[k]);
    }
    if (max_bytes[k] > 0) {
      // A step function: each value holds until the next point, so a
      // vertex is needed only where the edge moves.
      std::string path, last;
      auto to = [&](double x, int64_t bytes) {
        const std::string v = svg_number(x) + " " + svg_number(p.y_at(bytes));
        if (v == last) return;
        path += (path.empty() ? "M" : " L") + v;
        last = v;
      };
      const size_t n = points.size();
      to(points[0].x, above[0]);
      for (size_t i = 1; i < n; ++i) {
        if (above[i] == above[i - 1]) continue;
        to(points[i].x, above[i - 1]);
        to(points[i].x, above[i]);
      }
      to(points[n - 1].x, above[n - 1]);
      to(points[n - 1].x, below[n - 1]);
      for (size_t i = n - 1; i > 0; --i) {
        if (below[i] == below[i - 1]) continue;
        to(points[i].x, below[i]);
        to(points[i].x, below[i - 1]);
      }
      to(points[0].x, below[0]);
      s += "<path class=\"area\" data-category=\"" + std::string(to_string(c)) +
           "\" d=\"" + path + " Z\" fill=\"" + category_color(c) +
           "\"><title>" + category_label(c) + ": at most " +
           format_bytes(max_bytes[k]) + "</title></path>\n";
    }
    below = above;
  }
  // Phase boundaries drawn over the areas, so phases stay visible.
  for (size_t i = 1; i < bands.size(); ++i) {
    const double x = bands[i].box.x;
    s += "<line class=\"boundary\" x1=\"" + svg_number(x) + "\" y1=\"" +
         svg_number(area.y) + "\" x2=\"" + svg_number(x) + "\" y2=\"" +
         svg_number(area.bottom()) +
         "\" stroke=\"#ffffff\" stroke-opacity=\"0.7\" stroke-width=\"1\"/>\n";
  }
  // Axes.
  s += svg_axes(area);
  // Legend swatches.
  for (const TextLabel& l : labels) {
    if (l.role != "legend") continue;
    for (Category c : kStackOrder) {
      if (l.text != category_label(c)) continue;
      s += "<rect class=\"swatch\" x=\"" + svg_number(l.x - 14) + "\" y=\"" +
           svg_number(l.y - 9) + "\" width=\"10\" height=\"10\" fill=\"" +
           category_color(c) + "\"/>\n";
    }
  }
  // The peak: dot, leader line and annotation box.
  if (callout.w > 0) {
    std::string tip = "peak " + format_bytes(peak.bytes) + " (" +
                      std::to_string(peak.bytes) + " B)";
    for (const NamedBytes& c : peak.categories) {
      tip += "\n" + c.name + ": " + format_bytes(c.bytes);
    }
    // From the box's bottom when the peak is below it, else from its
    // nearer side, to just short of the dot.
    double x1 = peak_x, y1 = callout.bottom(), x2 = peak_x, y2 = peak_y - 5;
    if (peak_x < callout.x || peak_x > callout.right()) {
      const bool left = peak_x < callout.x;
      x1 = left ? callout.x : callout.right();
      y1 = std::clamp(peak_y, callout.y + 4, callout.bottom() - 4);
      x2 = peak_x + (left ? 5 : -5);
      y2 = peak_y;
    }
    s += "<line class=\"leader\" x1=\"" + svg_number(x1) + "\" y1=\"" +
         svg_number(y1) + "\" x2=\"" + svg_number(x2) + "\" y2=\"" +
         svg_number(y2) + "\" stroke=\"#a5281b\" stroke-width=\"1\"/>\n";
    s += "<rect class=\"callout\" x=\"" + svg_number(callout.x) + "\" y=\"" +
         svg_number(callout.y) + "\" width=\"" + svg_number(callout.w) +
         "\" height=\"" + svg_number(callout.h) +
         "\" rx=\"3\" fill=\"#ffffff\" fill-opacity=\"0.94\" "
         "stroke=\"#a5281b\" stroke-width=\"1\"/>\n";
    s += "<circle class=\"peak\" cx=\"" + svg_number(peak_x) + "\" cy=\"" +
         svg_number(peak_y) +
         "\" r=\"4\" fill=\"#a5281b\" stroke=\"#ffffff\" stroke-width=\"1\">"
         "<title>" +
         xml_escape(tip) + "</title></circle>\n";
  }
  for (const TextLabel& l : labels) s += svg_text(l);
  s += "</svg>\n";
  return s;
}

}  // namespace memfit
