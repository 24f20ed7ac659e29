#include "memfit/core/plan/ddp_budget.h"

#include "memfit/core/model/units.h"
#include "memfit/core/plan/batch_fit.h"

namespace memfit {

int64_t budget_beside_ddp_buckets(int64_t budget, int64_t bucket_bytes,
                                  const std::string& op,
                                  const std::string& shard_hint) {
  if (bucket_bytes >= budget) {
    throw DoesNotFit((op.empty() ? std::string() : "[" + op + "] ") +
                     "DDP's gradient buckets alone take " +
                     format_bytes(bucket_bytes) + " of the " +
                     format_bytes(budget) +
                     " budget: use a bigger card, or shard (" + shard_hint +
                     " shows ZeRO/FSDP per rank)");
  }
  return budget - bucket_bytes;
}

}  // namespace memfit
