#include "memfit/torch/data_parallel.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace memfit {

DataParallelSetup data_parallel_setup(const torch::nn::Module& model, int world_size) {
  if (world_size < 1) {
    throw std::invalid_argument("[data_parallel_setup] world size must be >= 1 ranks, got " +
                                std::to_string(world_size));
  }
  DataParallelSetup d;
  d.world_size = world_size;
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) d.gradient_bytes += p.numel() * p.element_size();
  }
  auto own_bytes = [](const torch::nn::Module& m) {
    int64_t bytes = 0;
    for (const auto& p : m.parameters(/*recurse=*/false)) bytes += p.numel() * p.element_size();
    return bytes;
  };
  d.largest_unit_bytes = own_bytes(model);
  for (const auto& m : model.modules(/*include_self=*/false)) {
    d.largest_unit_bytes = std::max(d.largest_unit_bytes, own_bytes(*m));
  }
  return d;
}

}  // namespace memfit
