// The building blocks every memfit picture shares: escaping, numbers,
// axis ticks, the <svg> element and text placed by text_layout.h. The
// pictures themselves are stacked_plot.h (memory by category over time),
// module_bars.h (activations by module) and prediction_plot.h (the peak
// over batch sizes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/text_layout.h"

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

}  // namespace memfit
