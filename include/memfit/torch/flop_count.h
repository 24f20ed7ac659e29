// FLOPs of the matmuls a step runs, counted from the ops themselves while it
// is recorded: see Note [FLOPs counted while a step is recorded].
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace memfit {

// Note [FLOPs counted while a step is recorded]
// advise estimates a setting's time on meta from FLOPs (Note [Time estimated
// from FLOPs and bytes], python/memfit/plan/cost.py). Counting them with a
// Python dispatch mode ran the whole step a second time, through Python for
// every op: on an 8B Llama, 0.2-0.9 s a copy of the model, 5 s of a 30 s
// advise. This counts the same FLOPs inside the recording advise makes
// anyway, at at::RecordFunction: torch's own formulas (torch.utils.
// flop_counter) for mm, addmm, bmm and baddbmm, and addmm_ and baddbmm_
// in place, which torch's counter leaves out (the chunked loss's weight
// gradient is an addmm_), from the shapes of the op's inputs. Only the outermost op of torch's flop registry counts,
// as under a dispatch mode, which sees no op inside another's kernel. An op
// of the registry that has no formula here (a convolution, a fused
// attention) is reported by uncounted(): the caller counts that step with
// torch's counter instead.
class FlopCount {
 public:
  // registry_ops: the ops torch's flop counter has formulas for
  // ("aten::convolution", ...). One FlopCount counts at a time, from its
  // construction to stop().
  explicit FlopCount(const std::vector<std::string>& registry_ops);
  ~FlopCount();
  FlopCount(const FlopCount&) = delete;
  FlopCount& operator=(const FlopCount&) = delete;

  // Ops count only while counting is on (the step's forward, loss and
  // backward; not its optimizer).
  void set_counting(bool on);
  // The block the FLOPs counted now also go to; -1 for none.
  void set_block(int64_t block);
  // Forget what was counted (a new iteration of the step begins).
  void reset();
  // Count no more ops (what was counted stays readable); idempotent.
  void stop();

  int64_t total() const;
  std::map<int64_t, int64_t> by_block() const;
  // Registry ops met while counting that have no formula here.
  std::vector<std::string> uncounted() const;

  struct Counts;

 private:
  std::unique_ptr<Counts> counts_;
  uint64_t handle_ = 0;
};

}  // namespace memfit
