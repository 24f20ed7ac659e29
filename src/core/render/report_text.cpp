#include "memfit/core/render/report_text.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "memfit/core/model/units.h"
#include "memfit/core/render/json_writer.h"
#include "memfit/core/render/text_table.h"

namespace memfit {
namespace {

void write_phases(std::ostringstream& out, const Report& report) {
  TextTable phases({"phase", "iter", "live after", "delta", "peak", "why"},
                   {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight,
                    Align::kLeft});
  for (const auto& p : report.phases) {
    phases.add_row({p.name, std::to_string(p.iteration), format_bytes(p.live_after),
                    format_signed_bytes(p.delta_bytes), format_bytes(p.peak_bytes), p.note});
  }
  out << phases.str() << "\n";
}

void write_categories(std::ostringstream& out, const Report& report) {
  TextTable cats({"at the peak", "bytes", "share"}, {Align::kLeft, Align::kRight, Align::kRight});
  for (int c = 0; c < kNumCategories; ++c) {
    const int64_t b = report.categories_at_peak[c];
    if (b == 0) continue;
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%",
                  report.peak_bytes ? 100.0 * static_cast<double>(b) /
                                          static_cast<double>(report.peak_bytes)
                                    : 0.0);
    cats.add_row({std::string(to_string(static_cast<Category>(c))), format_bytes(b), share});
  }
  out << cats.str() << "\n";
}

void write_modules(std::ostringstream& out, const Report& report, size_t max_modules) {
  if (report.modules.empty()) return;
  TextTable mods({"module", "activations saved"}, {Align::kLeft, Align::kRight});
  for (size_t i = 0; i < report.modules.size() && i < max_modules; ++i) {
    mods.add_row({report.modules[i].path, format_bytes(report.modules[i].activation_bytes)});
  }
  out << mods.str();
  if (report.modules.size() > max_modules) {
    out << "(" << report.modules.size() - max_modules << " more modules in --json)\n";
  }
}

void write_cuda(std::ostringstream& out, const CudaEstimate& cuda) {
  out << "\nCUDA estimate: " << format_bytes(cuda.peak_allocated) << " allocated, "
      << format_bytes(cuda.peak_reserved) << " reserved at the peak (caching allocator replayed";
  if (cuda.workspace_bytes > 0) out << ", workspaces " << format_bytes(cuda.workspace_bytes);
  out << ")\n";
}

void write_ranks(std::ostringstream& out, const DataParallelEstimate& dp, int64_t peak_bytes) {
  const DataParallelSetup& d = dp.setup;
  out << "\nPer rank on " << d.world_size << " ranks (buckets " << format_bytes(d.gradient_bytes)
      << "; largest unit " << format_bytes(d.largest_unit_bytes) << "):\n";
  // A host column only where a row keeps bytes there (FSDP2's CPU offload).
  const bool host = std::any_of(dp.per_rank.begin(), dp.per_rank.end(),
                                [](const RankPeak& r) { return r.host_bytes > 0; });
  std::vector<std::string> head = {"sharding", "peak", "vs 1 process", "where", "rule"};
  std::vector<Align> align = {Align::kLeft, Align::kRight, Align::kRight, Align::kLeft,
                              Align::kLeft};
  if (host) {
    head.insert(head.begin() + 2, "host");
    align.insert(align.begin() + 2, Align::kRight);
  }
  TextTable table(head, align);
  for (const RankPeak& r : dp.per_rank) {
    std::vector<std::string> row = {
        std::string(to_string(r.sharding)), format_bytes(r.peak_bytes),
        format_times(r.peak_bytes, std::max<int64_t>(peak_bytes, 1)),
        r.phase + (r.iteration > 0 ? " " + std::to_string(r.iteration) : ""), r.formula};
    if (host) row.insert(row.begin() + 2, format_bytes(r.host_bytes));
    table.add_row(row);
  }
  out << table.str();
}

}  // namespace

std::string to_text(const Report& report, size_t max_modules) {
  std::ostringstream out;
  out << "memfit profile: " << report.model << ", batch " << report.batch << ", optimizer "
      << report.optimizer << ", mode " << report.mode << "\n";
  if (!report.truth.empty()) out << report.truth << "\n";
  out << "peak " << format_bytes(report.peak_bytes) << " in " << report.peak_phase
      << " (iteration " << report.peak_iteration << ")";
  if (!report.peak_op.empty()) out << " at " << report.peak_op;
  out << "\n\n";
  write_phases(out, report);
  write_categories(out, report);
  write_modules(out, report, max_modules);
  if (report.cuda) write_cuda(out, *report.cuda);
  if (report.data_parallel) write_ranks(out, *report.data_parallel, report.peak_bytes);
  for (const auto& n : report.notes) out << "note: " << n << "\n";
  return out.str();
}

std::string to_json(const Report& report, bool pretty) {
  JsonWriter w(pretty);
  w.begin_object();
  w.member("model", report.model);
  w.member("batch", report.batch);
  w.member("optimizer", report.optimizer);
  w.member("mode", report.mode);
  if (!report.truth.empty()) w.member("truth", report.truth);
  w.member("peak_bytes", report.peak_bytes);
  w.key("phases").begin_array();
  for (const auto& p : report.phases) {
    w.begin_object();
    for_each_phase_row_field(
        [&](const char* key, auto field, const char*) { w.member(key, p.*field); });
    w.end_object();
  }
  w.end_array();
  w.key("categories_at_peak").begin_object();
  for (int c = 0; c < kNumCategories; ++c) {
    w.member(to_string(static_cast<Category>(c)), report.categories_at_peak[c]);
  }
  w.end_object();
  w.key("modules").begin_array();
  for (const auto& m : report.modules) {
    w.begin_object().member("path", m.path).member("activation_bytes", m.activation_bytes).end_object();
  }
  w.end_array();
  if (report.cuda) {
    w.key("cuda").begin_object()
        .member("peak_allocated_bytes", report.cuda->peak_allocated)
        .member("peak_reserved_bytes", report.cuda->peak_reserved)
        .member("workspace_bytes", report.cuda->workspace_bytes)
        .end_object();
  }
  if (report.data_parallel) {
    const DataParallelSetup& d = report.data_parallel->setup;
    w.key("data_parallel").begin_object()
        .member("world_size", d.world_size)
        .member("gradient_bytes", d.gradient_bytes)
        .member("gradient_as_bucket_view", d.gradient_as_bucket_view)
        .member("bucket_cap_bytes", d.bucket_cap_bytes)
        .member("largest_unit_bytes", d.largest_unit_bytes);
    w.key("per_rank").begin_array();
    for (const RankPeak& r : report.data_parallel->per_rank) {
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

}  // namespace memfit
