// The order in which a batch runs in chunks when memory may run out: balanced
// chunks of at most the current size, an out-of-memory chunk halved and its
// samples redone, never a sample lost or run twice. The one home of the
// schedule: the native Trainer (micro-batches) and memfit.lazy (chunks of a
// recorded graph) each only run a chunk and say how it went.
// See Note [How chunks are scheduled].
#pragma once

#include <cstdint>
#include <vector>

namespace memfit {

// Samples [start, start + size) of the batch.
struct Chunk {
  int64_t start = 0;
  int64_t size = 0;
  int64_t end() const { return start + size; }
};

// Note [How chunks are scheduled]
// The batch runs front to back in balanced chunks of at most `size()`
// samples (21 at most 8: 7, 7, 7, not 8, 8, 5). A chunk that runs out of
// memory halves the size and its own samples are redone, in chunks of the
// new size, before any sample after it: what the failed chunk left behind
// (gradients some parameters received before the OOM) covers exactly its
// samples, and the redo never straddles that boundary (see Note [Why a
// retried chunk never counts twice] in chunk_coverage.h). The position moves
// only when a chunk completes. The size never grows back within a step, and
// what it ends at is where the next step starts. A chunk of one sample that
// fails, or any chunk when splitting is off, ends the schedule: the front
// end reports the OOM.
class ChunkSchedule {
 public:
  // `limit`: the most samples to try at once; 0 (or >= batch): the whole
  // batch. `can_split` false: the first OOM ends the schedule. Throws
  // std::invalid_argument for batch < 1 or limit < 0.
  ChunkSchedule(int64_t batch, int64_t limit, bool can_split = true);

  bool done() const { return position_ >= batch_; }
  // The chunk to run now (while !done()).
  Chunk next() const;
  // The chunk from next() completed: the position moves past it.
  void succeeded();
  // The chunk from next() ran out of memory. True: it is redone in smaller
  // chunks; false: the schedule cannot go on (one sample, or no splitting).
  bool failed();

  int64_t batch() const { return batch_; }
  // Samples completed, all before this index.
  int64_t position() const { return position_; }
  // The most samples a chunk may hold now; once done, the size the next
  // step should start from.
  int64_t size() const { return size_; }
  // OOMs that were followed by a redo (not the one that ended the schedule).
  int64_t ooms_recovered() const { return ooms_recovered_; }

 private:
  int64_t batch_;
  int64_t size_;
  bool can_split_;
  int64_t position_ = 0;
  int64_t ooms_recovered_ = 0;
  // Ends of the failed chunks whose samples are being redone, innermost last.
  std::vector<int64_t> redo_until_;
};

// The first of the balanced chunks covering `remaining` samples with at most
// `most` each: as few chunks as possible, sizes differing by at most one.
int64_t balanced_chunk(int64_t remaining, int64_t most);

}  // namespace memfit
