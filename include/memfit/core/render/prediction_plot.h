// The predicted peak over batch sizes, with the probes it was fitted to and
// the budget line: how far the batch can grow.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memfit/core/model/peak_model.h"
#include "memfit/core/render/text_layout.h"

namespace memfit {

struct PredictionPlotOptions {
  std::string title = "Predicted peak by batch size";
  int width = 1200;    // pixels, >= 320
  int height = 360;    // pixels, >= 200
  int64_t batch = 0;   // the batch asked for, marked; 0: none
  int64_t budget = 0;  // bytes; 0: no budget line
};

struct PredictionPlot {
  PredictionPlotOptions options;
  Box area;
  int64_t x_max = 1;             // batches 1..x_max are drawn
  int64_t y_top = 1;             // bytes at the top of the area
  std::vector<int64_t> y_ticks;  // axis_ticks(), the last one y_top
  // The largest batch whose predicted peak is within the budget: 0 when
  // batch 1 does not fit or there is no budget, kMaxBatch when the peak
  // does not grow with the batch.
  int64_t max_batch = 0;
  std::vector<std::pair<int64_t, int64_t>> curve;   // (batch, predicted)
  std::vector<std::pair<int64_t, int64_t>> probes;  // (batch, measured)
  std::vector<TextLabel> labels;                    // none overlap

  // The predicted peak at `batch` as drawn; -1 if it is not on the curve.
  int64_t predicted(int64_t batch) const;
  double x_at(int64_t batch) const;
  double y_at(int64_t bytes) const;
  std::string svg() const;
};

// Throws std::invalid_argument for options out of range or a model without
// probes.
PredictionPlot prediction_plot(const PeakModel& model,
                               const PredictionPlotOptions& options = {});

}  // namespace memfit
