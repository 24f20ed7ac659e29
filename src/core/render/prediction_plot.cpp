#include "memfit/core/render/prediction_plot.h"

#include <algorithm>
#include <stdexcept>

#include "memfit/core/model/units.h"
#include "memfit/core/render/svg_plot.h"

namespace memfit {
namespace {

constexpr double kPlotMargin = 12;
constexpr int64_t kMaxDrawnBatch = int64_t{1} << 30;

// The first of `candidates` (anchor points for a label of `text`) whose box
// lies inside `inside` and meets none of `placed`; false if none does.
bool place(std::vector<TextLabel>& placed, TextLabel l,
           const std::vector<std::pair<double, double>>& candidates,
           const std::vector<Anchor>& anchors, const Box& inside) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    l.x = candidates[i].first;
    l.y = candidates[i].second;
    l.anchor = anchors[i];
    const Box b = l.box();
    if (!contains(inside, b)) continue;
    bool clash = false;
    for (const TextLabel& other : placed) {
      clash |= overlaps(inflate(b, 2), inflate(other.box(), 2));
    }
    if (clash) continue;
    placed.push_back(l);
    return true;
  }
  return false;
}

}  // namespace

int64_t PredictionPlot::predicted(int64_t batch) const {
  for (const auto& [b, bytes] : curve) {
    if (b == batch) return bytes;
  }
  return -1;
}

double PredictionPlot::x_at(int64_t batch) const {
  return area.x +
         area.w * static_cast<double>(batch) / static_cast<double>(x_max);
}

double PredictionPlot::y_at(int64_t bytes) const {
  return area.bottom() -
         area.h * static_cast<double>(bytes) / static_cast<double>(y_top);
}

PredictionPlot prediction_plot(const PeakModel& pm,
                               const PredictionPlotOptions& o) {
  if (o.width < 320 || o.height < 200) {
    throw std::invalid_argument(
        "[prediction_plot] a " + std::to_string(o.width) + "x" +
        std::to_string(o.height) +
        " picture is too small: use at least 320x200 pixels");
  }
  if (pm.probe_batches.empty() || pm.phases.empty()) {
    throw std::invalid_argument(
        "[prediction_plot] the peak model has no probes to draw");
  }
  PredictionPlot p;
  p.options = o;
  for (size_t i = 0; i < pm.probe_batches.size() && i < pm.probe_peaks.size();
       ++i) {
    p.probes.emplace_back(pm.probe_batches[i], pm.probe_peaks[i]);
  }
  const int64_t largest_probe =
      *std::max_element(pm.probe_batches.begin(), pm.probe_batches.end());
  p.x_max =
      std::max<int64_t>({8, 2 * largest_probe, o.batch + o.batch / 4 + 1});
  if (o.budget > 0) {
    try {
      p.max_batch = pm.max_batch_under(o.budget);
    } catch (const std::runtime_error&) {
      p.max_batch = kMaxBatch;  // the peak does not grow: every batch fits
    }
    if (p.max_batch > 0 && p.max_batch < kMaxBatch) {
      p.x_max = std::max(p.x_max, p.max_batch + p.max_batch / 4 + 1);
    }
  }
  p.x_max = std::min(p.x_max, kMaxDrawnBatch);

  std::vector<int64_t> batches = {1, p.x_max};
  for (int i = 1; i < 160; ++i) batches.push_back(1 + (p.x_max - 1) * i / 160);
  for (const auto& [b, peak] : p.probes) batches.push_back(b);
  if (o.batch > 0) batches.push_back(o.batch);
  if (p.max_batch > 0 && p.max_batch < p.x_max) {
    batches.push_back(p.max_batch);
    batches.push_back(p.max_batch + 1);
  }
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  int64_t highest = std::max<int64_t>(o.budget, 1);
  for (int64_t b : batches) {
    if (b < 1 || b > p.x_max) continue;
    p.curve.emplace_back(b, pm.predict(b));
    highest = std::max(highest, p.curve.back().second);
  }
  for (const auto& [b, peak] : p.probes) highest = std::max(highest, peak);
  const std::vector<int64_t> yticks = axis_ticks(highest + highest / 12);
  p.y_top = yticks.back();
  p.y_ticks = yticks;

  const double W = o.width, H = o.height;
  const TextLabel title = title_label(o.title, W, kPlotMargin, 14);
  if (!title.text.empty()) p.labels.push_back(title);
  std::string probes_text;
  for (size_t i = 0; i < p.probes.size(); ++i) {
    probes_text += (i ? ", " : "") + std::to_string(p.probes[i].first);
  }
  const TextLabel sub =
      subtitle_label("line: predicted from " + pm.mode + " probes at batches " +
                         probes_text + " (dots: their measured peaks)",
                     W, kPlotMargin);
  if (!sub.text.empty()) p.labels.push_back(sub);

  p.area.x = kPlotMargin + byte_ticks_width(yticks) + 8;
  p.area.y = 54;
  p.area.w = W - kPlotMargin - 8 - p.area.x;
  p.area.h = H - 40 - p.area.y;
  for (int64_t v : yticks) {
    p.labels.push_back(byte_tick_label(v, p.area.x - 6, p.y_at(v) + 4));
  }
  const XAxisTicks xt = x_axis_ticks(
      p.area, p.x_max, [](int64_t v, int64_t) { return std::to_string(v); });
  p.labels.insert(p.labels.end(), xt.labels.begin(), xt.labels.end());
  p.labels.push_back(x_axis_title("batch size", p.area));

  // Annotations, each where it meets nothing else.
  const Box inside = p.area;
  if (o.budget > 0) {
    TextLabel l;
    l.text = "budget " + format_bytes(o.budget);
    l.role = "budget";
    l.fill = "#a5281b";
    const double y = p.y_at(o.budget);
    place(p.labels, l,
          {{p.area.right() - 4, y - 4}, {p.area.right() - 4, y + 13}},
          {Anchor::kEnd, Anchor::kEnd}, inside);
  }
  auto mark = [&](int64_t batch, const std::string& text, const char* role,
                  const char* fill) {
    TextLabel l;
    l.text = text;
    l.role = role;
    l.fill = fill;
    const double x = p.x_at(batch), y = p.y_at(pm.predict(batch));
    place(p.labels, l,
          {{x - 6, y - 8},
           {x + 6, y - 8},
           {x + 6, y + 16},
           {x - 6, y + 16},
           {x + 6, y - 24},
           {x - 6, y - 24}},
          {Anchor::kEnd, Anchor::kStart, Anchor::kStart, Anchor::kEnd,
           Anchor::kStart, Anchor::kEnd},
          inside);
  };
  if (p.max_batch > 0 && p.max_batch <= p.x_max) {
    mark(p.max_batch,
         "largest batch under the budget: " + std::to_string(p.max_batch) +
             " (" + format_bytes(pm.predict(p.max_batch)) + ")",
         "max-batch", "#1d6b2f");
  }
  if (o.batch > 0 && o.batch <= p.x_max) {
    mark(o.batch,
         "batch " + std::to_string(o.batch) + ": " +
             format_bytes(pm.predict(o.batch)),
         "batch", "#1f4e8c");
  }
  return p;
}

