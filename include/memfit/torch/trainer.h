// Runs the batch the user asked for, whatever the memory: split along the
// batch into micro-batches that fit, gradients accumulated to equal the full
// batch's, one optimizer step; an OOM in a micro-batch halves it and redoes
// it, without losing or repeating a sample.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "memfit/core/model/chunk_coverage.h"
#include "memfit/core/model/oom_cause.h"

namespace torch::nn {
class Module;
}

namespace memfit {
namespace impl {
class TouchHooks;
}

// What to do with layers whose output for a sample depends on the others in
// the batch (BatchNorm in training mode) when the batch must be split.
enum class CoupledLayers {
  kError,  // refuse, naming the layers and the options (the default)
  kAllow,  // split anyway: those layers see micro-batch statistics
};

struct TrainerOptions {
  // Simulated device budget for the step (CPU); none on a real GPU, where
  // the card's memory is the limit.
  std::optional<int64_t> budget;
  bool split = true;  // false: run the batch whole, and let an OOM out
  CoupledLayers coupled = CoupledLayers::kError;
  // The loss is a mean over samples (weight each micro-batch by its share)
  // or a sum (weight 1).
  bool mean_loss = true;
  // First micro-batch size to try; 0: the whole batch.
  int64_t micro_batch = 0;
  // Run the forward and loss (chunk_loss) under CPU autocast in bfloat16.
  bool autocast_bf16 = false;
};

struct StepReport {
  int64_t batch = 0;
  int64_t micro_batch = 0;      // the largest micro-batch that ran
  int64_t micro_batches = 0;    // how many ran to completion
  int64_t ooms_recovered = 0;
  int64_t samples = 0;          // samples whose gradient was accumulated
  double loss = 0;              // of the whole batch (mean or sum)
  int64_t peak_bytes = 0;       // most tracked bytes live on the CPU at once
  std::vector<int64_t> chunks;  // sizes in the order they completed
  // What makes this step differ from one eager step on the whole batch
  // (the Python Trainer's: dropout's masks drawn per micro-batch).
  std::vector<std::string> notes;
};

class Trainer {
 public:
  // Forward and loss of samples [start, start + count): an unweighted scalar.
  using ChunkLoss = std::function<at::Tensor(int64_t start, int64_t count)>;

  // `params`: the parameters the optimizer updates. `optimizer_step` steps
  // it. `coupled_layers`: names of batch-coupled layers (see CoupledLayers).
  Trainer(std::vector<at::Tensor> params, std::function<void()> optimizer_step,
          TrainerOptions options, std::vector<std::string> coupled_layers = {});

  // One optimizer step on a batch of `batch` samples. `batch_bytes`: how
  // much of the device the batch's own inputs and targets take for the whole
  // step (0 when it stays on the host and each micro-batch is moved as it
  // runs); the OOM messages weigh it. Throws std::invalid_argument for
  // batch < 1 or a loss that is not a scalar; c10::OutOfMemoryError,
  // naming the phase and what fills the memory (see oom_cause.h), when even
  // one sample does not fit, when splitting is off and the batch does not
  // fit, or when the optimizer step does not.
  StepReport step(int64_t batch, const ChunkLoss& chunk_loss, int64_t batch_bytes = 0);

  // Convenience for one input and one target tensor, batch along dim 0 of
  // both (`batch_dim` of inputs).
  StepReport step(const at::Tensor& inputs, const at::Tensor& target,
                  const std::function<at::Tensor(const at::Tensor&)>& forward,
                  const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& loss,
                  int64_t batch_dim = 0);

  void set_budget(std::optional<int64_t> budget);
  std::optional<int64_t> budget() const { return options_.budget; }
  // The micro-batch size the next step starts from (0: whole batch).
  int64_t micro_batch() const { return micro_; }
  // Start the next step from `micro_batch` samples (0: the whole batch); a
  // distributed run sets the size all ranks agreed on. Throws for < 0.
  void set_micro_batch(int64_t micro_batch);

 private:
  void run_chunk(const Chunk& chunk, int64_t batch, ChunkCoverage& coverage,
                 impl::TouchHooks& hooks, const ChunkLoss& chunk_loss, StepReport& report);
  void drop_gradients();
  int64_t untracked_parameter_bytes() const;
  std::string out_of_memory(const std::string& what, const std::string& oom,
                            int64_t batch_bytes) const;

  std::vector<at::Tensor> params_;
  std::function<void()> optimizer_step_;
  TrainerOptions options_;
  std::vector<std::string> coupled_;
  int64_t micro_ = 0;
  OomPhase phase_ = OomPhase::kUnknown;  // where the last micro-batch was
};

// Paths of the batch-coupled layers (BatchNorm) of a module in training mode.
std::vector<std::string> coupled_layers_of(const torch::nn::Module& module);

}  // namespace memfit
