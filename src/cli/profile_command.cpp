#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <fstream>
#include <optional>
#include <iostream>
#include <sstream>

#include "args.h"
#include "commands.h"
#include "memfit/core/model/units.h"
#include "memfit/core/render/html_report.h"
#include "memfit/core/render/json_writer.h"
#include "memfit/core/render/report_text.h"
#include "memfit/core/render/stacked_plot.h"
#include "memfit/torch/data_parallel.h"
#include "memfit/torch/fit.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"
#include "memfit/torch/strategies.h"

namespace memfit::cli {
namespace {

std::vector<int64_t> parse_probes(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int64_t b = std::stoll(item, &used);
      if (used != item.size() || b < 1) throw std::invalid_argument(item);
      out.push_back(b);
    } catch (const std::exception&) {
      throw UsageError("--probes expects batches >= 1 separated by commas, "
                       "like 4,8,16; got '" + text + "'");
    }
  }
  if (out.size() < 2) throw UsageError("--probes needs at least two batches");
  return out;
}

std::string prediction_json(const PeakModel& pm, int64_t batch,
                            const std::optional<PredictionCertainty>& sure) {
  JsonWriter w(true);
  w.begin_object();
  w.member("batch", batch);
  w.member("predicted_peak_bytes", pm.predict(batch));
  const PhaseFit& at = pm.peak_phase(batch);
  w.member("peak_phase", at.phase);
  w.member("peak_iteration", at.iteration);
  w.member("mode", pm.mode);
  w.key("probe_batches").begin_array();
  for (auto b : pm.probe_batches) w.value(b);
  w.end_array();
  w.key("probe_peak_bytes").begin_array();
  for (auto b : pm.probe_peaks) w.value(b);
  w.end_array();
  w.member("max_rel_residual", pm.max_rel_residual());
  if (sure) {
    w.member("held_out_error", sure->held_out_error)
        .member("affine", sure->affine)
        .member("beyond_probes", sure->beyond_probes);
    if (sure->predicted_reserved_bytes >= 0) {
      w.member("predicted_reserved_bytes", sure->predicted_reserved_bytes);
    }
  }
  w.member("bytes_per_sample", at.fit.per_sample);
  w.member("fixed_bytes", at.fit.m0);
  w.key("notes").begin_array();
  for (const auto& n : pm.notes) w.value(n);
  w.end_array();
  w.end_object();
  return w.str();
}

std::string prediction_text(const PeakModel& pm, int64_t batch,
                            const std::optional<PredictionCertainty>& sure) {
  std::ostringstream out;
  const PhaseFit& at = pm.peak_phase(batch);
  out << "predicted peak at batch " << batch << ": "
      << format_bytes(pm.predict(batch)) << " in " << at.phase << " (iteration "
      << at.iteration << ")\n";
  out << "  from " << pm.mode << " probes at batches";
  for (size_t i = 0; i < pm.probe_batches.size(); ++i) {
    out << (i ? ", " : " ") << pm.probe_batches[i] << " ("
        << format_bytes(pm.probe_peaks[i]) << ")";
  }
  out << "\n  that phase: " << format_bytes(static_cast<int64_t>(at.fit.m0))
      << " fixed + " << format_bytes(static_cast<int64_t>(at.fit.per_sample))
      << " per sample; largest fit residual " << format_percent(pm.max_rel_residual())
      << "\n";
  if (sure) out << "  " << sure->text() << "\n";
  for (const auto& n : pm.notes) out << "note: " << n << "\n";
  return out.str();
}

// The dtype --param-dtype or --reduce-dtype names; none without the flag.
std::optional<at::ScalarType> dtype_flag(const Args& args, const std::string& flag) {
  if (!args.has(flag)) return std::nullopt;
  const std::string name = args.choice(flag, "", {"bf16", "fp16", "fp32"});
  return name == "bf16" ? at::kBFloat16 : name == "fp16" ? at::kHalf : at::kFloat;
}

void write_file(const std::string& flag, const std::string& path,
                const std::string& text) {
  std::ofstream f(path);
  if (!f) throw UsageError("cannot write --" + flag + " file '" + path + "'");
  f << text;
  if (!f.flush()) throw UsageError("cannot write --" + flag + " file '" + path + "'");
}

}  // namespace

