#include "memfit/core/render/fit_text.h"

#include <algorithm>
#include <sstream>

#include "memfit/core/model/units.h"
#include "memfit/core/render/json_writer.h"

namespace memfit {

std::string to_json(const BatchFit& f, bool pretty) {
  JsonWriter w(pretty);
  w.begin_object()
      .member("max_batch", f.max_batch)
      .member("recommended_batch", f.recommended_batch)
      .member("predicted_peak_bytes", f.predicted_peak_bytes)
      .member("budget_bytes", f.budget_bytes)
      .member("margin_bytes", f.margin_bytes)
      .member("trials", f.trials)
      .member("mode", f.mode)
      .member("verified", f.verified)
      .key("measured_peak_bytes");
  if (f.measured_peak_bytes >= 0) {
    w.value(f.measured_peak_bytes);
  } else {
    w.null();
  }
  w.member("held_out_error", f.held_out_error).member("affine", f.affine).key("probes").begin_array();
  for (const ProbeRecord& p : f.probes) {
    w.begin_object().member("batch", p.batch).member("peak_bytes", p.peak_bytes).key(
        "predicted_bytes");
    if (p.predicted_bytes >= 0) {
      w.value(p.predicted_bytes);
    } else {
      w.null();
    }
    w.member("out_of_memory", p.out_of_memory)
        .member("verification", p.verification)
        .end_object();
  }
  w.end_array().key("notes").begin_array();
  for (const std::string& n : f.notes) w.value(n);
  w.end_array().end_object();
  return w.str();
}

std::string to_text(const BatchFit& f) {
  std::ostringstream out;
  out << "largest batch under " << format_bytes(f.budget_bytes) << ": " << f.max_batch
      << " (recommended " << f.recommended_batch << ")\n"
      << "  predicted peak " << format_bytes(f.predicted_peak_bytes) << " in "
      << f.peak_phase << " (iteration " << f.peak_iteration << "): "
      << format_bytes(f.fixed_bytes) << " fixed + "
      << format_bytes(static_cast<int64_t>(f.bytes_per_sample)) << " per sample\n";
  if (f.verified) {
    out << "  verified: a whole step at " << f.max_batch << " peaked at "
        << format_bytes(f.measured_peak_bytes) << "\n";
  } else {
    out << "  unverified: no step ran at " << f.max_batch << "\n";
  }
  int64_t largest = 0;
  for (const ProbeRecord& p : f.probes) {
    if (!p.verification) largest = std::max(largest, p.batch);
  }
  out << "  margin " << format_bytes(f.margin_bytes) << ", " << f.trials
      << " full-size trial step" << (f.trials == 1 ? "" : "s") << ", "
      << f.probes.size() - static_cast<size_t>(f.trials) << " probes up to batch " << largest
      << " in " << f.mode << " mode, worst held-out miss "
      << format_percent(f.held_out_error) << (f.affine ? "" : " (not affine)") << "\n";
  for (const std::string& n : f.notes) out << "  note: " << n << "\n";
  return out.str();
}

}  // namespace memfit
