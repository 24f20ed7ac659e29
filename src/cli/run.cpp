// The memfit command line: profile | fit | train | advise. See `memfit --help`.
// Runs in the standalone program (main.cpp) and, through the Python
// extension, as the `memfit` command pip installs, where torch's Python meta
// kernels are loaded too.
#include <c10/util/Exception.h>

#include <iostream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "memfit/cli/run.h"

namespace {

const char* kUsage = R"(usage: memfit COMMAND [options]

commands:
  profile   where a training step's memory goes, phase by phase and module
            by module; predicts the peak at batches not run
            memfit profile --model mlp|cnn|gpt|lstm|resnet18 --batch N
                           [--optimizer adam|adam-offload|momentum|sgd|none]
                           [--mode cpu|meta] [--target cpu|cuda]
                           [--iterations K] [--json] [--svg FILE]
                           [--html FILE [--budget SIZE [--advise]]]
                           [--x-axis time|events]
                           [--predict] [--probes 4,8,16]
                           [--cuda-workspace SIZE]
                           [--world-size W [--bucket-view] [--bucket-cap SIZE]
                            [--fsdp2 [--param-dtype bf16|fp16|fp32]
                             [--reduce-dtype bf16|fp16|fp32] [--cpu-offload]]]
            --svg: memory by category over time, the peak annotated
            --html: one self-contained page: the plots (hover for bytes),
            the tables, the peak over batch sizes (from --probes) with
            the --budget line, and with --advise the advise table
            --world-size: each rank's peak under DDP, ZeRO-1/2/3 (FSDP)
            --fsdp2: and under torch's fully_shard, a unit per block of the
            model's chain (gpt), the root owning the rest; the dtypes are
            its MixedPrecisionPolicy; --cpu-offload: the sharded state on
            the host (the row's host bytes)
  fit       the largest batch whose whole step fits a budget: probes grown
            toward the answer, then one whole step at it to verify
            memfit fit --model NAME --budget SIZE [--optimizer ...]
                       [--mode cpu|meta] [--margin SIZE] [--ddp] [--json]
                       [--no-verify] [--target cpu|cuda [--cuda-workspace SIZE]]
            --ddp: each rank's batch, DDP's gradient buckets reserved
            --no-verify: the model's answer, no step at it (said unverified)
            --target cuda: the budget is a card's: held against the CUDA
            caching allocator's reserved bytes, replayed on each step
  train     real training steps on the simulated device (CPU); the batch is
            split into micro-batches that fit, OOMs recovered
            memfit train --model NAME --batch B --budget SIZE [--steps N]
                         [--optimizer ...] [--no-split] [--coupled error|allow]
                         [--plan auto [--allow-approximate]] [--seed S]
                         [--json]
            --plan auto: when even one sample does not fit, train with the
            plan `memfit advise` measures (checkpointing, micro-batches)
  advise    when even one sample does not fit: each strategy recorded on the
            model or predicted from the recordings ("~" peak), with saving,
            time estimated from the recorded step, fits or not; the
            checkpointing rules compared, and the plan: the
            largest micro-batch where the plain step or checkpointing fits,
            recorded to fit and timed against the plain step
            memfit advise --model NAME --batch B --budget SIZE
                          [--optimizer ...] [--allow-approximate]
                          [--mode cpu|meta] [--repeats K] [--json]
                          [--target cpu|cuda [--cuda-workspace SIZE]]
                          [--progress | --quiet] [--cards 8GiB,12GiB,...]
                          [--record-every-row]
            --record-every-row: record the rows advise predicts too
            --cards: the plan of each card too, from the same recordings
            (the budget is then optional)
            --mode meta: rows recorded on the meta device (no compute);
            --repeats 0: the plan's time estimated, not timed
            --target cuda: the budget is a card's: held against the CUDA
            caching allocator's reserved bytes, replayed on each step
  explain   (Python only: the `memfit` command pip installs) a CUDA memory
            snapshot from a real run, as this report: phases, categories,
            findings, the allocator replay held against the card
            memfit explain SNAPSHOT.pickle [--json] [--html FILE]
                           [--predict --model NAME --batch B]

profile, fit and train say each long step (a probe, a verification, a
recorded phase) on stderr as it starts, when stderr is a terminal or with
--progress; --quiet silences them. stdout is the same either way.
--optimizer adam-offload: Adam with its state and step on the host (CPU RAM
beside a GPU); the device keeps parameters and gradients only.
SIZE is a byte count or a number with KiB, MiB, GiB, TiB: 16GiB, 512MiB.
Exit status: 0 done, 1 bad command line or input, 2 out of memory.
)";

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

}  // namespace

// Every error leaves as one line on stderr (Note [One line, one prefix],
// args.h): exit 1 for bad input, 2 for out of memory. Nothing may escape main: an uncaught exception aborts with a
// backtrace and no JSON.
int memfit::cli::run(std::vector<std::string> args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 1 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (wants_help(args)) {
    std::cout << kUsage;
    return 0;
  }
  const std::string where = "memfit " + command + ": ";
  try {
    if (command == "profile") return memfit::cli::profile_command(args);
    if (command == "fit") return memfit::cli::fit_command(args);
    if (command == "train") return memfit::cli::train_command(args);
    if (command == "advise") return memfit::cli::advise_command(args);
    if (command == "explain") {
      std::cerr << "memfit explain is in the Python package: run the `memfit` command pip "
                << "installs, or python -m memfit explain\n";
      return 1;
    }
    std::cerr << "memfit: unknown command '" << command
              << "' (commands: profile, fit, train, advise; see memfit --help)\n";
    return 1;
  } catch (const memfit::cli::UsageError& e) {
    std::cerr << where << e.what() << " (see memfit --help)\n";
    return 1;
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << where << memfit::cli::error_line(e.what_without_backtrace()) << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << where << "the host ran out of memory: the sizes asked for are too "
              << "large for this machine; use --mode meta or smaller sizes\n";
    return 2;
  } catch (const c10::Error& e) {
    const std::string what = memfit::cli::error_line(e.what_without_backtrace());
    if (what.find("can't allocate memory") != std::string::npos) {
      // CPU allocator's own failure: the host is out of memory, not the budget.
      std::cerr << where << "the host ran out of memory (" << what
                << "); use --mode meta or smaller sizes\n";
      return 2;
    }
    std::cerr << where << what << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << where << memfit::cli::error_line(e.what()) << "\n";
    return 1;
  }
}
