#include <c10/util/Exception.h>

#include <unistd.h>

#include <iostream>

#include "args.h"
#include "commands.h"
#include "memfit/core/model/units.h"
#include "memfit/core/render/advice_table.h"
#include "memfit/torch/strategies.h"

namespace memfit::cli {

int advise_command(const std::vector<std::string>& argv) {
  Args args(argv,
            {"model", "batch", "budget", "optimizer", "repeats", "seed", "mode",
             "layers", "width", "heads", "context", "target", "cuda-workspace", "cards"},
            {"json", "allow-approximate", "progress", "quiet", "record-every-row"});
  const std::string name = args.require("model");
  AdviseOptions o;
  o.batch = args.get_count("batch", 8);
  o.budget = args.has("budget") ? args.get_size("budget", 1) : -1;
  if (args.has("cards")) o.cards = args.get_sizes("cards");
  if (o.budget < 0 && o.cards.empty()) o.budget = args.get_size("budget", 1);  // its message
  o.optimizer =
      args.choice("optimizer", "adam", optimizer_names());
  o.timing_repeats = static_cast<int>(args.get_int("repeats", 1));
  if (o.timing_repeats < 0) throw UsageError("--repeats must be >= 0 (0: the plan's time estimated)");
  o.meta = args.choice("mode", "cpu", {"cpu", "meta"}) == "meta";
  o.seed = static_cast<uint64_t>(args.get_int("seed", 0));
  o.allow_approximate = args.has("allow-approximate");
  o.predict_rows = !args.has("record-every-row");
  const CudaTarget card = cuda_target_of(args);
  o.cuda_target = card.on;
  o.cuda_workspace = card.workspace_bytes;
  auto model = make_model(name, model_options(args));
  // What it records, as it goes, on stderr: on a terminal, or asked for.
  Progress progress;
  if (!args.has("quiet") && (args.has("progress") || isatty(STDERR_FILENO))) {
    progress = Progress([](const std::string& line) { std::cerr << "memfit advise " << line << std::endl; });
  }
  const Advice a = advise(*model, o, progress);
  std::cout << (args.has("json") ? to_json(a, true) + "\n" : to_text(a));
  if (a.plan.found || (a.budget < 0 && !a.cards.empty())) return 0;
  // Exit 2, as every out-of-memory ends, with its one line on stderr.
  std::cerr << "memfit advise: " << a.does_not_fit << "\n";
  return 2;
}

}  // namespace memfit::cli
