#include <iostream>

#include "args.h"
#include "commands.h"
#include "memfit/core/model/units.h"
#include "memfit/core/plan/ddp_budget.h"
#include "memfit/core/render/fit_text.h"
#include "memfit/torch/data_parallel.h"
#include "memfit/torch/fit.h"

namespace memfit::cli {

int fit_command(const std::vector<std::string>& argv) {
  Args args(argv, {"model", "budget", "optimizer", "mode", "margin", "layers",
                   "width", "heads", "context", "target", "cuda-workspace"},
            {"json", "ddp", "no-verify", "progress", "quiet"});
  const std::string name = args.require("model");
  FitOptions o;
  o.budget = args.get_size("budget", 1);
  o.optimizer = args.choice("optimizer", "adam", optimizer_names());
  o.mode = args.choice("mode", "cpu", {"cpu", "meta"});
  if (args.has("margin")) o.extra_margin = args.get_size("margin");
  if (o.extra_margin >= o.budget) {
    throw UsageError("--margin " + format_bytes(o.extra_margin) + " leaves nothing of --budget " +
                     format_bytes(o.budget) + ": give a margin smaller than the budget");
  }
  o.verify = !args.has("no-verify");
  const CudaTarget card = cuda_target_of(args);
  o.cuda_target = card.on;
  o.cuda_workspace = card.workspace_bytes;
  o.progress = progress_of(args);
  auto model = make_model(name, model_options(args));
  try {
    if (args.has("ddp")) {
      // Each rank's batch: the step gets what DDP's buckets leave.
      const int64_t buckets = data_parallel_setup(model->module(), 1).gradient_bytes;
      o.budget = budget_beside_ddp_buckets(o.budget, buckets, "",
                                           "memfit profile --world-size W");
      if (!args.has("json")) {
        std::cout << "per rank under DDP: " << format_bytes(buckets)
                  << " of the budget held by gradient buckets\n";
      }
    }
    BatchFit f = fit_model(*model, o);
    std::cout << (args.has("json") ? to_json(f, true) + "\n" : to_text(f));
  } catch (const DoesNotFit& e) {
    std::cerr << "memfit fit: " << error_line(e.what()) << "\n";
    return 2;
  }
  return 0;
}

}  // namespace memfit::cli
