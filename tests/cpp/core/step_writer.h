// Writes a recorded step event by event, for the tests that build one by
// hand: each allocation gets a fresh id and the open phase; a free ends one.
#pragma once

#include <cstdint>
#include <string_view>

#include "memfit/core/model/timeline.h"

namespace memfit::testing {

class StepWriter {
 public:
  explicit StepWriter(Timeline& t) : t_(t) {}

  uint64_t alloc(int64_t bytes, Category c, std::string_view op = "") {
    Event e;
    e.kind = EventKind::kAlloc;
    e.id = next_id_++;
    e.bytes = bytes;
    e.category = c;
    e.phase = t_.current_phase();
    e.op = t_.op_index(op);
    t_.record(e);
    return e.id;
  }

  void free(uint64_t id) {
    Event e;
    e.kind = EventKind::kFree;
    e.id = id;
    e.phase = t_.current_phase();
    t_.record(e);
  }

 private:
  Timeline& t_;
  uint64_t next_id_ = 1;
};

}  // namespace memfit::testing
