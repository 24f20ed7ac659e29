// Activations by module as horizontal bars: which layer to checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/model/report.h"
#include "memfit/core/render/text_layout.h"

namespace memfit {

struct ModuleBarsOptions {
  std::string title = "Activations saved for backward, by module";
  int width = 1200;      // pixels, >= 320
  size_t max_bars = 12;  // >= 1; the modules past them share one bar
};

struct ModuleBar {
  std::string path;  // the module's; "N more modules" for the shared bar
  int64_t bytes = 0;
  size_t modules = 1;  // modules the bar sums (more than 1: the shared bar)
  Box rect;
};

// The chart laid out: bars largest first, names right-aligned on the left,
// "6.00 MiB  26.1%" (of all modules' activations) after each bar.
struct ModuleBars {
  ModuleBarsOptions options;
  int height = 0;
  int64_t total = 0;  // every module's bytes
  std::vector<ModuleBar> bars;
  std::vector<TextLabel> labels;  // every text drawn; none overlap

  // A standalone SVG document; each bar has a <title> with exact bytes and
  // data-path / data-bytes attributes.
  std::string svg() const;
};

// `modules` as Report::modules holds them (largest first). Throws
// std::invalid_argument for options out of range.
ModuleBars module_bars(const std::vector<ModuleRow>& modules,
                       const ModuleBarsOptions& options = {});

}  // namespace memfit
