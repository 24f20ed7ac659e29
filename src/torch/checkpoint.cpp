// Activation checkpointing for LibTorch C++: the backward node that runs a
// segment again. See Note [How a checkpointed segment runs] (checkpoint.h).
#include "memfit/torch/checkpoint.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include "memfit/torch/compat.h"
#include "memfit/torch/cpu_autocast.h"

namespace memfit {
namespace impl {

// See Note [How a checkpointed segment runs].
class CheckpointBackward final : public torch::autograd::Node {
 public:
  std::function<at::Tensor(const at::Tensor&)> fn;
  at::Tensor input;  // detached
  bool input_requires_grad = false;
  std::vector<at::Tensor> params;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;

  std::string name() const override { return "memfit::CheckpointBackward"; }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(input.defined(),
                "[checkpoint] the segment's backward ran twice: its input was "
                "released after the first (retain_graph is not supported)");
    torch::autograd::variable_list result(1 + params.size());
    if (grads.empty() || !grads[0].defined()) return result;
    at::Tensor x = input.detach();
    x.requires_grad_(input_requires_grad);
    at::Tensor out;
    {
      at::AutoGradMode grad_mode(true);
      CpuAutocast precision(autocast, autocast_dtype);
      out = fn(x);
    }
    std::vector<at::Tensor> wrt;
    std::vector<size_t> where;
    if (input_requires_grad) {
      wrt.push_back(x);
      where.push_back(0);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad()) {
        wrt.push_back(params[i]);
        where.push_back(i + 1);
      }
    }
    if (wrt.empty() || !out.requires_grad()) return result;
    auto g =
        torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) result[where[k]] = std::move(g[k]);
    input.reset();
    return result;
  }

  void release_variables() override { input.reset(); }
};

}  // namespace impl

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn,
                      const at::Tensor& input,
                      const std::vector<at::Tensor>& params) {
  bool needs_grad = input.requires_grad();
  for (const auto& p : params) needs_grad = needs_grad || p.requires_grad();
  if (!at::GradMode::is_enabled() || !needs_grad) return fn(input);
  at::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = fn(input);
  }
  auto node = compat::make_node<impl::CheckpointBackward>();
  node->input = input.detach();
  node->input_requires_grad = input.requires_grad();
  node->params = params;
  node->autocast = cpu_autocast_enabled();
  node->autocast_dtype = cpu_autocast_dtype();
  node->set_next_edges(torch::autograd::collect_next_edges(input, params));
  node->fn = std::move(fn);
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace memfit
