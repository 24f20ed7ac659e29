// A card's reserve at a batch no step ran at, from two steps that did.
// See Note [A card's reserve between two steps] in reserve_interpolation.cpp.
#pragma once

#include <cstdint>

#include "memfit/core/model/timeline.h"

namespace memfit {

// One recorded step: its batch, its events, and the fixed bytes a card
// holds beside them (the cuBLAS workspace of its CUDA estimate).
struct RecordedStep {
  int64_t batch = 0;
  const Timeline* timeline = nullptr;
  int64_t workspace_bytes = 0;
};

// Whether two recorded steps made the same allocations in the same order
// (op, module, phase, category, device; frees may come in another order,
// as threads finish): then the k-th allocation's size is a function of the
// batch to interpolate.
bool steps_align(const Timeline& a, const Timeline& b);

// The bytes a card is held against (Report::budget_peak) for the step at
// `batch`: the caching allocator replayed on the events of `b`, in b's
// order, the k-th allocation sized on the line through the k-th of `a` and
// of `b`. Throws
// std::invalid_argument when the steps do not align or share a batch.
int64_t interpolated_budget_peak(const RecordedStep& a, const RecordedStep& b, int64_t batch);

// The largest batch in [lo, hi] whose interpolated budget peak is at most
// `limit`, by bisection (the reserve is a staircase, nearly monotone: the
// answer is a candidate to measure, not a promise); lo - 1 when none is.
int64_t largest_interpolated_under(const RecordedStep& a, const RecordedStep& b, int64_t limit,
                                   int64_t lo, int64_t hi);

}  // namespace memfit
