// The advise planner on fake recordings: a step whose peak is a floor (the
// weights, gradients and optimizer state, whatever the batch) plus
// activations per sample, under the front's settings and optimizers.
#include "memfit/core/plan/advise_plan.h"
#include "memfit/core/render/advice_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace memfit {
namespace {

struct Shape {
  int64_t floor;       // outside forward and backward
  int64_t per_sample;  // activations
};

// Adam on the weights: 400 bytes outside forward and backward, 50 per
// sample. The settings: bf16 weights halve both; LoRA keeps the frozen
// weights and little else; "recompute" (exact, checkpoints itself) keeps
// 10 per sample.
Shape shape_of(const StepVariant& v) {
  Shape s{400, 50};
  if (v.setting == "bf16 weights") s = {200, 25};
  if (v.setting == "LoRA r=16") s = {60, 20};
  if (v.setting == "recompute") s = {400, 10};
  if (v.optimizer == "momentum") s.floor = 300;
  if (v.optimizer == "sgd") s.floor = 200;
  if (v.autocast_bf16) s.per_sample /= 2;
  if (v.step != StepKind::kTrain) s.floor = 100;
  return s;
}

VariantRecording fake(const StepVariant& v, int64_t batch) {
  const Shape s = shape_of(v);
  VariantRecording r;
  r.report.peak_bytes = s.floor + s.per_sample * batch;
  r.report.peak_phase = kPhaseBackward;
  // The weights: within the floor (the optimizer's state comes on top).
  r.report.phases = {{kPhaseParameters, 1, 0, 0, std::min<int64_t>(100, s.floor), ""},
                     {kPhaseBackward, 1, 0, 0, r.report.peak_bytes, ""},
                     {kPhaseOptimizerStep, 1, 0, 0, s.floor, ""}};
  r.meta = true;  // as a model on meta is recorded: nothing verified
  return r;
}

struct Fake {
  std::vector<std::pair<StepVariant, int64_t>> recorded;
  bool eval = true;  // false: eval steps cannot be recorded here
  AdviseMeasurer measurer() {
    AdviseMeasurer m;
    m.record = [this](const StepVariant& v, int64_t batch, bool) {
      recorded.push_back({v, batch});
      if (!eval && v.step != StepKind::kTrain) {
        VariantRecording r;
        r.unavailable = "no eval here";
        return r;
      }
      return fake(v, batch);
    };
    return m;
  }
};

AdviseSettings settings(int64_t budget, bool allow_approximate) {
  AdviseSettings s;
  s.batch = 4;
  s.budget = budget;
  s.optimizer = "AdamW";
  s.settings = {{"bf16 weights", false, false}, {"LoRA r=16", false, false}};
  s.allow_approximate = allow_approximate;
  return s;
}

const AdviseRow* row(const Advice& a, const std::string& name) {
  for (const auto& r : a.rows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

TEST(AdvisePlanTest, EachSettingIsARowAtTheWholeBatch) {
  Fake f;
  const Advice a = plan_advice(f.measurer(), settings(-1, false));
  const AdviseRow* bf16 = row(a, "bf16 weights");
  const AdviseRow* lora = row(a, "LoRA r=16");
  ASSERT_NE(bf16, nullptr);
  ASSERT_NE(lora, nullptr);
  EXPECT_EQ(bf16->kind, StrategyKind::kSetting);
  EXPECT_EQ(bf16->peak_bytes, 200 + 25 * 4);
  EXPECT_EQ(lora->peak_bytes, 60 + 20 * 4);
  EXPECT_EQ(lora->saving_bytes, 600 - 140);
  EXPECT_FALSE(lora->variant.exact());
  EXPECT_EQ(lora->variant.setting, "LoRA r=16");
  EXPECT_NE(to_text(a).find("LoRA r=16"), std::string::npos);
  // Fake steps are not timed: no "0 ms per step"; the result column is said.
  EXPECT_EQ(a.plain_step_ms, 0);
  EXPECT_NE(to_text(a).find(", not timed; parameters and buffers"), std::string::npos)
      << to_text(a);
  EXPECT_NE(to_text(a).find("result: same = the plain step's numbers"), std::string::npos);
  const std::string json = to_json(a, false);
  EXPECT_NE(json.find("\"name\":\"LoRA r=16\",\"kind\":\"setting\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"setting\":\"LoRA r=16\""), std::string::npos);
}

TEST(AdvisePlanTest, AnApproximateSettingIsPlannedOnlyWithAllowApproximate) {
  // 150 bytes: Adam needs 400 outside forward and backward, bf16 weights
  // 200; only LoRA (60 + 20 a sample) fits, at the whole batch.
  Fake strict;
  const Advice no = plan_advice(strict.measurer(), settings(150, false));
  EXPECT_FALSE(no.plan.found);
  EXPECT_TRUE(row(no, "LoRA r=16")->fits);  // listed, not used
  // Recorded once, for its row: the search did not try it.
  EXPECT_EQ(std::count_if(
                strict.recorded.begin(), strict.recorded.end(),
                [](const auto& r) { return r.first.setting == "LoRA r=16"; }),
            1);
  const std::string& last = no.notes[no.notes.size() - 2];
  EXPECT_NE(
      last.find(
          "(bf16, a lighter optimizer, bf16 weights, LoRA r=16) may help"),
      std::string::npos)
      << last;

  Fake loose;
  const Advice yes = plan_advice(loose.measurer(), settings(150, true));
  ASSERT_TRUE(yes.plan.found);
  EXPECT_EQ(yes.plan.variant.setting, "LoRA r=16");
  EXPECT_EQ(yes.plan.micro_batch, 0);
  EXPECT_EQ(yes.plan.peak_bytes, 140);
  EXPECT_FALSE(yes.plan.exact);
  EXPECT_EQ(yes.plan.summary, "LoRA r=16");
  // bf16 weights came first in the front's order: its 200 bytes outside
  // forward and backward ruled it out without recording a micro-batch.
  for (const auto& [v, batch] : loose.recorded) {
    if (v.setting == "bf16 weights") EXPECT_EQ(batch, 4);
  }
}

TEST(AdvisePlanTest, NothingFitsIsOneLineForEitherFront) {
  // 150 bytes: no exact strategy meets it (Adam keeps 400 outside forward
  // and backward); the LoRA row (140) would, changing the training.
  Fake strict;
  const Advice no = plan_advice(strict.measurer(), settings(150, false));
  ASSERT_FALSE(no.plan.found);
  const std::string& m = no.does_not_fit;
  EXPECT_EQ(m.rfind("no strategy fits the budget of 150 B: the smallest peak memfit reached is ",
                    0),
            0u)
      << m;
  EXPECT_NE(m.find("--allow-approximate reaches 140 B with LoRA r=16, changing the numbers"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("the plain step peaks at 400 B outside forward and backward"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find('\n'), std::string::npos);
  // The front names its own flag; a plan found has no such line.
  AdviseSettings py = settings(150, false);
  py.approximate_flag = "allow_approximate=True";
  Fake again;
  EXPECT_NE(plan_advice(again.measurer(), py).does_not_fit.find("allow_approximate=True reaches"),
            std::string::npos);
  Fake loose;
  EXPECT_TRUE(plan_advice(loose.measurer(), settings(150, true)).does_not_fit.empty());
}

TEST(AdvisePlanTest, SettingsAreSearchedWithHalvingMicroBatches) {
  // 110 bytes: LoRA at 2 samples (60 + 40), accumulating.
  Fake f;
  const Advice a = plan_advice(f.measurer(), settings(110, true));
  ASSERT_TRUE(a.plan.found);
  EXPECT_EQ(a.plan.variant.setting, "LoRA r=16");
  EXPECT_EQ(a.plan.micro_batch, 2);
  EXPECT_EQ(a.plan.peak_bytes, 100);
  EXPECT_EQ(a.plan.summary, "LoRA r=16; micro-batches of 2");
}

TEST(AdvisePlanTest, ALevelBoundedOverTheBudgetIsNotRecorded) {
  // 110 bytes: the plain step at 4 samples peaks at 600 with 100 of
  // weights, so at 2 samples at least 100 + 500 / 2 = 350 and at 1 at least
  // 225: neither is recorded. LoRA (60 of weights, 140 at 4) is bounded at
  // 100 at 2 samples, recorded there, and fits.
  Fake f;
  const Advice a = plan_advice(f.measurer(), settings(110, true));
  ASSERT_TRUE(a.plan.found);
  EXPECT_EQ(a.plan.micro_batch, 2);
  for (const auto& [v, batch] : f.recorded) {
    EXPECT_FALSE(batch < 4 && v.setting.empty() && v.step == StepKind::kTrain)
        << describe(v, "AdamW", "") << " recorded at batch " << batch;
  }
  // LoRA: its row at 4 samples only (its bound there is its row, 140),
  // then 2 samples (cheaply, then on the device), never 1.
  std::vector<int64_t> lora;
  for (const auto& [v, batch] : f.recorded) {
    if (v.setting == "LoRA r=16") lora.push_back(batch);
  }
  EXPECT_EQ(lora, (std::vector<int64_t>{4, 2, 2}));
}

TEST(AdvisePlanTest, ACombinationWhoseFloorIsOverTheBudgetIsNotRecorded) {
  // 130 bytes, nothing fits alone (LoRA: 140); with every block
  // checkpointed the table combines each setting and optimizer, but bf16
  // weights need 200 outside forward and backward (momentum 300, sgd 200,
  // the user's AdamW 400): only LoRA (60) is combined.
  Fake f;
  AdviseSettings s = settings(130, true);
  s.chain = {"blocks.0", "blocks.1"};
  s.other_optimizers = {"momentum", "sgd"};
  s.lighter = {"momentum", "sgd"};
  const Advice a = plan_advice(f.measurer(), s);
  std::vector<std::string> combined;
  for (const auto& r : a.rows) {
    if (r.kind == StrategyKind::kCombination) combined.push_back(r.name);
  }
  EXPECT_EQ(combined, std::vector<std::string>{"LoRA r=16; checkpoint every block (2 of 2)"});
  const bool noted = std::any_of(a.notes.begin(), a.notes.end(), [](const std::string& n) {
    return n.find("not combined with checkpointing every block") != std::string::npos &&
           n.find("bf16 weights (200 B)") != std::string::npos &&
           n.find("optimizer momentum instead of AdamW (300 B)") != std::string::npos;
  });
  EXPECT_TRUE(noted) << to_text(a);
}

TEST(AdvisePlanTest, AnExactSettingIsPlannedWithoutAllowApproximate) {
  // 430 bytes: the plain step needs 450 at one sample; "recompute" keeps
  // the result and fits at 2 (400 + 20).
  AdviseSettings s = settings(430, false);
  s.settings.push_back({"recompute", true, true});
  Fake f;
  const Advice a = plan_advice(f.measurer(), s);
  ASSERT_TRUE(a.plan.found);
  EXPECT_EQ(a.plan.variant.setting, "recompute");
  EXPECT_TRUE(a.plan.exact);
  EXPECT_EQ(a.plan.micro_batch, 2);
  EXPECT_TRUE(row(a, "recompute")->variant.exact());
}

TEST(AdvisePlanTest, WithoutSettingsNoSettingRowOrKey) {
  AdviseSettings s = settings(-1, false);
  s.settings.clear();
  Fake f;
  const Advice a = plan_advice(f.measurer(), s);
  for (const auto& r : a.rows) EXPECT_NE(r.kind, StrategyKind::kSetting);
  EXPECT_EQ(to_json(a).find("setting"), std::string::npos);
  for (const auto& [v, batch] : f.recorded) EXPECT_TRUE(v.setting.empty());
}

TEST(AdvisePlanTest, RowsNotRecordedForOneReasonAreOneNote) {
  Fake f;
  f.eval = false;
  const Advice a = plan_advice(f.measurer(), settings(-1, false));
  const std::string note =
      "not recorded (no eval here): \"eval step under no_grad\", \"eval step "
      "under "
      "inference_mode\"";
  EXPECT_EQ(std::count(a.notes.begin(), a.notes.end(), note), 1);
  for (const auto& n : a.notes)
    EXPECT_EQ(n.find("eval step under no_grad: not"), std::string::npos);
}

TEST(AdvisePlanTest, OptimizerChoicesAreOneRuleForBothFronts) {
  using V = std::vector<std::string>;
  const OptimizerChoices adam = optimizer_choices("adam");
  EXPECT_EQ(adam.others, (V{"momentum", "sgd"}));
  EXPECT_EQ(adam.lighter, (V{"momentum", "sgd"}));
  EXPECT_TRUE(adam.can_offload);
  const OptimizerChoices offloaded = optimizer_choices("adam-offload");
  EXPECT_EQ(offloaded.others, (V{"momentum", "sgd"}));
  EXPECT_EQ(offloaded.lighter, (V{"momentum", "sgd"}));
  EXPECT_FALSE(offloaded.can_offload);
  EXPECT_EQ(optimizer_choices("momentum").lighter, V{"sgd"});
  EXPECT_TRUE(optimizer_choices("momentum").can_offload);
  EXPECT_EQ(optimizer_choices("sgd").others, (V{"adam", "momentum"}));
  EXPECT_TRUE(optimizer_choices("sgd").lighter.empty());
  EXPECT_FALSE(optimizer_choices("sgd").can_offload);
  // Another optimizer's class: every built-in is a row, but adam beside
  // another Adam (the same states); momentum and sgd are lighter.
  EXPECT_EQ(optimizer_choices("AdamW").others, (V{"momentum", "sgd"}));
  EXPECT_EQ(optimizer_choices("AdamW").lighter, (V{"momentum", "sgd"}));
  EXPECT_EQ(optimizer_choices("Adafactor").others, (V{"adam", "momentum", "sgd"}));
  const OptimizerChoices none = optimizer_choices("none");
  EXPECT_TRUE(none.others.empty() && none.lighter.empty() && !none.can_offload);
}

TEST(AdvisePlanTest, ACudaTargetHoldsTheBudgetAgainstReservedBytes) {
  // The caching allocator reserves 100 bytes more than is allocated. At
  // 650 bytes the whole batch fits in allocated bytes (600) but not in
  // reserved ones (700): for a card, micro-batches of 2 (500, 600 reserved).
  for (const bool cuda : {false, true}) {
    AdviseMeasurer m;
    m.record = [cuda](const StepVariant& v, int64_t batch, bool) {
      VariantRecording r = fake(v, batch);
      if (cuda) r.report.cuda = CudaEstimate{r.report.peak_bytes, r.report.peak_bytes + 100, 0};
      return r;
    };
    AdviseSettings s = settings(650, false);
    s.settings.clear();
    const Advice a = plan_advice(m, s);
    ASSERT_TRUE(a.plan.found) << cuda;
    EXPECT_EQ(a.cuda_reserved, cuda);
    EXPECT_EQ(a.plan.micro_batch, cuda ? 2 : 0);
    EXPECT_EQ(a.plan.peak_bytes, cuda ? 400 + 50 * 2 + 100 : 400 + 50 * 4);
    EXPECT_EQ(a.plain_peak, cuda ? 700 : 600);
    EXPECT_EQ(row(a, "plain (zero_grad set_to_none)")->fits, !cuda);
    EXPECT_EQ(to_text(a).find("peaks: the CUDA caching allocator's reserved bytes") != std::string::npos,
              cuda);
    EXPECT_NE(to_json(a, false).find(cuda ? "\"peaks\":\"cuda_reserved\""
                                         : "\"peaks\":\"allocated\""),
              std::string::npos);
    // Unverified (on meta): the note names which bytes the peak counts.
    const bool says_reserved =
        std::any_of(a.notes.begin(), a.notes.end(), [](const std::string& n) {
          return n.find("unverified") != std::string::npos &&
                 n.find("caching allocator's reserved bytes, replayed") != std::string::npos;
        });
    EXPECT_EQ(says_reserved, cuda);
  }
}

TEST(AdvisePlanTest, WhenNothingFitsThePlanIsTheLowestPeakReached) {
  // 420 bytes: the plain step (400 + 50 a sample) and the state on the
  // host (390 + 50) are searched down to one sample and neither fits; the
  // closest is the host's at micro-batches of 1 (440), and the line says so.
  AdviseMeasurer m;
  m.record = [](const StepVariant& v, int64_t batch, bool) {
    StepVariant plain = v;
    plain.host_state = false;
    VariantRecording r = fake(plain, batch);
    if (v.host_state) {
      r.report.peak_bytes -= 10;
      r.report.phases[1].peak_bytes -= 10;
      r.report.phases[2].peak_bytes = 390;
    }
    return r;
  };
  AdviseSettings s = settings(420, false);
  s.settings.clear();
  s.can_offload = true;
  s.offload_label = "memfit.offload";
  const Advice a = plan_advice(m, s);
  ASSERT_FALSE(a.plan.found);
  EXPECT_TRUE(a.plan.variant.host_state);
  EXPECT_EQ(a.plan.micro_batch, 1);
  EXPECT_EQ(a.plan.peak_bytes, 390 + 50);
  EXPECT_NE(a.does_not_fit.find("the smallest peak memfit reached is 440 B"), std::string::npos)
      << a.does_not_fit;
}

TEST(AdvisePlanTest, ALongRowNameAndBlockListWrapUnderTheirColumn) {
  // Guards against what was: a 32-layer chain's rows were lines of 200 characters.
  Advice a;
  a.model = "LlamaForCausalLM";
  a.batch = 4;
  a.budget = 12 * (int64_t{1} << 30);
  std::string blocks;
  for (int i = 0; i < 32; ++i) blocks += (i ? "," : "") + std::to_string(i);
  AdviseRow row;
  row.name = "checkpoint sqrt(n): blocks " + blocks;
  row.kind = StrategyKind::kCheckpointing;
  a.rows.push_back(row);
  ChainPlan every;
  every.rule = "every layer";
  every.checkpointed.assign(32, true);
  a.chain_plans.push_back(every);
  const std::string text = to_text(a);
  std::istringstream lines(text.substr(text.find('\n') + 1));  // the title names the model
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_NE(text.find("checkpoint sqrt(n): blocks 0,1,2,"), std::string::npos) << text;
  EXPECT_NE(text.find(",31"), std::string::npos) << text;
}

}  // namespace
}  // namespace memfit
