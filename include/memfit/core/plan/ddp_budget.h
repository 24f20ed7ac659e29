// What one rank's step may use of a budget under DDP, for `memfit fit --ddp`
// and memfit.find_batch_size on a DistributedDataParallel model alike.
#pragma once

#include <cstdint>
#include <string>

namespace memfit {

// DDP's gradient buckets (one copy of the gradients, `bucket_bytes`) are
// held from wrapping on, at every phase (Note [One rank's memory under data
// parallelism], data_parallel.cpp): the step gets the rest of `budget`.
// Throws DoesNotFit (batch_fit.h) when the buckets alone take the budget;
// the message starts with "[op] " (none when `op` is empty) and names
// `shard_hint`, where the front shows ZeRO/FSDP per rank.
int64_t budget_beside_ddp_buckets(int64_t budget, int64_t bucket_bytes,
                                  const std::string& op,
                                  const std::string& shard_hint);

}  // namespace memfit
