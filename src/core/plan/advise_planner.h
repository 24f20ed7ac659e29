// The planner behind plan_advice (advise_plan.h), shared by the files that
// implement its steps: advise_plan.cpp (the order), advise_rows.cpp (the
// rows), advise_search.cpp (the plan's search) and advise_finish.cpp (the
// plan, or why nothing fits). Private to core: not installed.
// See Note [How advise plans] in advise_plan.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/plan/advise_plan.h"
#include "memfit/core/plan/checkpoint_plan.h"

namespace memfit::impl {

// Recorded times of the last iteration, in ns.
struct StepTimes {
  double forward = 0;  // forward and loss
  double optimizer = 0;  // optimizer step and zero_grad
  double total = 0;
};
StepTimes step_times(const Timeline& t);

// What no micro-batch or checkpointing lowers: the peak of the phases outside
// forward, loss and backward (the weights, their gradients, the optimizer's
// state and step). The inputs phase is left out: it holds the batch.
int64_t batch_free_floor(const Report& r);

// The weights on the device: the parameters phase's peak (it only
// materializes them). Forward and backward hold at least as much.
int64_t weights_peak(const Report& r);

// Bytes of the recorded step's peak that no batch size changes: the larger
// of weights_peak and batch_independent_at_peak (step_transform.h).
int64_t independent_bytes(const VariantRecording& r);

// The step under the front's setting `st`, nothing else.
StepVariant variant_of(const AdviseSetting& st);

struct Tried {
  StepVariant variant;
  int64_t micro_batch = 0;
  int64_t peak = 0;
};

class Planner {
 public:
  Planner(const AdviseMeasurer& m, const AdviseSettings& s) : m_(m), s_(s) {
    has_budget_ = s.budget >= 0;
    limit_ = has_budget_ ? s.budget : std::numeric_limits<int64_t>::max() / 4;
    n_ = s.chain.size();
  }

  // The steps of Note [How advise plans], in order (advise_plan.cpp).
  Advice run();

 private:
  // The plain step recorded on a real device (and cheaply), and its row
  // (advise_rows.cpp).
  void record_plain();
  // Each strategy's row at the whole batch, and the combinations when none
  // the plan may use fits (advise_rows.cpp).
  void strategy_rows();
  // The plan's search, in the order of Note [How advise plans]: the plain
  // step and checkpointing, the state on the host, the front's settings,
  // then (allow_approximate) bf16 and the lighter optimizers
  // (advise_search.cpp).
  bool search_plan();
  // Nothing fits: the notes and the one line a front raises
  // (advise_finish.cpp).
  void note_nothing_fits();
  VariantRecording record(const StepVariant& v, int64_t batch, bool cheap) {
    s_.progress.step((cheap ? "record " : "record on the device ") +
                     describe(v, s_.optimizer, s_.offload_label) + " at batch " +
                     std::to_string(batch));
    VariantRecording r = m_.record(v, batch, cheap);
    if (!r.meta) ++a_.recordings;
    return r;
  }
  const VariantRecording& plain_like(bool meta) const { return meta ? *plain_cheap_ : plain_; }
  double estimate_ratio(const VariantRecording& r, int64_t micro_batch) const;
  // The front's estimate (FLOPs) where the plain step has no recorded times;
  // -1 otherwise.
  double counted_ratio(const StepVariant& v, int64_t micro_batch) {
    if (!m_.estimate_ratio || plain_times_.total > 0) return -1;
    a_.estimated_from = m_.estimated_from;
    return m_.estimate_ratio(v, micro_batch);
  }
  void add_row(std::string name, StrategyKind kind, const StepVariant& v,
               std::optional<VariantRecording> given = std::nullopt, bool predicted = false);
  // See Note [Rows advise predicts]: `base` (a recording without the
  // choice) as the step with gradients kept and zeroed in place, or with
  // the optimizer's state on the host; nullopt where rows are not
  // predicted or `base` has no timeline to predict from.
  enum class Prediction { kGradientsKept, kStateOnHost };
  std::optional<VariantRecording> predict(const VariantRecording& base, Prediction p) const;
  void checkpoint_rows();
  void combination_rows();
  struct Choice {
    double recompute_ns = 0;
    StepVariant variant;
    VariantRecording recording;  // cheap: on meta when the front could
  };
  std::vector<Choice> fitting_choices(const std::vector<ChainSegment>& segs,
                                      const ChainMemory& mem, const StepVariant& base, int64_t c,
                                      const VariantRecording& every,
                                      std::optional<std::pair<StepVariant, int64_t>>* first);
  bool search(StepVariant base, bool approximate_only_every);
  // The searches that keep the numbers: the plain step and checkpointing,
  // the state on the host, the exact settings.
  bool search_exact();
  bool try_level(const StepVariant& base, int64_t c, bool every_only);
  bool verify(const StepVariant& v, int64_t c, std::optional<VariantRecording> real = std::nullopt);
  void finish_plan();
  const AdviseSetting* setting_of(const StepVariant& v) const;
  std::string does_not_fit_message(int64_t outside) const;
  // The blocks the planner may checkpoint under `v`: none when its setting
  // checkpoints the model itself.
  size_t chain_of(const StepVariant& v) const {
    const AdviseSetting* st = setting_of(v);
    return st && st->checkpoints ? 0 : n_;
  }
  void setting_rows();
  void note_unrecorded();
  bool search_settings(bool exact);
  // Note [The rest of the batch beside a micro-batch]
  // A step recorded on a micro-batch of c samples holds c samples' data;
  // the rest of the user's batch waits on the device beside it (the
  // Trainer slices it there): reserve_bytes (the whole batch's data) x
  // (B - c) / B. A micro-batch plan has that much less room, and its peak
  // is the step's plus that rest (the step's alone was 2-5% under what a
  // loop slicing the batch on the device peaks at). The whole batch's own
  // step holds its data already: none is taken from it (it was, and
  // advise moved a plan that fit on the device to the host).
  int64_t rest_at(int64_t c) const {
    if (c <= 0 || c >= s_.batch) return 0;
    return static_cast<int64_t>(static_cast<double>(s_.reserve_bytes) *
                                static_cast<double>(s_.batch - c) /
                                static_cast<double>(s_.batch));
  }
  int64_t limit_at(int64_t c) const { return has_budget_ ? limit_ - rest_at(c) : limit_; }

