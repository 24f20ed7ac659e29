// A self-contained SVG picture of live memory over a timeline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/timeline.h"

namespace memfit {

struct SvgOptions {
  std::string title = "memory";
  int width = 960;           // pixels, >= 320
  int height = 360;          // pixels, >= 160
  size_t max_points = 2000;  // curve points kept (Timeline::curve), >= 4
};

// Live bytes (y) over events (x: event order, so a phase's band is as wide
// as its number of events), with the phase spans as alternating shaded
// bands labelled "phase#iteration", the peak marked with a dot and
// "peak 12.30 MiB (backward)", a y axis of 4-6 ticks labelled by
// format_bytes, and the title. No scripts, no external references; text
// is XML-escaped. Throws std::invalid_argument for options out of range.
std::string memory_svg(const Timeline& timeline,
                       const SvgOptions& options = {});

// The y axis: 0, s, 2s, ... up to the first multiple of s >= max_bytes,
// where s is the smallest power of two giving at most 6 ticks. That is 4-6
// ticks whenever max_bytes > 5 (max_bytes <= 0 counts as 1), and every
// label format_bytes gives is exact (512.00 MiB, 1.00 GiB, 1.50 GiB), which
// decimal steps in binary units are not (500 MiB * 3 = 1.46 GiB).
std::vector<int64_t> axis_ticks(int64_t max_bytes);

// Text safe inside XML elements and attribute values: & < > " ' escaped.
std::string xml_escape(std::string_view text);

}  // namespace memfit
