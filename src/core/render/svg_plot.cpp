#include "memfit/core/render/svg_plot.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "memfit/core/model/units.h"

namespace memfit {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<int64_t> axis_ticks(int64_t max_bytes) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t top = std::max<int64_t>(max_bytes, 1);
  // The smallest power of two with ceil(top / step) <= 5, i.e. <= 6 ticks.
  // Halving the step would give >= 7, so this one gives >= 4 (for top > 5).
  int64_t step = 1;
  while ((top - 1) / step + 1 > 5) step *= 2;
  std::vector<int64_t> ticks;
  const int64_t n = (top - 1) / step + 1;
  for (int64_t i = 0; i <= n; ++i) {
    ticks.push_back(i > 0 && step > kMax / i ? kMax : i * step);
  }
  return ticks;
}

std::vector<int64_t> decimal_ticks(int64_t max_value, int max_ticks) {
  if (max_ticks < 1) {
    throw std::invalid_argument("[decimal_ticks] max_ticks must be >= 1, got " +
                                std::to_string(max_ticks));
  }
  const int64_t top = std::max<int64_t>(max_value, 1);
  int64_t step = 1;
  for (int64_t decade = 1;; decade *= 10) {
    bool found = false;
    for (int64_t f : {1, 2, 5}) {
      step = decade * f;
      if (top / step <= max_ticks) {
        found = true;
        break;
      }
    }
    if (found || decade > std::numeric_limits<int64_t>::max() / 50) break;
  }
  std::vector<int64_t> ticks;
  for (int64_t v = 0; v <= top; v += step) {
    ticks.push_back(v);
    if (v > std::numeric_limits<int64_t>::max() - step) break;
  }
  return ticks;
}

std::string svg_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string svg_open(int width, int height, std::string_view title,
                     std::string_view css_class) {
  const std::string w = std::to_string(width), h = std::to_string(height);
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"" +
         xml_escape(css_class) + "\" width=\"" + w + "\" height=\"" + h +
         "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"" + kFontFamily +
         "\" font-size=\"11\">\n<title>" + xml_escape(title) +
         "</title>\n<rect x=\"0\" y=\"0\" width=\"" + w + "\" height=\"" + h +
         "\" fill=\"#ffffff\"/>\n";
}

std::string svg_text(const TextLabel& l) {
  std::string s = "<text class=\"" + xml_escape(l.role) + "\" x=\"" +
                  svg_number(l.x) + "\" y=\"" + svg_number(l.y) + "\"";
  if (l.anchor == Anchor::kMiddle) s += " text-anchor=\"middle\"";
  if (l.anchor == Anchor::kEnd) s += " text-anchor=\"end\"";
  if (l.size != 11) s += " font-size=\"" + svg_number(l.size) + "\"";
  if (l.bold) s += " font-weight=\"bold\"";
  s += " fill=\"" + xml_escape(l.fill) + "\">" + xml_escape(l.text) +
       "</text>\n";
  return s;
}

TextLabel subtitle_label(std::string_view text, double width, double margin) {
  TextLabel l;
  l.text = fit_text(text, width - 2 * margin, 11);
  l.x = margin;
  l.y = 40;
  l.role = "subtitle";
  l.fill = "#555555";
  return l;
}

double byte_ticks_width(const std::vector<int64_t>& ticks) {
  double w = 0;
  for (int64_t v : ticks) w = std::max(w, text_width(format_bytes(v), 11));
  return w;
}

XAxisTicks x_axis_ticks(
    const Box& area, int64_t span,
    const std::function<std::string(int64_t value, int64_t step)>& text) {
  const double top = static_cast<double>(std::max<int64_t>(span, 1));
  XAxisTicks t;
  for (int max_ticks = 12; max_ticks >= 1; --max_ticks) {
    t.values = decimal_ticks(span, max_ticks);
    t.step = t.values.size() > 1 ? t.values[1] : 1;
    t.labels.clear();
    for (int64_t v : t.values) {
      TextLabel l;
      l.text = text(v, t.step);
      l.x = area.x + area.w * static_cast<double>(v) / top;
      l.y = area.bottom() + 16;
      l.anchor = Anchor::kMiddle;
      l.role = "tick";
      l.fill = "#555555";
      t.labels.push_back(l);
    }
    bool clash = false;
    for (size_t i = 1; i < t.labels.size(); ++i) {
      clash |= overlaps(inflate(t.labels[i - 1].box(), 4), t.labels[i].box());
    }
    if (!clash) break;
  }
  return t;
}

TextLabel x_axis_title(std::string_view text, const Box& area) {
  TextLabel l;
  l.text = fit_text(text, area.w, 11);
  l.x = area.x + area.w / 2;
  l.y = area.bottom() + 32;
  l.anchor = Anchor::kMiddle;
  l.role = "axis-title";
  l.fill = "#555555";
  return l;
}

std::string svg_grid(const Box& area, const std::vector<double>& ys) {
  std::string s;
  for (double y : ys) {
    s += "<line class=\"grid\" x1=\"" + svg_number(area.x) + "\" y1=\"" +
         svg_number(y) + "\" x2=\"" + svg_number(area.right()) + "\" y2=\"" +
         svg_number(y) + "\" stroke=\"#cfd6df\" stroke-width=\"0.7\"/>\n";
  }
  return s;
}

std::string svg_axes(const Box& area) {
  return "<path class=\"axis\" d=\"M" + svg_number(area.x) + " " +
         svg_number(area.y) + " L" + svg_number(area.x) + " " +
         svg_number(area.bottom()) + " L" + svg_number(area.right()) + " " +
         svg_number(area.bottom()) + "\" fill=\"none\" stroke=\"#333333\"/>\n";
}

}  // namespace memfit
