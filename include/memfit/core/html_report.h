// One self-contained HTML page of a profiled step: the pictures with hover
// for exact bytes, the tables, the notes, and (when given) the prediction
// over batch sizes and the advise table. No network, no external scripts:
// the page is one file that opens anywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/peak_model.h"
#include "memfit/core/report.h"
#include "memfit/core/stacked_plot.h"
#include "memfit/core/timeline.h"

namespace memfit {

// One measured strategy of `memfit advise`, as the page shows it.
struct AdviceRow {
  std::string name;
  int64_t peak_bytes = 0;
  int64_t saving_bytes = 0;
  double time_ratio = 0;
  std::optional<bool> fits;  // nullopt: no budget to fit
  std::string result;        // "same", "changes", "no training"
};

struct AdviceTable {
  int64_t budget_bytes = 0;  // 0: none
  int64_t plain_peak_bytes = 0;
  std::vector<AdviceRow> rows;
  std::string plan;  // one line: what the plan runs, or why none fits
  std::vector<std::string> notes;
};

struct HtmlReportOptions {
  std::string title;  // "": "memfit profile: <model>, batch <b>, <optimizer>"
  PlotAxis x_axis = PlotAxis::kTime;
  int64_t budget = 0;  // bytes; 0: no budget line on the prediction
  std::optional<PeakModel> prediction;  // the peak over batch sizes
  std::optional<AdviceTable> advice;
};

// Note [The page's numbers are the JSON's]
// Every byte count the page shows is an element with data-field (a path
// into the page's JSON, e.g. "report.phases.3.peak_bytes") and data-bytes
// (the exact value); the text is format_bytes() of it. The JSON is embedded
// as <script type="application/json" id="memfit-data">: {"report":
// Report::to_json(), "peak": the annotated peak, "plot": the stacked
// plot's points, "prediction", "advice"}. Tests compare the three.
std::string html_report(const Report& report, const Timeline& timeline,
                        const HtmlReportOptions& options = {});

}  // namespace memfit
