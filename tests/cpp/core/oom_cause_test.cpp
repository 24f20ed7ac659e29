#include "memfit/core/model/oom_cause.h"

#include <gtest/gtest.h>

namespace memfit {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(OomCauseTest, AdamStepIsOptimizerStateNotTheBatch) {
  OomMemory m;
  m.parameters = 10 * kMiB;
  m.gradients = 10 * kMiB;
  m.optimizer_state = 15 * kMiB;
  m.activations = 1 * kMiB;
  const OomDiagnosis d = diagnose_oom(OomPhase::kOptimizerStep, m, 36 * kMiB);
  EXPECT_EQ(d.cause, OomCause::kOptimizerState);
  EXPECT_NE(d.advice.find("memfit.offload"), std::string::npos);
  EXPECT_NE(d.advice.find("momentum"), std::string::npos);
  EXPECT_EQ(d.advice.find("smaller batch"),
            d.advice.find("smaller batch cannot help"));
  EXPECT_EQ(
      d.what_fills,
      "optimizer state 15.00 MiB, parameters 10.00 MiB, gradients 10.00 MiB, "
      "activations 1.00 MiB");
}

TEST(OomCauseTest, StateAlreadyOnTheHostIsNotAdvisedThere) {
  OomMemory m;
  m.parameters = m.gradients = m.optimizer_state = kMiB;
  const OomDiagnosis d =
      diagnose_oom(OomPhase::kOptimizerStep, m, 4 * kMiB, true);
  EXPECT_EQ(d.advice.find("memfit.offload"), std::string::npos);
  EXPECT_NE(d.advice.find("already on the host"), std::string::npos);
}

TEST(OomCauseTest, ModelAloneOverTheBudgetIsTheModelWhateverThePhase) {
  OomMemory m;
  m.parameters = 10 * kMiB;
  m.activations = 3 * kMiB;
  for (OomPhase p :
       {OomPhase::kForward, OomPhase::kBackward, OomPhase::kOptimizerStep}) {
    const OomDiagnosis d =
        diagnose_oom(p, m, 16 * kMiB);  // 10 + 10 of gradients > 16
    EXPECT_EQ(d.cause, OomCause::kModel);
    EXPECT_NE(d.advice.find("bigger card"), std::string::npos);
    EXPECT_NE(d.advice.find("shard"), std::string::npos);
    EXPECT_NE(d.advice.find("smaller batch cannot help"), std::string::npos);
  }
  EXPECT_EQ(diagnose_oom(OomPhase::kParameters, m, std::nullopt).cause,
            OomCause::kModel);
}

TEST(OomCauseTest, AnEvaluationsModelIsItsWeightsWithNoGradientToCome) {
  // Grad disabled: 10 MiB of weights in 16 MiB leave room; what the
  // forward's ops hold is the excess, and a smaller batch helps.
  OomMemory m;
  m.parameters = 10 * kMiB;
  m.temporaries = 3 * kMiB;
  const OomDiagnosis d = diagnose_oom(OomPhase::kForward, m, 16 * kMiB,
                                      /*state_on_host=*/false, /*training=*/false);
  EXPECT_EQ(d.cause, OomCause::kTemporaries);
  EXPECT_EQ(d.advice.find("smaller batch cannot help"), std::string::npos);
  // Weights alone over the budget are the model's, in evaluation too.
  m.parameters = 17 * kMiB;
  EXPECT_EQ(diagnose_oom(OomPhase::kForward, m, 16 * kMiB, false, false).cause,
            OomCause::kModel);
}

TEST(OomCauseTest, ActivationsGetCheckpointing) {
  OomMemory m;
  m.parameters = m.gradients = kMiB;
  m.activations = 20 * kMiB;
  m.temporaries = 2 * kMiB;
  const OomDiagnosis d = diagnose_oom(OomPhase::kBackward, m, 24 * kMiB);
  EXPECT_EQ(d.cause, OomCause::kActivations);
  EXPECT_NE(d.advice.find("checkpointing"), std::string::npos);
}

TEST(OomCauseTest, TheBatchsOwnDataIsSaidAndKeptOnTheHost) {
  OomMemory m;
  m.parameters = 2 * kMiB;
  m.batch = 12 * kMiB;
  m.activations = kMiB;
  const OomDiagnosis d = diagnose_oom(OomPhase::kForward, m, 16 * kMiB);
  EXPECT_EQ(d.cause, OomCause::kBatch);
  EXPECT_NE(d.advice.find("keep the batch on the host"), std::string::npos);
  EXPECT_EQ(diagnose_oom(OomPhase::kInputs, OomMemory{}, 16 * kMiB).cause,
            OomCause::kBatch);
}

TEST(OomCauseTest, MessageStartsWithCudasWordsThenTheOperationAndPhase) {
  OomMemory m;
  m.parameters = m.gradients = kMiB;
  m.optimizer_state = 2 * kMiB;
  const OomDiagnosis d = diagnose_oom(OomPhase::kOptimizerStep, m, 3 * kMiB);
  EXPECT_EQ(oom_message("Trainer::step", "", OomPhase::kOptimizerStep, d,
                        "Tried to allocate 1 KiB."),
            "CUDA out of memory. [Trainer::step] ran out in the optimizer "
            "step, with optimizer "
            "state 2.00 MiB, parameters 1.00 MiB, gradients 1.00 MiB on the "
            "device. " +
                d.advice + " Tried to allocate 1 KiB.");
  EXPECT_EQ(
      oom_message("fit", "batch 1 does not fit", OomPhase::kForward, d)
          .substr(0, 68),
      "CUDA out of memory. [fit] batch 1 does not fit: it ran out in the fo");
}

TEST(OomCauseTest, AllocatorFiguresDropCudasWordsAndTheGenericAdvice) {
  EXPECT_EQ(allocator_figures(
                "CUDA out of memory. Tried to allocate 2 KiB (budget 1 MiB). "
                "Use a smaller batch, or let memfit find one.\nmore"),
            "Tried to allocate 2 KiB (budget 1 MiB).");
}

TEST(OomCauseTest, ProfilePhasesAndCategoriesMapOntoTheDiagnosis) {
  EXPECT_EQ(oom_phase_of("loss"), OomPhase::kForward);
  EXPECT_EQ(oom_phase_of("optimizer_step"), OomPhase::kOptimizerStep);
  EXPECT_EQ(oom_phase_of("zero_grad"), OomPhase::kUnknown);
  std::array<int64_t, kNumCategories> c{};
  c[static_cast<size_t>(Category::kParameter)] = 10;
  c[static_cast<size_t>(Category::kBuffer)] = 1;
  c[static_cast<size_t>(Category::kInput)] = 5;
  c[static_cast<size_t>(Category::kOptimizerState)] = 20;
  const OomMemory m = oom_memory_of(c);
  EXPECT_EQ(m.parameters, 11);
  EXPECT_EQ(m.batch, 5);
  EXPECT_EQ(m.optimizer_state, 20);
  EXPECT_EQ(m.total(), 36);
}

}  // namespace
}  // namespace memfit
