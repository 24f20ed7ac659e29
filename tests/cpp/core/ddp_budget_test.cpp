#include "memfit/core/plan/ddp_budget.h"

#include <gtest/gtest.h>

#include "memfit/core/plan/batch_fit.h"

namespace memfit {
namespace {

TEST(DdpBudgetTest, TheStepGetsWhatTheBucketsLeave) {
  EXPECT_EQ(budget_beside_ddp_buckets(16 << 20, 3 << 20, "fit", "x"), 13 << 20);
}

TEST(DdpBudgetTest, BucketsThatTakeTheBudgetDoNotFit) {
  try {
    budget_beside_ddp_buckets(2 << 20, 2 << 20, "find_batch_size",
                              "report.data_parallel()");
    FAIL() << "expected DoesNotFit";
  } catch (const DoesNotFit& e) {
    EXPECT_STREQ(e.what(),
                 "[find_batch_size] DDP's gradient buckets alone take 2.00 MiB "
                 "of the 2.00 MiB "
                 "budget: use a bigger card, or shard (report.data_parallel() "
                 "shows ZeRO/FSDP "
                 "per rank)");
  }
  try {
    budget_beside_ddp_buckets(1 << 20, 2 << 20, "",
                              "memfit profile --world-size W");
    FAIL() << "expected DoesNotFit";
  } catch (const DoesNotFit& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "DDP's gradient buckets alone take 2.00 MiB of the "
                  "1.00 MiB budget",
                  0),
              0u);
  }
}

}  // namespace
}  // namespace memfit