  const AdviseMeasurer& m_;
  const AdviseSettings& s_;
  bool has_budget_ = false;
  int64_t limit_ = 0;
  size_t n_ = 0;
  Advice a_;
  VariantRecording plain_;
  std::optional<VariantRecording> plain_cheap_;
  StepTimes plain_times_;
  std::vector<double> forward_ns_;
  std::optional<VariantRecording> every_cheap_;
  std::optional<Tried> accepted_;
  std::optional<Tried> closest_;
  std::optional<VariantRecording> accepted_recording_;
  bool accepted_verified_ = false;
  // The micro-batches a search tries: from the whole batch, or from its half
  // (the second pass of Note [Micro-batches of a model that mixes samples]);
  // whole_only_: none.
  bool from_half_ = false;
  bool whole_only_ = false;
  // batch_free_floor of each optimizer and setting (the front's setting,
  // optimizer, state on the host) recorded at the whole batch: a search it
  // rules out is skipped.
  using FloorKey = std::tuple<std::string, std::string, bool>;
  static FloorKey floor_key(const StepVariant& v) { return {v.setting, v.optimizer, v.host_state}; }
  std::vector<std::pair<FloorKey, int64_t>> floors_;
  // Each training variant recorded (or predicted from a recording) at the
  // whole batch: its peak, the bytes of it no batch changes
  // (independent_bytes) and its weights (weights_peak), for lower_bound_at.
  struct Whole {
    StepVariant variant;
    int64_t peak = 0;
    int64_t independent = 0;
    int64_t weights = 0;
  };
  void add_whole(const StepVariant& v, const VariantRecording& r) {
    wholes_.push_back({v, r.report.budget_peak(), independent_bytes(r), weights_peak(r.report)});
  }
  std::vector<Whole> wholes_;
  // See Note [Levels the search skips].
  std::optional<int64_t> lower_bound_at(const StepVariant& v, int64_t c) const;
  bool bounded_over(const StepVariant& v, int64_t c) const;
  // The rows the front could not record, by its reason: one note a reason.
  std::vector<std::pair<std::string, std::vector<std::string>>> unrecorded_;
  // The chain calibrated at each micro-batch the search reached.
  std::vector<std::pair<int64_t, std::pair<std::vector<ChainSegment>, ChainMemory>>> chains_;
};

}  // namespace memfit::impl
