// The end of Note [How advise plans]: the plan found (or the closest the
// search came) with its time, or the notes and the line a front raises when
// nothing fits the budget.
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "advise_planner.h"
#include "memfit/core/model/oom_cause.h"
#include "memfit/core/model/optimizers.h"
#include "memfit/core/model/units.h"

namespace memfit::impl {

void Planner::finish_plan() {
  AdvisePlan& p = a_.plan;
  if (!accepted_) {
    // A search ruled out before recording (its floor is over) never came
    // close: the closest is also the lowest recorded row the plan may use.
    for (const auto& r : a_.rows) {
      if (r.kind == StrategyKind::kEval || r.predicted ||
          !(r.variant.exact() || s_.allow_approximate))
        continue;
      if (!closest_ || r.peak_bytes < closest_->peak) closest_ = Tried{r.variant, 0, r.peak_bytes};
    }
  }
  const std::optional<Tried>& t = accepted_ ? accepted_ : closest_;
  if (!t) return;
  p.found = accepted_.has_value();
  p.verified = p.found && accepted_verified_;
  if (p.found && !p.verified) {
    // Allocated bytes understate a card: its caching allocator reserves
    // more (the 8B example: 22.30 GiB allocated, 24.15 reserved).
    a_.notes.push_back(
        std::string("the plan is unverified: it was recorded on the meta device only (the "
                    "model's weights are there), so no real step measured it; ") +
        (a_.cuda_reserved
             ? "its peak is the CUDA caching allocator's reserved bytes, replayed on the "
               "recorded step (the CUDA context and other processes are not in it)"
             : "its peak is allocated bytes, and a CUDA card's caching allocator reserves "
               "more: advise for a CUDA target compares the reserved bytes"));
  }
  p.variant = t->variant;
  p.micro_batch = t->micro_batch;
  // See Note [The rest of the batch beside a micro-batch].
  p.peak_bytes = t->peak + rest_at(t->micro_batch);
  // See Note [Micro-batches of a model that mixes samples].
  const bool mixes = p.micro_batch > 0 && !s_.split_changes.empty();
  p.exact = t->variant.exact() && !mixes;
  if (p.found && mixes) {
    a_.notes.push_back("micro-batches of " + std::to_string(p.micro_batch) + " change what " +
                       s_.split_changes + " compute (each micro-batch normalized with its own "
                       "statistics): not the plain step's numbers");
  }
  p.optimizer = t->variant.optimizer.empty() ? s_.optimizer : t->variant.optimizer;
  if (t->variant.host_state) p.optimizer += "-offload";
  p.summary = describe(p.variant, s_.optimizer, s_.offload_label, p.micro_batch);
  if (p.found) {
    if (m_.time_ratio) {
      s_.progress.step("time the plan against the plain step");
      p.time_ratio = m_.time_ratio(p.variant, p.micro_batch);
      p.time_measured = true;
    } else if (p.micro_batch == 0 && p.variant.checkpointed() > 0 && plain_times_.total > 0 &&
               p.variant.checkpoint.size() == a_.segments.size()) {
      // As the checkpointing rows are: the plain step plus the recompute.
      p.time_ratio = 1.0 + chain_recompute_ns(a_.segments, p.variant.checkpoint) /
                               plain_times_.total;
    } else {
      p.time_ratio = estimate_ratio(*accepted_recording_, p.micro_batch);
    }
    if (p.time_ratio < 0) p.time_ratio = counted_ratio(p.variant, p.micro_batch);
    // The rules are compared on the chain the plan's checkpointing was made for.
    for (const auto& [c, chain] : chains_) {
      if (c == (p.micro_batch > 0 ? p.micro_batch : s_.batch) && p.variant.checkpointed() > 0) {
        a_.segments = chain.first;
        a_.chain_memory = chain.second;
        a_.chain_batch = c;
        a_.chain_plans = compare_chain_plans(a_.segments, a_.chain_memory, limit_at(c));
      }
    }
  }
}

// The line a front raises when nothing meets the budget: the lowest peak
// the user's terms reached (a row, or the plan's search with its
// micro-batches), what allowing approximate strategies reaches or adds, and
// what fills the plain step's peak whatever the batch.
std::string Planner::does_not_fit_message(int64_t outside) const {
  const AdviseRow* low = nullptr;     // the lowest row the plan may use
  const AdviseRow* lowest = nullptr;  // the lowest row of all
  std::vector<std::string> settings;  // approximate settings, by label
  for (const auto& r : a_.rows) {
    if (r.kind == StrategyKind::kEval || r.predicted) continue;  // reached: recorded
    if (!lowest || r.peak_bytes < lowest->peak_bytes) lowest = &r;
    if ((r.variant.exact() || s_.allow_approximate) && (!low || r.peak_bytes < low->peak_bytes))
      low = &r;
    if (r.kind == StrategyKind::kSetting && !r.variant.exact()) settings.push_back(r.name);
  }
  int64_t low_peak = low ? low->peak_bytes : a_.plain_peak;
  std::string low_name = low ? low->name : "the plain step";
  if (a_.plan.peak_bytes > 0 && a_.plan.peak_bytes < low_peak) {
    low_peak = a_.plan.peak_bytes;
    low_name = a_.plan.summary;
  }
  std::string m = "no strategy fits the budget of " + format_bytes(s_.budget) +
                  ": the smallest peak memfit reached is " + format_bytes(low_peak) + ", with " +
                  low_name + " (plain step: " + format_bytes(a_.plain_peak) + ")";
  if (lowest && lowest->peak_bytes < low_peak) {
    m += "; " + s_.approximate_flag + " reaches " + format_bytes(lowest->peak_bytes) + " with " +
         lowest->name + ", changing the numbers";
  } else if (!s_.allow_approximate) {
    std::string listed;
    for (const auto& n : settings) listed += (listed.empty() ? "" : ", ") + n;
    m += "; " + s_.approximate_flag + " also tries bf16 autocast and lighter optimizers" +
         (listed.empty() ? "" : " and the settings (" + listed + ")") +
         " combined with these, changing the numbers";
  }
  if (whole_only_) {  // See Note [Micro-batches of a model that mixes samples].
    m += "; micro-batches were not tried: " + s_.split_changes +
         " mix the batch's samples, so splitting it changes the numbers (" +
         s_.approximate_flag + " tries them)";
  }
  const bool state_on_host = optimizer_on_host(s_.optimizer);
  const OomPhase phase = oom_phase_of(plain_.report.peak_phase);
  const OomDiagnosis d = diagnose_oom(phase, oom_memory_of(plain_.report.categories_at_peak),
                                      s_.budget, state_on_host);
  return m + ". Whatever the batch, the plain step peaks at " + format_bytes(outside) +
         " outside forward and backward (parameters, gradients, optimizer state). The plain "
         "step peaks in " + to_string(phase) + ", with " + d.what_fills + ": " + d.advice;
}

void Planner::note_nothing_fits() {
  std::string approximate_settings;
  for (const auto& st : s_.settings) {
    if (!st.exact) approximate_settings += (approximate_settings.empty() ? "" : ", ") + st.label;
  }
  int64_t outside = 0;
  for (const auto& ph : plain_.report.phases) {
    if (ph.name != kPhaseForward && ph.name != kPhaseLoss && ph.name != kPhaseBackward)
      outside = std::max(outside, ph.peak_bytes);
  }
  a_.notes.push_back(
      "nothing measured fits " + format_bytes(s_.budget) + ": the lowest peak is " +
      format_bytes(a_.plan.peak_bytes) +
      (s_.allow_approximate ? ""
       : approximate_settings.empty()
           ? "; allowing approximate strategies (bf16, a lighter optimizer) may help"
           : "; allowing approximate strategies (bf16, a lighter optimizer, " +
                 approximate_settings + ") may help") +
      "; outside forward and backward the step peaks at " + format_bytes(outside) +
      " whatever the batch");
  const OomPhase phase = oom_phase_of(plain_.report.peak_phase);
  const OomDiagnosis d =
      diagnose_oom(phase, oom_memory_of(plain_.report.categories_at_peak), s_.budget,
                   false);
  a_.notes.push_back(std::string("the plain step peaks in ") + to_string(phase) + ", with " +
                     d.what_fills + ": " + d.advice);
  a_.does_not_fit = does_not_fit_message(outside);
}

}  // namespace memfit::impl
