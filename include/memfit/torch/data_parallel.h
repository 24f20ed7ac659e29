// What a model brings to the data-parallel estimate: the bytes DDP's buckets
// hold and the largest unit FSDP gathers. The arithmetic is in core.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <vector>

#include "memfit/core/model/data_parallel.h"

namespace memfit {

// gradient_bytes: the trainable parameters' bytes; largest_unit_bytes: the
// most parameter bytes any single module holds itself (not counting its
// children), i.e. a layer, the unit an FSDP wrap per layer gathers. Throws
// std::invalid_argument for world_size < 1.
DataParallelSetup data_parallel_setup(const torch::nn::Module& model, int world_size);

// `root` under fully_shard on `world_size` ranks, as Python's fsdp2_setup()
// with its default units: each block of `chain` (submodule paths) a unit,
// the root owning every other parameter (no chain: the root alone).
// `param_dtype`/`reduce_dtype`: a MixedPrecisionPolicy's; none: the
// parameters' own. The sizes are the core's fsdp2_unit().
Fsdp2Setup fsdp2_setup(torch::nn::Module& root, const std::vector<std::string>& chain,
                       int world_size, std::optional<at::ScalarType> param_dtype,
                       std::optional<at::ScalarType> reduce_dtype, bool cpu_offload);

}  // namespace memfit
