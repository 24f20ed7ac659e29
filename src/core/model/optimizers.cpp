#include "memfit/core/model/optimizers.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace memfit {

// Adding an optimizer is an entry here; and, only when its torch class is
// new to LibTorch's side, a branch in make_optimizer (src/torch/profile.cpp).
// Python builds it from torch.optim by its class name, advise rows it and
// ranks it by `states`, and --optimizer lists it, all from this list.
const std::vector<OptimizerSpec>& builtin_optimizers() {
  static const std::vector<OptimizerSpec> specs = [] {
    const std::string adam_state = "Adam exp_avg and exp_avg_sq";
    std::vector<OptimizerSpec> v(5);
    v[0].name = "adam";
    v[0].torch_class = "Adam";
    v[0].states = 2;
    v[0].state_label = adam_state;
    v[1] = v[0];
    v[1].name = std::string("adam") + kOffloadSuffix;
    v[1].on_host = true;
    v[2].name = "momentum";
    v[2].torch_class = "SGD";
    v[2].momentum = 0.9;
    v[2].states = 1;
    v[2].state_label = "momentum buffers";
    v[3].name = "sgd";
    v[3].torch_class = "SGD";
    v[4].name = "none";
    return v;
  }();
  return specs;
}

const OptimizerSpec* find_optimizer(const std::string& name) {
  for (const auto& s : builtin_optimizers()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& s : builtin_optimizers()) v.push_back(s.name);
    return v;
  }();
  return names;
}

bool optimizer_is_adam(const std::string& optimizer) {
  std::string lower = optimizer;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("adam") != std::string::npos;
}

bool optimizer_on_host(const std::string& optimizer) {
  const size_t n = std::strlen(kOffloadSuffix);
  return optimizer.size() > n &&
         optimizer.compare(optimizer.size() - n, n, kOffloadSuffix) == 0;
}

int optimizer_states(const std::string& optimizer) {
  const OptimizerSpec* s = find_optimizer(optimizer);
  return s ? s->states : 2;
}

std::string optimizer_state_label(const std::string& optimizer) {
  const OptimizerSpec* s = find_optimizer(optimizer);
  if (s && !s->state_label.empty()) return s->state_label;
  if (optimizer_is_adam(optimizer)) return find_optimizer("adam")->state_label;
  return "optimizer state";
}

}  // namespace memfit