std::string PredictionPlot::svg() const {
  std::string s = svg_open(options.width, options.height, options.title,
                           "memfit-prediction");
  std::vector<double> grid;
  for (int64_t v : y_ticks) grid.push_back(y_at(v));
  s += svg_grid(area, grid) + svg_axes(area);
  if (options.budget > 0) {
    const double y = y_at(options.budget);
    s += "<line class=\"budget\" x1=\"" + svg_number(area.x) + "\" y1=\"" +
         svg_number(y) + "\" x2=\"" + svg_number(area.right()) + "\" y2=\"" +
         svg_number(y) +
         "\" stroke=\"#a5281b\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\">"
         "<title>budget " +
         format_bytes(options.budget) + " (" + std::to_string(options.budget) +
         " B)</title></line>\n";
  }
  std::string pts;
  for (const auto& [b, bytes] : curve) {
    pts += (pts.empty() ? "" : " ") + svg_number(x_at(b)) + "," +
           svg_number(y_at(bytes));
  }
  s += "<polyline class=\"predicted\" fill=\"none\" stroke=\"#1f4e8c\" "
       "stroke-width=\"2\" points=\"" +
       pts + "\"/>\n";
  for (const auto& [b, bytes] : probes) {
    s += "<circle class=\"probe\" data-batch=\"" + std::to_string(b) +
         "\" data-bytes=\"" + std::to_string(bytes) + "\" cx=\"" +
         svg_number(x_at(b)) + "\" cy=\"" + svg_number(y_at(bytes)) +
         "\" r=\"4\" fill=\"#ffffff\" stroke=\"#1f4e8c\" stroke-width=\"2\">"
         "<title>probe at batch " +
         std::to_string(b) + ": " + format_bytes(bytes) + " (" +
         std::to_string(bytes) + " B)</title></circle>\n";
  }
  const std::pair<int64_t, const char*> marks[] = {{max_batch, "max-batch"},
                                                   {options.batch, "batch"}};
  for (const auto& [b, role] : marks) {
    const int64_t bytes = predicted(b);
    if (b < 1 || bytes < 0) continue;
    s += "<circle class=\"" + std::string(role) + "\" cx=\"" +
         svg_number(x_at(b)) + "\" cy=\"" + svg_number(y_at(bytes)) +
         "\" r=\"4\" fill=\"" + (b == max_batch ? "#1d6b2f" : "#1f4e8c") +
         "\"><title>batch " + std::to_string(b) + ": " + format_bytes(bytes) +
         " (" + std::to_string(bytes) + " B)</title></circle>\n";
  }
  for (const TextLabel& l : labels) s += svg_text(l);
  s += "</svg>\n";
  return s;
}

}  // namespace memfit
