// memfit: profile | fit | train | advise. See `memfit --help`.
#include <iostream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"

namespace {

const char* kUsage = R"(usage: memfit COMMAND [options]

commands:
  profile   where a training step's memory goes, phase by phase and module
            by module; predicts the peak at batches not run
            memfit profile --model mlp|cnn|gpt|lstm --batch N
                           [--optimizer adam|adam-offload|momentum|sgd|none]
                           [--mode cpu|meta] [--target cpu|cuda]
                           [--iterations K] [--json] [--svg FILE]
                           [--predict] [--probes 4,8,16]
                           [--cuda-workspace SIZE]
                           [--world-size W [--bucket-view] [--bucket-cap SIZE]]
            --world-size: each rank's peak under DDP, ZeRO-1/2/3 (FSDP)
  fit       the largest batch whose whole step fits a budget, from probes
            at small batches: no trial-and-error crashes
            memfit fit --model NAME --budget SIZE [--optimizer ...]
                       [--mode cpu|meta] [--margin SIZE] [--ddp] [--json]
            --ddp: each rank's batch, DDP's gradient buckets reserved
  train     real training steps on the simulated device (CPU); the batch is
            split into micro-batches that fit, OOMs recovered
            memfit train --model NAME --batch B --budget SIZE [--steps N]
                         [--optimizer ...] [--no-split] [--coupled error|allow]
                         [--plan auto [--allow-approximate]] [--seed S]
                         [--json]
            --plan auto: when even one sample does not fit, train with the
            plan `memfit advise` measures (checkpointing, micro-batches)
  advise    when even one sample does not fit: each strategy measured on the
            model (peak, saving, time against the plain step, fits or not),
            the checkpointing rules compared, and the cheapest combination
            that fits the budget
            memfit advise --model NAME --batch B --budget SIZE
                          [--optimizer ...] [--allow-approximate]
                          [--repeats K] [--json]

--optimizer adam-offload: Adam with its state and step on the host (CPU RAM
beside a GPU); the device keeps parameters and gradients only.
SIZE is a byte count or a number with KiB, MiB, GiB, TiB: 16GiB, 512MiB.
Exit status: 0 done, 1 bad command line or input, 2 out of memory.
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 1 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "profile") return memfit::cli::profile_command(args);
    if (command == "fit") return memfit::cli::fit_command(args);
    if (command == "train") return memfit::cli::train_command(args);
    if (command == "advise") return memfit::cli::advise_command(args);
    std::cerr << "memfit: unknown command '" << command << "'\n\n" << kUsage;
    return 1;
  } catch (const memfit::cli::UsageError& e) {
    std::cerr << "memfit " << command << ": " << e.what() << "\n\n" << kUsage;
    return 1;
  } catch (const std::invalid_argument& e) {
    std::cerr << "memfit " << command << ": " << e.what() << "\n";
    return 1;
  }
}
