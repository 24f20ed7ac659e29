#include "memfit/core/model/phase_category.h"

namespace memfit {

Category default_category(std::string_view phase) {
  if (phase == "parameters") return Category::kParameter;
  if (phase == "inputs") return Category::kInput;
  if (phase == "forward" || phase == "loss") return Category::kActivation;
  if (phase == "backward") return Category::kGradient;
  if (phase == "optimizer_step") return Category::kOptimizerState;
  return Category::kOther;
}

}  // namespace memfit
