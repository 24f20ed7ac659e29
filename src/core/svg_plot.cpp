#include "memfit/core/svg_plot.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "memfit/core/units.h"

namespace memfit {

namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The phase to name at the peak: the event's own stamp, else the span the
// event falls in.
std::string peak_phase(const Timeline& t, const Timeline::Peak& p) {
  if (p.phase != 0) return t.phase_name(p.phase);
  for (const PhaseSpan& s : t.phase_spans()) {
    if (s.first_event <= p.event_index && p.event_index < s.end_event) {
      return t.phase_name(s.phase);
    }
  }
  return "";
}

}  // namespace

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

std::string memory_svg(const Timeline& t, const SvgOptions& o) {
  if (o.width < 320 || o.height < 160) {
    throw std::invalid_argument(
        "[memory_svg] a " + std::to_string(o.width) + "x" +
        std::to_string(o.height) +
        " picture is too small: use at least 320x160 pixels");
  }
  if (o.max_points < 4) {
    throw std::invalid_argument("[memory_svg] max_points " +
                                std::to_string(o.max_points) +
                                " is too small: use at least 4");
  }
  const double left = 90, right = 20, top = 40, bottom = 30;
  const double x0 = left, x1 = o.width - right;
  const double y0 = top, y1 = o.height - bottom;
  const size_t n = t.size();
  const Timeline::Peak peak = t.peak();
  const std::vector<int64_t> ticks = axis_ticks(peak.bytes);
  const double y_top = static_cast<double>(ticks.back());
  // Event i occupies [i, i+1) on the x axis; its live bytes are drawn at
  // its right edge, the start (nothing live) at the left of the axis.
  auto x_at = [&](size_t position) {
    return x0 + (x1 - x0) * (n == 0 ? 0.0 : double(position) / double(n));
  };
  auto y_at = [&](int64_t bytes) {
    return y1 - (y1 - y0) * static_cast<double>(bytes) / y_top;
  };

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
       std::to_string(o.width) + "\" height=\"" + std::to_string(o.height) +
       "\" viewBox=\"0 0 " + std::to_string(o.width) + " " +
       std::to_string(o.height) +
       "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s += "<title>" + xml_escape(o.title) + "</title>\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(o.width) +
       "\" height=\"" + std::to_string(o.height) + "\" fill=\"#ffffff\"/>\n";

  // Phase bands, alternating shades; the label shows when it fits and
  // always as a tooltip.
  const std::vector<PhaseSpan>& spans = t.phase_spans();
  for (size_t i = 0; i < spans.size(); ++i) {
    const PhaseSpan& span = spans[i];
    const std::string label = xml_escape(t.phase_name(span.phase) + "#" +
                                         std::to_string(span.iteration));
    const double bx = x_at(span.first_event);
    const double bw = x_at(span.end_event) - bx;
    s += "<rect class=\"band\" x=\"" + fmt(bx) + "\" y=\"" + fmt(y0) +
         "\" width=\"" + fmt(bw) + "\" height=\"" + fmt(y1 - y0) +
         "\" fill=\"" + (i % 2 == 0 ? "#eef2f7" : "#dde5ef") + "\"><title>" +
         label + "</title></rect>\n";
    if (bw >= 7.0 * static_cast<double>(label.size())) {
      s += "<text class=\"band-label\" x=\"" + fmt(bx + 3) + "\" y=\"" +
           fmt(y0 + 12) + "\" fill=\"#556\">" + label + "</text>\n";
    }
  }

  // Y axis with byte ticks and light grid lines.
  s += "<line x1=\"" + fmt(x0) + "\" y1=\"" + fmt(y0) + "\" x2=\"" + fmt(x0) +
       "\" y2=\"" + fmt(y1) + "\" stroke=\"#333\"/>\n";
  s += "<line x1=\"" + fmt(x0) + "\" y1=\"" + fmt(y1) + "\" x2=\"" + fmt(x1) +
       "\" y2=\"" + fmt(y1) + "\" stroke=\"#333\"/>\n";
  for (int64_t tick : ticks) {
    const double y = y_at(tick);
    s += "<line x1=\"" + fmt(x0 - 4) + "\" y1=\"" + fmt(y) + "\" x2=\"" +
         fmt(x1) + "\" y2=\"" + fmt(y) + "\" stroke=\"#ccc\"/>\n";
    s += "<text class=\"tick\" x=\"" + fmt(x0 - 6) + "\" y=\"" + fmt(y + 4) +
         "\" text-anchor=\"end\">" + xml_escape(format_bytes(tick)) +
         "</text>\n";
  }
  s += "<text x=\"" + fmt((x0 + x1) / 2) + "\" y=\"" + fmt(o.height - 8.0) +
       "\" text-anchor=\"middle\" fill=\"#555\">events (" + std::to_string(n) +
       ")</text>\n";

  if (n > 0) {
    const std::vector<size_t> keep = t.curve_indices(o.max_points);
    const std::vector<std::pair<int64_t, int64_t>> points =
        t.curve(o.max_points);
    std::string path = fmt(x_at(0)) + "," + fmt(y_at(0));
    for (size_t k = 0; k < keep.size(); ++k) {
      path += " " + fmt(x_at(keep[k] + 1)) + "," + fmt(y_at(points[k].second));
    }
    s += "<polyline class=\"live\" fill=\"none\" stroke=\"#1f5fa8\" "
         "stroke-width=\"1.5\" points=\"" +
         path + "\"/>\n";

    const double px = x_at(peak.event_index + 1);
    const double py = y_at(peak.bytes);
    const std::string phase = peak_phase(t, peak);
    std::string label = "peak " + format_bytes(peak.bytes);
    if (!phase.empty()) label += " (" + phase + ")";
    const bool right_half = px > (x0 + x1) / 2;
    s += "<circle class=\"peak\" cx=\"" + fmt(px) + "\" cy=\"" + fmt(py) +
         "\" r=\"4\" fill=\"#c0392b\"/>\n";
    s += "<text class=\"peak-label\" x=\"" + fmt(right_half ? px - 8 : px + 8) +
         "\" y=\"" + fmt(std::max(py - 6, y0 + 10)) + "\" text-anchor=\"" +
         (right_half ? "end" : "start") + "\" fill=\"#c0392b\">" +
         xml_escape(label) + "</text>\n";
  } else {
    s += "<text x=\"" + fmt((x0 + x1) / 2) + "\" y=\"" + fmt((y0 + y1) / 2) +
         "\" text-anchor=\"middle\" fill=\"#555\">no events</text>\n";
  }

  s += "<text class=\"title\" x=\"" + fmt(x0) +
       "\" y=\"24\" font-size=\"15\">" + xml_escape(o.title) + "</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace memfit
