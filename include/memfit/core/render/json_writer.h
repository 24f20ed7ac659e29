// A small streaming JSON writer for reports: no DOM, output as you go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace memfit {

// Writes one JSON document. Compact by default ({"a":[1,2]}); pretty
// printing puts each member and element on its own line, indented by two
// spaces per level, with ": " after keys; empty containers stay {} and [].
// Misuse (a value where a key is needed, an unbalanced end, a second root
// value) throws std::runtime_error naming the call; the writer is unchanged.
class JsonWriter {
 public:
  explicit JsonWriter(bool pretty = false);

  JsonWriter& begin_object();
  JsonWriter& end_object();  // throws if no object is open or a key waits
  JsonWriter& begin_array();
  JsonWriter& end_array();  // throws if no array is open
  // The next member's name; throws outside an object or after another key.
  JsonWriter& key(std::string_view name);

  // Values; each throws where a key is needed, or after the document's one
  // root value is complete.
  JsonWriter& value(std::string_view s);  // escaped; UTF-8 passes through
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b);
  JsonWriter& value(double d);  // shortest round-trip; non-finite -> null
  JsonWriter& value(std::nullptr_t) { return null(); }
  // Any integer type except bool: int, int64_t, size_t, ...
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>,
                             int> = 0>
  JsonWriter& value(T v) {
    if constexpr (std::is_signed_v<T>) {
      return signed_value(static_cast<int64_t>(v));
    } else {
      return unsigned_value(static_cast<uint64_t>(v));
    }
  }
  JsonWriter& null();

  // key(name) then value(v).
  template <typename T>
  JsonWriter& member(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  // The document; throws std::runtime_error while it is incomplete.
  std::string str() const;

 private:
  enum class Scope : uint8_t { kObject, kArray };
  struct Level {
    Scope scope;
    bool empty = true;
  };
  JsonWriter& signed_value(int64_t v);
  JsonWriter& unsigned_value(uint64_t v);
  // Writes the separator and indentation a value needs here; throws if no
  // value may go here. `what` names the caller in errors.
  void before_value(const char* what);
  void newline_indent(size_t depth);
  void write_string(std::string_view s);

  bool pretty_;
  bool key_pending_ = false;
  bool done_ = false;  // the root value is complete
  std::vector<Level> stack_;
  std::string out_;
};

// `s` as a JSON string literal, quotes included: \" \\ and control
// characters as \u00XX.
std::string json_quote(std::string_view s);

}  // namespace memfit
