#include "memfit/core/render/module_bars.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "memfit/core/model/units.h"
#include "memfit/core/render/svg_plot.h"

namespace memfit {
namespace {

constexpr double kBarsMargin = 12;
constexpr double kTop = 54;  // first bar's row
constexpr double kRow = 22;  // one bar's row
constexpr double kBar = 14;  // a bar's height

std::string share(int64_t bytes, int64_t total) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%",
                total > 0 ? 100.0 * static_cast<double>(bytes) /
                                static_cast<double>(total)
                          : 0.0);
  return buf;
}

}  // namespace

ModuleBars module_bars(const std::vector<ModuleRow>& modules,
                       const ModuleBarsOptions& o) {
  if (o.width < 320) {
    throw std::invalid_argument("[module_bars] a chart " +
                                std::to_string(o.width) +
                                " pixels wide is too small: use at least 320");
  }
  if (o.max_bars < 1) {
    throw std::invalid_argument("[module_bars] max_bars must be at least 1");
  }
  ModuleBars c;
  c.options = o;
  std::vector<ModuleRow> rows = modules;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const ModuleRow& a, const ModuleRow& b) {
                     return a.activation_bytes > b.activation_bytes;
                   });
  for (const ModuleRow& m : rows) c.total += m.activation_bytes;
  const size_t shown = rows.size() > o.max_bars ? o.max_bars - 1 : rows.size();
  for (size_t i = 0; i < shown; ++i) {
    c.bars.push_back({rows[i].path, rows[i].activation_bytes, 1, Box{}});
  }
  if (shown < rows.size()) {
    ModuleBar rest;
    rest.modules = rows.size() - shown;
    rest.path = std::to_string(rest.modules) + " more modules";
    for (size_t i = shown; i < rows.size(); ++i)
      rest.bytes += rows[i].activation_bytes;
    c.bars.push_back(rest);
  }

  const double W = o.width;
  const TextLabel title = title_label(o.title, W, kBarsMargin, 14);
  if (!title.text.empty()) c.labels.push_back(title);
  const TextLabel sub = subtitle_label(
      rows.empty()
          ? "no activations were attributed to modules"
          : format_bytes(c.total) + " in " + std::to_string(rows.size()) +
                (rows.size() == 1 ? " module" : " modules") +
                ": checkpointing a module frees what it saved",
      W, kBarsMargin);
  if (!sub.text.empty()) c.labels.push_back(sub);

  // Columns: names (at most 40% of the width), bars, values.
  std::vector<std::string> values;
  double name_w = 0, value_w = 0;
  for (const ModuleBar& b : c.bars) {
    name_w = std::max(name_w, text_width(b.path, 11));
    values.push_back(format_bytes(b.bytes) + "  " + share(b.bytes, c.total));
    value_w = std::max(value_w, text_width(values.back(), 11));
  }
  name_w = std::min(name_w, 0.4 * W);
  const double bar_x = kBarsMargin + name_w + 8;
  const double bar_max = std::max(1.0, W - kBarsMargin - value_w - 6 - bar_x);
  const int64_t largest =
      c.bars.empty() ? 1 : std::max<int64_t>(c.bars.front().bytes, 1);
  for (size_t i = 0; i < c.bars.size(); ++i) {
    ModuleBar& b = c.bars[i];
    const double y = kTop + kRow * static_cast<double>(i);
    const double frac = std::max<double>(
        0.0, static_cast<double>(b.bytes) / static_cast<double>(largest));
    b.rect = Box{bar_x, y, std::max(1.0, bar_max * std::min(frac, 1.0)), kBar};
    TextLabel name;
    name.text = fit_text(b.path, name_w, 11);
    name.x = bar_x - 8;
    name.y = y + 11;
    name.anchor = Anchor::kEnd;
    name.role = "module";
    if (!name.text.empty()) c.labels.push_back(name);
    TextLabel value;
    value.text = values[i];
    value.x = b.rect.right() + 6;
    value.y = y + 11;
    value.role = "value";
    value.fill = "#555555";
    c.labels.push_back(value);
  }
  c.height =
      static_cast<int>(kTop + kRow * static_cast<double>(c.bars.size()) + 8);
  return c;
}

std::string ModuleBars::svg() const {
  std::string s =
      svg_open(options.width, height, options.title, "memfit-modules");
  for (const ModuleBar& b : bars) {
    s += "<rect class=\"bar\" data-path=\"" + xml_escape(b.path) +
         "\" data-bytes=\"" + std::to_string(b.bytes) + "\" x=\"" +
         svg_number(b.rect.x) + "\" y=\"" + svg_number(b.rect.y) +
         "\" width=\"" + svg_number(b.rect.w) + "\" height=\"" +
         svg_number(b.rect.h) + "\" fill=\"" +
         (b.modules > 1 ? "#c9b8a6" : "#f28e2b") + "\"><title>" +
         xml_escape(b.path) + ": " + format_bytes(b.bytes) + " (" +
         std::to_string(b.bytes) + " B)</title></rect>\n";
  }
  for (const TextLabel& l : labels) s += svg_text(l);
  s += "</svg>\n";
  return s;
}

}  // namespace memfit
