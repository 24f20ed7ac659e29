// When even one sample does not fit: the strategies that lower a step's
// memory, each measured on the user's model (peak from a recorded profile of
// the transformed step, time against the plain step in the same process),
// and the cheapest combination that fits a budget, applied by the Trainer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/checkpoint_plan.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"
#include "memfit/torch/trainer.h"

namespace memfit {

struct AdviseOptions {
  int64_t batch = 8;
  int64_t budget = 0;
  std::string optimizer = "adam";  // the user's: adam | momentum | sgd | none
  uint64_t seed = 0;
  double lr = 1e-3;
  int timing_repeats = 3;  // timed steps per strategy (median), after a warm-up
  // The plan may only use strategies that leave the result as it is
  // (checkpointing, micro-batching); true also lets it use bf16 autocast and
  // a lighter optimizer, which change the numbers (and, for the optimizer,
  // the training).
  bool allow_approximate = false;
};

// One measured strategy, at the user's whole batch.
struct StrategyRow {
  std::string name;  // "checkpoint every layer (4 of 4)", "autocast bf16", ...
  std::string
      kind;  // baseline | memory | checkpointing | precision | optimizer | eval
  StepStrategies strategies;
  std::string optimizer;
  int64_t peak_bytes = 0;    // measured: profile of the transformed step
  int64_t saving_bytes = 0;  // plain peak - peak (negative: costs memory)
  double time_ratio = 0;     // median step time / the plain step's
  bool fits = false;         // peak <= the budget
  bool exact = true;         // same result as the plain step (float tolerance)
};

// What the plan runs: strategies on micro-batches of `micro_batch` samples.
struct Plan {
  bool found =
      false;  // false: nothing measured fits; the fields say the closest
  StepStrategies strategies;
  std::string optimizer;
  int64_t micro_batch = 0;  // 0: the whole batch
  int64_t peak_bytes = 0;   // measured at micro_batch, accumulating
  double time_ratio = 0;    // a Trainer step of the plan / a plain step
  bool exact = true;
  std::string summary;  // one line: "checkpoint blocks 0,1,2; micro-batch 4"
};

struct Advice {
  std::string model;
  int64_t batch = 0;
  int64_t budget = 0;
  int64_t reserve_bytes = 0;  // kept free for the full batch's data
  std::string optimizer;
  int64_t plain_peak = 0;
  double plain_step_ms = 0;
  std::vector<StrategyRow> rows;
  // The checkpointing rules compared on the chain measured at
  // `chain_batch`, against the budget there (predicted peak, recompute).
  int64_t chain_batch = 0;
  std::vector<ChainSegment> segments;
  ChainMemory chain_memory;
  std::vector<ChainPlan> chain_plans;
  Plan plan;
  std::vector<std::string> notes;

  std::string table() const;
  // Keys: model, batch, budget_bytes, optimizer, plain_peak_bytes,
  // plain_step_ms, strategies, checkpoint_rules, plan, notes.
  std::string to_json(bool pretty = true) const;
};

// Measures every strategy at `batch` and plans for `budget`. The model is
// given back as it came (weights, checkpointing). Throws
// std::invalid_argument for a batch < 1, a budget < 0 or an unknown
// optimizer.
Advice advise(TrainableModel& model, const AdviseOptions& options);

// Sets the model's checkpointing to the plan's and returns `base` with the
// plan's micro-batch and precision: what the Trainer needs to run it. The
// plan's optimizer is the caller's to make. Throws std::invalid_argument if
// the model cannot checkpoint what the plan asks.
TrainerOptions apply_plan(const Plan& plan, TrainableModel& model,
                          TrainerOptions base = {});

}  // namespace memfit
