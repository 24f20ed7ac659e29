// The rows advise predicts instead of recording (Note [Rows advise
// predicts]), on the recorded step of training_step.h: the front records
// what the planner asks, the planner predicts the rest, marks it, and
// accepts a plan only on its own recording.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memfit/core/model/step_transform.h"
#include "memfit/core/model/units.h"
#include "memfit/core/plan/advise_plan.h"
#include "memfit/core/render/advice_table.h"
#include "training_step.h"

namespace memfit {
namespace {

using testing::kMiB;

struct Front {
  // false: the state on the host records like the plain step (a prediction
  // under the truth, which the plan's recording must catch).
  bool host_saves = true;
  std::vector<std::pair<StepVariant, bool>> recorded;  // variant, cheap
  AdviseMeasurer measurer() {
    AdviseMeasurer m;
    m.record = [this](const StepVariant& v, int64_t batch, bool cheap) {
      recorded.push_back({v, cheap});
      Timeline t = testing::training_step();
      if (v.zero_grad_in_place) t = *with_gradients_kept(t);
      if (v.host_state && host_saves) t = *with_state_on_host(t);
      VariantRecording r;
      r.report = make_report(t, {"step", batch, v.host_state ? "adam-offload" : "adam", "cpu"});
      r.timeline = std::move(t);
      return r;
    };
    return m;
  }
  bool asked(const StepVariant& v) const {
    return std::any_of(recorded.begin(), recorded.end(),
                       [&](const auto& r) { return r.first == v; });
  }
};

AdviseSettings settings(int64_t budget) {
  AdviseSettings s;
  s.batch = 4;
  s.budget = budget;
  s.optimizer = "adam";
  s.can_offload = true;
  s.offload_label = "memfit.offload";
  return s;
}

const AdviseRow& row(const Advice& a, StrategyKind kind) {
  auto it = std::find_if(a.rows.begin(), a.rows.end(),
                         [&](const AdviseRow& r) { return r.kind == kind; });
  EXPECT_NE(it, a.rows.end());
  return *it;
}

StepVariant in_place() {
  StepVariant v;
  v.zero_grad_in_place = true;
  return v;
}

StepVariant on_host() {
  StepVariant v;
  v.host_state = true;
  return v;
}

StepVariant inference() {
  StepVariant v;
  v.step = StepKind::kEvalInference;
  return v;
}

TEST(AdvisePredictTest, RowsThatFollowFromThePlainStepAreNotRecorded) {
  Front f;
  const Advice a = plan_advice(f.measurer(), settings(-1));
  const Timeline plain = testing::training_step();
  const AdviseRow& kept = row(a, StrategyKind::kMemory);
  EXPECT_TRUE(kept.predicted);
  EXPECT_EQ(kept.peak_bytes,
            make_report(*with_gradients_kept(plain), {"step", 4, "adam", "cpu"}).peak_bytes);
  const AdviseRow& host = row(a, StrategyKind::kOptimizer);
  EXPECT_TRUE(host.predicted);
  EXPECT_EQ(host.saving_bytes, 6 * kMiB);
  EXPECT_LT(host.time_ratio, 0);  // the plain step's times say nothing of the host's step
  EXPECT_FALSE(row(a, StrategyKind::kBaseline).predicted);
  EXPECT_FALSE(f.asked(in_place()));
  EXPECT_FALSE(f.asked(on_host()));
  EXPECT_FALSE(f.asked(inference()));
  // The same rows recorded, when asked: the same bytes.
  AdviseSettings s = settings(-1);
  s.predict_rows = false;
  Front g;
  const Advice b = plan_advice(g.measurer(), s);
  EXPECT_TRUE(g.asked(in_place()));
  EXPECT_TRUE(g.asked(on_host()));
  EXPECT_TRUE(g.asked(inference()));
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_FALSE(b.rows[i].predicted) << b.rows[i].name;
    EXPECT_EQ(a.rows[i].peak_bytes, b.rows[i].peak_bytes) << a.rows[i].name;
  }
}

TEST(AdvisePredictTest, APredictedRowIsMarkedInTheTableAndTheJson) {
  Front f;
  const Advice a = plan_advice(f.measurer(), settings(-1));
  const std::string text = to_text(a);
  const AdviseRow& kept = row(a, StrategyKind::kMemory);
  EXPECT_NE(text.find("~" + format_bytes(kept.peak_bytes)), std::string::npos) << text;
  EXPECT_NE(text.find("~ peak: predicted from the recorded rows"), std::string::npos) << text;
  // The plain step's peak is recorded: no "~" before it.
  const size_t plain = text.find("plain (zero_grad set_to_none)");
  ASSERT_NE(plain, std::string::npos);
  const std::string line = text.substr(plain, text.find('\n', plain) - plain);
  EXPECT_EQ(line.find('~'), std::string::npos) << line;
  const std::string json = to_json(a, false);
  EXPECT_NE(json.find("\"name\":\"zero_grad in place\""), std::string::npos);
  EXPECT_NE(json.find("\"recorded_on\":\"device\",\"predicted\":true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"recorded_on\":\"device\",\"predicted\":false"), std::string::npos);
  const AdviceTable t = advice_table(a);
  EXPECT_TRUE(std::any_of(t.rows.begin(), t.rows.end(),
                          [](const AdviceRow& r) { return r.predicted; }));
}

TEST(AdvisePredictTest, ThePlanOnAPredictedRowIsRecorded) {
  // 25 MiB: the plain step peaks at 29.53, its state on the host at 23.53
  // (predicted). The plan is that, recorded on the device at the whole batch.
  Front f;
  const Advice a = plan_advice(f.measurer(), settings(25 * kMiB));
  EXPECT_TRUE(row(a, StrategyKind::kOptimizer).predicted);
  EXPECT_TRUE(row(a, StrategyKind::kOptimizer).fits);
  ASSERT_TRUE(a.plan.found);
  EXPECT_TRUE(a.plan.verified);
  EXPECT_TRUE(a.plan.variant.host_state);
  EXPECT_EQ(a.plan.micro_batch, 0);
  EXPECT_TRUE(f.asked(on_host()));
}

TEST(AdvisePredictTest, APredictionUnderTheTruthIsCaughtByThePlansRecording) {
  // The host's step records as the plain one here: the row predicted to fit
  // does not, and no plan rests on it.
  Front f;
  f.host_saves = false;
  const Advice a = plan_advice(f.measurer(), settings(25 * kMiB));
  EXPECT_TRUE(row(a, StrategyKind::kOptimizer).fits);  // the prediction
  EXPECT_FALSE(a.plan.found);
  EXPECT_GT(a.plan.peak_bytes, 25 * kMiB);
  EXPECT_TRUE(f.asked(on_host()));
}

}  // namespace
}  // namespace memfit
