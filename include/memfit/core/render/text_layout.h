// How much room text takes in a picture, so labels can be placed without
// overlapping and tests can check that they were.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memfit {

// The fonts pictures ask for. text_width() measures the widest of the first
// two per character, and Arial and Helvetica have Liberation Sans's widths,
// so the estimate holds whichever of them the viewer has.
inline constexpr const char* kFontFamily =
    "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";

// A rectangle in pixels, y pointing down.
struct Box {
  double x = 0;
  double y = 0;
  double w = 0;
  double h = 0;
  double right() const { return x + w; }
  double bottom() const { return y + h; }
};

// Whether the interiors intersect: boxes that only touch do not overlap.
bool overlaps(const Box& a, const Box& b);
// Whether `inner` lies inside `outer` (edges included).
bool contains(const Box& outer, const Box& inner);
// `b` grown by `margin` on every side.
Box inflate(const Box& b, double margin);

// The advance width of `text` in pixels at font size `size` (px): per
// character the wider of DejaVu Sans and Liberation Sans (regular or bold);
// any non-ASCII code point counts one em. Never below the width a browser
// draws with either font.
double text_width(std::string_view text, double size, bool bold = false);

// `text` whole if it is at most max_width wide, else cut at a character
// boundary with "…" appended so that it is; "" if not even "…" fits.
std::string fit_text(std::string_view text, double max_width, double size,
                     bool bold = false);

enum class Anchor { kStart, kMiddle, kEnd };  // SVG's text-anchor

// One piece of text in a picture: what the SVG draws and the room it takes.
struct TextLabel {
  std::string text;  // not escaped
  double x = 0;      // the anchor point
  double y = 0;      // the baseline
  Anchor anchor = Anchor::kStart;
  double size = 11;  // px
  bool bold = false;
  std::string role;  // the SVG class: "title", "tick", "phase", "peak", ...
  std::string fill = "#333333";

  // From 1 em above the baseline to 0.34 em below it, as wide as
  // text_width(): at least the box a browser gives the text in either font
  // (its ascent and descent rounded to whole pixels).
  Box box() const;
};

// The labels every picture draws alike: its title (bold, at the top left,
// cut to the width the margins leave; empty text when there is none) and a
// y-axis tick of bytes whose text ends at `x`.
TextLabel title_label(std::string_view title, double width, double margin, double size);
TextLabel byte_tick_label(int64_t bytes, double x, double baseline);

// The first pair (i < j) of labels whose boxes overlap; nullopt if none.
std::optional<std::pair<size_t, size_t>> first_overlap(
    const std::vector<TextLabel>& labels);

}  // namespace memfit
