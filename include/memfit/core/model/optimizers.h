// The optimizers memfit builds by name, and what an optimizer's name says.
// The one list of them: the command's --optimizer, the Python package's
// optimizer="..." (memfit._native.builtin_optimizers), advise's rows and
// the reports' notes all read it. Each front builds the named class once:
// make_optimizer (torch/profile.h) for LibTorch, OPTIMIZERS
// (python/memfit/_step/training_step.py) for torch.optim.
#pragma once

#include <string>
#include <vector>

namespace memfit {

// A name ending in this keeps its optimizer's state and step on the host
// (host_offload.h, memfit.offload): "adam-offload", "Adam-offload".
inline constexpr const char* kOffloadSuffix = "-offload";

struct OptimizerSpec {
  std::string name;         // as --optimizer and optimizer="..." take it
  std::string torch_class;  // torch.optim's (torch::optim's) class; "": no optimizer
  double lr = 1e-3;         // the learning rate a front builds it with
  double momentum = 0;      // SGD's momentum; 0: none
  bool on_host = false;     // its state and step on the host (kOffloadSuffix)
  // Tensors of state it keeps per trainable parameter, each the
  // parameter's size: Adam 2 (exp_avg, exp_avg_sq), momentum 1, SGD 0.
  int states = 0;
  std::string state_label;  // a report's words for that state; "": "optimizer state"
};

// In the order --optimizer lists them: adam, adam-offload, momentum, sgd, none.
const std::vector<OptimizerSpec>& builtin_optimizers();

// The built-in optimizer `name`, or nullptr for any other name (a Python
// optimizer's class name, a typo).
const OptimizerSpec* find_optimizer(const std::string& name);

// The built-in names, in builtin_optimizers() order.
const std::vector<std::string>& optimizer_names();

// What an optimizer's name (as Report::optimizer holds it: a built-in name
// or a Python optimizer's class name) says: an Adam variant (adam, Adam,
// AdamW, adam-offload, ...); its state and step kept on the host (the
// kOffloadSuffix); tensors of state per parameter (a built-in's states; any
// other class is taken to keep Adam's two); a report's words for its state.
bool optimizer_is_adam(const std::string& optimizer);
bool optimizer_on_host(const std::string& optimizer);
int optimizer_states(const std::string& optimizer);
std::string optimizer_state_label(const std::string& optimizer);

}  // namespace memfit
