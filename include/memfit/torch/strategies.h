// When even one sample does not fit: memfit advise on a built-in model. The
// planner is core's (core/plan/advise_plan.h); this front records the built-in
// model's step under each variant it asks for (on the meta device when it
// asks for a cheap recording and the step allows), times the plan, and
// applies it to the Trainer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/plan/advise_plan.h"
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
  // Timed steps of the plan and of the plain step (median), after the
  // recordings (no untimed step); 0: estimated.
  int timing_repeats = 1;
  // Rows recorded on the meta device where the step allows (nothing
  // computed; each saving against the plain step recorded there too). The
  // plain step and the plan are recorded on the CPU either way.
  bool meta = false;
  // The plan may only use strategies that leave the result as it is
  // (checkpointing, micro-batching); true also lets it use bf16 autocast and
  // a lighter optimizer, which change the numbers (and, for the optimizer,
  // the training).
  bool allow_approximate = false;
  // The card the budget is for: each recorded step gets the CUDA caching
  // allocator's estimate, and the budget is held against its reserved bytes
  // (Report::budget_peak) instead of the allocated ones.
  bool cuda_target = false;
  int64_t cuda_workspace = kDefaultCudaWorkspaceBytes;
  // Budgets of cards: the plan of each too (Advice::cards), from the same
  // recordings. See Note [What fits on which card].
  std::vector<int64_t> cards;
  // AdviseSettings::predict_rows: false records every row.
  bool predict_rows = true;
};

// Records every strategy at `batch` and plans for `budget`. The model is
// given back as it came (weights, checkpointing). Throws
// std::invalid_argument for a batch < 1, a budget < 0 or an unknown
// optimizer.
Advice advise(TrainableModel& model, const AdviseOptions& options,
              const Progress& progress = Progress());

// Sets the model's checkpointing to the plan's and returns `base` with the
// plan's micro-batch and precision: what the Trainer needs to run it. The
// plan's optimizer is the caller's to make. Throws std::invalid_argument if
// the model cannot checkpoint what the plan asks.
TrainerOptions apply_plan(const AdvisePlan& plan, TrainableModel& model,
                          TrainerOptions base = {});

}  // namespace memfit
