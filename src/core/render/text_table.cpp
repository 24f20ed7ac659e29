#include "memfit/core/render/text_table.h"

#include <algorithm>
#include <stdexcept>

namespace memfit {

namespace {

// Code points, not bytes, so "µs" or a non-ASCII module name lines up.
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

void trim_trailing_spaces(std::string& line) {
  while (!line.empty() && line.back() == ' ') line.pop_back();
}

}  // namespace

TextTable::TextTable(std::vector<std::string> headers, std::vector<Align> align)
    : headers_(std::move(headers)), align_(std::move(align)) {
  if (headers_.empty()) {
    throw std::invalid_argument(
        "[TextTable] no headers: give one header per column");
  }
  if (align_.size() != headers_.size()) {
    throw std::invalid_argument("[TextTable] " + std::to_string(align_.size()) +
                                " alignments for " +
                                std::to_string(headers_.size()) +
                                " headers: give one alignment per column");
  }
}

void TextTable::add_row(std::vector<std::string> cells) {
  if (cells.size() != headers_.size()) {
    throw std::invalid_argument(
        "[TextTable::add_row] " + std::to_string(cells.size()) + " cells for " +
        std::to_string(headers_.size()) +
        " columns: give one cell per column (\"\" for none)");
  }
  rows_.push_back(std::move(cells));
}

void TextTable::add_separator() { rows_.emplace_back(); }

std::string TextTable::str() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    width[c] = display_width(headers_[c]);
  }
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], display_width(row[c]));
    }
  }

  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) line += "  ";
      const std::string pad(width[c] - display_width(cells[c]), ' ');
      line += align_[c] == Align::kRight ? pad + cells[c] : cells[c] + pad;
    }
    trim_trailing_spaces(line);
    out += line;
    out += '\n';
  };
  auto dashes = [&] {
    std::string line;
    for (size_t c = 0; c < width.size(); ++c) {
      if (c > 0) line += "  ";
      line.append(width[c], '-');
    }
    trim_trailing_spaces(line);
    out += line;
    out += '\n';
  };

  emit(headers_);
  dashes();
  for (const auto& row : rows_) {
    if (row.empty()) {
      dashes();
    } else {
      emit(row);
    }
  }
  return out;
}

}  // namespace memfit
