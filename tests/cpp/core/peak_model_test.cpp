#include "memfit/core/model/peak_model.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "memfit/core/model/batch_model.h"
#include "memfit/core/plan/batch_fit.h"

namespace memfit {
namespace {

// One phase whose memory is `fixed` + `per_sample` * batch.
PeakModel affine(double fixed, double per_sample) {
  PhaseFit p;
  p.phase = "backward";
  p.iteration = 2;
  p.fit.m0 = fixed;
  p.fit.per_sample = per_sample;
  p.envelope = {Line{fixed, per_sample}};
  PeakModel m;
  m.phases = {p};
  m.mode = "cpu";
  return m;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(PeakModelTest, PredictsToTheByteUpToTheBatchCap) {
  const PeakModel m = affine(1000, 96);
  EXPECT_EQ(m.predict(1), 1096);
  EXPECT_EQ(m.predict(kMaxBatch), 1000 + 96 * kMaxBatch);
}

// 2**60 samples once came back as 2704 B: the product left int64.
TEST(PeakModelTest, RefusesBatchesPastTheCapInsteadOfOverflowing) {
  const PeakModel m = affine(1000, 96);
  const std::string what = message_of([&] { m.predict(int64_t{1} << 60); });
  EXPECT_NE(what.find("outside what memfit predicts"), std::string::npos) << what;
  EXPECT_THROW(m.predict(-1), std::invalid_argument);
}

TEST(PeakModelTest, PredictionsSaturateRatherThanWrap) {
  const PeakModel m = affine(1000, 1e12);  // 1 TB per sample
  EXPECT_EQ(m.predict(kMaxBatch), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ceil_bytes(1e30L), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ceil_bytes(-5.0L), 0);
  EXPECT_EQ(ceil_bytes(12.0000000001L), 12);
}

// A budget of 16000 TiB is "no phase grows with the batch" no more: the
// memory does grow; the budget is past any real batch.
TEST(PeakModelTest, ABudgetBeyondEveryBatchNamesTheUnitsNotTheProbes) {
  const PeakModel m = affine(1 << 20, 4096);
  const std::string what = message_of([&] { m.max_batch_under(int64_t{16000} << 40); });
  EXPECT_NE(what.find("holds more than 2**40 samples"), std::string::npos) << what;
  EXPECT_NE(what.find("check the budget's units"), std::string::npos) << what;
  const std::string flat = message_of([&] { affine(1 << 20, 0).max_batch_under(1 << 30); });
  EXPECT_NE(flat.find("no phase's memory grows"), std::string::npos) << flat;
}

TEST(FitBatchTest, AMarginAsLargeAsTheBudgetIsNamedAsTheCause) {
  const PeakModel m = affine(1 << 20, 4096);
  Report reference;
  const std::string what =
      message_of([&] { fit_batch(m, reference, 16 << 20, 32 << 20); });
  EXPECT_NE(what.find("the margin 32.00 MiB leaves nothing of the budget 16.00 MiB"),
            std::string::npos)
      << what;
  EXPECT_EQ(what.find("optimizer"), std::string::npos) << what;
  EXPECT_EQ(fit_batch(m, reference, 16 << 20, 1 << 20).max_batch, (14 << 20) / 4096);
}

}  // namespace
}  // namespace memfit
