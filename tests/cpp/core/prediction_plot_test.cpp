#include "memfit/core/render/prediction_plot.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "memfit/core/model/units.h"

namespace memfit {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

// 10 MiB fixed + 1.5 MiB per sample, probed at 4, 8 and 16.
PeakModel affine_model() {
  PeakModel pm;
  pm.mode = "cpu";
  pm.probe_batches = {4, 8, 16};
  PhaseFit f;
  f.phase = "backward";
  f.iteration = 2;
  f.fit.m0 = 10.0 * kMiB;
  f.fit.per_sample = 1.5 * kMiB;
  pm.phases = {f};
  for (int64_t b : pm.probe_batches) pm.probe_peaks.push_back(pm.predict(b));
  return pm;
}

void expect_readable(const PredictionPlot& p) {
  const Box picture{0, 0, double(p.options.width), double(p.options.height)};
  const auto clash = first_overlap(p.labels);
  EXPECT_FALSE(clash.has_value())
      << "'" << p.labels[clash->first].text << "' overlaps '"
      << p.labels[clash->second].text << "'";
  for (const TextLabel& l : p.labels)
    EXPECT_TRUE(contains(picture, l.box())) << l.text;
}

TEST(PredictionPlotTest,
     CurveIsThePredictionAndMarksTheLargestBatchUnderTheBudget) {
  const PeakModel pm = affine_model();
  PredictionPlotOptions o;
  o.batch = 16;
  o.budget = 256 * kMiB;
  const PredictionPlot p = prediction_plot(pm, o);
  // (256 - 10) / 1.5 = 164
  EXPECT_EQ(p.max_batch, 164);
  EXPECT_EQ(p.max_batch, pm.max_batch_under(o.budget));
  EXPECT_GE(p.x_max, 164);
  for (const auto& [b, bytes] : p.curve) EXPECT_EQ(bytes, pm.predict(b)) << b;
  EXPECT_EQ(p.predicted(164), pm.predict(164));
  EXPECT_EQ(p.predicted(165), pm.predict(165));
  EXPECT_EQ(p.predicted(16), pm.predict(16));
  EXPECT_GE(p.y_top, o.budget);
  ASSERT_EQ(p.probes.size(), 3u);
  EXPECT_EQ(p.probes[2], std::make_pair(int64_t{16}, pm.predict(16)));
  std::string roles;
  for (const TextLabel& l : p.labels) roles += l.role + ";";
  EXPECT_NE(roles.find("budget;"), std::string::npos);
  EXPECT_NE(roles.find("max-batch;"), std::string::npos);
  EXPECT_NE(roles.find("batch;"), std::string::npos);
  const std::string svg = p.svg();
  EXPECT_NE(svg.find(">budget 256.00 MiB</text>"), std::string::npos);
  EXPECT_NE(
      svg.find(">largest batch under the budget: 164 (256.00 MiB)</text>"),
      std::string::npos);
  EXPECT_NE(svg.find(">batch 16: 34.00 MiB</text>"), std::string::npos);
  expect_readable(p);
}

TEST(PredictionPlotTest, NoLabelOverlapsAnotherAtAnySize) {
  const PeakModel pm = affine_model();
  for (int width : {320, 640, 1200, 1920}) {
    for (int height : {200, 360, 600}) {
      for (int64_t budget :
           {int64_t{0}, 12 * kMiB, 40 * kMiB, 256 * kMiB, 64 * 1024 * kMiB}) {
        SCOPED_TRACE(std::to_string(width) + "x" + std::to_string(height) +
                     " budget " + std::to_string(budget));
        PredictionPlotOptions o;
        o.width = width;
        o.height = height;
        o.batch = 16;
        o.budget = budget;
        expect_readable(prediction_plot(pm, o));
      }
    }
  }
}

TEST(PredictionPlotTest, RejectsTinyPicturesAndEmptyModels) {
  PredictionPlotOptions o;
  o.width = 100;
  EXPECT_THROW(prediction_plot(affine_model(), o), std::invalid_argument);
  EXPECT_THROW(prediction_plot(PeakModel{}), std::invalid_argument);
}

}  // namespace
}  // namespace memfit
