#include "memfit/core/render/json_writer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace memfit {

namespace {

void append_quoted(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
}

[[noreturn]] void misuse(const char* what, const std::string& why) {
  throw std::runtime_error(std::string("[JsonWriter::") + what + "] " + why);
}

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_quoted(out, s);
  return out;
}

JsonWriter::JsonWriter(bool pretty) : pretty_(pretty) {}

void JsonWriter::newline_indent(size_t depth) {
  out_ += '\n';
  out_.append(2 * depth, ' ');
}

void JsonWriter::before_value(const char* what) {
  if (done_) {
    misuse(what,
           "the document's root value is complete: a JSON document has one "
           "root; wrap several values in an array or object");
  }
  if (stack_.empty()) return;
  Level& top = stack_.back();
  if (top.scope == Scope::kObject) {
    if (!key_pending_) {
      misuse(what, "a value inside an object needs a key: call key() first");
    }
    key_pending_ = false;  // key() already wrote the separator
    return;
  }
  if (!top.empty) out_ += ',';
  if (pretty_) newline_indent(stack_.size());
  top.empty = false;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  if (stack_.empty() || stack_.back().scope != Scope::kObject) {
    misuse("key", "key '" + std::string(name) +
                      "' outside an object: call begin_object() first");
  }
  if (key_pending_) {
    misuse("key", "key '" + std::string(name) +
                      "' follows another key: write the first key's value");
  }
  Level& top = stack_.back();
  if (!top.empty) out_ += ',';
  if (pretty_) newline_indent(stack_.size());
  top.empty = false;
  append_quoted(out_, name);
  out_ += pretty_ ? ": " : ":";
  key_pending_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value("begin_object");
  out_ += '{';
  stack_.push_back(Level{Scope::kObject});
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value("begin_array");
  out_ += '[';
  stack_.push_back(Level{Scope::kArray});
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  if (stack_.empty() || stack_.back().scope != Scope::kObject) {
    misuse("end_object", stack_.empty()
                             ? "no object is open"
                             : "the innermost open container is an array: call "
                               "end_array() first");
  }
  if (key_pending_) {
    misuse("end_object", "the last key has no value: write one first");
  }
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (pretty_ && !empty) newline_indent(stack_.size());
  out_ += '}';
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  if (stack_.empty() || stack_.back().scope != Scope::kArray) {
    misuse("end_array", stack_.empty()
                            ? "no array is open"
                            : "the innermost open container is an object: call "
                              "end_object() first");
  }
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (pretty_ && !empty) newline_indent(stack_.size());
  out_ += ']';
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value("value");
  append_quoted(out_, s);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(bool b) {
  before_value("value");
  out_ += b ? "true" : "false";
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(double d) {
  if (!std::isfinite(d)) return null();
  before_value("value");
  // The shortest %g form that reads back as the same double.
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string text = buf;
  for (char& c : text) {
    if (c == ',') c = '.';  // a locale's decimal comma is not JSON
  }
  // Keep doubles recognisable as such ("2.0", not "2"), as Python writes.
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  out_ += text;
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::signed_value(int64_t v) {
  before_value("value");
  out_ += std::to_string(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::unsigned_value(uint64_t v) {
  before_value("value");
  out_ += std::to_string(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value("null");
  out_ += "null";
  if (stack_.empty()) done_ = true;
  return *this;
}

std::string JsonWriter::str() const {
  if (!done_) {
    throw std::runtime_error(
        "[JsonWriter::str] the document is incomplete (" +
        std::to_string(stack_.size()) +
        " container(s) open, or nothing written): close every "
        "begin_object()/begin_array() first");
  }
  return out_;
}

}  // namespace memfit
