#include "args.h"

#include <unistd.h>

#include <algorithm>

#include <iostream>
#include <stdexcept>

#include "commands.h"
#include "memfit/core/model/units.h"

namespace memfit::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& known,
           const std::set<std::string>& switches) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "'");
    // --name VALUE and --name=VALUE both work, as in argparse.
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (!known.count(name) && !switches.count(name)) {
      throw UsageError("unknown option --" + name);
    }
    if (present_.count(name)) throw UsageError("--" + name + " is given twice");
    present_.insert(name);
    if (switches.count(name)) {
      if (eq != std::string::npos) throw UsageError("--" + name + " takes no value");
      continue;
    }
    if (eq != std::string::npos) {
      values_[name] = a.substr(eq + 1);
      continue;
    }
    if (i + 1 >= argv.size()) throw UsageError("--" + name + " needs a value");
    values_[name] = argv[++i];
  }
}

bool Args::has(const std::string& name) const { return present_.count(name) > 0; }

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::require(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw UsageError("--" + name + " is required");
  return it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != it->second.size()) {
    throw UsageError("--" + name + " expects a whole number, got '" +
                     it->second + "'");
  }
  return v;
}

int64_t Args::get_count(const std::string& name, int64_t fallback) const {
  const int64_t v = get_int(name, fallback);
  if (v < 1) {
    throw UsageError("--" + name + " must be at least 1, got " + std::to_string(v));
  }
  return v;
}

int64_t Args::get_size(const std::string& name, int64_t at_least) const {
  const std::string text = require(name);
  int64_t bytes = 0;
  try {
    bytes = parse_size(text);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--" + name + ": " + error_line(e.what()));
  }
  if (bytes < at_least) {
    throw UsageError("--" + name + " must be at least " + std::to_string(at_least) +
                     (at_least == 1 ? " byte" : " bytes") + ", got '" + text + "'");
  }
  return bytes;
}

std::vector<int64_t> Args::get_sizes(const std::string& name) const {
  const std::string text = require(name);
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string one = text.substr(start, comma - start);
    int64_t bytes = 0;
    try {
      bytes = parse_size(one);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--" + name + ": " + error_line(e.what()) +
                       " (a list of sizes: 8GiB,12GiB)");
    }
    if (bytes < 1) {
      throw UsageError("--" + name + ": each card must be at least 1 byte, got '" + one + "'");
    }
    out.push_back(bytes);
    start = comma + 1;
  }
  return out;
}

std::string Args::choice(const std::string& name, const std::string& fallback,
                         const std::vector<std::string>& allowed) const {
  const std::string v = get(name, fallback);
  for (const auto& a : allowed) {
    if (a == v) return v;
  }
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  throw UsageError("--" + name + " must be one of " + list + ", got '" + v + "'");
}

std::string error_line(const std::string& what) {
  std::string line = what.substr(0, what.find('\n'));
  if (line.size() > 2 && line[0] == '[') {
    const size_t end = line.find("] ");
    const bool operation =
        end != std::string::npos && end > 1 &&
        line.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:.",
                               1) == end;
    if (operation) line = line.substr(end + 2);
  }
  return line;
}

Progress progress_of(const Args& args) {
  if (args.has("progress") && args.has("quiet")) {
    throw UsageError("--progress and --quiet contradict each other: give one");
  }
  if (args.has("quiet")) return Progress();
  if (!args.has("progress") && isatty(STDERR_FILENO) != 1) return Progress();
  return Progress([](const std::string& line) { std::cerr << line << std::endl; });
}

CudaTarget cuda_target_of(const Args& args) {
  CudaTarget t;
  t.on = args.choice("target", "cpu", {"cpu", "cuda"}) == "cuda";
  if (args.has("cuda-workspace")) t.workspace_bytes = args.get_size("cuda-workspace");
  return t;
}

ModelOptions model_options(const Args& args) {
  ModelOptions mo;
  mo.layers = args.get_int("layers", mo.layers);
  mo.width = args.get_int("width", mo.width);
  mo.heads = args.get_int("heads", mo.heads);
  mo.context = args.get_int("context", mo.context);
  return mo;
}

}  // namespace memfit::cli
