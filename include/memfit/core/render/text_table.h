// Plain-text tables for the terminal report.
#pragma once

#include <string>
#include <vector>

namespace memfit {

enum class Align { kLeft, kRight };

// Columns padded to their widest cell (counted in UTF-8 code points), two
// spaces between columns, a dashed line under the header. Lines carry no
// trailing spaces and each ends in '\n':
//
//   phase     peak
//   --------  ---------
//   forward   3.00 GiB
class TextTable {
 public:
  // Throws std::invalid_argument if there are no headers or `align` does not
  // give one alignment per header.
  TextTable(std::vector<std::string> headers, std::vector<Align> align);

  // Throws std::invalid_argument unless the row has one cell per column.
  void add_row(std::vector<std::string> cells);
  // A dashed line like the one under the header, e.g. above a total row.
  void add_separator();

  std::string str() const;
  size_t num_rows() const { return rows_.size(); }  // separators included

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;  // empty row = separator
};

}  // namespace memfit
