// The peak memory of one rank under data parallelism (DDP, ZeRO stages 1-3,
// FSDP), predicted from the timeline of the same step run on one process.
// See Note [One rank's memory under data parallelism].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/model/timeline.h"

namespace memfit {

enum class Sharding : uint8_t {
  kDdp,    // DistributedDataParallel: everything replicated, plus buckets
  kZero1,  // DDP + optimizer state sharded (ZeroRedundancyOptimizer)
  kZero2,  // + gradients sharded (reduce-scatter per bucket)
  kZero3,  // + parameters sharded, one unit gathered at a time (FSDP)
  kFsdp2,  // torch's fully_shard, unit by unit: see fsdp2_rank_peak()
};
// The ZeRO family per_rank_peaks() returns; kFsdp2 comes from
// fsdp2_rank_peak(), which needs the units.
inline constexpr int kNumShardings = 4;

// "ddp", "zero1", "zero2", "zero3", "fsdp2".
std::string_view to_string(Sharding s);
// Inverse of to_string(); "fsdp" is accepted for zero3. Throws
// std::invalid_argument naming the accepted names.
Sharding sharding_from_string(std::string_view name);

struct DataParallelSetup {
  int world_size = 2;
  // Bytes of the trainable parameters: DDP's buckets hold one copy of their
  // gradients for the whole run.
  int64_t gradient_bytes = 0;
  // DDP's gradient_as_bucket_view=True: .grad are views into the buckets,
  // so the separate gradients disappear.
  bool gradient_as_bucket_view = false;
  int64_t bucket_cap_bytes = int64_t{25} << 20;       // DDP's bucket_cap_mb
  int64_t broadcast_bucket_bytes = int64_t{250} << 20;  // DDP's construction
  // Parameter bytes of the largest unit FSDP gathers at once (the largest
  // wrapped submodule); 0 if unknown: then zero3 gathers nothing extra and
  // the formula says so.
  int64_t largest_unit_bytes = 0;
  // The share of the optimizer state the fullest rank holds: 0 means 1/W
  // (flat even shards: DeepSpeed, FSDP); torch's ZeroRedundancyOptimizer
  // shards whole parameters: see largest_partition_fraction().
  double optimizer_shard_fraction = 0;
  // Extra temporaries the fullest rank's optimizer step holds over the
  // single process's: see step_reorder_bytes(). Added in optimizer_step to
  // ZeRO-1/2/3; 0 for flat shards.
  int64_t step_reorder_bytes = 0;
};

// The share of `param_bytes` the fullest of `world_size` ranks gets when
// whole parameters are dealt largest first to the least-loaded rank (torch's
// ZeroRedundancyOptimizer). 1/W at best; 1 for a single parameter. With
// per_parameter_bytes k > 0, the larger of that and the rank's share of
// (bytes + k per parameter): optimizer state that holds a scalar per
// parameter (Adam's 4-byte step) besides its per-element tensors stays
// covered when the fullest rank holds more than its share of parameters
// (resnet18's fullest rank was 7 bytes over the byte share). Throws
// std::invalid_argument for world_size < 1 or a negative size.
double largest_partition_fraction(std::vector<int64_t> param_bytes, int world_size,
                                  int64_t per_parameter_bytes = 0);

// Note [A rank's optimizer step deals parameters in another order]
// torch's for-loop Adam keeps one parameter's denominator alive while the
// next parameter's sqrt and division are made: its step's temporaries peak
// at the largest (previous + 2 x current) over neighbouring parameters. In
// the single process a bias or a norm usually sits between two large
// weights; ZeroRedundancyOptimizer deals each rank its parameters largest
// first, so equal large weights become neighbours and the fullest rank's
// step holds one more weight of temporaries (resnet18 on 2 ranks: rank 0's
// step peaked 9 MiB, one 512x512x3x3 weight, above what the single process
// implied). The bytes returned are that difference, never negative: the
// worst rank's (previous + 2 x current) less the single process's, with
// ranks dealt as largest_partition_fraction() deals them.
int64_t step_reorder_bytes(const std::vector<int64_t>& param_bytes, int world_size);

struct RankPeak {
  Sharding sharding = Sharding::kDdp;
  int64_t peak_bytes = 0;
  std::string phase;      // where it is reached; "ddp_construction" for the
  int iteration = 0;      // broadcast and bucket allocation of DDP(model)
  std::string formula;    // the rule applied, in words
  // FSDP2 with CPU offload: the most bytes the host holds for this rank
  // (sharded parameters, gradients, optimizer state, the step's
  // temporaries); peak_bytes is then the device's alone. 0 otherwise.
  int64_t host_bytes = 0;
};

// The per-rank peak of `single_step` (a profile's timeline: phases
// "parameters", "forward", "loss", "backward", "optimizer_step", ...) under
// `sharding`. Throws std::invalid_argument for world_size < 1 or negative
// byte counts.
RankPeak per_rank_peak(const Timeline& single_step, const DataParallelSetup& setup,
                       Sharding sharding);
// All four, in enum order.
std::vector<RankPeak> per_rank_peaks(const Timeline& single_step,
                                     const DataParallelSetup& setup);

// One fully_shard unit: the parameters one fully_shard(module) call owns
// (those of its subtree not owned by a unit below it).
struct Fsdp2Unit {
  // The module's path; "" for the root, whose parameters stay gathered
  // from its forward to the end of backward.
  std::string path;
  // Bytes of the unit's parameters as the single process holds them.
  int64_t param_bytes = 0;
  // This rank's sharded parameters: each parameter's dim 0 padded to a
  // multiple of W, 1/W of it, in the parameters' own dtype.
  int64_t shard_bytes = 0;
  // The all-gathered unsharded parameters: W x the padded shard, in the
  // mixed-precision param_dtype if any. Gradients come in the same dtype.
  int64_t gathered_bytes = 0;
  // The reduce-scatter input: W x the padded shard in the reduce dtype.
  int64_t reduce_bytes = 0;
  // A copy made of the shard before its all-gather: the cast to
  // param_dtype, or the host-to-device copy under CPU offload; 0 when the
  // all-gather reads the shard in place.
  int64_t gather_input_bytes = 0;
  // The sharded gradient cast back from the reduce dtype to the
  // parameters' dtype; 0 when they are the same.
  int64_t grad_cast_bytes = 0;
};

struct Fsdp2Setup {
  int world_size = 2;
  // The root unit (path "") first if it has parameters, then the others in
  // the order their forwards run.
  std::vector<Fsdp2Unit> units;
  // Unsharded gradient bytes per byte the single process recorded (its
  // gradients are in the parameters' dtype): 0.5 for bf16 over fp32.
  double grad_scale = 1.0;
  // CPUOffloadPolicy: sharded parameters, gradients and optimizer state
  // (and the step) on the host.
  bool cpu_offload = false;
};

// One parameter as FSDP2 shards it: what fsdp2_unit() needs of a tensor.
struct ParamShape {
  int64_t rows = 1;      // dim 0's size (1 for a 0-dim parameter)
  int64_t numel = 1;     // elements
  int element_size = 4;  // bytes per element of the parameter's dtype
  // Its dtype differs from the mixed-precision param_dtype, so the shard is
  // cast before its all-gather: also for equal sizes (fp16 under bf16).
  // Ignored without a param_dtype.
  bool cast_to_param_dtype = false;
};

// FSDP2's MixedPrecisionPolicy as element sizes; 0: none (the parameter's
// own dtype; a reduce dtype of 0 follows the param dtype).
struct Fsdp2Precision {
  int param_dtype_size = 0;
  int reduce_dtype_size = 0;
};

// The unit at `path` owning `params` on `world_size` ranks: each parameter
// sharded on dim 0, padded to a multiple of the world size (FSDP2's
// FSDPParam), gathered in the param dtype, reduced in the reduce dtype;
// under `cpu_offload` the shard's host-to-device copy is a gather input.
// Throws std::invalid_argument for world_size < 1, a negative size, an
// element size < 1 or rows that do not divide numel.
Fsdp2Unit fsdp2_unit(std::string path, const std::vector<ParamShape>& params, int world_size,
                     const Fsdp2Precision& precision, bool cpu_offload);
// Fsdp2Setup::grad_scale: the param dtype's size over the largest element
// size of the model's `params` (at most 1; 1 without a param dtype).
double fsdp2_grad_scale(const std::vector<ParamShape>& params,
                        const Fsdp2Precision& precision);

// The per-rank peak of `single_step` under torch's fully_shard with
// `setup`'s units (see Note [One rank's memory under FSDP2] in
// data_parallel.cpp). Throws std::invalid_argument for world_size < 1, no
// units, negative byte counts or a grad_scale outside (0, 1].
RankPeak fsdp2_rank_peak(const Timeline& single_step, const Fsdp2Setup& setup);

}  // namespace memfit
