#include "memfit/core/model/reserve_interpolation.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/model/allocator_model.h"

namespace memfit {

// Note [A card's reserve between two steps]
// What a card reserves is a staircase in the batch: the caching allocator
// rounds each request to 512 B, serves requests under 1 MiB from 2 MiB
// segments and those under 10 MiB from 20 MiB ones, and rounds larger
// segments to 2 MiB; a batch one sample larger can need one more segment.
// A line through two measured reserves (a secant) cannot see the stairs:
// aimed at the budget, it lands on the stair above it about half the time,
// and the search spends its full-size steps creeping along one stair.
//
// The allocations themselves are not stairs. Two steps of the same model at
// two batches usually make the same allocations in the same order, each of
// a size affine in the batch (activations, gradients of the inputs,
// temporaries; parameters and optimizer state are constant). When they do
// (steps_align), the step at any batch between them is those allocations
// at sizes on the line through the two, and the allocator's rules replayed
// on it (replay_cuda, cheap) give its reserve, stairs included: exact for a
// step whose sizes are affine, and near for one whose are not. It is still
// only a candidate: the search measures a real step at it before answering.

namespace {

// The same allocation in two steps: the k-th allocation of each, made by
// the same op of the same module in the same phase, of the same category.
bool same_allocation(const Timeline& a, const Event& x, const Timeline& b, const Event& y) {
  if (x.device != y.device || x.category != y.category) return false;
  if (a.op_name(x.op) != b.op_name(y.op)) return false;
  if (a.module_name(x.module) != b.module_name(y.module)) return false;
  return a.phase_name(x.phase) == b.phase_name(y.phase);
}

// Indices of the allocations, in order.
std::vector<size_t> allocations(const Timeline& t) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.events()[i].kind == EventKind::kAlloc) idx.push_back(i);
  }
  return idx;
}

// The size on the line through (ba, sa) and (bb, sb) at `batch`, rounded to
// the nearest byte, never negative.
int64_t size_at(int64_t sa, int64_t ba, int64_t sb, int64_t bb, int64_t batch) {
  const __int128 num = static_cast<__int128>(sb - sa) * (batch - ba);
  const __int128 den = bb - ba;
  __int128 q = num / den;
  const __int128 r = num % den;
  // Round half away from zero.
  if (2 * (r < 0 ? -r : r) >= (den < 0 ? -den : den)) q += ((r < 0) != (den < 0)) ? -1 : 1;
  return std::max<int64_t>(0, sa + static_cast<int64_t>(q));
}

}  // namespace

bool steps_align(const Timeline& a, const Timeline& b) {
  const std::vector<size_t> xa = allocations(a), xb = allocations(b);
  if (xa.size() != xb.size()) return false;
  for (size_t k = 0; k < xa.size(); ++k) {
    if (!same_allocation(a, a.events()[xa[k]], b, b.events()[xb[k]])) return false;
  }
  return true;
}

namespace {

void check_pair(const RecordedStep& a, const RecordedStep& b, const std::vector<size_t>& xa) {
  if (a.timeline == nullptr || b.timeline == nullptr || a.batch == b.batch) {
    throw std::invalid_argument("[reserve] two recorded steps at two batches are needed, got "
                                "batches " + std::to_string(a.batch) + " and " +
                                std::to_string(b.batch));
  }
  if (xa.size() != allocations(*b.timeline).size()) {
    throw std::invalid_argument("[reserve] the steps at batches " + std::to_string(a.batch) +
                                " and " + std::to_string(b.batch) +
                                " made different allocations: nothing to interpolate");
  }
}

// interpolated_budget_peak, with a's allocation indices found once.
int64_t budget_peak_at(const RecordedStep& a, const std::vector<size_t>& xa,
                       const RecordedStep& b, int64_t batch) {
  const std::vector<Event>& ea = a.timeline->events();
  // b's events in b's order (frees may come in another order in a: threads),
  // the k-th allocation sized on the line through the k-th of each. The
  // replay frees by id, so a free's bytes are not needed.
  std::vector<Event> events = b.timeline->events();
  size_t k = 0;
  for (Event& e : events) {
    if (e.kind != EventKind::kAlloc) continue;
    e.bytes = size_at(ea[xa[k++]].bytes, a.batch, e.bytes, b.batch, batch);
  }
  // Reserved bytes hold every live block, each at least its request: the
  // replay's peak is also over the live bytes' (Report::budget_peak).
  return replay_cuda(events, std::nullopt, std::max(a.workspace_bytes, b.workspace_bytes),
                     cublaslt_event(*b.timeline))
      .peak_reserved;
}

}  // namespace

int64_t interpolated_budget_peak(const RecordedStep& a, const RecordedStep& b, int64_t batch) {
  const std::vector<size_t> xa = a.timeline ? allocations(*a.timeline) : std::vector<size_t>{};
  check_pair(a, b, xa);
  return budget_peak_at(a, xa, b, batch);
}

int64_t largest_interpolated_under(const RecordedStep& a, const RecordedStep& b, int64_t limit,
                                   int64_t lo, int64_t hi) {
  if (lo > hi) return lo - 1;
  const std::vector<size_t> xa = a.timeline ? allocations(*a.timeline) : std::vector<size_t>{};
  check_pair(a, b, xa);
  if (budget_peak_at(a, xa, b, lo) > limit) return lo - 1;
  // Invariant: lo fits, everything above hi is unknown or over.
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (budget_peak_at(a, xa, b, mid) <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace memfit
