#include "memfit/torch/data_parallel.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_set>

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

Fsdp2Setup fsdp2_setup(torch::nn::Module& root, const std::vector<std::string>& chain,
                       int world_size, std::optional<at::ScalarType> param_dtype,
                       std::optional<at::ScalarType> reduce_dtype, bool cpu_offload) {
  const Fsdp2Precision precision{
      param_dtype ? static_cast<int>(c10::elementSize(*param_dtype)) : 0,
      reduce_dtype ? static_cast<int>(c10::elementSize(*reduce_dtype)) : 0};
  auto shape = [&](const at::Tensor& p) {
    return ParamShape{p.dim() > 0 ? p.size(0) : 1, p.numel(),
                      static_cast<int>(p.element_size()),
                      param_dtype.has_value() && *param_dtype != p.scalar_type()};
  };
  // Each tensor once, in the order of root.parameters() (shared ones as
  // Python's model.parameters() gives them: first place only).
  auto unowned = [&](const std::vector<at::Tensor>& params,
                     std::unordered_set<const c10::TensorImpl*>& seen) {
    std::vector<ParamShape> out;
    for (const at::Tensor& p : params) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(shape(p));
    }
    return out;
  };
  const auto modules = root.named_modules(/*name_prefix=*/"", /*include_self=*/false);
  std::unordered_set<const c10::TensorImpl*> owned, all_seen;
  std::vector<Fsdp2Unit> blocks;
  for (const std::string& path : chain) {
    const auto* m = modules.find(path);
    if (m == nullptr) {
      throw std::invalid_argument("[fsdp2_setup] the chain's block '" + path +
                                  "' is not a submodule of the model");
    }
    blocks.push_back(
        fsdp2_unit(path, unowned((*m)->parameters(), owned), world_size, precision, cpu_offload));
  }
  Fsdp2Setup d;
  d.world_size = world_size;
  d.cpu_offload = cpu_offload;
  d.units.push_back(fsdp2_unit("", unowned(root.parameters(), owned), world_size, precision,
                               cpu_offload));
  d.units.insert(d.units.end(), blocks.begin(), blocks.end());
  d.grad_scale = fsdp2_grad_scale(unowned(root.parameters(), all_seen), precision);
  return d;
}

}  // namespace memfit
