// How an Advice reads: the table `memfit advise` and memfit.advise() print,
// its JSON, and what the HTML page shows of it. One place for both fronts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/plan/advise_plan.h"

namespace memfit {

// The rows, the checkpointing rules and the plan, with the notes.
std::string to_text(const Advice& advice);

// Keys: model, batch, budget_bytes, reserve_bytes, optimizer,
// parameter_bytes, peaks ("allocated" or "cuda_reserved"),
// plain_peak_bytes, plain_step_ms, chain, strategies,
// checkpoint_rules, plan, notes (and time_estimated_from where a front
// estimated times from FLOPs).
std::string to_json(const Advice& advice, bool pretty = true);

// The cards' plans (advise's cards): card, plan, peak, time, result; "" without cards.
std::string cards_table(const Advice& advice);

// One measured strategy of `memfit advise`, as the page shows it.
struct AdviceRow {
  std::string name;
  int64_t peak_bytes = 0;
  int64_t saving_bytes = 0;
  double time_ratio = 0;
  std::optional<bool> fits;  // nullopt: no budget to fit
  std::string result;        // "same", "changes", "no training"
  bool predicted = false;    // peak predicted, not recorded (AdviseRow::predicted)
};

struct AdviceTable {
  int64_t budget_bytes = 0;  // 0: none
  int64_t plain_peak_bytes = 0;
  std::vector<AdviceRow> rows;
  std::string plan;  // one line: what the plan runs, or why none fits
  std::vector<std::string> notes;
};

// What the page shows of an Advice: each row's peak, saving, time, fits
// (none without a budget) and result ("no training" for an eval step, "same" where the variant keeps
// the numbers, else "changes"), and the plan in one line.
AdviceTable advice_table(const Advice& advice);

}  // namespace memfit
