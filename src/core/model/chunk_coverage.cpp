#include "memfit/core/model/chunk_coverage.h"

#include <stdexcept>
#include <string>

namespace memfit {

std::vector<size_t> ChunkCoverage::owed(const Chunk& chunk) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < covered_until_.size(); ++i) {
    if (covered_until_[i] == chunk.start) out.push_back(i);
  }
  return out;
}

void ChunkCoverage::add(const Chunk& chunk, const std::vector<size_t>& items) {
  for (size_t i : items) {
    if (i >= covered_until_.size() || covered_until_[i] != chunk.start) {
      throw std::logic_error("[ChunkCoverage::add] item " + std::to_string(i) +
                             " is not owed samples " +
                             std::to_string(chunk.start) + ".." +
                             std::to_string(chunk.end() - 1));
    }
    covered_until_[i] = chunk.end();
  }
}

}  // namespace memfit
