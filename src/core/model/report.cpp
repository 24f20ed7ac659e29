#include "memfit/core/model/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "memfit/core/model/allocator_model.h"
#include "memfit/core/model/optimizers.h"
#include "memfit/core/model/units.h"

namespace memfit {
namespace {

// Note [Explaining a phase's delta]
// A delta is explained in units of the parameters' bytes P where that is what
// it is (gradients are 1x P, Adam's state 2x P, momentum 1x P), and per sample
// where it grows with the batch (activations). A peak above both ends of a
// phase is memory the phase allocated and freed again: temporaries.
using CategoryBytes = std::array<int64_t, kNumCategories>;

int64_t at(const CategoryBytes& c, Category k) { return c[static_cast<int>(k)]; }

// Live bytes by category after event index `end` - 1 (all zero for 0).
CategoryBytes live_by_category(const Timeline& t, size_t end) {
  return end == 0 ? CategoryBytes{} : t.breakdown_after(end - 1).by_category;
}

std::string explain(const Timeline::PhaseSummary& s, int64_t p,
                    const ReportInputs& in, const CategoryBytes& before,
                    const CategoryBytes& after) {
  const int64_t d = s.delta;
  std::string note;
  const std::string& n = s.name;
  if (n == kPhaseParameters) {
    // State the user's optimizer and .grad held before the step: Note [State
    // the step starts with] (user_state.py).
    const int64_t state = at(after, Category::kOptimizerState);
    const int64_t grads = at(after, Category::kGradient);
    note = "parameters and buffers on the device: " +
           format_bytes(d - state - grads);
    if (state > 0) note += "; optimizer state held already: " + format_bytes(state);
    if (grads > 0) note += "; gradients held already: " + format_bytes(grads);
  } else if (n == kPhaseInputs) {
    note = "inputs and targets of the batch: " + format_bytes(d);
  } else if (n == kPhaseForward) {
    note = format_signed_bytes(d) + ": activations saved for backward";
    if (in.batch > 0) note += " (" + format_bytes(d / in.batch) + " per sample)";
  } else if (n == kPhaseLoss) {
    note = format_signed_bytes(d) + ": the loss and what its backward needs";
  } else if (n == kPhaseZeroGrad) {
    note = d < 0 ? format_signed_bytes(d) + ": gradients freed (set_to_none)"
                 : "nothing to free";
  } else if (n == kPhaseBackward) {
    const int64_t grads = at(after, Category::kGradient) - at(before, Category::kGradient);
    const int64_t freed = at(before, Category::kActivation) - at(after, Category::kActivation);
    note = format_signed_bytes(grads) + " gradients";
    if (p > 0) note += " (" + format_times(grads, p) + " parameters)";
    if (freed > 0) note += ", -" + format_bytes(freed) + " activations freed";
  } else if (n == kPhaseOptimizerStep) {
    if (d == 0) {
      note = optimizer_on_host(in.optimizer)
                 ? "+0: the optimizer's state and step are on the host"
                 : "+0: optimizer state exists already";
    } else if (p > 0) {
      note = format_signed_bytes(d) + " = " + format_times(d, p) + " parameters";
      note += ": " + optimizer_state_label(in.optimizer);
      if (s.iteration <= 1) note += " (first step)";
    }
  } else {
    note = format_signed_bytes(d);
  }
  // A library's workspace, kept from its first use (Note [Workspaces in a
  // snapshot], snapshot_events.cpp): named, not left inside another category.
  const int64_t workspace =
      at(after, Category::kWorkspace) - at(before, Category::kWorkspace);
  if (workspace > 0) {
    note += "; +" + format_bytes(workspace) +
            " of library workspaces (cuBLAS's, kept from here on)";
  }
  const int64_t transient = s.peak - std::max(s.live_before, s.live_after);
  // Below 1% of the parameters a transient is noise in a one-line note.
  if (p > 0 && transient * 100 < p) return note;
  if (transient > 0 && n != kPhaseForward && n != kPhaseBackward &&
      n != kPhaseParameters && n != kPhaseInputs && p > 0) {
    note += "; peak inside: temporaries of " + format_times(transient, p) +
            " parameters";
  } else if (transient > 0 && n == kPhaseBackward) {
    note += "; peak inside +" + format_bytes(transient) +
            " above its ends (gradients meeting activations)";
  }
  return note;
}

}  // namespace

Report make_report(const Timeline& t, const ReportInputs& in) {
  if (t.empty()) {
    throw std::invalid_argument(
        "[make_report] the recording holds no allocation: nothing ran under "
        "memfit's tracking (was the step run before recording started?)");
  }
  Report r;
  r.model = in.model;
  r.batch = in.batch;
  r.optimizer = in.optimizer;
  r.mode = in.mode;
  const auto peak = t.peak();
  r.peak_bytes = peak.bytes;
  r.peak_phase = t.phase_name(peak.phase);
  r.peak_op = t.op_name(peak.op);
  const auto at_peak = t.breakdown_after(peak.event_index);
  r.categories_at_peak = at_peak.by_category;

  const auto summaries = t.phase_summaries();
  for (size_t i = 0; i < summaries.size(); ++i) {
    const auto& s = summaries[i];
    if (s.name == kPhaseParameters && s.live_after > 0) {
      const auto& span = t.phase_spans()[i];
      if (span.end_event > span.first_event) {
        r.parameter_bytes = t.breakdown_after(span.end_event - 1)
            .by_category[static_cast<int>(Category::kParameter)];
      }
    }
  }
  for (size_t i = 0; i < summaries.size(); ++i) {
    const auto& s = summaries[i];
    const auto& span = t.phase_spans()[i];
    if (span.first_event <= peak.event_index && peak.event_index < span.end_event) {
      r.peak_iteration = s.iteration;
    }
    const CategoryBytes before = live_by_category(t, span.first_event);
    const CategoryBytes after = live_by_category(t, span.end_event);
    r.phases.push_back(PhaseRow{s.name, s.iteration, s.live_after, s.delta, s.peak,
                                explain(s, r.parameter_bytes, in, before, after)});
  }
  // Activations per module: what the first forward left live.
  for (size_t i = 0; i < summaries.size(); ++i) {
    const auto& span = t.phase_spans()[i];
    if (summaries[i].name == kPhaseForward && span.end_event > span.first_event) {
      for (auto& [path, bytes] :
           t.module_bytes_after(span.end_event - 1, Category::kActivation)) {
        r.modules.push_back(ModuleRow{path.empty() ? "(top level)" : path, bytes});
      }
      break;
    }
  }
  return r;
}

CudaEstimate estimate_cuda(const Timeline& timeline, int64_t workspace_bytes) {
  // The replay's allocated bytes hold cuBLASLt's block: See Note
  // [cuBLASLt's block in the replay] (allocator_model.cpp).
  const CudaReplay c = replay_cuda(timeline, std::nullopt, workspace_bytes);
  return CudaEstimate{c.peak_allocated + cuda_workspace_held(workspace_bytes), c.peak_reserved,
                      workspace_bytes};
}

}  // namespace memfit
