#include "memfit/core/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "memfit/core/allocator_model.h"
#include "memfit/core/json_writer.h"
#include "memfit/core/text_table.h"
#include "memfit/core/units.h"

namespace memfit {
namespace {

std::string ratio(int64_t bytes, int64_t parameter_bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx",
                static_cast<double>(bytes) / static_cast<double>(parameter_bytes));
  return buf;
}

std::string signed_bytes(int64_t b) {
  return (b > 0 ? "+" : "") + format_bytes(b);
}

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
    note = "parameters and buffers on the device: " + format_bytes(d);
  } else if (n == kPhaseInputs) {
    note = "inputs and targets of the batch: " + format_bytes(d);
  } else if (n == kPhaseForward) {
    note = signed_bytes(d) + ": activations saved for backward";
    if (in.batch > 0) note += " (" + format_bytes(d / in.batch) + " per sample)";
  } else if (n == kPhaseLoss) {
    note = signed_bytes(d) + ": the loss and what its backward needs";
  } else if (n == kPhaseZeroGrad) {
    note = d < 0 ? signed_bytes(d) + ": gradients freed (set_to_none)"
                 : "nothing to free";
  } else if (n == kPhaseBackward) {
    const int64_t grads = at(after, Category::kGradient) - at(before, Category::kGradient);
    const int64_t freed = at(before, Category::kActivation) - at(after, Category::kActivation);
    note = signed_bytes(grads) + " gradients";
    if (p > 0) note += " (" + ratio(grads, p) + " parameters)";
    if (freed > 0) note += ", -" + format_bytes(freed) + " activations freed";
  } else if (n == kPhaseOptimizerStep) {
    if (d == 0) {
      note = optimizer_on_host(in.optimizer)
                 ? "+0: the optimizer's state and step are on the host"
                 : "+0: optimizer state exists already";
    } else if (p > 0) {
      note = signed_bytes(d) + " = " + ratio(d, p) + " parameters";
      if (optimizer_is_adam(in.optimizer)) {
        note += ": Adam exp_avg and exp_avg_sq";
      } else if (in.optimizer == "momentum") {
        note += ": momentum buffers";
      } else {
        note += ": optimizer state";
      }
      if (s.iteration <= 1) note += " (first step)";
    }
  } else {
    note = signed_bytes(d);
  }
  const int64_t transient = s.peak - std::max(s.live_before, s.live_after);
  // Below 1% of the parameters a transient is noise in a one-line note.
  if (p > 0 && transient * 100 < p) return note;
  if (transient > 0 && n != kPhaseForward && n != kPhaseBackward &&
      n != kPhaseParameters && n != kPhaseInputs && p > 0) {
    note += "; peak inside: temporaries of " + ratio(transient, p) +
            " parameters";
  } else if (transient > 0 && n == kPhaseBackward) {
    note += "; peak inside +" + format_bytes(transient) +
            " above its ends (gradients meeting activations)";
  }
  return note;
}

}  // namespace

bool optimizer_is_adam(const std::string& optimizer) {
  std::string lower = optimizer;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  return lower.find("adam") != std::string::npos;
}

bool optimizer_on_host(const std::string& optimizer) {
  const std::string suffix = "-offload";
  return optimizer.size() > suffix.size() &&
         optimizer.compare(optimizer.size() - suffix.size(), suffix.size(),
                           suffix) == 0;
}

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

