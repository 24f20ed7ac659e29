#include "memfit/core/model/chunk_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace memfit {

int64_t balanced_chunk(int64_t remaining, int64_t most) {
  const int64_t chunks = (remaining + most - 1) / most;
  return (remaining + chunks - 1) / chunks;
}

ChunkSchedule::ChunkSchedule(int64_t batch, int64_t limit, bool can_split)
    : batch_(batch), size_(batch), can_split_(can_split) {
  if (batch < 1) {
    throw std::invalid_argument(
        "[ChunkSchedule] the batch must hold at least one sample, got " +
        std::to_string(batch));
  }
  if (limit < 0) {
    throw std::invalid_argument(
        "[ChunkSchedule] limit must be >= 0 (0: the whole batch), got " +
        std::to_string(limit));
  }
  if (limit > 0) size_ = std::min(limit, batch);
}

Chunk ChunkSchedule::next() const {
  // Inside a failed chunk, its samples first. See Note [How chunks are
  // scheduled].
  const int64_t end = redo_until_.empty() ? batch_ : redo_until_.back();
  return {position_, balanced_chunk(end - position_, size_)};
}

void ChunkSchedule::succeeded() {
  position_ = next().end();
  while (!redo_until_.empty() && redo_until_.back() <= position_)
    redo_until_.pop_back();
}

bool ChunkSchedule::failed() {
  const Chunk chunk = next();
  if (!can_split_ || chunk.size <= 1) return false;
  ++ooms_recovered_;
  size_ = chunk.size / 2;
  redo_until_.push_back(chunk.end());
  return true;
}

}  // namespace memfit
