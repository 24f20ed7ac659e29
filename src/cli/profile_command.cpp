#include <c10/util/Exception.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "args.h"
#include "commands.h"
#include "memfit/core/allocator_model.h"
#include "memfit/core/json_writer.h"
#include "memfit/core/svg_plot.h"
#include "memfit/core/units.h"
#include "memfit/torch/data_parallel.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

namespace memfit::cli {
namespace {

// cuBLAS workspace on most GPUs (8 MiB + 128 KiB per handle); Hopper uses
// 32 MiB. Both go through the caching allocator.
constexpr int64_t kDefaultCudaWorkspace = (8 << 20) + (128 << 10);

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

std::string prediction_json(const PeakModel& pm, int64_t batch) {
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
  w.member("bytes_per_sample", at.fit.per_sample);
  w.member("fixed_bytes", at.fit.m0);
  w.key("notes").begin_array();
  for (const auto& n : pm.notes) w.value(n);
  w.end_array();
  w.end_object();
  return w.str();
}

std::string prediction_text(const PeakModel& pm, int64_t batch) {
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
      << " per sample; largest fit residual "
      << pm.max_rel_residual() * 100.0 << "%\n";
  for (const auto& n : pm.notes) out << "note: " << n << "\n";
  return out.str();
}

}  // namespace

int profile_command(const std::vector<std::string>& argv) {
  Args args(argv,
            {"model", "batch", "optimizer", "mode", "target", "iterations", "svg",
             "probes", "cuda-workspace", "layers", "width", "heads", "context",
             "world-size", "bucket-cap"},
            {"json", "predict", "bucket-view"});
  const std::string name = args.require("model");
  ProfileOptions o;
  o.batch = args.get_count("batch", 64);
  o.optimizer = args.choice("optimizer", "adam", optimizer_names());
  o.mode = args.choice("mode", "cpu", {"cpu", "meta"});
  o.iterations = static_cast<int>(args.get_count("iterations", 2));
  const std::string target = args.choice("target", "cpu", {"cpu", "cuda"});
  auto model = make_model(name, model_options(args));

  if (args.has("predict")) {
    const auto probes = parse_probes(args.get("probes", "4,8,16"));
    PeakModel pm = probe_peak_model(*model, o, probes);
    std::cout << (args.has("json") ? prediction_json(pm, o.batch) + "\n"
                                   : prediction_text(pm, o.batch));
    return 0;
  }

  Profile p;
  try {
    p = profile_model(*model, o);
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << "memfit profile: out of memory: " << e.what_without_backtrace()
              << "\n";
    return 2;
  }
  if (target == "cuda") {
    const int64_t workspace = args.has("cuda-workspace")
                                  ? args.get_size("cuda-workspace")
                                  : kDefaultCudaWorkspace;
    CudaReplay replay = replay_cuda(p.timeline, std::nullopt, workspace);
    p.report.cuda = CudaEstimate{replay.peak_allocated + workspace, replay.peak_reserved,
                                 workspace};
  }
  if (args.has("world-size")) {
    const int64_t world = args.get_int("world-size", 2);
    if (world < 1 || world > 1 << 20) {
      throw UsageError("--world-size expects a number of ranks >= 1, got " +
                       std::to_string(world));
    }
    DataParallelSetup d = data_parallel_setup(model->module(), static_cast<int>(world));
    d.gradient_as_bucket_view = args.has("bucket-view");
    if (args.has("bucket-cap")) {
      d.bucket_cap_bytes = args.get_size("bucket-cap");
      if (d.bucket_cap_bytes < 1) throw UsageError("--bucket-cap must be at least 1 byte");
    }
    p.report.data_parallel = DataParallelEstimate{d, per_rank_peaks(p.timeline, d)};
  }
  if (args.has("svg")) {
    const std::string path = args.get("svg", "");
    std::ofstream f(path);
    if (!f) throw UsageError("cannot write --svg file '" + path + "'");
    SvgOptions so;
    so.title = "memfit profile: " + name + ", batch " + std::to_string(o.batch) +
               ", " + o.optimizer;
    f << memory_svg(p.timeline, so);
  }
  if (args.has("json")) {
    std::cout << p.report.to_json(true) << "\n";
  } else {
    std::cout << p.report.table();
    if (args.has("svg")) std::cout << "\ntimeline written to " << args.get("svg", "") << "\n";
  }
  return 0;
}

}  // namespace memfit::cli
