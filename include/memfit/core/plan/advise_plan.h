// memfit advise's planner, once for both fronts: when a step does not fit,
// which strategies lower its memory, and the cheapest plan that fits a
// budget. Torch-free: the front (C++ for the built-in models, Python for the
// user's nn.Module) only records steps when the planner asks and, if it can,
// times one; everything else (the rows, the chain's calibration, the search
// over micro-batches, the choice, the names) is here.
// See Note [How advise plans] in advise_plan.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/plan/checkpoint_plan.h"
#include "memfit/core/plan/progress.h"

namespace memfit {

enum class StrategyKind {
  kBaseline,
  kMemory,  // zero_grad in place
  kCheckpointing,
  kPrecision,
  kOptimizer,
  kEval,
  kCombination,
  kSetting,  // a front's setting (bf16 weights, LoRA ...) at the whole batch
};
// "baseline", "memory", "checkpointing", "precision", "optimizer", "eval",
// "combination", "setting".
const char* to_string(StrategyKind kind);

enum class StepKind {
  kTrain,
  kEvalNoGrad,      // forward and loss under no_grad
  kEvalInference,   // forward and loss under inference mode
};
// "train", "no_grad", "inference_mode".
const char* to_string(StepKind kind);

// One way to run the training step, as the planner asks a front to record
// it.
struct StepVariant {
  std::vector<bool> checkpoint;  // one flag per block of the chain; empty: none
  bool autocast_bf16 = false;
  bool zero_grad_in_place = false;  // zero_grad(set_to_none=False)
  std::string optimizer;            // "": the user's; else adam | momentum | sgd
  bool host_state = false;          // the optimizer's state and step on the host
  StepKind step = StepKind::kTrain;
  // "": none; else the label of an AdviseSetting the front applies to a copy
  // of the model and its optimizer (bf16 weights, LoRA r=16 ...).
  std::string setting;
  bool setting_exact = false;  // the setting keeps what is trained (its AdviseSetting's exact)

