// Which gradients a chunk still owes its samples to, so that a chunk redone
// after an OOM adds none of them twice. Gradients are items by index; the
// front end (the native Trainer's parameters, memfit.lazy's tensors) says
// which of them received a chunk's share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memfit/core/model/chunk_schedule.h"

namespace memfit {

// Note [Why a retried chunk never counts twice]
// An OOM can strike in the middle of a chunk's backward, after some
// gradients have accumulated their share of it. Each gradient therefore
// carries how far along the batch it is complete. A chunk [a, a+n) is owed
// by the gradients complete exactly up to a; those that received their
// share before an OOM are marked complete through a+n, and the redo (in
// smaller chunks, never past a+n: see Note [How chunks are scheduled])
// computes the others only. Accumulated shares stay; none is added twice.
class ChunkCoverage {
 public:
  explicit ChunkCoverage(size_t items) : covered_until_(items, 0) {}

  size_t items() const { return covered_until_.size(); }
  // The items whose gradient still lacks the chunk's samples, ascending.
  std::vector<size_t> owed(const Chunk& chunk) const;
  // `items` (owed by the chunk) now hold its share. Throws std::logic_error
  // for an item that was not owed: the share would count twice.
  void add(const Chunk& chunk, const std::vector<size_t>& items);

 private:
  std::vector<int64_t> covered_until_;
};

}  // namespace memfit
