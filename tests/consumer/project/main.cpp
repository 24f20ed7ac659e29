// Profiles a built-in model through the installed API and prints its peak.
#include <iostream>

#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

int main() {
  auto model = memfit::make_model("mlp");
  memfit::ProfileOptions options;
  options.batch = 8;
  const memfit::Profile profile = memfit::profile_model(*model, options);
  std::cout << "mlp batch 8: peak " << profile.report.peak_bytes << " bytes in "
            << profile.report.peak_phase << "\n";
  return profile.report.peak_bytes > 0 ? 0 : 1;
}
