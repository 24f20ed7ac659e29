#include "memfit/core/svg_plot.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

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

}  // namespace memfit
