// Byte sizes as people write them ("16GiB") and as reports print them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

// Reads a size in bytes: a plain byte count ("17179869184") or a decimal
// number immediately followed by B, KiB, MiB, GiB or TiB ("1.5GiB",
// "512MiB", "100B"). Fractions of a byte are dropped (rounded down), exactly:
// no floating point is involved. Throws std::invalid_argument for whitespace,
// a sign, an empty or unreadable text, decimal SI units (GB: ambiguous) and
// sizes above INT64_MAX bytes.
int64_t parse_size(std::string_view text);

// "0 B", "512 B", "1.00 KiB", "3.73 GiB": bytes below 1 KiB as an integer,
// above in the largest binary unit (up to TiB) that is <= the value, rounded
// to two decimals (half up). Negative values (deltas) get a leading '-'.
std::string format_bytes(int64_t bytes);

// A fraction as a percentage with two decimals: 0.0123 -> "1.23%".
std::string format_percent(double fraction);

// A delta of bytes with its sign: "+2.55 MiB", "-258.50 KiB", "0 B".
std::string format_signed_bytes(int64_t bytes);

// bytes as a multiple of `of` with two decimals: "2.00x".
std::string format_times(int64_t bytes, int64_t of);

}  // namespace memfit
