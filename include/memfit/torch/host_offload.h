// Optimizer state kept in host memory: the ZeRO-Offload trade for one GPU.
// An optimizer over host copies of the parameters does the step on the CPU;
// the device keeps only parameters and gradients. Each step copies the
// parameters and gradients to the host and the updated parameters back: no
// optimizer state and no step temporaries on the device, at the price of
// three transfers of the parameters' size and a step on the CPU.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

namespace memfit {

// Makes the optimizer that runs on the host copies.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<at::Tensor> host_params)>;

// Note [Host copies of the parameters]
// The host keeps a copy of each parameter (the inner optimizer's), its
// gradient buffer (pinned when the parameter is on CUDA, so the copy is a
// plain DMA) and the inner optimizer's state: about (2 + state/P) times the
// parameters' bytes in host RAM. On CUDA the host is the CPU; when the CPU
// itself plays the device (a simulated device), host memory is allocated
// under memfit::HostMemory so that it is in no recording and no budget, as
// the CPU RAM beside a card is not the card's. The updated parameters are
// copied into the device parameters' own storage: the step allocates nothing
// on the device, and the result is the inner optimizer's exactly (on the CPU
// the same arithmetic; on CUDA the CPU's rounding instead of the GPU's).
// The host copies follow the device: each step copies the parameters to the
// host with their gradients, so weights changed on the device between steps
// (a checkpoint loaded) are what the step updates; one more transfer of the
// parameters' size than keeping the host copy as the master, and nothing to
// go stale.
class HostOffloadOptimizer : public torch::optim::Optimizer {
 public:
  // `params`: the model's parameters, on any device. The group's options
  // (learning rate, ...) are the inner optimizer's, and changes made to this
  // optimizer's options (an LR scheduler's) reach it at each step.
  HostOffloadOptimizer(std::vector<at::Tensor> params, const OptimizerFactory& make);

  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Bytes the host holds for this optimizer: parameter copies, gradient
  // buffers and the inner optimizer's state (Adam's or SGD's; other
  // optimizers' state is not counted).
  int64_t host_bytes() const;
  torch::optim::Optimizer& inner() { return *inner_; }

 private:
  std::vector<at::Tensor> device_params_;
  std::vector<at::Tensor> host_params_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
};

// Adam (learning rate `lr`, torch's defaults otherwise) with its state and
// step on the host.
std::unique_ptr<HostOffloadOptimizer> host_offload_adam(std::vector<at::Tensor> params,
                                                        double lr);

}  // namespace memfit
