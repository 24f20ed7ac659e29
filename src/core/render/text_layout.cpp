#include "memfit/core/render/text_layout.h"

#include <array>
#include <cstdint>

#include "memfit/core/model/units.h"

namespace memfit {
namespace {

// Note [Text widths without a font engine]
// Advance widths in thousandths of an em of ASCII 32..126, each the larger
// of DejaVu Sans's and Liberation Sans's (read from their hmtx tables and
// rounded up). Liberation Sans is metric-compatible with Arial, and
// Helvetica's widths are Arial's, so a label measured here is at least as
// wide as any of the fonts of kFontFamily draws it. DejaVu is the widest of
// them (about 13% wider than Arial), so labels are placed for it.
constexpr std::array<uint16_t, 95> kRegular = {
    318, 401, 460, 838, 637,  951, 780, 275, 391, 391, 500, 838, 318, 361,
    318, 337, 637, 637, 637,  637, 637, 637, 637, 637, 637, 637, 337, 337,
    838, 838, 838, 557, 1016, 685, 687, 723, 771, 667, 611, 778, 752, 295,
    500, 667, 558, 863, 749,  788, 667, 788, 723, 667, 611, 732, 685, 989,
    686, 667, 686, 391, 337,  391, 838, 557, 500, 613, 635, 550, 635, 616,
    353, 635, 634, 278, 278,  580, 278, 975, 634, 612, 635, 635, 412, 521,
    393, 634, 592, 818, 592,  592, 525, 637, 337, 637, 838};
constexpr std::array<uint16_t, 95> kBold = {
    349, 457, 521, 838, 696,  1002, 873, 307,  458, 458, 523, 838, 380, 416,
    380, 366, 696, 696, 696,  696,  696, 696,  696, 696, 696, 696, 400, 400,
    838, 838, 838, 611, 1000, 774,  763, 734,  831, 684, 684, 821, 837, 373,
    557, 775, 638, 996, 837,  851,  733, 851,  771, 721, 683, 813, 774, 1104,
    771, 725, 726, 458, 366,  458,  838, 557,  500, 675, 716, 593, 716, 679,
    436, 716, 712, 343, 343,  666,  343, 1042, 712, 688, 716, 716, 494, 596,
    479, 712, 652, 924, 646,  652,  583, 712,  366, 712, 838};

// The fonts' ascent (DejaVu Sans 0.928 em, Liberation Sans 0.905) and
// descent (0.236, 0.212), each as a browser rounds it to whole pixels and
// then some: chromium's getBBox() of 11 px text runs from 10 px above the
// baseline to 3 px below, of 12 px bold from 11 above to 4 below.
constexpr double kAscent = 1.0;
constexpr double kDescent = 0.34;

// Thousandths of an em of the character starting at text[i]; advances i
// past it (a whole UTF-8 sequence).
int char_width(std::string_view text, size_t& i, bool bold) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) {
    ++i;
    if (c < 32 || c > 126) return 1000;
    return (bold ? kBold : kRegular)[c - 32];
  }
  ++i;
  while (i < text.size() &&
         (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80)
    ++i;
  return 1000;
}

}  // namespace

bool overlaps(const Box& a, const Box& b) {
  return a.x < b.right() && b.x < a.right() && a.y < b.bottom() &&
         b.y < a.bottom();
}

bool contains(const Box& outer, const Box& inner) {
  return inner.x >= outer.x && inner.y >= outer.y &&
         inner.right() <= outer.right() && inner.bottom() <= outer.bottom();
}

Box inflate(const Box& b, double margin) {
  return Box{b.x - margin, b.y - margin, b.w + 2 * margin, b.h + 2 * margin};
}

double text_width(std::string_view text, double size, bool bold) {
  int64_t milli = 0;
  for (size_t i = 0; i < text.size();) milli += char_width(text, i, bold);
  return static_cast<double>(milli) * size / 1000.0;
}

std::string fit_text(std::string_view text, double max_width, double size,
                     bool bold) {
  if (text_width(text, size, bold) <= max_width) return std::string(text);
  const std::string_view ellipsis = "\u2026";
  const double room = max_width - text_width(ellipsis, size, bold);
  if (room < 0) return "";
  int64_t milli = 0;
  size_t end = 0;
  for (size_t i = 0; i < text.size();) {
    const int64_t next = milli + char_width(text, i, bold);
    if (static_cast<double>(next) * size / 1000.0 > room) break;
    milli = next;
    end = i;
  }
  return std::string(text.substr(0, end)) + std::string(ellipsis);
}

Box TextLabel::box() const {
  const double w = text_width(text, size, bold);
  const double left = anchor == Anchor::kStart    ? x
                      : anchor == Anchor::kMiddle ? x - w / 2
                                                  : x - w;
  return Box{left, y - kAscent * size, w, (kAscent + kDescent) * size};
}

std::optional<std::pair<size_t, size_t>> first_overlap(
    const std::vector<TextLabel>& labels) {
  std::vector<Box> boxes;
  boxes.reserve(labels.size());
  for (const TextLabel& l : labels) boxes.push_back(l.box());
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      if (overlaps(boxes[i], boxes[j])) return std::make_pair(i, j);
    }
  }
  return std::nullopt;
}

TextLabel title_label(std::string_view title, double width, double margin, double size) {
  TextLabel l;
  l.text = fit_text(title, width - 2 * margin, size, true);
  l.x = margin;
  l.y = 22;
  l.size = size;
  l.bold = true;
  l.role = "title";
  l.fill = "#222222";
  return l;
}

TextLabel byte_tick_label(int64_t bytes, double x, double baseline) {
  TextLabel l;
  l.text = format_bytes(bytes);
  l.x = x;
  l.y = baseline;
  l.anchor = Anchor::kEnd;
  l.role = "tick";
  l.fill = "#555555";
  return l;
}

}  // namespace memfit
