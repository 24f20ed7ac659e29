// What a long operation is doing, as it does it: "probe batch 64 (3 of 5)".
// The operations (fit's search, advise's planner, a meta profile) report
// each step to a Progress; the fronts decide where the lines go (the CLI
// prints them to stderr; Python passes a callable or prints when asked).
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace memfit {

class Progress {
 public:
  using Sink = std::function<void(const std::string&)>;

  Progress() = default;  // silent
  explicit Progress(Sink sink) : sink_(std::move(sink)) {}

  bool enabled() const { return static_cast<bool>(sink_); }

  // One line, prefixed by the seconds since this Progress was made:
  // "[  2.4s] probe batch 64".
  void step(const std::string& what) const {
    if (!sink_) return;
    const double s = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start_)
                         .count();
    char stamp[32];
    std::snprintf(stamp, sizeof stamp, "[%6.1fs] ", s);
    sink_(stamp + what);
  }

 private:
  Sink sink_;
  std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
};

}  // namespace memfit