int profile_command(const std::vector<std::string>& argv) {
  Args args(argv,
            {"model", "batch", "optimizer", "mode", "target", "iterations", "svg",
             "html", "budget", "x-axis", "repeats", "probes", "cuda-workspace",
             "layers", "width", "heads", "context", "world-size", "bucket-cap",
             "param-dtype", "reduce-dtype"},
            {"json", "predict", "bucket-view", "fsdp2", "cpu-offload", "advise", "progress",
             "quiet"});
  const std::string name = args.require("model");
  ProfileOptions o;
  o.batch = args.get_count("batch", 64);
  o.optimizer = args.choice("optimizer", "adam", optimizer_names());
  o.mode = args.choice("mode", "cpu", {"cpu", "meta"});
  o.iterations = static_cast<int>(args.get_count("iterations", 2));
  o.progress = progress_of(args);
  const CudaTarget card = cuda_target_of(args);
  o.cuda_target = card.on;  // each recorded step (the probes too) carries the estimate
  o.cuda_workspace = card.workspace_bytes;
  const PlotAxis x_axis = plot_axis_from_string(args.choice("x-axis", "time", {"time", "events"}));
  const int64_t budget = args.has("budget") ? args.get_size("budget", 1) : 0;
  // --probes for --predict; the --html page's curve defaults to 4, 8, 16.
  const std::optional<std::vector<int64_t>> probes =
      args.has("probes") ? std::optional(parse_probes(args.get("probes", ""))) : std::nullopt;
  const int64_t world = args.has("world-size") ? args.get_int("world-size", 2) : 0;
  if (args.has("world-size") && (world < 1 || world > 1 << 20)) {
    throw UsageError("--world-size expects a number of ranks >= 1, got " + std::to_string(world));
  }
  const int64_t bucket_cap = args.has("bucket-cap") ? args.get_size("bucket-cap", 1) : 0;
  if (args.has("advise") && !args.has("budget")) {
    throw UsageError("--advise needs --budget: the strategies are measured against it");
  }
  if (args.has("advise") && !args.has("html")) {
    throw UsageError("--advise adds the advise table to the --html page: give --html FILE "
                     "(or run `memfit advise` for the table alone)");
  }
  if (args.has("fsdp2") && !args.has("world-size")) {
    throw UsageError("--fsdp2 needs --world-size W: the ranks fully_shard shards over");
  }
  for (const char* flag : {"param-dtype", "reduce-dtype", "cpu-offload"}) {
    if (args.has(flag) && !args.has("fsdp2")) {
      throw UsageError(std::string("--") + flag + " is an FSDP2 policy: give it with --fsdp2");
    }
  }
  const std::optional<at::ScalarType> param_dtype = dtype_flag(args, "param-dtype");
  const std::optional<at::ScalarType> reduce_dtype = dtype_flag(args, "reduce-dtype");
  const int64_t repeats = args.get_int("repeats", 1);
  if (repeats < 1) throw UsageError("--repeats must be >= 1");
  auto model = make_model(name, model_options(args));

  if (args.has("predict")) {
    // Fixed --probes, or probes grown toward the batch (Note [Probing
    // toward the answer]), with how sure the prediction is.
    std::optional<PredictionCertainty> sure;
    PeakModel pm;
    if (probes) {
      pm = probe_peak_model(*model, o, *probes);
    } else {
      ProbePlan plan;
      plan.limit_bytes = probe_memory_limit(o.mode);
      const int64_t target = o.batch;
      ProfileOptions each = o;  // the probes say their batch; their phases stay quiet
      each.progress = Progress();
      const ProbedModel probed = probe_toward(
          measure_model(*model, each), [target](const PeakModel&) { return target; }, plan,
          o.progress);
      if (probed.model.phases.empty()) {
        throw UsageError("not even two probes fit this machine's memory: give --probes");
      }
      pm = probed.model;
      for (const auto& n : probed.notes) pm.notes.push_back(n);
      sure = certainty_at(probed, target);
    }
    if (card.on) {
      pm.notes.push_back(
          sure && sure->predicted_reserved_bytes >= 0
              ? "the predicted peak counts allocated bytes; what a card would reserve is the "
                "replay's figure above"
              : "the prediction counts allocated bytes: a card's reserved bytes are estimated "
                "for a profiled batch (without --predict, or with probes grown toward the "
                "batch, not --probes), and `memfit fit --target cuda` fits a batch to them");
    }
    std::cout << (args.has("json") ? prediction_json(pm, o.batch, sure) + "\n"
                                   : prediction_text(pm, o.batch, sure));
    return 0;
  }

  Profile p;
  try {
    p = profile_model(*model, o);
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << "memfit profile: out of memory: " << error_line(e.what_without_backtrace())
              << "\n";
    return 2;
  }
  if (args.has("world-size")) {
    DataParallelSetup d = data_parallel_setup(model->module(), static_cast<int>(world));
    d.gradient_as_bucket_view = args.has("bucket-view");
    if (args.has("bucket-cap")) d.bucket_cap_bytes = bucket_cap;
    o.progress.step("each rank's peak over " + std::to_string(world) + " ranks");
    p.report.data_parallel = DataParallelEstimate{d, per_rank_peaks(p.timeline, d)};
    if (args.has("fsdp2")) {
      // One more row, as Python's sharding="fsdp2" adds it.
      const Fsdp2Setup f = fsdp2_setup(model->module(), model->chain(), static_cast<int>(world),
                                       param_dtype, reduce_dtype, args.has("cpu-offload"));
      p.report.data_parallel->per_rank.push_back(fsdp2_rank_peak(p.timeline, f));
    }
  }
  const std::string title = "memfit profile: " + name + ", batch " +
                            std::to_string(o.batch) + ", " + o.optimizer;
  if (args.has("svg")) {
    StackedPlotOptions so;
    so.title = title;
    so.x_axis = x_axis;
    write_file("svg", args.get("svg", ""), stacked_plot(p.timeline, so).svg());
  }
  if (args.has("html")) {
    HtmlReportOptions ho;
    ho.title = title;
    ho.x_axis = x_axis;
    ho.budget = budget;
    // The prediction curve: probes at small batches, as --predict runs.
    ho.prediction = probe_peak_model(*model, o, probes.value_or(std::vector<int64_t>{4, 8, 16}));
    if (args.has("advise")) {
      AdviseOptions ao;
      ao.batch = o.batch;
      ao.budget = budget;
      ao.optimizer = o.optimizer;
      ao.timing_repeats = static_cast<int>(repeats);
      o.progress.step("advise: measure the strategies under " + format_bytes(budget));
      ho.advice = advice_table(advise(*model, ao));
    }
    write_file("html", args.get("html", ""), html_report(p.report, p.timeline, ho));
  }
  if (args.has("json")) {
    std::cout << to_json(p.report, true) << "\n";
  } else {
    std::cout << to_text(p.report);
    if (args.has("svg")) std::cout << "\ntimeline written to " << args.get("svg", "") << "\n";
    if (args.has("html")) std::cout << "page written to " << args.get("html", "") << "\n";
  }
  return 0;
}

}  // namespace memfit::cli
