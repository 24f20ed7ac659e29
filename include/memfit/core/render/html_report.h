// One self-contained HTML page of a profiled step: the pictures with hover
// for exact bytes, the tables, the notes, and (when given) the prediction
// over batch sizes and the advise table. No network, no external scripts:
// the page is one file that opens anywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/model/peak_model.h"
#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/render/advice_table.h"
#include "memfit/core/render/stacked_plot.h"

namespace memfit {

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
// to_json(report) (render/report_text.h), "peak": the annotated peak, "plot": the stacked
// plot's points, "prediction", "advice"}. Tests compare the three.
std::string html_report(const Report& report, const Timeline& timeline,
                        const HtmlReportOptions& options = {});

}  // namespace memfit
