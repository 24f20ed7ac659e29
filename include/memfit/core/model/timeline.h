// A recording of memory events and everything that is computed from it:
// live bytes over time, the peak, what is live at any instant, per phase.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memfit/core/model/event.h"

namespace memfit {

// An event index meaning "no event": the peak of an empty timeline, the peak
// event of a phase whose events never rose above its starting level.
inline constexpr size_t kNoEvent = std::numeric_limits<size_t>::max();

// One run of a phase: events [first_event, end_event). While the phase is
// still open, end_event follows the end of the recording.
struct PhaseSpan {
  uint16_t phase = 0;  // index into Timeline::phase_name()
  int iteration = 0;
  size_t first_event = 0;
  size_t end_event = 0;  // one past the last event of the span
};

namespace detail {

// Interned names; index 0 is always "". Names keep their address for the
// table's lifetime (a deque), so the lookup map can key on string_view.
class StringTable {
 public:
  StringTable();
  StringTable(const StringTable& other);
  StringTable& operator=(const StringTable& other);
  StringTable(StringTable&&) = default;
  StringTable& operator=(StringTable&&) = default;

  // The index of `name`, adding it if new; throws std::runtime_error past
  // `max_size` names, naming `what` ("phase", "module", "op").
  uint32_t intern(std::string_view name, uint32_t max_size, const char* what);
  // Throws std::invalid_argument for an index that was never returned.
  const std::string& name(uint32_t index, const char* what) const;
  size_t size() const { return names_.size(); }

 private:
  void rebuild_index();

  std::deque<std::string> names_;
  std::unordered_map<std::string_view, uint32_t> index_;
};

// id -> index of the live allocation event of that id. Open addressing
// with linear probing and backward-shift erase: record() runs on every
// tensor allocation, and holding only live ids keeps the table as small as
// the live set (thousands), so lookups stay in cache.
class IdMap {
 public:
  // The slot for `id`, or nullptr.
  size_t* find(uint64_t id);
  const size_t* find(uint64_t id) const;
  // The slot for `id`, created holding kNoEvent if new.
  size_t& find_or_insert(uint64_t id);
  // Removes `id` if present.
  void erase(uint64_t id);
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t id;
    size_t value;  // kNoEvent marks an empty slot
  };
  size_t probe(uint64_t id) const;  // slot holding id, or the empty one
  void grow(size_t capacity);

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// id -> index of its latest allocation, freed ids included, built on first
// use and extended as events arrive. Only questions about freed ids need
// it, so record() never pays for it. A copy starts empty and rebuilds.
class AllocIndex {
 public:
  AllocIndex() = default;
  AllocIndex(const AllocIndex&) {}
  AllocIndex& operator=(const AllocIndex&);
  AllocIndex(AllocIndex&&) noexcept {}
  AllocIndex& operator=(AllocIndex&&) noexcept;

  // kNoEvent if `id` was never allocated in `events`.
  size_t latest(uint64_t id, const std::vector<Event>& events) const;

 private:
  mutable std::mutex mu_;  // const readers may share a timeline
  mutable std::unordered_map<uint64_t, size_t> latest_;
  mutable size_t indexed_ = 0;  // events [0, indexed_) are in latest_
};

}  // namespace detail

// See Note [Timeline recording rules] in timeline.cpp.
//
// All analysis counts the events of every device together; use filtered()
// for one device. Analysis functions are O(number of events) and do not
// cache: call them once and keep the result.
class Timeline {
 public:
  Timeline();

  // --- Recording. Not thread-safe: the caller serialises (the torch layer
  // records under its own lock).

  // Interned names; index 0 is always "" (none). Throw std::runtime_error
  // when the index type is exhausted (65535 phases, 2^32-1 modules or ops).
  uint16_t phase_index(std::string_view name);
  uint32_t module_index(std::string_view path);
  uint32_t op_index(std::string_view name);
  // Throw std::invalid_argument for an index this timeline never returned.
  const std::string& phase_name(uint16_t index) const;
  const std::string& module_name(uint32_t index) const;
  const std::string& op_name(uint32_t index) const;

  // Appends an event; amortised O(1), no string work. A free's bytes,
  // device and category are taken from its allocation; frees of ids not
  // allocated in this recording, and second frees, are dropped.
  void record(const Event& e);
  // Reserves room for n events ahead of a long recording.
  void reserve(size_t n);

  // Reclassifies the latest allocation of `alloc_id` (and its free, if
  // any). False if the id was never allocated in this recording. O(1) for
  // a live id; for a freed one the first call indexes every event (O(n)),
  // later calls are O(1).
  bool set_category(uint64_t alloc_id, Category c);
  // Category of the latest allocation of `alloc_id`; throws
  // std::invalid_argument for an unknown id. Cost as set_category(). For
  // the category of a given event, read Event::category: ids are reused.
  Category category_of(uint64_t alloc_id) const;
  // Whether `alloc_id` is allocated and not yet freed at the end of the
  // recording; false for unknown ids. O(1).
  bool is_live(uint64_t alloc_id) const;

