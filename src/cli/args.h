// A small command-line parser: --flag VALUE and --switch, with errors that
// name the flag and the accepted values.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/plan/progress.h"

namespace memfit::cli {

class Args {
 public:
  // `switches` take no value; every other --name takes one.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& known,
       const std::set<std::string>& switches);

  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback) const;
  std::string require(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  // A count that must be at least 1 (a batch, steps, ranks): one message for
  // every command.
  int64_t get_count(const std::string& name, int64_t fallback) const;
  // A size: bytes or 16GiB-style (see parse_size), at least `at_least`
  // bytes (a budget: 1): one message for every command.
  int64_t get_size(const std::string& name, int64_t at_least = 0) const;
  // A comma-separated list of sizes, each at least 1 byte: --cards 8GiB,12GiB.
  std::vector<int64_t> get_sizes(const std::string& name) const;
  std::string choice(const std::string& name, const std::string& fallback,
                     const std::vector<std::string>& allowed) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> present_;
};

// Thrown for a command line we cannot run; main prints it with the usage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Note [One line, one prefix]
// Every command checks its flags when it reads them, before it runs
// anything, and every error leaves as one line on stderr that starts with
// the command: "memfit fit: --budget must be at least 1 byte, got '0'". The
// library's own messages start with their operation ("[fit_batch] ..."), for
// C++ and Python callers; under a command that names the operation already,
// error_line() drops it.

// The first line of `what`, without a leading "[operation] ".
std::string error_line(const std::string& what);

// Progress lines to stderr ("[   2.4s] probe batch 64") when stderr is a
// terminal or --progress is given, none with --quiet. stdout is untouched:
// what scripts parse stays the same with and without them. The commands
// that take them list "progress" and "quiet" among their switches.
Progress progress_of(const Args& args);

}  // namespace memfit::cli
