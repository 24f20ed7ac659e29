// Built-in models for the CLI, the demo, tests and benchmarks: each knows its
// module, how to make a batch of synthetic data, and its loss.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace memfit {

struct Batch {
  at::Tensor inputs;
  at::Tensor target;
};

struct ModelOptions {
  // gpt
  int64_t layers = 4;
  int64_t width = 256;
  int64_t heads = 4;
  int64_t context = 128;
  int64_t vocab = 1024;
  // lstm
  int64_t lstm_hidden = 256;
  int64_t lstm_steps = 32;
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  virtual std::string name() const = 0;
  virtual torch::nn::Module& module() = 0;
  // The forward pass, with a ModuleScope around each submodule.
  virtual at::Tensor forward(const at::Tensor& inputs) = 0;
  // Synthetic data: `batch` samples, the batch dimension first.
  virtual Batch make_batch(int64_t batch, const at::TensorOptions& device,
                           uint64_t seed) const = 0;
  // Mean over the batch (sum when `mean` is false).
  virtual at::Tensor loss(const at::Tensor& output, const at::Tensor& target,
                          bool mean = true) const = 0;
  // The model's chain of blocks that activation checkpointing works on
  // ("blocks.0", ...); empty for a model without one.
  virtual std::vector<std::string> chain() const { return {}; }
  // Which blocks of chain() the forward checkpoints (See Note [How a
  // checkpointed segment runs]): one flag per block, or empty for none.
  // False, and nothing changes, for a model without a chain or flags of the
  // wrong length.
  virtual bool set_checkpointing(const std::vector<bool>& blocks) {
    return blocks.empty();
  }
  virtual std::vector<bool> checkpointing() const { return {}; }
};

// "mlp", "cnn", "gpt", "lstm", "resnet18"; throws std::invalid_argument naming them for
// anything else.
std::unique_ptr<TrainableModel> make_model(const std::string& name,
                                           const ModelOptions& options = {});
std::vector<std::string> model_names();

}  // namespace memfit