  // Opens a span of `name` at the current end of the recording. Phases do
  // not nest: beginning one while another is open ends the open one.
  void begin_phase(std::string_view name, int iteration);
  // Ends the open span; does nothing if none is open (so nested RAII scopes
  // that each end "their" phase are harmless).
  void end_phase();
  // The open phase's index, 0 when none: the torch layer stamps events with
  // it. Timeline never stamps events itself.
  uint16_t current_phase() const { return current_phase_; }

  const std::vector<Event>& events() const { return events_; }
  const std::vector<PhaseSpan>& phase_spans() const { return spans_; }
  size_t size() const { return events_.size(); }
  bool empty() const { return events_.empty(); }
  // For an allocation, the index of its free (kNoEvent while it lives); for
  // a free, the index of its allocation (every recorded free has one).
  // Throws std::invalid_argument past the end.
  size_t partner(size_t event_index) const {
    check_index(event_index, "partner");
    return partner_[event_index];
  }

  // --- Analysis.

  // Live bytes right after events[event_index]; throws std::invalid_argument
  // past the end.
  int64_t live_after(size_t event_index) const;
  // Live bytes at the end of the recording (0 when empty).
  int64_t live_bytes() const;

  struct Peak {
    int64_t bytes = 0;
    size_t event_index = kNoEvent;  // the event after which it was reached
    uint16_t phase = 0;             // that event's phase, module, op, time
    uint32_t module = 0;
    uint32_t op = 0;
    int64_t time_ns = 0;
  };
  // The highest live bytes and the first event reaching them. An empty
  // timeline gives bytes 0 and event_index kNoEvent.
  Peak peak() const;
  // The same over events [first, end). An empty range gives the live bytes
  // before `first` and event_index kNoEvent. Throws std::invalid_argument if
  // first > end or end > size().
  Peak peak_in(size_t first, size_t end) const;

  struct Breakdown {
    int64_t total = 0;
    std::array<int64_t, kNumCategories> by_category{};  // sums to total
    // Phase in which each still-live allocation was made.
    std::vector<std::pair<std::string, int64_t>> by_phase;
    // Module path of each still-live allocation; "" (none) included.
    std::vector<std::pair<std::string, int64_t>> by_module;
  };
  // What is live right after events[event_index]. by_phase and by_module
  // list every name holding at least one live allocation, by bytes
  // descending, ties by name; each sums to total. Throws std::invalid_argument
  // past the end.
  Breakdown breakdown_after(size_t event_index) const;
  // by_module of breakdown_after() restricted to one category (e.g. which
  // modules hold the activations at the peak). Same order and rules.
  std::vector<std::pair<std::string, int64_t>> module_bytes_after(
      size_t event_index, Category category) const;

  struct PhaseSummary {
    std::string name;
    int iteration = 0;
    int64_t live_before = 0;       // live bytes when the span began
    int64_t live_after = 0;        // live bytes when it ended
    int64_t delta = 0;             // live_after - live_before
    int64_t peak = 0;              // max(live_before, live after each event)
    size_t peak_event = kNoEvent;  // first event reaching peak; kNoEvent if
                                   // none rose above live_before
  };
  // One per phase span, in order. An empty span has peak == live_before.
  std::vector<PhaseSummary> phase_summaries() const;

  // Live bytes after each event.
  std::vector<int64_t> live_curve() const;
  // (time_ns, live bytes) after each event.
  std::vector<std::pair<int64_t, int64_t>> curve() const;
  // At most max_points points for plotting: the first, the last, and the
  // lowest and highest of each of (max_points - 2) / 2 equal runs of events
  // between them, so every swing wider than a run survives, the global peak
  // (first event reaching it) included. Returns curve() when it already
  // fits. Throws std::invalid_argument if max_points < 4.
  std::vector<std::pair<int64_t, int64_t>> curve(size_t max_points) const;
  // The event indices curve(max_points) keeps, ascending.
  std::vector<size_t> curve_indices(size_t max_points) const;

  // The same names, only events on `device`, spans remapped to the kept
  // events (a span may become empty).
  Timeline filtered(Device device) const;

 private:
  int64_t signed_bytes(size_t i) const {
    return events_[i].kind == EventKind::kAlloc ? events_[i].bytes
                                                : -events_[i].bytes;
  }
  bool live_after_index(size_t alloc_index, size_t event_index) const {
    return partner_[alloc_index] == kNoEvent ||
           partner_[alloc_index] > event_index;
  }
  void append_free(size_t alloc_index, const Event& e);
  // Index of the latest allocation of `id`, live or not; kNoEvent if none.
  size_t latest_alloc(uint64_t id) const;
  void check_index(size_t event_index, const char* op) const;

  std::vector<Event> events_;
  // For an allocation, the index of its free (kNoEvent while live); for a
  // free, the index of its allocation.
  std::vector<size_t> partner_;
  detail::IdMap live_ids_;      // id -> its live allocation's index
  detail::AllocIndex all_ids_;  // for questions about freed ids
  detail::StringTable phases_;
  detail::StringTable modules_;
  detail::StringTable ops_;
  std::vector<PhaseSpan> spans_;
  bool phase_open_ = false;
  uint16_t current_phase_ = 0;
};

}  // namespace memfit
