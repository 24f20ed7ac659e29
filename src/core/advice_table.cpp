// How an Advice reads: the table `memfit advise` and memfit.advise() print,
// and its JSON. One place for both fronts.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "memfit/core/advise_plan.h"
#include "memfit/core/json_writer.h"
#include "memfit/core/text_table.h"
#include "memfit/core/units.h"

namespace memfit {
namespace {

std::string ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

// "1.25x" measured, "~1.25x" estimated from the recorded times, "-" unknown.
std::string time_cell(double r, bool measured) {
  if (!(r >= 0)) return "-";
  return (measured ? "" : "~") + ratio(r);
}

void write_variant(JsonWriter& w, const StepVariant& v) {
  w.begin_object();
  w.key("checkpoint").begin_array();
  for (size_t i = 0; i < v.checkpoint.size(); ++i) {
    if (v.checkpoint[i]) w.value(static_cast<int64_t>(i));
  }
  w.end_array();
  w.member("autocast_bf16", v.autocast_bf16)
      .member("zero_grad_in_place", v.zero_grad_in_place)
      .key("optimizer");
  if (v.optimizer.empty()) {
    w.null();
  } else {
    w.value(v.optimizer);
  }
  w.member("host_state", v.host_state).member("step", to_string(v.step));
  // Only a front's setting adds the key: the JSON of advice without one
  // stays as it was.
  if (!v.setting.empty()) w.member("setting", v.setting).member("setting_exact", v.setting_exact);
  w.end_object();
}

void optional_number(JsonWriter& w, const char* name, double v, bool present) {
  w.key(name);
  if (present) {
    w.value(v);
  } else {
    w.null();
  }
}

}  // namespace

std::string Advice::table() const {
  std::ostringstream out;
  const bool has_budget = budget >= 0;
  out << "memfit advise: " << model << ", batch " << batch << ", optimizer " << optimizer
      << ", budget " << (has_budget ? format_bytes(budget) : std::string("none")) << "\n";
  out << "plain step: peak " << format_bytes(plain_peak) << ", " << std::lround(plain_step_ms)
      << " ms per step recorded; parameters and buffers " << format_bytes(parameter_bytes)
      << (reserve_bytes > 0 ? "; " + format_bytes(reserve_bytes) + " kept for the batch's data"
                            : std::string())
      << "\n";
  if (cuda_reserved) {
    out << "peaks: the CUDA caching allocator's reserved bytes (replayed on each recorded "
           "step; the budget is held against them)\n";
  }
  out << "chain: " << (chain_description.empty() ? "none" : chain_description) << "\n\n";
  bool any_meta = false;
  bool any_estimate = false;
  TextTable t({"strategy", "peak", "saving", "time", "fits", "result"},
              {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kLeft,
               Align::kLeft});
  for (const auto& r : rows) {
    any_meta = any_meta || r.meta;
    any_estimate = any_estimate || (!r.time_measured && r.time_ratio >= 0);
    t.add_row({r.name, format_bytes(r.peak_bytes) + (r.meta ? " (meta)" : ""),
               format_bytes(r.saving_bytes), time_cell(r.time_ratio, r.time_measured),
               has_budget ? (r.fits ? "yes" : "no") : "-",
               r.kind == StrategyKind::kEval ? "no training"
               : r.variant.exact()           ? "same"
                                             : "changes"});
  }
  out << t.str();
  if (any_estimate) {
    out << "~: time estimated from "
        << (estimated_from.empty() ? "the recorded step's times" : estimated_from)
        << ", not timed\n";
  }
  if (any_meta) {
    out << "(meta): recorded on the meta device, against the plain step recorded there"
        << (plan.found && !plan.verified ? "\n" : "; the plan is recorded on the device\n");
  }
  if (!chain_plans.empty()) {
    const ChainPlan* every = nullptr;
    for (const auto& c : chain_plans) {
      if (c.rule == "every layer") every = &c;
    }
    out << "\ncheckpointing rules on the chain at batch " << chain_batch
        << (cuda_reserved ? " (predicted allocated bytes, not reserved; recompute as a share "
                            "of checkpointing every block's)\n"
                          : " (predicted; recompute as a share of checkpointing every block's)\n");
    TextTable c({"rule", "blocks", "predicted peak", "recompute", "fits"},
                {Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kLeft});
    for (const auto& p : chain_plans) {
      const double share =
          every && every->recompute_ns > 0 ? p.recompute_ns / every->recompute_ns : 0;
      c.add_row({p.rule, p.indices(), format_bytes(p.predicted_peak), ratio(share),
                 has_budget ? (p.fits ? "yes" : "no") : "-"});
    }
    out << c.str();
  }
  out << "\nplan: " << plan.summary;
  if (plan.found) {
    out << ": peak " << format_bytes(plan.peak_bytes)
        << (plan.verified ? " (measured)" : " (meta, unverified)") << ", time "
        << time_cell(plan.time_ratio, plan.time_measured) << " of the plain step, "
        << (plan.exact ? "same result" : "changes the numbers") << "\n";
  } else if (has_budget) {
    out << ": does not fit (the lowest measured peak, " << format_bytes(plan.peak_bytes) << ")\n";
  } else {
    out << " (no budget to plan for)\n";
  }
  for (const auto& n : notes) out << "note: " << n << "\n";
  if (!cards.empty()) out << "\n" << cards_table();
  return out.str();
}

std::string Advice::to_json(bool pretty) const {
  JsonWriter w(pretty);
  w.begin_object().member("model", model).member("batch", batch).key("budget_bytes");
  if (budget >= 0) {
    w.value(budget);
  } else {
    w.null();
  }
  w.member("optimizer", optimizer)
      .member("parameter_bytes", parameter_bytes)
      .member("peaks", cuda_reserved ? "cuda_reserved" : "allocated")
      .member("plain_peak_bytes", plain_peak)
      .member("plain_step_ms", plain_step_ms);
  w.key("chain");
  if (chain_description.empty()) {
    w.null();
  } else {
    w.begin_object().member("description", chain_description).key("block_paths").begin_array();
    for (const auto& s : segments) w.value(s.name);
    w.end_array().end_object();
  }
  w.key("strategies").begin_array();
  for (const auto& r : rows) {
    w.begin_object().member("name", r.name).member("kind", to_string(r.kind)).key("strategy");
    write_variant(w, r.variant);
    w.member("peak_bytes", r.peak_bytes)
        .member("saving_bytes", r.saving_bytes)
        .member("recorded_on", r.meta ? "meta" : "device");
    optional_number(w, "time_ratio", r.time_ratio, r.time_ratio >= 0);
    w.member("time_measured", r.time_measured)
        .key("fits");
    if (budget >= 0) {
      w.value(r.fits);
    } else {
      w.null();
    }
    w.member("exact", r.variant.exact());
    optional_number(w, "recompute_ns", r.recompute_ns, r.recompute_ns >= 0);
    optional_number(w, "predicted_peak_bytes", static_cast<double>(r.predicted_peak_bytes),
                    r.predicted_peak_bytes >= 0);
    w.end_object();
  }
  w.end_array();
  w.key("checkpoint_rules").begin_array();
  for (const auto& p : chain_plans) {
    w.begin_object()
        .member("rule", p.rule)
        .member("blocks", p.indices())
        .member("predicted_peak_bytes", p.predicted_peak)
        .member("recompute_ns", p.recompute_ns)
        .member("fits", p.fits)
        .end_object();
  }
  w.end_array();
  w.key("plan").begin_object().member("found", plan.found).member("summary", plan.summary);
  w.key("strategy");
  write_variant(w, plan.variant);
  w.member("optimizer", plan.optimizer)
      .member("micro_batch", plan.micro_batch)
      .member("peak_bytes", plan.peak_bytes);
  optional_number(w, "time_ratio", plan.time_ratio, plan.time_ratio >= 0);
  w.member("time_measured", plan.time_measured)
      .member("exact", plan.exact)
      .member("verified", plan.verified)
      .member("recordings", static_cast<int64_t>(recordings))
      .end_object();
  w.key("notes").begin_array();
  for (const auto& n : notes) w.value(n);
  w.end_array();
  if (!cards.empty()) {
    w.key("cards").begin_array();
    for (const auto& c : cards) {
      w.begin_object().member("budget_bytes", c.budget).member("found", c.plan.found)
          .member("summary", c.plan.summary).key("strategy");
      write_variant(w, c.plan.variant);
      w.member("optimizer", c.plan.optimizer).member("micro_batch", c.plan.micro_batch)
          .member("peak_bytes", c.plan.peak_bytes);
      optional_number(w, "time_ratio", c.plan.time_ratio, c.plan.time_ratio >= 0);
      w.member("exact", c.plan.exact).member("verified", c.plan.verified).end_object();
    }
    w.end_array();
  }
  // Only where a front estimated times without a clock (FLOPs on meta).
  if (!estimated_from.empty()) w.member("time_estimated_from", estimated_from);
  w.end_object();
  return w.str();
}

}  // namespace memfit