std::string Report::table(size_t max_modules) const {
  std::ostringstream out;
  out << "memfit profile: " << model << ", batch " << batch << ", optimizer "
      << optimizer << ", mode " << mode << "\n";
  out << "peak " << format_bytes(peak_bytes) << " in " << peak_phase
      << " (iteration " << peak_iteration << ")";
  if (!peak_op.empty()) out << " at " << peak_op;
  out << "\n\n";

  TextTable phases_table({"phase", "iter", "live after", "delta", "peak", "why"},
                         {Align::kLeft, Align::kRight, Align::kRight,
                          Align::kRight, Align::kRight, Align::kLeft});
  for (const auto& p : phases) {
    phases_table.add_row({p.name, std::to_string(p.iteration),
                          format_bytes(p.live_after), signed_bytes(p.delta_bytes),
                          format_bytes(p.peak_bytes), p.note});
  }
  out << phases_table.str() << "\n";

  TextTable cats({"at the peak", "bytes", "share"},
                 {Align::kLeft, Align::kRight, Align::kRight});
  for (int c = 0; c < kNumCategories; ++c) {
    const int64_t b = categories_at_peak[c];
    if (b == 0) continue;
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%",
                  peak_bytes ? 100.0 * static_cast<double>(b) /
                                   static_cast<double>(peak_bytes)
                             : 0.0);
    cats.add_row({std::string(to_string(static_cast<Category>(c))),
                  format_bytes(b), share});
  }
  out << cats.str() << "\n";

  if (!modules.empty()) {
    TextTable mods({"module", "activations saved"}, {Align::kLeft, Align::kRight});
    for (size_t i = 0; i < modules.size() && i < max_modules; ++i) {
      mods.add_row({modules[i].path, format_bytes(modules[i].activation_bytes)});
    }
    out << mods.str();
    if (modules.size() > max_modules) {
      out << "(" << modules.size() - max_modules << " more modules in --json)\n";
    }
  }
  if (cuda) {
    out << "\nCUDA estimate: " << format_bytes(cuda->peak_allocated)
        << " allocated, " << format_bytes(cuda->peak_reserved)
        << " reserved at the peak (caching allocator replayed";
    if (cuda->workspace_bytes > 0) {
      out << ", workspaces " << format_bytes(cuda->workspace_bytes);
    }
    out << ")\n";
  }
  if (data_parallel) {
    const DataParallelSetup& d = data_parallel->setup;
    out << "\nPer rank on " << d.world_size << " ranks (buckets "
        << format_bytes(d.gradient_bytes) << "; largest unit "
        << format_bytes(d.largest_unit_bytes) << "):\n";
    // A host column only where a row keeps bytes there (FSDP2's CPU offload).
    const bool host = std::any_of(data_parallel->per_rank.begin(), data_parallel->per_rank.end(),
                                  [](const RankPeak& r) { return r.host_bytes > 0; });
    std::vector<std::string> head = {"sharding", "peak", "vs 1 process", "where", "rule"};
    std::vector<Align> align = {Align::kLeft, Align::kRight, Align::kRight, Align::kLeft,
                                Align::kLeft};
    if (host) {
      head.insert(head.begin() + 2, "host");
      align.insert(align.begin() + 2, Align::kRight);
    }
    TextTable dp(head, align);
    for (const RankPeak& r : data_parallel->per_rank) {
      std::vector<std::string> row = {
          std::string(to_string(r.sharding)), format_bytes(r.peak_bytes),
          ratio(r.peak_bytes, std::max<int64_t>(peak_bytes, 1)),
          r.phase + (r.iteration > 0 ? " " + std::to_string(r.iteration) : ""), r.formula};
      if (host) row.insert(row.begin() + 2, format_bytes(r.host_bytes));
      dp.add_row(row);
    }
    out << dp.str();
  }
  for (const auto& n : notes) out << "note: " << n << "\n";
  return out.str();
}

std::string Report::to_json(bool pretty) const {
  JsonWriter w(pretty);
  w.begin_object();
  w.member("model", model);
  w.member("batch", batch);
  w.member("optimizer", optimizer);
  w.member("mode", mode);
  w.member("peak_bytes", peak_bytes);
  w.key("phases").begin_array();
  for (const auto& p : phases) {
    w.begin_object();
    for_each_phase_row_field([&](const char* key, auto field) { w.member(key, p.*field); });
    w.end_object();
  }
  w.end_array();
  w.key("categories_at_peak").begin_object();
  for (int c = 0; c < kNumCategories; ++c) {
    w.member(to_string(static_cast<Category>(c)), categories_at_peak[c]);
  }
  w.end_object();
  w.key("modules").begin_array();
  for (const auto& m : modules) {
    w.begin_object()
        .member("path", m.path)
        .member("activation_bytes", m.activation_bytes)
        .end_object();
  }
  w.end_array();
  if (cuda) {
    w.key("cuda").begin_object()
        .member("peak_allocated_bytes", cuda->peak_allocated)
        .member("peak_reserved_bytes", cuda->peak_reserved)
        .member("workspace_bytes", cuda->workspace_bytes)
        .end_object();
  }
  if (data_parallel) {
    const DataParallelSetup& d = data_parallel->setup;
    w.key("data_parallel").begin_object()
        .member("world_size", d.world_size)
        .member("gradient_bytes", d.gradient_bytes)
        .member("gradient_as_bucket_view", d.gradient_as_bucket_view)
        .member("bucket_cap_bytes", d.bucket_cap_bytes)
        .member("largest_unit_bytes", d.largest_unit_bytes);
    w.key("per_rank").begin_array();
    for (const RankPeak& r : data_parallel->per_rank) {
      w.begin_object()
          .member("sharding", to_string(r.sharding))
          .member("peak_bytes", r.peak_bytes)
          .member("phase", r.phase)
          .member("iteration", r.iteration)
          .member("formula", r.formula)
          .member("host_bytes", r.host_bytes)
          .end_object();
    }
    w.end_array().end_object();
  }
  w.end_object();
  return w.str();
}

CudaEstimate estimate_cuda(const Timeline& timeline, int64_t workspace_bytes) {
  const CudaReplay c = replay_cuda(timeline, std::nullopt, workspace_bytes);
  return CudaEstimate{c.peak_allocated + workspace_bytes, c.peak_reserved, workspace_bytes};
}

}  // namespace memfit
