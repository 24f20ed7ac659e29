#include <iostream>

#include "args.h"
#include "commands.h"
#include "memfit/torch/fit.h"

namespace memfit::cli {

int fit_command(const std::vector<std::string>& argv) {
  Args args(argv, {"model", "budget", "optimizer", "mode", "margin", "layers",
                   "width", "heads", "context"},
            {"json"});
  const std::string name = args.require("model");
  FitOptions o;
  o.budget = args.get_size("budget");
  o.optimizer = args.choice("optimizer", "adam", {"adam", "sgd", "momentum", "none"});
  o.mode = args.choice("mode", "cpu", {"cpu", "meta"});
  if (args.has("margin")) o.extra_margin = args.get_size("margin");
  auto model = make_model(name, model_options(args));
  try {
    BatchFit f = fit_model(*model, o);
    std::cout << (args.has("json") ? f.to_json(true) + "\n" : f.text());
  } catch (const DoesNotFit& e) {
    std::cerr << "memfit fit: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace memfit::cli
