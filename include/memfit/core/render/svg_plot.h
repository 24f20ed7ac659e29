// The building blocks every memfit picture shares: escaping, numbers,
// axis ticks, the <svg> element and text placed by text_layout.h. The
// pictures themselves are stacked_plot.h (memory by category over time),
// module_bars.h (activations by module) and prediction_plot.h (the peak
// over batch sizes).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/render/text_layout.h"

namespace memfit {

// The y axis: 0, s, 2s, ... up to the first multiple of s >= max_bytes,
// where s is the smallest power of two giving at most 6 ticks. That is 4-6
// ticks whenever max_bytes > 5 (max_bytes <= 0 counts as 1), and every
// label format_bytes gives is exact (512.00 MiB, 1.00 GiB, 1.50 GiB), which
// decimal steps in binary units are not (500 MiB * 3 = 1.46 GiB).
std::vector<int64_t> axis_ticks(int64_t max_bytes);

// 0, s, 2s, ... <= max_value with s one of 1, 2, 5 times a power of ten,
// the smallest giving at most max_ticks + 1 ticks (max_ticks >= 1). For
// event counts and times, which have no binary units.
std::vector<int64_t> decimal_ticks(int64_t max_value, int max_ticks);

// Text safe inside XML elements and attribute values: & < > " ' escaped.
std::string xml_escape(std::string_view text);

// A coordinate as SVG gets it: one decimal.
std::string svg_number(double v);

// The opening <svg ...> element (a white background and a <title> with
// it), sized width x height px, its text in kFontFamily at 11 px.
std::string svg_open(int width, int height, std::string_view title,
                     std::string_view css_class);

// <text class="role" ...>text</text> for a placed label.
std::string svg_text(const TextLabel& label);

// The line under a picture's title (title_label): 11 px grey at y 40, cut
// to the width the margins leave; empty text when there is none.
TextLabel subtitle_label(std::string_view text, double width, double margin);

// The width of the widest of `ticks` written by format_bytes: where a plot's
// area starts, right of its y-axis labels (byte_tick_label).
double byte_ticks_width(const std::vector<int64_t>& ticks);

// The x axis of a plot whose area shows 0..span (x proportional to the
// value; span <= 0 counts as 1): the most decimal ticks (decimal_ticks, at
// most 12) whose labels, centred 16 px under the area, keep 4 px apart.
// text(value, step) writes one label; step is the ticks' spacing.
struct XAxisTicks {
  std::vector<int64_t> values;
  int64_t step = 1;
  std::vector<TextLabel> labels;
};
XAxisTicks x_axis_ticks(
    const Box& area, int64_t span,
    const std::function<std::string(int64_t value, int64_t step)>& text);

// The x axis's title, centred under its tick labels, cut to the area's width.
TextLabel x_axis_title(std::string_view text, const Box& area);

// A light grid line across `area` at each of `ys`.
std::string svg_grid(const Box& area, const std::vector<double>& ys);

// The axes: the area's left and bottom edges.
std::string svg_axes(const Box& area);

}  // namespace memfit
