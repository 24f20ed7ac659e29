#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "memfit/core/model/units.h"
#include "memfit/core/render/advice_table.h"
#include "memfit/core/render/json_writer.h"
#include "memfit/core/render/text_table.h"

namespace memfit {
namespace {

std::string advice_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

// "1.25x" measured, "~1.25x" estimated from the recorded times, "-" unknown.
std::string time_cell(double r, bool measured) {
  if (!(r >= 0)) return "-";
  return (measured ? "" : "~") + advice_ratio(r);
}

// `text` cut at spaces, and a list of blocks ("0,1,2,...") after its
// commas, into lines of at most `width` characters (a piece longer than that
// stays whole): a plan's summary under a table's column.
std::vector<std::string> wrapped(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string word;
  std::string line;
  auto add = [&](const std::string& piece, const char* sep) {
    if (!line.empty() && line.size() + std::strlen(sep) + piece.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : sep) + piece;
  };
  while (words >> word) {
    // A long list goes piece by piece, each piece ending at its comma.
    size_t start = 0;
    const char* sep = " ";
    while (start < word.size()) {
      const size_t comma = word.size() > width ? word.find(',', start) : std::string::npos;
      const size_t end = comma == std::string::npos ? word.size() : comma + 1;
      add(word.substr(start, end - start), sep);
      sep = "";
      start = end;
    }
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

// A row whose `wide` cell is wrapped: its first line beside the other
// cells, the rest in rows of their own under it.
void add_wrapped_row(TextTable& t, std::vector<std::string> cells, size_t wide, size_t width) {
  const std::vector<std::string> lines = wrapped(cells[wide], width);
  cells[wide] = lines[0];
  t.add_row(cells);
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> more(cells.size());
    more[wide] = lines[i];
    t.add_row(more);
  }
}

// What the "result" column says.
constexpr const char* kResultLine =
    "result: same = the plain step's numbers; changes = other numbers (precision, optimizer, "
    "LoRA)";

// The width a long cell (a plan, a row's name, a list of blocks) is wrapped to.
constexpr size_t kPlanWidth = 60;
constexpr size_t kBlocksWidth = 48;  // beside the rule, peak, recompute and fits

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

std::string to_text(const Advice& a) {
  std::ostringstream out;
  const bool has_budget = a.budget >= 0;
  out << "memfit advise: " << a.model << ", batch " << a.batch << ", optimizer " << a.optimizer
      << ", budget " << (has_budget ? format_bytes(a.budget) : std::string("none")) << "\n";
  out << "plain step: peak " << format_bytes(a.plain_peak) << ", "
      << (a.plain_step_ms > 0 ? std::to_string(std::lround(a.plain_step_ms)) + " ms per step recorded"
                              : std::string("not timed"))
      << "; parameters and buffers " << format_bytes(a.parameter_bytes)
      << (a.reserve_bytes > 0 ? "; the batch's data " + format_bytes(a.reserve_bytes) +
                                    " (a plan in micro-batches leaves room for the rest of it)"
                            : std::string())
      << "\n";
  if (a.cuda_reserved) {
    out << "peaks: the CUDA caching allocator's reserved bytes (replayed on each recorded "
           "step; the budget is held against them)\n";
  }
  out << "chain: " << (a.chain_description.empty() ? "none" : a.chain_description) << "\n\n";
  bool any_meta = false;
  bool any_estimate = false;
  bool any_predicted = false;
  TextTable t({"strategy", "peak", "saving", "time", "fits", "result"},
              {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kLeft,
               Align::kLeft});
  for (const auto& r : a.rows) {
    any_meta = any_meta || r.meta;
    any_estimate = any_estimate || (!r.time_measured && r.time_ratio >= 0);
    any_predicted = any_predicted || r.predicted;
    add_wrapped_row(
        t,
        {r.name,
         (r.predicted ? "~" : "") + format_bytes(r.peak_bytes) + (r.meta ? " (meta)" : ""),
         format_bytes(r.saving_bytes), time_cell(r.time_ratio, r.time_measured),
         has_budget ? (r.fits ? "yes" : "no") : "-",
         r.kind == StrategyKind::kEval ? "no training"
         : r.variant.exact()           ? "same"
                                       : "changes"},
        0, kPlanWidth);
  }
  out << t.str() << kResultLine << "\n";
  if (any_estimate) {
    out << "~: time estimated from "
        << (a.estimated_from.empty() ? "the recorded step's times" : a.estimated_from)
        << ", not timed\n";
  }
  if (any_predicted) {
    out << "~ peak: predicted from the recorded rows, not recorded (Note [Rows advise predicts]); "
           "the plan is recorded\n";
  }
  if (any_meta) {
    out << "(meta): recorded on the meta device, against the plain step recorded there"
        << (a.plan.found && !a.plan.verified ? "\n" : "; the plan is recorded on the device\n");
  }
  if (!a.chain_plans.empty()) {
    const ChainPlan* every = nullptr;
    for (const auto& c : a.chain_plans) {
      if (c.rule == "every layer") every = &c;
    }
    out << "\ncheckpointing rules on the chain at batch " << a.chain_batch
        << (a.cuda_reserved ? " (predicted allocated bytes, not reserved;\n"
                            : " (predicted;\n")
        << "recompute as a share of checkpointing every block's)\n";
    TextTable c({"rule", "blocks", "predicted peak", "recompute", "fits"},
                {Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kLeft});
    for (const auto& p : a.chain_plans) {
      const double share =
          every && every->recompute_ns > 0 ? p.recompute_ns / every->recompute_ns : 0;
      add_wrapped_row(c,
                      {p.rule, p.indices(), format_bytes(p.predicted_peak), advice_ratio(share),
                       has_budget ? (p.fits ? "yes" : "no") : "-"},
                      1, kBlocksWidth);
    }
    out << c.str();
  }
  out << "\nplan: " << a.plan.summary;
  if (a.plan.found) {
    out << ": peak " << format_bytes(a.plan.peak_bytes)
        << (a.plan.verified ? " (measured)" : " (meta, unverified)") << ", time "
        << time_cell(a.plan.time_ratio, a.plan.time_measured) << " of the plain step, "
        << (a.plan.exact ? "same result" : "changes the numbers") << "\n";
  } else if (has_budget) {
    out << ": does not fit (the lowest measured peak, " << format_bytes(a.plan.peak_bytes) << ")\n";
  } else {
    out << " (no budget to plan for)\n";
  }
  for (const auto& n : a.notes) out << "note: " << n << "\n";
  if (!a.cards.empty()) out << "\n" << cards_table(a);
  return out.str();
}

std::string to_json(const Advice& a, bool pretty) {
  JsonWriter w(pretty);
  w.begin_object().member("model", a.model).member("batch", a.batch).key("budget_bytes");
  if (a.budget >= 0) {
    w.value(a.budget);
  } else {
    w.null();
  }
  w.member("optimizer", a.optimizer)
      .member("parameter_bytes", a.parameter_bytes)
      .member("peaks", a.cuda_reserved ? "cuda_reserved" : "allocated")
      .member("plain_peak_bytes", a.plain_peak)
      .member("plain_step_ms", a.plain_step_ms);
  w.key("chain");
  if (a.chain_description.empty()) {
    w.null();
  } else {
    w.begin_object().member("description", a.chain_description).key("block_paths").begin_array();
    for (const auto& s : a.segments) w.value(s.name);
    w.end_array().end_object();
  }
  w.key("strategies").begin_array();
  for (const auto& r : a.rows) {
    w.begin_object().member("name", r.name).member("kind", to_string(r.kind)).key("strategy");
    write_variant(w, r.variant);
    w.member("peak_bytes", r.peak_bytes)
        .member("saving_bytes", r.saving_bytes)
        .member("recorded_on", r.meta ? "meta" : "device")
        .member("predicted", r.predicted);
    optional_number(w, "time_ratio", r.time_ratio, r.time_ratio >= 0);
    w.member("time_measured", r.time_measured)
        .key("fits");
    if (a.budget >= 0) {
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
  for (const auto& p : a.chain_plans) {
    w.begin_object()
        .member("rule", p.rule)
        .member("blocks", p.indices())
        .member("predicted_peak_bytes", p.predicted_peak)
        .member("recompute_ns", p.recompute_ns)
        .member("fits", p.fits)
        .end_object();
  }
  w.end_array();
  w.key("plan").begin_object().member("found", a.plan.found).member("summary", a.plan.summary);
  w.key("strategy");
  write_variant(w, a.plan.variant);
  w.member("optimizer", a.plan.optimizer)
      .member("micro_batch", a.plan.micro_batch)
      .member("peak_bytes", a.plan.peak_bytes);
  optional_number(w, "time_ratio", a.plan.time_ratio, a.plan.time_ratio >= 0);
  w.member("time_measured", a.plan.time_measured)
      .member("exact", a.plan.exact)
      .member("verified", a.plan.verified)
      .member("recordings", static_cast<int64_t>(a.recordings))
      .end_object();
  w.key("notes").begin_array();
  for (const auto& n : a.notes) w.value(n);
  w.end_array();
  if (!a.cards.empty()) {
    w.key("cards").begin_array();
    for (const auto& c : a.cards) {
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
  if (!a.estimated_from.empty()) w.member("time_estimated_from", a.estimated_from);
  w.end_object();
  return w.str();
}

AdviceTable advice_table(const Advice& a) {
  AdviceTable t;
  t.budget_bytes = a.budget >= 0 ? a.budget : 0;
  t.plain_peak_bytes = a.plain_peak;
  const bool has_budget = a.budget >= 0;
  for (const AdviseRow& r : a.rows) {
    t.rows.push_back(AdviceRow{r.name, r.peak_bytes, r.saving_bytes, r.time_ratio,
                               has_budget ? std::optional<bool>(r.fits) : std::nullopt,
                               r.kind == StrategyKind::kEval ? "no training"
                               : r.variant.exact()           ? "same"
                                                             : "changes",
                               r.predicted});
  }
  if (a.plan.found) {
    t.plan = a.plan.summary + ": peak " + format_bytes(a.plan.peak_bytes) + " (measured)";
  } else if (has_budget) {
    t.plan = a.plan.summary + ": does not fit (lowest measured peak " +
             format_bytes(a.plan.peak_bytes) + ")";
  } else {
    t.plan = a.plan.summary;
  }
  t.notes = a.notes;
  return t;
}

std::string cards_table(const Advice& a) {
  if (a.cards.empty()) return "";
  std::ostringstream out;
  out << "what fits on which card: " << a.model << ", batch " << a.batch << ", optimizer "
      << a.optimizer << "; peaks in "
      << (a.cuda_reserved ? "the CUDA caching allocator's reserved bytes"
                          : "allocated bytes (not a card's reserved bytes)")
      << "\n";
  TextTable t({"card", "plan", "peak", "time", "result"},
              {Align::kRight, Align::kLeft, Align::kRight, Align::kRight, Align::kLeft});
  // A card nothing fits shows the least peak any card's search measured:
  // its own search's closest may be above a larger card's plan.
  const AdvisePlan* least = nullptr;
  for (const auto& c : a.cards) {
    if (c.plan.peak_bytes > 0 && (!least || c.plan.peak_bytes < least->peak_bytes))
      least = &c.plan;
  }
  bool unverified = false;
  for (const auto& c : a.cards) {
    const AdvisePlan& p = c.plan;
    if (!p.found) {
      const AdvisePlan& l = least ? *least : p;
      add_wrapped_row(t,
                      {format_bytes(c.budget), "nothing measured fits; the least measured: " +
                                                   l.summary,
                       format_bytes(l.peak_bytes), "-", "-"},
                      1, kPlanWidth);
      continue;
    }
    unverified = unverified || !p.verified;
    add_wrapped_row(t,
                    {format_bytes(c.budget), p.summary,
                     format_bytes(p.peak_bytes) + (p.verified ? "" : " (meta)"),
                     time_cell(p.time_ratio, p.time_measured), p.exact ? "same" : "changes"},
                    1, kPlanWidth);
  }
  out << t.str() << kResultLine << "\n";
  out << "time: of the plain step of the whole batch; ~ estimated"
      << (a.estimated_from.empty() ? " from the recorded times" : " from " + a.estimated_from)
      << (unverified ? "; (meta): recorded on the meta device only, unverified" : "") << "\n";
  return out.str();
}

}  // namespace memfit
