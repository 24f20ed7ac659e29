#include "memfit/core/model/event.h"

#include <stdexcept>
#include <string>

namespace memfit {

namespace {

constexpr std::array<std::string_view, kNumCategories> kCategoryNames = {
    "parameter", "buffer",          "input",     "activation",
    "gradient",  "optimizer_state", "temporary", "other",
    "workspace",
};

}  // namespace

std::string_view to_string(Device d) {
  switch (d) {
    case Device::kCPU:
      return "cpu";
    case Device::kMeta:
      return "meta";
    case Device::kCUDA:
      return "cuda";
  }
  return "unknown";  // only reachable through a cast of a bad value
}

std::string_view to_string(Category c) {
  const auto i = static_cast<size_t>(c);
  return i < kCategoryNames.size() ? kCategoryNames[i] : "unknown";
}

Category category_from_string(std::string_view name) {
  for (size_t i = 0; i < kCategoryNames.size(); ++i) {
    if (kCategoryNames[i] == name) return static_cast<Category>(i);
  }
  std::string accepted;
  for (size_t i = 0; i < kCategoryNames.size(); ++i) {
    if (i > 0) accepted += ", ";
    accepted += kCategoryNames[i];
  }
  throw std::invalid_argument("[category_from_string] unknown category '" +
                              std::string(name) + "': use one of " + accepted);
}

}  // namespace memfit
