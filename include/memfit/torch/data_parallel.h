// What a model brings to the data-parallel estimate: the bytes DDP's buckets
// hold and the largest unit FSDP gathers. The arithmetic is in core.
#pragma once

#include <torch/nn/module.h>

#include "memfit/core/data_parallel.h"

namespace memfit {

// gradient_bytes: the trainable parameters' bytes; largest_unit_bytes: the
// most parameter bytes any single module holds itself (not counting its
// children), i.e. a layer, the unit an FSDP wrap per layer gathers. Throws
// std::invalid_argument for world_size < 1.
DataParallelSetup data_parallel_setup(const torch::nn::Module& model, int world_size);

}  // namespace memfit
