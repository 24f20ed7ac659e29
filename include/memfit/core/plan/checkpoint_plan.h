// Which segments of a chain (a list of transformer blocks) to checkpoint so
// that a step fits a budget with the least recomputation: dynamic
// programming over the chain's measured per-segment memory and time, and the
// rules people use instead (every layer, every k-th, sqrt(n)) to compare.
// See Note [The chain's memory model].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memfit {

// One segment of the chain, as measured.
struct ChainSegment {
  std::string name;
  // Saved for backward by the segment's forward, its output excluded: kept
  // from forward to its backward when it is not checkpointed, rebuilt by the
  // recompute when it is.
  int64_t activation_bytes = 0;
  // Kept from forward to its backward when it is checkpointed and not kept
  // otherwise (0 when its input is kept anyway, as in a residual chain).
  int64_t input_bytes = 0;
  // Extra live above its activations while its backward runs.
  int64_t backward_extra_bytes = 0;
  // Its forward time: the price of checkpointing it (nanoseconds).
  double recompute_ns = 0;
};

// What is live besides the chain's kept bytes.
struct ChainMemory {
  int64_t forward_fixed = 0;   // at the end of forward, or as the backward begins
  int64_t backward_fixed = 0;  // while the chain's backward runs
  int64_t other_peak = 0;      // peaks the chain does not touch (optimizer)
};

// Note [The chain's memory model]
// kept_i is activation_bytes_i for a plain segment, input_bytes_i for a
// checkpointed one. Forward ends holding forward_fixed + sum(kept). Backward
// visits the segments last to first; when it reaches segment i the kept
// bytes of the later ones are freed, and segment i holds its activations
// (kept, or rebuilt by the recompute) and its backward's extra:
//   during i: backward_fixed + sum(kept_j, j < i) + [input_bytes_i if
//             checkpointed] + activation_bytes_i + backward_extra_bytes_i
// The predicted peak is the largest of the end of forward, every segment's
// backward, and other_peak. Checkpointing segment i lowers the peak during
// the backward of every segment j > i and at the end of forward, never
// during its own backward: checkpointing the last segment only ever helps
// the end of forward. Each checkpointed segment runs its forward once more.
//
// The optimal plan minimises the sum of recompute_ns over checkpointed
// segments subject to predicted peak <= budget, over all 2^n subsets (each
// checkpointed segment recomputed once, as torch.utils.checkpoint does; not
// rotor's multi-level schedules). Dynamic programming over the chain in
// forward order: the state is the kept bytes of the prefix, which is all the
// later constraints depend on; a state with more bytes and no less time is
// dropped (Pareto front). Exact while the front stays under 65536 states per
// segment; past that, states are merged onto a grid of kept bytes rounded
// up, which stays safe (never predicts less than the truth).

// Predicted peak of a choice (one flag per segment, true = checkpointed).
// Throws std::invalid_argument if the sizes differ.
int64_t chain_peak(const std::vector<ChainSegment>& segments,
                   const ChainMemory& memory,
                   const std::vector<bool>& checkpointed);
// Sum of recompute_ns over the checkpointed segments.
double chain_recompute_ns(const std::vector<ChainSegment>& segments,
                          const std::vector<bool>& checkpointed);

// "0,2,3": the indices of the true flags (the checkpointed segments); "-"
// when none.
std::string checkpoint_indices(const std::vector<bool>& checkpointed);

struct ChainPlan {
  std::string
      rule;  // "none", "every layer", "every 2nd layer", "sqrt(n)", "optimal"
  std::vector<bool> checkpointed;
  int64_t predicted_peak = 0;
  double recompute_ns = 0;
  bool fits = false;  // predicted_peak <= the budget it was made for
  int count() const;  // segments checkpointed
  // "0,2,3": indices of the checkpointed segments; "-" when none.
  std::string indices() const;
};

// The rules, evaluated against `budget`.
ChainPlan chain_plan_none(const std::vector<ChainSegment>& segments,
                          const ChainMemory& memory, int64_t budget);
// Checkpoints segments 0, k, 2k, ...; k = 1 is every layer. Throws
// std::invalid_argument for k < 1.
ChainPlan chain_plan_every_k(const std::vector<ChainSegment>& segments,
                             const ChainMemory& memory, int64_t budget, int k);
// Chen et al.'s sqrt(n) rule for a chain whose boundaries are kept: keep the
// activations of every k-th segment (k = ceil(sqrt(n))), checkpoint the rest.
ChainPlan chain_plan_sqrt(const std::vector<ChainSegment>& segments,
                          const ChainMemory& memory, int64_t budget);
// The least recompute time whose predicted peak fits `budget`. When no
// choice fits: every segment whose checkpoint keeps less than its
// activations is checkpointed, and fits is false.
ChainPlan chain_plan_optimal(const std::vector<ChainSegment>& segments,
                             const ChainMemory& memory, int64_t budget);

// none, every layer, sqrt(n), every k-th for k = 2..n-1 (distinct choices
// only), optimal: the table `memfit advise` prints.
std::vector<ChainPlan> compare_chain_plans(
    const std::vector<ChainSegment>& segments, const ChainMemory& memory,
    int64_t budget);

}  // namespace memfit
