#include "memfit/core/plan/step_protocol.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace memfit {
namespace {

// Every callback writes its name to `log`, begin_phase as "<phase> <it>".
StepCallbacks logging(std::vector<std::string>& log, bool train,
                      bool has_optimizer) {
  StepCallbacks cb;
  cb.train = train;
  cb.has_optimizer = has_optimizer;
  cb.begin_phase = [&log](const std::string& phase, int it) {
    log.push_back(phase + " " + std::to_string(it));
  };
  auto says = [&log](const char* what) {
    return [&log, what] { log.push_back(what); };
  };
  cb.materialize = says("materialize");
  cb.inputs = says("inputs()");
  cb.forward = says("forward()");
  cb.loss = says("loss()");
  cb.backward = says("backward()");
  cb.optimizer_step = says("optimizer_step()");
  cb.zero_grad = says("zero_grad()");
  cb.end_phase = says("end_phase()");
  return cb;
}

std::vector<std::string> iteration(int it, bool train, bool has_optimizer) {
  const std::string n = " " + std::to_string(it);
  std::vector<std::string> v = {"inputs" + n, "inputs()", "forward" + n,
                                "forward()",  "loss" + n, "loss()"};
  if (train) {
    v.insert(v.end(), {"backward" + n, "backward()"});
    if (has_optimizer)
      v.insert(v.end(), {"optimizer_step" + n, "optimizer_step()"});
    v.insert(v.end(), {"zero_grad" + n, "zero_grad()"});
  }
  v.push_back("end_phase()");
  return v;
}

std::vector<std::string> expected(int iterations, bool train,
                                  bool has_optimizer) {
  std::vector<std::string> v = {"parameters 1", "materialize"};
  for (int it = 1; it <= iterations; ++it) {
    auto i = iteration(it, train, has_optimizer);
    v.insert(v.end(), i.begin(), i.end());
  }
  return v;
}

TEST(StepProtocolTest, TrainWithOptimizerRunsEveryPhaseInOrder) {
  std::vector<std::string> log;
  run_step_protocol(logging(log, true, true), 2);
  EXPECT_EQ(log, expected(2, true, true));
  EXPECT_EQ(log.size(), 2u + 2u * 13u);
}

TEST(StepProtocolTest, WithoutOptimizerSkipsOnlyTheOptimizerStep) {
  std::vector<std::string> log;
  StepCallbacks cb = logging(log, true, false);
  cb.optimizer_step = nullptr;  // not needed without an optimizer
  run_step_protocol(cb, 2);
  EXPECT_EQ(log, expected(2, true, false));
}

TEST(StepProtocolTest, EvalStepEndsAfterLoss) {
  std::vector<std::string> log;
  StepCallbacks cb = logging(log, false, true);
  cb.backward = cb.optimizer_step = cb.zero_grad = nullptr;
  run_step_protocol(cb, 2);
  EXPECT_EQ(log, expected(2, false, true));
}

TEST(StepProtocolTest, ProgressSaysEachPhaseAndTheIterationWhenSeveral) {
  std::vector<std::string> log, lines;
  Progress progress([&lines](const std::string& l) {
    lines.push_back(l.substr(l.find("] ") + 2));
  });
  run_step_protocol(logging(log, true, false), 2, progress,
                    "record batch 8 on cpu");
  ASSERT_EQ(lines.size(), 1u + 2u * 5u);
  EXPECT_EQ(lines[0], "record batch 8 on cpu: parameters");
  EXPECT_EQ(lines[1], "record batch 8 on cpu: inputs (iteration 1)");
  EXPECT_EQ(lines.back(), "record batch 8 on cpu: zero_grad (iteration 2)");
  lines.clear();
  run_step_protocol(logging(log, false, false), 1, progress, "record on meta");
  EXPECT_EQ(lines, (std::vector<std::string>{
                       "record on meta: parameters", "record on meta: inputs",
                       "record on meta: forward", "record on meta: loss"}));
}

TEST(StepProtocolTest, PhaseOpensBeforeItsCallbackRuns) {
  std::vector<std::string> log;
  StepCallbacks cb = logging(log, true, true);
  cb.forward = [&log] {
    ASSERT_EQ(log.back(), "forward 1");
    log.push_back("forward()");
  };
  run_step_protocol(cb, 1);
  EXPECT_EQ(log, expected(1, true, true));
}

TEST(StepProtocolTest, ACallbackThatThrowsStopsTheStep) {
  std::vector<std::string> log;
  StepCallbacks cb = logging(log, true, true);
  cb.backward = [] { throw std::runtime_error("out of memory"); };
  EXPECT_THROW(run_step_protocol(cb, 2), std::runtime_error);
  EXPECT_EQ(log.back(), "backward 1");
}

TEST(StepProtocolTest, MissingCallbackOrNoIterationIsTheCallersMistake) {
  std::vector<std::string> log;
  StepCallbacks cb = logging(log, true, true);
  cb.zero_grad = nullptr;
  try {
    run_step_protocol(cb, 1);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "[run_step_protocol] no zero_grad callback: give one for "
                 "every phase the step "
                 "runs");
  }
  EXPECT_TRUE(log.empty());
  EXPECT_THROW(run_step_protocol(logging(log, true, true), 0),
               std::invalid_argument);
}

// Phases of `log` after "parameters", as "<phase> <it>" only.
std::vector<std::string> phases(const std::vector<std::string>& log) {
  std::vector<std::string> v;
  for (size_t i = 2; i < log.size(); ++i)
    if (log[i].back() != ')') v.push_back(log[i]);
  return v;
}

TEST(StepProtocolTest, AccumulationStepsTheOptimizerOnceEveryTwoRecordedMicroBatches) {
  std::vector<std::string> log;
  LoopShape loop;
  loop.accumulation_steps = 4;  // recorded as two: see Note [The loop the user runs]
  run_step_protocol(logging(log, true, true), 2, Progress(), "record", loop);
  const std::vector<std::string> want = {
      "inputs 1", "forward 1", "loss 1", "backward 1",  //
      "inputs 2", "forward 2", "loss 2", "backward 2", "optimizer_step 2",
      "zero_grad 2",  //
      "inputs 3", "forward 3", "loss 3", "backward 3",  //
      "inputs 4", "forward 4", "loss 4", "backward 4", "optimizer_step 4",
      "zero_grad 4"};
  EXPECT_EQ(phases(log), want);
}

TEST(StepProtocolTest, TutorialOrderZeroesTheGradientsJustBeforeBackward) {
  std::vector<std::string> log;
  LoopShape loop;
  loop.zero_grad_first = true;
  run_step_protocol(logging(log, true, true), 2, Progress(), "record", loop);
  const std::vector<std::string> want = {
      "inputs 1",   "forward 1",  "loss 1",
      "zero_grad 1", "backward 1", "optimizer_step 1",  //
      "inputs 2",   "forward 2",  "loss 2",
      "zero_grad 2", "backward 2", "optimizer_step 2"};
  EXPECT_EQ(phases(log), want);
}

TEST(StepProtocolTest, AccumulationStepsBelowOneAreRefused) {
  std::vector<std::string> log;
  LoopShape loop;
  loop.accumulation_steps = 0;
  EXPECT_THROW(run_step_protocol(logging(log, true, true), 1, Progress(),
                                 "record", loop),
               std::invalid_argument);
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace memfit
