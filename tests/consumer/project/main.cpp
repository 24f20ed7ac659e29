// Profiles a built-in model through the installed API, prints its peak, and
// reads it back from the report's JSON (a render header of the core).
#include <iostream>
#include <string>

#include "memfit/core/render/report_text.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

int main() {
  auto model = memfit::make_model("mlp");
  memfit::ProfileOptions options;
  options.batch = 8;
  const memfit::Profile profile = memfit::profile_model(*model, options);
  std::cout << "mlp batch 8: peak " << profile.report.peak_bytes << " bytes in "
            << profile.report.peak_phase << "\n";
  const std::string json = memfit::to_json(profile.report, false);
  const std::string peak = "\"peak_bytes\":" + std::to_string(profile.report.peak_bytes);
  return profile.report.peak_bytes > 0 && json.find(peak) != std::string::npos ? 0 : 1;
}
