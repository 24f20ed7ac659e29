#include "memfit/torch/host_offload.h"

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <stdexcept>

#include "memfit/torch/tracking.h"

namespace memfit {
namespace {

// Where a parameter's host copy lives: the CPU beside a GPU; beside a CPU or
// meta "device", the same device under HostMemory (see Note [Host copies of
// the parameters]).
at::Device host_device_for(const at::Tensor& p) {
  return p.is_cuda() ? at::Device(at::kCPU) : p.device();
}

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

// One group over `params` with a copy of `options`.
std::vector<torch::optim::OptimizerParamGroup> one_group(
    std::vector<at::Tensor> params, const torch::optim::OptimizerOptions& options) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(params), options.clone());
  return groups;
}

}  // namespace

HostOffloadOptimizer::HostOffloadOptimizer(std::vector<at::Tensor> params,
                                           const OptimizerFactory& make)
    : torch::optim::Optimizer(
          std::vector<torch::optim::OptimizerParamGroup>{},
          std::make_unique<torch::optim::OptimizerOptions>()),
      device_params_(std::move(params)) {
  {
    HostMemory host;
    torch::NoGradGuard no_grad;
    for (const auto& p : device_params_) {
      at::Tensor h = p.detach().to(host_device_for(p), /*non_blocking=*/false,
                                  /*copy=*/true);
      h.set_requires_grad(p.requires_grad());
      host_params_.push_back(h);
    }
    inner_ = make(host_params_);
  }
  if (!inner_) {
    throw std::invalid_argument(
        "[host offload] the optimizer factory returned no optimizer");
  }
  if (inner_->param_groups().size() != 1) {
    throw std::invalid_argument(
        "[host offload] the inner optimizer must have one parameter group, got " +
        std::to_string(inner_->param_groups().size()));
  }
  const auto& inner_group = inner_->param_groups().front();
  defaults_ = inner_group.options().clone();
  for (auto& g : one_group(device_params_, inner_group.options())) {
    param_groups_.push_back(std::move(g));
  }
}

at::Tensor HostOffloadOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    torch::AutoGradMode grad_mode(true);
    loss = closure();
  }
  // An LR scheduler changes this optimizer's options: the inner one runs
  // with them.
  inner_->param_groups().front().set_options(param_groups_.front().options().clone());
  torch::NoGradGuard no_grad;
  {
    HostMemory host;
    for (size_t i = 0; i < device_params_.size(); ++i) {
      const at::Tensor& g = device_params_[i].grad();
      at::Tensor& hg = host_params_[i].mutable_grad();
      if (!g.defined()) {
        hg = at::Tensor();  // no gradient: the inner optimizer skips it
        continue;
      }
      if (!hg.defined()) {
        hg = at::empty_like(host_params_[i],
                            host_params_[i].options().pinned_memory(
                                device_params_[i].is_cuda()));
      }
      hg.copy_(g);
      // See Note [Host copies of the parameters]: they follow the device.
      host_params_[i].copy_(device_params_[i]);
    }
    inner_->step();
  }
  for (size_t i = 0; i < device_params_.size(); ++i) {
    if (host_params_[i].grad().defined()) device_params_[i].copy_(host_params_[i]);
  }
  return loss;
}

void HostOffloadOptimizer::save(torch::serialize::OutputArchive& archive) const {
  inner_->save(archive);
}

void HostOffloadOptimizer::load(torch::serialize::InputArchive& archive) {
  HostMemory host;
  inner_->load(archive);
}

int64_t HostOffloadOptimizer::host_bytes() const {
  int64_t bytes = 0;
  for (const auto& h : host_params_) bytes += bytes_of(h) + bytes_of(h.grad());
  for (const auto& [key, state] : inner_->state()) {
    (void)key;
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      bytes += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) +
               bytes_of(adam->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      bytes += bytes_of(sgd->momentum_buffer());
    }
  }
  return bytes;
}

std::unique_ptr<HostOffloadOptimizer> host_offload_adam(std::vector<at::Tensor> params,
                                                        double lr) {
  return std::make_unique<HostOffloadOptimizer>(
      std::move(params), [lr](std::vector<at::Tensor> host) {
        return std::make_unique<torch::optim::Adam>(std::move(host),
                                                    torch::optim::AdamOptions(lr));
      });
}

}  // namespace memfit
