#include "memfit/core/model/data_parallel.h"

#include "memfit/core/model/report.h"
#include "memfit/core/render/report_text.h"

#include <gtest/gtest.h>

#include <array>
#include <stdexcept>

namespace memfit {
namespace {

class Step {
 public:
  void phase(const char* name, int iteration) { t.begin_phase(name, iteration); }
  void alloc(uint64_t id, int64_t bytes, Category c, const char* op = "") {
    Event e;
    e.kind = EventKind::kAlloc;
    e.id = id;
    e.bytes = bytes;
    e.category = c;
    e.phase = t.current_phase();
    e.op = t.op_index(op);
    t.record(e);
  }
  void free(uint64_t id) {
    Event e;
    e.kind = EventKind::kFree;
    e.id = id;
    e.phase = t.current_phase();
    t.record(e);
  }
  Timeline t;
};

// One iteration; live bytes after each event in the comments. The single
// process peaks at 4500 inside the optimizer step.
Timeline one_step() {
  Step s;
  s.phase("parameters", 0);
  s.alloc(1, 600, Category::kParameter);        // 600
  s.alloc(2, 400, Category::kParameter);        // 1000
  s.phase("forward", 1);
  s.alloc(3, 2000, Category::kActivation);      // 3000
  s.alloc(4, 300, Category::kTemporary);        // 3300
  s.free(4);                                    // 3000
  s.phase("loss", 1);
  s.alloc(5, 10, Category::kActivation);        // 3010
  s.phase("backward", 1);
  s.alloc(6, 500, Category::kGradient);         // 3510: an activation's gradient
  s.alloc(7, 600, Category::kGradient);         // 4110: p1.grad
  s.free(6);                                    // 3610
  s.alloc(8, 400, Category::kGradient);         // 4010: p2.grad
  s.free(3);                                    // 2010
  s.free(5);                                    // 2000
  s.phase("optimizer_step", 1);
  s.alloc(9, 1200, Category::kOptimizerState);  // 3200
  s.alloc(10, 800, Category::kOptimizerState);  // 4000
  s.alloc(11, 500, Category::kTemporary);       // 4500
  s.free(11);                                   // 4000
  s.phase("zero_grad", 1);
  s.free(7);                                    // 3400
  s.free(8);                                    // 3000
  s.t.end_phase();
  return s.t;
}

DataParallelSetup two_ranks() {
  DataParallelSetup d;
  d.world_size = 2;
  d.gradient_bytes = 1000;
  d.bucket_cap_bytes = 300;
  d.largest_unit_bytes = 100;
  return d;
}

TEST(DataParallel, DdpAddsOneCopyOfTheGradientsEverywhere) {
  const RankPeak p = per_rank_peak(one_step(), two_ranks(), Sharding::kDdp);
  EXPECT_EQ(p.peak_bytes, 4500 + 1000);
  EXPECT_EQ(p.phase, "optimizer_step");
  EXPECT_EQ(p.iteration, 1);
  EXPECT_NE(p.formula.find("buckets"), std::string::npos);
}

// With .grad as bucket views, each gradient lives in the bucket: only the
// one being moved counts apart. The activation's gradient (freed inside
// backward) is not a parameter gradient: counting it would give 4610.
TEST(DataParallel, BucketViewsReplaceTheGradients) {
  DataParallelSetup d = two_ranks();
  d.gradient_as_bucket_view = true;
  const RankPeak p = per_rank_peak(one_step(), d, Sharding::kDdp);
  EXPECT_EQ(p.peak_bytes, 4110 - 600 + 600 + 1000);
  EXPECT_EQ(p.phase, "backward");
}

// See Note [Gradients the reducer has not yet moved]: one backward op (an
// LSTM layer's) makes two gradients and then a workspace; the reducer takes
// them only after the op returns, so both sit beside the buckets.
TEST(DataParallel, BucketViewsCountEveryGradientOfOneOp) {
  Step s;
  s.phase("parameters", 0);
  s.alloc(1, 1000, Category::kParameter);
  s.phase("backward", 1);
  s.alloc(2, 300, Category::kGradient, "rnn_backward");     // 1300
  s.alloc(3, 200, Category::kGradient, "rnn_backward");     // 1500
  s.alloc(4, 1000, Category::kTemporary, "rnn_backward");   // 2500
  s.free(4);                                                // 1500
  s.alloc(5, 100, Category::kGradient, "mm");               // 1600: input's gradient
  s.free(5);
  s.phase("optimizer_step", 1);
  s.t.end_phase();
  DataParallelSetup d = two_ranks();
  d.gradient_bytes = 500;
  d.gradient_as_bucket_view = true;
  const RankPeak p = per_rank_peak(s.t, d, Sharding::kDdp);
  // At the workspace: live 2500 - gradients 500 + both arriving + buckets.
  EXPECT_EQ(p.peak_bytes, 2500 - 500 + 500 + 500);
  EXPECT_EQ(p.phase, "backward");
}

// Sharding the optimizer state (2000 -> 1000) moves the peak from the step
// (5500 -> 4500; its temporary is kept whole) to backward.
TEST(DataParallel, Zero1ShardsStateAndStep) {
  const RankPeak p = per_rank_peak(one_step(), two_ranks(), Sharding::kZero1);
  EXPECT_EQ(p.peak_bytes, 4110 + 1000);
  EXPECT_EQ(p.phase, "backward");
}

TEST(DataParallel, Zero2ShardsGradientsAndKeepsOneBucket) {
  // At p1.grad's arrival: live 4110, gradients 600 -> 300 kept, plus the
  // arriving 600 and one 300-byte bucket.
  const RankPeak p = per_rank_peak(one_step(), two_ranks(), Sharding::kZero2);
  EXPECT_EQ(p.peak_bytes, 4110 - 600 + 300 + 600 + 300);
  EXPECT_EQ(p.phase, "backward");
}

TEST(DataParallel, Zero3ShardsParametersAndGathersUnits) {
  // zero2's 4710, parameters 1000 -> 500, three units of 100 in backward.
  const RankPeak p = per_rank_peak(one_step(), two_ranks(), Sharding::kZero3);
  EXPECT_EQ(p.peak_bytes, 4710 - 500 + 300);
  EXPECT_EQ(p.phase, "backward");
}

TEST(DataParallel, OneRankShardsNothing) {
  DataParallelSetup d = two_ranks();
  d.world_size = 1;
  const auto peaks = per_rank_peaks(one_step(), d);
  ASSERT_EQ(peaks.size(), 4u);
  EXPECT_EQ(peaks[0].peak_bytes, 5500);
  EXPECT_EQ(peaks[1].peak_bytes, 5500);
}

// Shards round up: 3 ranks hold ceil(2000 / 3) = 667 of the state.
TEST(DataParallel, ShardsRoundUp) {
  DataParallelSetup d = two_ranks();
  d.world_size = 3;
  d.gradient_bytes = 0;
  const RankPeak p = per_rank_peak(one_step(), d, Sharding::kZero1);
  // optimizer temp alloc: live 4500 - (2000 - 667) = 3167; backward's
  // 4110 is higher.
  EXPECT_EQ(p.peak_bytes, 4110);
  d.gradient_bytes = 1000;
  d.largest_unit_bytes = 0;
  EXPECT_EQ(per_rank_peak(one_step(), d, Sharding::kZero1).peak_bytes, 5110);
}

// Wrapping in DDP broadcasts the parameters as one flat copy, then
// allocates the buckets: 1000 + max(min(1000, cap), 1000) = 2000, lower than
// the step here; with a huge gradient_bytes it is the peak.
TEST(DataParallel, ConstructionPeak) {
  DataParallelSetup d = two_ranks();
  d.gradient_bytes = 100000;
  const RankPeak p = per_rank_peak(one_step(), d, Sharding::kDdp);
  EXPECT_EQ(p.peak_bytes, 4500 + 100000);
  EXPECT_EQ(p.phase, "optimizer_step");
  d.gradient_bytes = 1000;
  d.broadcast_bucket_bytes = 400;
  Step s;
  s.phase("parameters", 0);
  s.alloc(1, 100000, Category::kParameter);
  s.t.end_phase();
  const RankPeak c = per_rank_peak(s.t, d, Sharding::kDdp);
  // The buckets (1000) outweigh the 400-byte broadcast chunk: equal to
  // parameters + G, first reached in "parameters".
  EXPECT_EQ(c.peak_bytes, 100000 + 1000);
  EXPECT_EQ(c.phase, "parameters");
  d.gradient_bytes = 10;
  const RankPeak b = per_rank_peak(s.t, d, Sharding::kZero1);
  EXPECT_EQ(b.peak_bytes, 100000 + 400);  // the broadcast chunk
  EXPECT_EQ(b.phase, "ddp_construction");
}

// torch's ZeroRedundancyOptimizer deals whole parameters, largest first, to
// the least-loaded rank: {1000, 500, 300, 200} on 2 ranks -> {1000} and
// {500, 300, 200}; on 3 -> {1000}, {500}, {300, 200}.
TEST(DataParallel, LargestPartition) {
  EXPECT_DOUBLE_EQ(largest_partition_fraction({300, 1000, 200, 500}, 2), 0.5);
  EXPECT_DOUBLE_EQ(largest_partition_fraction({300, 1000, 200, 500}, 3), 0.5);
  EXPECT_DOUBLE_EQ(largest_partition_fraction({1000, 100}, 2), 1000.0 / 1100);
  EXPECT_DOUBLE_EQ(largest_partition_fraction({7}, 4), 1.0);
  EXPECT_DOUBLE_EQ(largest_partition_fraction({}, 4), 0.25);
  EXPECT_THROW(largest_partition_fraction({1}, 0), std::invalid_argument);
  EXPECT_THROW(largest_partition_fraction({-1}, 2), std::invalid_argument);
}

// {1000} and {500, 300, 200}: half the bytes each, but the second rank
// holds 3 of the 4 parameters: with 8 bytes more per parameter it holds
// (1000 + 24) / (2000 + 32) of the state.
TEST(DataParallel, LargestPartitionCoversPerParameterState) {
  EXPECT_DOUBLE_EQ(largest_partition_fraction({300, 1000, 200, 500}, 2, 8), 1024.0 / 2032);
  EXPECT_DOUBLE_EQ(largest_partition_fraction({1000, 100}, 2, 8), 1000.0 / 1100);
  EXPECT_THROW(largest_partition_fraction({1}, 2, -1), std::invalid_argument);
}

// A rank holding 90% of the state keeps 1800 of its 2000 bytes.
TEST(DataParallel, UnevenOptimizerShards) {
  DataParallelSetup d = two_ranks();
  d.optimizer_shard_fraction = 0.9;
  const RankPeak p = per_rank_peak(one_step(), d, Sharding::kZero1);
  EXPECT_EQ(p.peak_bytes, 5500 - 200);  // in the step, above backward's 5110
  EXPECT_EQ(p.phase, "optimizer_step");
  EXPECT_NE(p.formula.find("0.900"), std::string::npos);
  d.optimizer_shard_fraction = 1.5;
  EXPECT_THROW(per_rank_peaks(one_step(), d), std::invalid_argument);
}

TEST(DataParallel, RejectsBadSetup) {
  DataParallelSetup d = two_ranks();
  d.world_size = 0;
  EXPECT_THROW(per_rank_peaks(one_step(), d), std::invalid_argument);
  d = two_ranks();
  d.gradient_bytes = -1;
  EXPECT_THROW(per_rank_peaks(one_step(), d), std::invalid_argument);
}

TEST(DataParallel, ShardingNames) {
  EXPECT_EQ(sharding_from_string("zero2"), Sharding::kZero2);
  EXPECT_EQ(sharding_from_string("fsdp2"), Sharding::kFsdp2);
  EXPECT_EQ(to_string(Sharding::kFsdp2), "fsdp2");
  EXPECT_EQ(sharding_from_string("fsdp"), Sharding::kZero3);
  EXPECT_EQ(to_string(Sharding::kZero1), "zero1");
  try {
    sharding_from_string("zero4");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ddp, zero1, zero2, zero3"), std::string::npos);
  }
}

// The profile report carries the estimate only when asked for one.
TEST(DataParallel, ReportShowsPerRankPeaks) {
  Report r = make_report(one_step(), {"toy", 4, "adam", "cpu"});
  EXPECT_EQ(to_json(r, false).find("data_parallel"), std::string::npos);
  r.data_parallel = DataParallelEstimate{two_ranks(), per_rank_peaks(one_step(), two_ranks())};
  const std::string json = to_json(r, false);
  EXPECT_NE(json.find("\"data_parallel\":{\"world_size\":2"), std::string::npos);
  EXPECT_NE(json.find("{\"sharding\":\"ddp\",\"peak_bytes\":5500,"
                      "\"phase\":\"optimizer_step\",\"iteration\":1"),
            std::string::npos);
  const std::string table = to_text(r);
  EXPECT_NE(table.find("Per rank on 2 ranks"), std::string::npos);
  EXPECT_NE(table.find("1.22x"), std::string::npos);  // ddp: 5500 / 4500
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// See Note [A rank's optimizer step deals parameters in another order]:
// three equal weights with biases between them; on 2 ranks one rank gets
// two weights side by side, the step holding one more weight than the
// single process's bias-separated order implied.
TEST(StepReorderBytes, EqualWeightsDealtSideBySideHoldOneMore) {
  EXPECT_EQ(step_reorder_bytes({100, 1, 100, 1, 100, 1}, 2), 300 - 201);
  EXPECT_EQ(step_reorder_bytes({100, 1, 100, 1, 100, 1}, 1), 0);  // nothing dealt
  // Already side by side in the single process: no more than it implied.
  EXPECT_EQ(step_reorder_bytes({100, 100, 100, 1, 1, 1}, 2), 0);
  EXPECT_THROW(step_reorder_bytes({1}, 0), std::invalid_argument);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// one_step()'s parameters as two fully_shard units on 2 ranks: "a" (600
// bytes, gathered and reduced whole) and "b" (400), the root holding none.
Fsdp2Setup two_units() {
  Fsdp2Setup d;
  d.world_size = 2;
  d.units = {Fsdp2Unit{"", 0, 0, 0, 0, 0, 0}, Fsdp2Unit{"a", 600, 300, 600, 600, 0, 0},
             Fsdp2Unit{"b", 400, 200, 400, 400, 0, 0}};
  return d;
}

// See Note [One rank's memory under FSDP2]. At p1.grad's arrival (live
// 4110: parameters 1000, p1.grad 600, the rest 2510) the worst instant is
// a's reduce-scatter: sharded parameters 500, p1.grad whole 600, the
// prefetched-nothing + a's reduce-scatter input, gloo's copy and its
// output (600 + 600 + 300).
TEST(Fsdp2, ShardsAndGathersUnitByUnit) {
  const RankPeak p = fsdp2_rank_peak(one_step(), two_units());
  EXPECT_EQ(p.sharding, Sharding::kFsdp2);
  EXPECT_EQ(p.peak_bytes, 2510 + 500 + 600 + 1500);
  EXPECT_EQ(p.phase, "backward");
  EXPECT_EQ(p.host_bytes, 0);
  // The gathered units cost more than the shards save on so small a model.
  EXPECT_GT(p.peak_bytes, 4500);
}

// Offloaded, the device keeps activations, gathered units and the unit's
// whole gradients; the host the shards (500 + 1000 + 500) and the step's
// 500-byte temporary.
TEST(Fsdp2, CpuOffloadSplitsDeviceAndHost) {
  Fsdp2Setup d = two_units();
  d.cpu_offload = true;
  const RankPeak p = fsdp2_rank_peak(one_step(), d);
  EXPECT_EQ(p.peak_bytes, 2510 + 600 + 1500);
  EXPECT_EQ(p.phase, "backward");
  EXPECT_EQ(p.host_bytes, 500 + 1000 + 500 + 500);
}

// bf16 gradients of fp32 parameters: the whole ones cost half, and a's
// reduce-scatter (2510 + 500 + 300 + 1500) falls below b's backward while a
// is prefetched: p1.grad sharded (300), b gathered (400), a's all-gather
// output and gloo's copy (1200).
TEST(Fsdp2, MixedPrecisionHalvesTheUnshardedGradients) {
  Fsdp2Setup d = two_units();
  d.grad_scale = 0.5;
  EXPECT_EQ(fsdp2_rank_peak(one_step(), d).peak_bytes, 2510 + 500 + 300 + 400 + 1200);
}

// A Linear(3, 5) in fp32: weight 5x3, bias 5. On 2 ranks dim 0 pads to 6
// rows, 3 per rank: the weight's shard is 3x3 elements (36 B), the bias's 3
// (12 B); W x the padded shard is 18 + 6 elements.
std::vector<ParamShape> linear_3_to_5(bool cast = false) {
  return {ParamShape{5, 15, 4, cast}, ParamShape{5, 5, 4, cast}};
}

void expect_unit(const Fsdp2Unit& u, std::array<int64_t, 6> bytes) {
  EXPECT_EQ((std::array<int64_t, 6>{u.param_bytes, u.shard_bytes, u.gathered_bytes,
                                    u.reduce_bytes, u.gather_input_bytes, u.grad_cast_bytes}),
            bytes)
      << "unit '" << u.path << "': param, shard, gathered, reduce, gather input, grad cast";
}

TEST(Fsdp2Unit, ShardsDimZeroPaddedToTheWorldSize) {
  const Fsdp2Unit u = fsdp2_unit("0", linear_3_to_5(), 2, {}, false);
  EXPECT_EQ(u.path, "0");
  // param 60 + 20, shard 36 + 12, gathered and reduced 2 x 48 in fp32.
  expect_unit(u, {80, 48, 96, 96, 0, 0});
  // 3 ranks: 2 rows each, 6 of 5 again; 1 rank: no padding.
  expect_unit(fsdp2_unit("0", linear_3_to_5(), 3, {}, false), {80, 32, 96, 96, 0, 0});
  expect_unit(fsdp2_unit("0", linear_3_to_5(), 1, {}, false), {80, 80, 80, 80, 0, 0});
}

TEST(Fsdp2Unit, ZeroDimAndEmptyParameters) {
  // A scalar is one row: padded to 2 on 2 ranks. A 0x4 parameter has none.
  expect_unit(fsdp2_unit("", {ParamShape{1, 1, 4}, ParamShape{0, 0, 4}}, 2, {}, false),
              {4, 4, 8, 8, 0, 0});
  expect_unit(fsdp2_unit("", {}, 2, {}, false), {0, 0, 0, 0, 0, 0});
}

TEST(Fsdp2Unit, Bf16ParamDtypeGathersAndReducesInBf16) {
  // Gathered 2 x 24 elements x 2 B; the reduce dtype follows (48); the
  // shard's cast before the all-gather 24 x 2 B; the reduced gradient cast
  // back to fp32, 24 x 4 B.
  expect_unit(fsdp2_unit("0", linear_3_to_5(true), 2, {2, 0}, false), {80, 48, 48, 48, 24, 48});
  // An fp32 reduce dtype: reduced as the parameters are, no cast back.
  expect_unit(fsdp2_unit("0", linear_3_to_5(true), 2, {2, 4}, false), {80, 48, 48, 96, 24, 0});
  // A bf16 reduce dtype alone: gathered in fp32, reduced in bf16.
  expect_unit(fsdp2_unit("0", linear_3_to_5(), 2, {0, 2}, false), {80, 48, 96, 48, 0, 48});
}

TEST(Fsdp2Unit, CastIsByDtypeNotSize) {
  // fp16 parameters under a bf16 param_dtype: cast (24 x 2 B), same size.
  const std::vector<ParamShape> fp16{{5, 15, 2, true}, {5, 5, 2, true}};
  expect_unit(fsdp2_unit("0", fp16, 2, {2, 0}, false), {40, 24, 48, 48, 24, 0});
  // bf16 parameters under bf16: read in place.
  const std::vector<ParamShape> bf16{{5, 15, 2, false}, {5, 5, 2, false}};
  expect_unit(fsdp2_unit("0", bf16, 2, {2, 0}, false), {40, 24, 48, 48, 0, 0});
  // Without a param_dtype the flag means nothing.
  expect_unit(fsdp2_unit("0", linear_3_to_5(true), 2, {}, false), {80, 48, 96, 96, 0, 0});
}

TEST(Fsdp2Unit, CpuOffloadCopiesTheShardToTheDevice) {
  // The host-to-device copy of the shard (48 B) before the all-gather ...
  expect_unit(fsdp2_unit("0", linear_3_to_5(), 2, {}, true), {80, 48, 96, 96, 48, 0});
  // ... then its cast to bf16 (48 B).
  expect_unit(fsdp2_unit("0", linear_3_to_5(true), 2, {2, 4}, true), {80, 48, 48, 96, 72, 0});
}

TEST(Fsdp2Unit, GradScaleIsTheParamDtypeOverTheWidestParameter) {
  const std::vector<ParamShape> mixed{{5, 15, 4}, {5, 5, 2}};
  EXPECT_EQ(fsdp2_grad_scale(mixed, {}), 1.0);
  EXPECT_EQ(fsdp2_grad_scale(mixed, {2, 4}), 0.5);
  EXPECT_EQ(fsdp2_grad_scale({{5, 15, 8}}, {2, 0}), 0.25);
  // Never above 1: fp32 param_dtype over bf16 parameters; none at all.
  EXPECT_EQ(fsdp2_grad_scale({{5, 15, 2}}, {4, 0}), 1.0);
  EXPECT_EQ(fsdp2_grad_scale({}, {2, 0}), 1.0);
}

TEST(Fsdp2Unit, RejectsBadShapes) {
  EXPECT_THROW(fsdp2_unit("0", linear_3_to_5(), 0, {}, false), std::invalid_argument);
  EXPECT_THROW(fsdp2_unit("0", {{0, 3, 4}}, 2, {}, false), std::invalid_argument);
  EXPECT_THROW(fsdp2_unit("0", {{2, 3, 4}}, 2, {}, false), std::invalid_argument);
  EXPECT_THROW(fsdp2_unit("0", {{2, 4, 0}}, 2, {}, false), std::invalid_argument);
  EXPECT_THROW(fsdp2_unit("0", {{-1, 4, 4}}, 2, {}, false), std::invalid_argument);
  EXPECT_THROW(fsdp2_unit("0", linear_3_to_5(), 2, {-2, 0}, false), std::invalid_argument);
}

TEST(Fsdp2, RejectsBadSetup) {
  Fsdp2Setup d = two_units();
  d.world_size = 0;
  EXPECT_THROW(fsdp2_rank_peak(one_step(), d), std::invalid_argument);
  d = two_units();
  d.units.clear();
  EXPECT_THROW(fsdp2_rank_peak(one_step(), d), std::invalid_argument);
  d = two_units();
  d.units[1].shard_bytes = -1;
  EXPECT_THROW(fsdp2_rank_peak(one_step(), d), std::invalid_argument);
  d = two_units();
  d.grad_scale = 0;
  EXPECT_THROW(fsdp2_rank_peak(one_step(), d), std::invalid_argument);
}

}  // namespace
}  // namespace memfit