  // Same result as the plain step (float tolerance).
  bool exact() const {
    return !autocast_bf16 && optimizer.empty() && (setting.empty() || setting_exact);
  }
  int checkpointed() const;
  bool operator==(const StepVariant& o) const;
};

// What a front recorded of a variant.
struct VariantRecording {
  Report report;
  Timeline timeline;
  bool meta = false;  // recorded on the meta device (no real compute)
  // Non-empty: the front cannot record this variant here, and why (bf16 on
  // a model whose weights are on meta): the row is left out, the plan
  // does not use it.
  std::string unavailable;
};

// What the planner asks of a front.
struct AdviseMeasurer {
  // The step under the variant at `batch` samples, recorded (two
  // iterations). cheap=true: the front may record it on the meta device and
  // says so in `meta`; the planner verifies every plan it returns on a real
  // recording (cheap=false).
  std::function<VariantRecording(const StepVariant&, int64_t batch, bool cheap)> record;
  // Median time of a training step of the whole batch under the variant, in
  // micro-batches of `micro_batch` samples (0: whole), over the plain
  // step's, both timed now. Empty: the plan's time is an estimate.
  std::function<double(const StepVariant&, int64_t micro_batch)> time_ratio;
  // The same ratio estimated without a clock (from FLOPs counted on meta),
  // for rows and a plan when the plain step was recorded on meta and has no
  // times. Empty: those times are unknown ("-").
  std::function<double(const StepVariant&, int64_t micro_batch)> estimate_ratio;
  std::string estimated_from;  // what estimate_ratio counts: "FLOPs counted on meta"
};

// A transformation of the model or its optimizer that only the front knows
// how to apply (bf16 weights, Adafactor, LoRA via peft, HF gradient
// checkpointing). The planner records it as a row and, when nothing else
// fits, searches it like a lighter optimizer. See Note [How advise plans].
struct AdviseSetting {
  std::string label;  // the row's name and StepVariant::setting
  // Keeps what is trained (HF gradient checkpointing). false: it changes
  // the training (dtype, optimizer, trainable parameters): the plan may use
  // it only with allow_approximate; the row is listed either way.
  bool exact = false;
  // It checkpoints the model itself: the planner adds no checkpointing of
  // the chain to it, only micro-batches.
  bool checkpoints = false;
};

// Which optimizers advise compares with the user's: the rule both fronts
// follow, for the user's optimizer kind ("adam", "momentum", "sgd", "none",
// "<kind>-offload", or another optimizer's class name).
struct OptimizerChoices {
  std::vector<std::string> others;   // rows "optimizer <o> instead of <user>", in order
  std::vector<std::string> lighter;  // the plan may switch to, with allow_approximate, in order
  bool can_offload = false;          // has state, and it is not on the host yet
};
OptimizerChoices optimizer_choices(const std::string& user_kind);

// The layers that mix a batch's samples (AdviseSettings::split_changes), as
// both fronts' messages name them: "the BatchNorm layers (a, b, c and 2
// more)"; "" for none.
std::string mixing_layers_phrase(const std::vector<std::string>& paths);

struct AdviseSettings {
  int64_t batch = 0;
  int64_t budget = -1;         // bytes; < 0: no budget (rows only, no plan)
  int64_t reserve_bytes = 0;   // kept free for the full batch's data
  std::string optimizer;       // the user's, as named in the rows
  bool has_optimizer = true;   // false: zero_grad and optimizer rows do not apply
  bool can_offload = false;    // the user's optimizer can keep its state on the host
  std::string offload_label;   // how the front offloads: "memfit.offload", "adam-offload"
  std::vector<std::string> other_optimizers;  // rows: adam | momentum | sgd
  std::vector<std::string> lighter;           // tried with allow_approximate, in order
  std::vector<std::string> chain;             // block paths; empty: no chain
  std::vector<AdviseSetting> settings;        // the front's, in the order it prefers them
  bool allow_approximate = false;
  // How the front's user allows approximate strategies, as its messages say
  // it: "--allow-approximate" (the CLI), "allow_approximate=True" (Python).
  std::string approximate_flag = "--allow-approximate";
  Progress progress;
  // Budgets of cards, bytes: non-empty asks for the plan of each card too
  // (Advice::cards), from the same recordings. See Note [What fits on which card].
  std::vector<int64_t> cards;
  // Rows that follow from other recordings are predicted, not recorded
  // (AdviseRow::predicted; Note [Rows advise predicts]); false records
  // every row, as a check of the predictions. The plan is recorded either way.
  bool predict_rows = true;
  // The layers that mix a batch's samples in training (BatchNorm), named;
  // empty: none. Micro-batches change what they compute, so the plan splits
  // the batch only with allow_approximate, and such a plan is not exact.
  // See Note [Micro-batches of a model that mixes samples] (advise_search.cpp).
  std::string split_changes;
};

// One strategy at the user's whole batch.
struct AdviseRow {
  std::string name;
  StrategyKind kind = StrategyKind::kBaseline;
  StepVariant variant;
  int64_t peak_bytes = 0;
  int64_t saving_bytes = 0;  // the plain step's peak (same device) - peak
  bool meta = false;         // recorded on the meta device
  double time_ratio = 0;     // step time / the plain step's; < 0: unknown
  bool time_measured = false;  // false: estimated from the recorded times
  bool fits = false;           // peak <= budget (no budget: false)
  double recompute_ns = -1;    // checkpointing: forward time recomputed
  int64_t predicted_peak_bytes = -1;  // checkpointing: the chain model's
  // Not recorded: peak_bytes predicted from the recordings (Note [Rows
  // advise predicts]); the table marks its peak "~".
  bool predicted = false;
};

// What the plan runs: the variant on micro-batches of `micro_batch` samples.
struct AdvisePlan {
  bool found = false;  // false: nothing fits; the fields say the closest
  StepVariant variant;
  int64_t micro_batch = 0;  // 0: the whole batch
  int64_t peak_bytes = 0;   // recorded on a real device at micro_batch
  double time_ratio = 0;    // < 0: unknown
  bool time_measured = false;
  bool exact = true;
  // Recorded on a real device and measured within the budget; false when
  // the front could only record on meta (a model larger than the machine).
  bool verified = false;
  std::string optimizer;  // what it trains with: the user's, a lighter one, "<x>-offload"
  std::string summary;    // "checkpoint blocks 0,2 (2 of 4); micro-batches of 4"
};

// The plan for one card of a "what fits on which card" question.
struct CardPlan {
  int64_t budget = 0;
  AdvisePlan plan;  // plan.found false: nothing fits; plan.peak_bytes the closest
};

// Read as a table or JSON by render/advice_table.h.
struct Advice {
  std::string model;
  std::string chain_description;  // "encoder.layers (3 blocks, found)"; "" none
  int64_t batch = 0;
  int64_t budget = -1;
  int64_t reserve_bytes = 0;
  std::string optimizer;
  int64_t parameter_bytes = 0;
  int64_t plain_peak = 0;     // the plain step, recorded on a real device
  // Every peak here is the CUDA caching allocator's reserved bytes, replayed
  // on the recorded step (the front records for a CUDA target: Report's
  // budget_peak); false: allocated bytes.
  bool cuda_reserved = false;
  double plain_step_ms = 0;   // its recorded time
  std::vector<AdviseRow> rows;
  int64_t chain_batch = 0;    // the batch the chain below was measured at
  std::vector<ChainSegment> segments;
  ChainMemory chain_memory;
  std::vector<ChainPlan> chain_plans;
  AdvisePlan plan;
  int recordings = 0;         // real-device recordings the plan ran
  std::string estimated_from;  // "": "~" times come from the recorded times
  std::vector<std::string> notes;
  // With a budget that nothing meets: the one line a front raises (without
  // its "[advise]"), the closest peak reached and how, what allowing
  // approximate strategies adds, and what fills the plain step's peak.
  std::string does_not_fit;
  // With AdviseSettings::cards: each card's plan, smallest card first.
  std::vector<CardPlan> cards;
};

// "checkpoint blocks 0,2 (2 of 4); autocast bf16; micro-batches of 4"; "the
// plain step" for none.
std::string describe(const StepVariant& v, const std::string& user_optimizer,
                     const std::string& offload_label, int64_t micro_batch = 0);

// Records the strategies and plans for the budget. Throws
// std::invalid_argument for a batch < 1 or a measurer without record.
// With settings.cards, the plan for settings.budget (none: < 0) and then for
// each card, every variant recorded once (plan_cards, plan/advise_cards.cpp).
Advice plan_advice(const AdviseMeasurer& measurer, const AdviseSettings& settings);
Advice plan_cards(const AdviseMeasurer& measurer, const AdviseSettings& settings);

}  // namespace memfit
