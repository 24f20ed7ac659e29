// "What fits on which card" (plan_cards) on fake recordings: each card's
// plan is the planner's for that budget alone, every step is recorded once
// for all cards, and a larger card never gets a plan that changes more.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "memfit/core/model/units.h"
#include "memfit/core/plan/advise_plan.h"
#include "memfit/core/render/advice_table.h"

namespace memfit {
namespace {

// A step of 4 samples whose peak is max(floor, weights + per_sample * batch):
// Adam's floor is 400 bytes outside forward and backward, 100 of weights,
// 50 a sample of activations; checkpointing both blocks keeps 20 a sample.
// The state on the host leaves a floor of 250. Settings: "recompute" (exact,
// checkpoints itself) 15 a sample; bf16 weights halve everything; LoRA
// keeps 60 and 20 a sample. The lighter optimizers lower the floor;
// autocast halves the activations.
VariantRecording fake(const StepVariant& v, int64_t batch) {
  int64_t floor = 400, weights = 100, per_sample = v.checkpointed() == 2 ? 20 : 50;
  if (v.setting == "recompute") per_sample = 15;
  if (v.setting == "bf16 weights") floor /= 2, weights /= 2, per_sample /= 2;
  if (v.setting == "LoRA r=16") floor = 60, weights = 50, per_sample = v.checkpointed() ? 8 : 20;
  if (v.optimizer == "momentum") floor = 300;
  if (v.optimizer == "sgd") floor = 200;
  if (v.host_state) floor = 250;
  if (v.autocast_bf16) per_sample /= 2;
  if (v.step != StepKind::kTrain) floor = 100;
  VariantRecording r;
  const int64_t inside = weights + per_sample * batch;
  r.report.peak_bytes = std::max(floor, inside);
  r.report.peak_phase = inside >= floor ? kPhaseBackward : kPhaseOptimizerStep;
  r.report.phases = {{kPhaseParameters, 1, 0, 0, weights, ""},
                     {kPhaseBackward, 1, 0, 0, inside, ""},
                     {kPhaseOptimizerStep, 1, 0, 0, floor, ""}};
  r.meta = false;  // a real device: every plan is verified
  return r;
}

using Key = std::tuple<std::string, int64_t, bool>;  // variant, batch, cheap

struct Fake {
  std::map<Key, int> recorded;
  AdviseMeasurer measurer() {
    AdviseMeasurer m;
    m.record = [this](const StepVariant& v, int64_t batch, bool cheap) {
      const std::string name = describe(v, "AdamW", "host") + (v.zero_grad_in_place ? "; zip" : "");
      ++recorded[{name, batch, cheap}];
      return fake(v, batch);
    };
    return m;
  }
};

AdviseSettings settings(std::vector<int64_t> cards = {}) {
  AdviseSettings s;
  s.batch = 4;
  s.optimizer = "AdamW";
  s.has_optimizer = true;
  s.can_offload = true;
  s.offload_label = "host";
  s.other_optimizers = {"momentum", "sgd"};
  s.lighter = {"momentum", "sgd"};
  s.chain = {"blocks.0", "blocks.1"};
  s.settings = {{"recompute", true, true}, {"bf16 weights", false, false},
                {"LoRA r=16", false, false}};
  s.allow_approximate = true;
  s.cards = std::move(cards);
  return s;
}

std::vector<int64_t> budgets() {
  std::vector<int64_t> b;
  for (int64_t x = 40; x <= 700; x += 10) b.push_back(x);
  return b;
}

// How much a plan changes the plain step, in the planner's order of
// preference (See Note [What fits on which card]): the stage (the device
// alone, the state on the host, an exact setting, an approximate one,
// bf16 or a lighter optimizer), the setting's place in the front's order,
// then the smaller micro-batch, then more blocks checkpointed.
std::tuple<int, int, int64_t, int> change(const AdvisePlan& p, const AdviseSettings& s) {
  const StepVariant& v = p.variant;
  int stage = 0, setting = -1;
  if (v.host_state) stage = 1;
  for (size_t i = 0; i < s.settings.size(); ++i) {
    if (s.settings[i].label == v.setting) stage = s.settings[i].exact ? 2 : 3, setting = int(i);
  }
  if (v.autocast_bf16 || !v.optimizer.empty()) stage = 4;
  const int64_t samples = p.micro_batch == 0 ? s.batch : p.micro_batch;
  return {stage, setting, -samples, v.checkpointed()};
}

TEST(AdviseCardsTest, EachCardGetsThePlanOfItsBudgetAlone) {
  Fake all;
  const Advice a = plan_advice(all.measurer(), settings(budgets()));
  ASSERT_EQ(a.cards.size(), budgets().size());
  int found = 0;
  for (const CardPlan& c : a.cards) {
    AdviseSettings one = settings();
    one.budget = c.budget;
    Fake alone;
    const AdvisePlan p = plan_advice(alone.measurer(), one).plan;
    EXPECT_EQ(c.plan.found, p.found) << c.budget;
    EXPECT_EQ(c.plan.summary, p.summary) << c.budget;
    EXPECT_TRUE(c.plan.variant == p.variant) << c.budget;
    EXPECT_EQ(c.plan.micro_batch, p.micro_batch) << c.budget;
    EXPECT_EQ(c.plan.peak_bytes, p.peak_bytes) << c.budget;
    EXPECT_EQ(c.plan.exact, p.exact) << c.budget;
    if (c.plan.found) {
      EXPECT_LE(c.plan.peak_bytes, c.budget);
      ++found;
    }
  }
  // The sweep crosses the stages: nothing (LoRA's weights and one sample
  // checkpointed need 58), LoRA, bf16 weights (from its floor of 200), the
  // state on the host (250), the device alone (400). "recompute" keeps
  // Adam's floor of 400: never planned, as the device alone fits there.
  EXPECT_FALSE(a.cards.front().plan.found);
  EXPECT_EQ(a.cards.back().plan.summary, "the plain step");
  std::vector<std::pair<std::string, bool>> seen;  // setting, state on the host
  for (const CardPlan& c : a.cards) {
    const std::pair<std::string, bool> k{c.plan.variant.setting, c.plan.variant.host_state};
    if (c.plan.found && std::find(seen.begin(), seen.end(), k) == seen.end()) seen.push_back(k);
  }
  const std::vector<std::pair<std::string, bool>> stages = {
      {"LoRA r=16", false}, {"bf16 weights", false}, {"", true}, {"", false}};
  EXPECT_EQ(seen, stages) << cards_table(a);
  EXPECT_GT(found, 0);
}

TEST(AdviseCardsTest, EveryStepIsRecordedOnceForAllCards) {
  Fake f;
  const Advice a = plan_advice(f.measurer(), settings(budgets()));
  for (const auto& [key, n] : f.recorded) {
    EXPECT_EQ(n, 1) << std::get<0>(key) << " at " << std::get<1>(key)
                    << (std::get<2>(key) ? " (cheap)" : "");
  }
  // The cards cost no more recordings than the card that searched most
  // and the rows (an upper bound: the sum over cards planned alone).
  int alone = 0;
  for (int64_t b : budgets()) {
    AdviseSettings one = settings();
    one.budget = b;
    Fake g;
    plan_advice(g.measurer(), one);
    for (const auto& [key, n] : g.recorded) alone += n;
  }
  EXPECT_LT(static_cast<int>(f.recorded.size()) * 4, alone);
}

TEST(AdviseCardsTest, ALargerCardNeverGetsAPlanThatChangesMore) {
  const AdviseSettings s = settings(budgets());
  Fake f;
  const Advice a = plan_advice(f.measurer(), s);
  for (size_t i = 1; i < a.cards.size(); ++i) {
    const AdvisePlan& small = a.cards[i - 1].plan;
    const AdvisePlan& large = a.cards[i].plan;
    EXPECT_TRUE(!small.found || large.found) << a.cards[i].budget;
    if (!small.found || !large.found) continue;
    EXPECT_LE(change(large, s), change(small, s))
        << a.cards[i - 1].budget << ": " << small.summary << "; " << a.cards[i].budget << ": "
        << large.summary;
    EXPECT_TRUE(!small.exact || large.exact) << a.cards[i].budget;
  }
}

TEST(AdviseCardsTest, TheTableHasACardARowAndSaysWhatNothingFits) {
  Fake f;
  const Advice a = plan_advice(f.measurer(), settings({700, 40, 700, 150}));
  ASSERT_EQ(a.cards.size(), 3u);  // sorted, duplicates dropped
  EXPECT_EQ(a.cards[0].budget, 40);
  EXPECT_EQ(a.cards[2].budget, 700);
  const std::string t = cards_table(a);
  // The card nothing fits shows the least peak measured for any card, not
  // only its own search's closest.
  const size_t none = t.find("nothing measured fits; the least measured: ");
  ASSERT_NE(none, std::string::npos) << t;
  int64_t least = a.cards[0].plan.peak_bytes;
  for (const auto& c : a.cards) least = std::min(least, c.plan.peak_bytes);
  const std::string row = t.substr(none, t.find('\n', none) - none);
  EXPECT_NE(row.find(format_bytes(least)), std::string::npos) << row;
  EXPECT_NE(t.find("the plain step"), std::string::npos) << t;
  EXPECT_NE(t.find("allocated bytes (not a card's reserved bytes)"), std::string::npos) << t;
  // The title, the header and its rule, 3 cards (a long plan wrapped under
  // its own), what "result" says, the time line; no row past 100 characters.
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1 + 2 + 3 + 1 + 2) << t;
  EXPECT_NE(t.find("\n       checkpoint every block (2 of 2)\n"), std::string::npos) << t;
  EXPECT_NE(t.find("result: same = the plain step's numbers"), std::string::npos) << t;
  std::istringstream lines(t.substr(t.find('\n') + 1));  // the title names the model
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_NE(to_json(a, false).find("\"cards\""), std::string::npos);
}

TEST(AdviseCardsTest, ACardOfNoBytesIsRefused) {
  Fake f;
  try {
    plan_advice(f.measurer(), settings({8, 0}));
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "[advise] a card's budget must be > 0 bytes, got 0");
  }
}

}  // namespace
}  // namespace memfit
