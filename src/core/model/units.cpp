#include "memfit/core/model/units.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <vector>

namespace memfit {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

struct Unit {
  std::string_view name;
  int shift;  // the unit is 2^shift bytes
};
constexpr std::array<Unit, 5> kUnits = {{
    {"B", 0},
    {"KiB", 10},
    {"MiB", 20},
    {"GiB", 30},
    {"TiB", 40},
}};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

[[noreturn]] void fail_unreadable(std::string_view text) {
  throw std::invalid_argument(
      "[parse_size] cannot read '" + std::string(text) +
      "' as a size: use a byte count (17179869184) or a number with KiB, "
      "MiB, GiB or TiB and no space (16GiB)");
}

[[noreturn]] void fail_too_large(std::string_view text) {
  throw std::invalid_argument("[parse_size] '" + std::string(text) +
                              "' is too large: the largest size is " +
                              std::to_string(kMax) +
                              " bytes (just under 8 EiB)");
}

// Decimal SI and bare-letter units people commonly type; each is rejected
// with a pointer to the binary unit memfit means.
const char* binary_equivalent(std::string_view unit) {
  if (unit == "KB" || unit == "kB" || unit == "K" || unit == "k") return "KiB";
  if (unit == "MB" || unit == "M") return "MiB";
  if (unit == "GB" || unit == "G") return "GiB";
  if (unit == "TB" || unit == "T") return "TiB";
  return nullptr;
}

// Parses a run of decimal digits as an integer; false on overflow.
bool parse_digits(std::string_view digits, int64_t* out) {
  int64_t v = 0;
  for (char c : digits) {
    const int d = c - '0';
    if (v > (kMax - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// floor(0.<digits> * 2^shift), exactly: doubles the decimal fraction `shift`
// times and collects the bits that carry out of it.
int64_t fraction_bytes(std::string_view digits, int shift) {
  std::vector<int> frac(digits.size());
  for (size_t i = 0; i < digits.size(); ++i) frac[i] = digits[i] - '0';
  int64_t whole = 0;
  for (int s = 0; s < shift; ++s) {
    int carry = 0;
    for (size_t i = frac.size(); i-- > 0;) {
      const int v = frac[i] * 2 + carry;
      frac[i] = v % 10;
      carry = v / 10;
    }
    whole = whole * 2 + carry;
  }
  return whole;
}

}  // namespace

int64_t parse_size(std::string_view text) {
  if (text.empty()) {
    throw std::invalid_argument(
        "[parse_size] the size is empty: use a byte count (17179869184) or a "
        "number with KiB, MiB, GiB or TiB (16GiB)");
  }
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) fail_unreadable(text);
  }
  if (text[0] == '-') {
    throw std::invalid_argument("[parse_size] '" + std::string(text) +
                                "' is negative: a size is a byte count >= 0 "
                                "(0, 512MiB, 16GiB)");
  }

  size_t pos = 0;
  while (pos < text.size() && is_digit(text[pos])) ++pos;
  const std::string_view int_digits = text.substr(0, pos);
  if (int_digits.empty()) fail_unreadable(text);

  std::string_view frac_digits;
  if (pos < text.size() && text[pos] == '.') {
    const size_t start = ++pos;
    while (pos < text.size() && is_digit(text[pos])) ++pos;
    frac_digits = text.substr(start, pos - start);
    if (frac_digits.empty()) fail_unreadable(text);
  }
  const std::string_view unit_text = text.substr(pos);
  if (unit_text.size() > 1 && (unit_text[0] == 'e' || unit_text[0] == 'E') &&
      (is_digit(unit_text[1]) || unit_text[1] == '+' || unit_text[1] == '-')) {
    throw std::invalid_argument("[parse_size] cannot read '" + std::string(text) +
                                "': it has an exponent, which sizes do not take; write the "
                                "number with a unit (16GiB, 1024TiB); the largest size is " +
                                std::to_string(kMax) + " bytes (just under 8 EiB)");
  }

  int64_t whole = 0;
  if (!parse_digits(int_digits, &whole)) fail_too_large(text);
  if (unit_text.empty()) {
    if (!frac_digits.empty()) {
      throw std::invalid_argument(
          "[parse_size] '" + std::string(text) +
          "' has a fraction but no unit: write whole bytes (" +
          std::string(int_digits) + ") or add a unit (" + std::string(text) +
          "GiB)");
    }
    return whole;
  }

  for (const Unit& unit : kUnits) {
    if (unit.name != unit_text) continue;
    if (whole > (kMax >> unit.shift)) fail_too_large(text);
    const int64_t bytes = whole << unit.shift;
    const int64_t extra = fraction_bytes(frac_digits, unit.shift);
    if (bytes > kMax - extra) fail_too_large(text);
    return bytes + extra;
  }
  if (const char* binary = binary_equivalent(unit_text)) {
    throw std::invalid_argument(
        "[parse_size] '" + std::string(unit_text) + "' in '" +
        std::string(text) + "' is ambiguous (powers of 1000 or of 1024): use " +
        binary + " (" + std::string(text.substr(0, pos)) + binary + ")");
  }
  fail_unreadable(text);
}

std::string format_bytes(int64_t bytes) {
  // Work on the magnitude as unsigned so INT64_MIN has one too.
  const bool negative = bytes < 0;
  const uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(bytes)
                                      : static_cast<uint64_t>(bytes);
  std::string sign = negative ? "-" : "";
  if (magnitude < 1024) return sign + std::to_string(magnitude) + " B";

  size_t u = 1;
  while (u + 1 < kUnits.size() && (magnitude >> kUnits[u + 1].shift) > 0) ++u;
  // Hundredths of the unit, rounded half up; 1023.999 KiB rounds to
  // 1024.00 KiB, which is then shown as 1.00 MiB.
  for (;; ++u) {
    const uint64_t unit = uint64_t{1} << kUnits[u].shift;
    const uint64_t q = magnitude / unit;
    const uint64_t r = magnitude % unit;
    const uint64_t hundredths = q * 100 + (r * 100 + unit / 2) / unit;
    if (hundredths >= 1024 * 100 && u + 1 < kUnits.size()) continue;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%llu.%02llu %s", sign.c_str(),
                  static_cast<unsigned long long>(hundredths / 100),
                  static_cast<unsigned long long>(hundredths % 100),
                  std::string(kUnits[u].name).c_str());
    return buf;
  }
}

std::string format_percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", fraction * 100);
  return buf;
}

std::string format_signed_bytes(int64_t bytes) {
  return (bytes > 0 ? "+" : "") + format_bytes(bytes);
}

std::string format_times(int64_t bytes, int64_t of) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", static_cast<double>(bytes) / static_cast<double>(of));
  return buf;
}

}  // namespace memfit
