#include "memfit/core/model/timeline.h"

#include <algorithm>
#include <stdexcept>

namespace memfit {

// Note [Timeline recording rules]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A timeline answers "what did this recording allocate, and when was it
// live?", so live bytes count only allocations made during the recording:
// - A free of an id never allocated here (a tensor that existed before
//   recording began) is dropped, not appended: appending it would drive live
//   bytes below zero and make every later number meaningless.
// - A second free of the same id is dropped for the same reason.
// - A free takes bytes, device and category from its allocation, so the
//   two always cancel exactly and filtered(device) keeps them together;
//   time, phase, module and op stay the free's own.
// - Ids may be reused once freed (allocators reuse addresses). An
//   allocation of an id that is still live means its free was missed; a
//   free is appended for the earlier allocation, stamped like the new one,
//   so the bytes are not counted twice.
// Each allocation and its free know each other's index (partner_), which
// makes "live right after event i" a single pass with no lookups. Only live
// ids are hashed (live_ids_): the table stays the size of the live set and
// in cache, which is what makes record() cheap; questions about freed ids
// (category_of, set_category) go to an index of every id that is built
// only when first asked for (AllocIndex).

namespace detail {

// --- StringTable

StringTable::StringTable() {
  names_.emplace_back();
  rebuild_index();
}

StringTable::StringTable(const StringTable& other) : names_(other.names_) {
  rebuild_index();
}

StringTable& StringTable::operator=(const StringTable& other) {
  if (this != &other) {
    names_ = other.names_;
    rebuild_index();
  }
  return *this;
}

void StringTable::rebuild_index() {
  // The index keys view our own strings, never the copied-from table's.
  index_.clear();
  for (size_t i = 0; i < names_.size(); ++i) {
    index_.emplace(names_[i], static_cast<uint32_t>(i));
  }
}

uint32_t StringTable::intern(std::string_view name, uint32_t max_size,
                             const char* what) {
  auto it = index_.find(name);
  if (it != index_.end()) return it->second;
  if (names_.size() > max_size) {
    throw std::runtime_error(std::string("[Timeline::") + what +
                             "_index] more than " + std::to_string(max_size) +
                             " distinct " + what +
                             " names: record coarser names (e.g. module paths "
                             "without per-call suffixes)");
  }
  const auto index = static_cast<uint32_t>(names_.size());
  names_.emplace_back(name);
  index_.emplace(names_.back(), index);
  return index;
}

const std::string& StringTable::name(uint32_t index, const char* what) const {
  if (index >= names_.size()) {
    throw std::invalid_argument(
        std::string("[Timeline::") + what + "_name] no " + what +
        " has index " + std::to_string(index) + ": this timeline has " +
        std::to_string(names_.size()) + " (use indices it returned)");
  }
  return names_[index];
}

// --- IdMap

namespace {

// splitmix64's finaliser: ids are often addresses or counters, whose low
// bits alone would cluster.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

size_t IdMap::probe(uint64_t id) const {
  const size_t mask = slots_.size() - 1;
  size_t i = mix(id) & mask;
  while (slots_[i].value != kNoEvent && slots_[i].id != id) i = (i + 1) & mask;
  return i;
}

size_t* IdMap::find(uint64_t id) {
  if (slots_.empty()) return nullptr;
  Slot& s = slots_[probe(id)];
  return s.value == kNoEvent ? nullptr : &s.value;
}

const size_t* IdMap::find(uint64_t id) const {
  if (slots_.empty()) return nullptr;
  const Slot& s = slots_[probe(id)];
  return s.value == kNoEvent ? nullptr : &s.value;
}

size_t& IdMap::find_or_insert(uint64_t id) {
  // Load factor at most 1/2 keeps probe runs short.
  if ((size_ + 1) * 2 > slots_.size()) {
    grow(std::max<size_t>(16, slots_.size() * 2));
  }
  Slot& s = slots_[probe(id)];
  if (s.value == kNoEvent) {
    s.id = id;
    ++size_;
  }
  return s.value;
}

void IdMap::erase(uint64_t id) {
  if (slots_.empty()) return;
  const size_t mask = slots_.size() - 1;
  size_t hole = probe(id);
  if (slots_[hole].value == kNoEvent) return;
  // Backward shift: pull later entries of the probe run into the hole
  // unless their home slot lies cyclically in (hole, j].
  for (size_t j = (hole + 1) & mask; slots_[j].value != kNoEvent;
       j = (j + 1) & mask) {
    const size_t home = mix(slots_[j].id) & mask;
    const bool stays =
        hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole].value = kNoEvent;
  --size_;
}

void IdMap::grow(size_t capacity) {
  std::vector<Slot> old(capacity, Slot{0, kNoEvent});
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.value == kNoEvent) continue;
    size_t i = mix(s.id) & mask;
    while (slots_[i].value != kNoEvent) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

// --- AllocIndex

AllocIndex& AllocIndex::operator=(const AllocIndex& other) {
  if (this != &other) {
    std::lock_guard<std::mutex> lock(mu_);
    latest_.clear();
    indexed_ = 0;
  }
  return *this;
}

AllocIndex& AllocIndex::operator=(AllocIndex&& other) noexcept {
  if (this != &other) {
    std::lock_guard<std::mutex> lock(mu_);
    latest_.clear();
    indexed_ = 0;
  }
  return *this;
}

size_t AllocIndex::latest(uint64_t id, const std::vector<Event>& events) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (; indexed_ < events.size(); ++indexed_) {
    if (events[indexed_].kind == EventKind::kAlloc) {
      latest_[events[indexed_].id] = indexed_;
    }
  }
  auto it = latest_.find(id);
  return it == latest_.end() ? kNoEvent : it->second;
}

}  // namespace detail

// --- Timeline: recording

namespace {

constexpr uint32_t kMaxPhases = 65535;
constexpr uint32_t kMaxNames = 0xFFFFFFFEu;

}  // namespace

Timeline::Timeline() = default;

uint16_t Timeline::phase_index(std::string_view name) {
  return static_cast<uint16_t>(phases_.intern(name, kMaxPhases, "phase"));
}

uint32_t Timeline::module_index(std::string_view path) {
  return modules_.intern(path, kMaxNames, "module");
}

uint32_t Timeline::op_index(std::string_view name) {
  return ops_.intern(name, kMaxNames, "op");
}

const std::string& Timeline::phase_name(uint16_t index) const {
  return phases_.name(index, "phase");
}

const std::string& Timeline::module_name(uint32_t index) const {
  return modules_.name(index, "module");
}

const std::string& Timeline::op_name(uint32_t index) const {
  return ops_.name(index, "op");
}

void Timeline::append_free(size_t alloc_index, const Event& e) {
  Event f = e;
  f.kind = EventKind::kFree;
  f.id = events_[alloc_index].id;
  f.bytes = events_[alloc_index].bytes;
  f.device = events_[alloc_index].device;
  f.category = events_[alloc_index].category;
  partner_[alloc_index] = events_.size();
  events_.push_back(f);
  partner_.push_back(alloc_index);
}

void Timeline::record(const Event& e) {
  // See Note [Timeline recording rules].
  if (e.kind == EventKind::kAlloc) {
    size_t& live = live_ids_.find_or_insert(e.id);
    if (live != kNoEvent) append_free(live, e);
    live = events_.size();
    events_.push_back(e);
    partner_.push_back(kNoEvent);
  } else {
    size_t* live = live_ids_.find(e.id);
    if (live == nullptr) return;
    append_free(*live, e);
    live_ids_.erase(e.id);
  }
  if (phase_open_) spans_.back().end_event = events_.size();
}

void Timeline::reserve(size_t n) {
  events_.reserve(n);
  partner_.reserve(n);
}

size_t Timeline::latest_alloc(uint64_t id) const {
  if (const size_t* live = live_ids_.find(id)) return *live;
  return all_ids_.latest(id, events_);
}

bool Timeline::set_category(uint64_t alloc_id, Category c) {
  const size_t a = latest_alloc(alloc_id);
  if (a == kNoEvent) return false;
  events_[a].category = c;
  if (partner_[a] != kNoEvent) events_[partner_[a]].category = c;
  return true;
}

Category Timeline::category_of(uint64_t alloc_id) const {
  const size_t a = latest_alloc(alloc_id);
  if (a == kNoEvent) {
    throw std::invalid_argument(
        "[Timeline::category_of] id " + std::to_string(alloc_id) +
        " was never allocated in this recording: ask only about ids it "
        "recorded (see is_live())");
  }
  return events_[a].category;
}

bool Timeline::is_live(uint64_t alloc_id) const {
  return live_ids_.find(alloc_id) != nullptr;
}

void Timeline::begin_phase(std::string_view name, int iteration) {
  const uint16_t index = phase_index(name);
  end_phase();
  spans_.push_back(PhaseSpan{index, iteration, events_.size(), events_.size()});
  phase_open_ = true;
  current_phase_ = index;
}

void Timeline::end_phase() {
  if (!phase_open_) return;
  spans_.back().end_event = events_.size();
  phase_open_ = false;
  current_phase_ = 0;
}

// --- Timeline: analysis

void Timeline::check_index(size_t event_index, const char* op) const {
  if (event_index >= events_.size()) {
    throw std::invalid_argument(
        std::string("[Timeline::") + op + "] event " +
        std::to_string(event_index) + " is past the end: the timeline has " +
        std::to_string(events_.size()) + " events (valid: 0.." +
        (events_.empty() ? std::string("none")
                         : std::to_string(events_.size() - 1)) +
        ")");
  }
}

int64_t Timeline::live_after(size_t event_index) const {
  check_index(event_index, "live_after");
  int64_t live = 0;
  for (size_t i = 0; i <= event_index; ++i) live += signed_bytes(i);
  return live;
}

int64_t Timeline::live_bytes() const {
  int64_t live = 0;
  for (size_t i = 0; i < events_.size(); ++i) live += signed_bytes(i);
  return live;
}

Timeline::Peak Timeline::peak() const { return peak_in(0, events_.size()); }

Timeline::Peak Timeline::peak_in(size_t first, size_t end) const {
  if (first > end || end > events_.size()) {
    throw std::invalid_argument(
        "[Timeline::peak_in] range [" + std::to_string(first) + ", " +
        std::to_string(end) + ") is not inside the timeline's " +
        std::to_string(events_.size()) + " events: use first <= end <= size()");
  }
  int64_t live = 0;
  for (size_t i = 0; i < first; ++i) live += signed_bytes(i);
  Peak p;
  p.bytes = live;
  for (size_t i = first; i < end; ++i) {
    live += signed_bytes(i);
    if (p.event_index == kNoEvent || live > p.bytes) {
      p.bytes = live;
      p.event_index = i;
    }
  }
  if (p.event_index != kNoEvent) {
    const Event& e = events_[p.event_index];
    p.phase = e.phase;
    p.module = e.module;
    p.op = e.op;
    p.time_ns = e.time_ns;
  }
  return p;
}

namespace {

// Names with at least one live allocation, by bytes descending, ties by
// name.
template <typename NameFn>
std::vector<std::pair<std::string, int64_t>> sorted_by_bytes(
    const std::vector<int64_t>& bytes, const std::vector<uint8_t>& present,
    NameFn name) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (present[i]) out.emplace_back(name(i), bytes[i]);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return out;
}

}  // namespace

Timeline::Breakdown Timeline::breakdown_after(size_t event_index) const {
  check_index(event_index, "breakdown_after");
  Breakdown b;
  std::vector<int64_t> phase_bytes(phases_.size(), 0);
  std::vector<uint8_t> phase_present(phases_.size(), 0);
  std::vector<int64_t> module_bytes(modules_.size(), 0);
  std::vector<uint8_t> module_present(modules_.size(), 0);
  for (size_t i = 0; i <= event_index; ++i) {
    const Event& e = events_[i];
    if (e.kind != EventKind::kAlloc || !live_after_index(i, event_index)) {
      continue;
    }
    b.total += e.bytes;
    b.by_category[static_cast<size_t>(e.category)] += e.bytes;
    phase_bytes[e.phase] += e.bytes;
    phase_present[e.phase] = 1;
    module_bytes[e.module] += e.bytes;
    module_present[e.module] = 1;
  }
  b.by_phase = sorted_by_bytes(phase_bytes, phase_present, [this](size_t i) {
    return phase_name(static_cast<uint16_t>(i));
  });
  b.by_module = sorted_by_bytes(module_bytes, module_present, [this](size_t i) {
    return module_name(static_cast<uint32_t>(i));
  });
  return b;
}

std::vector<std::pair<std::string, int64_t>> Timeline::module_bytes_after(
    size_t event_index, Category category) const {
  check_index(event_index, "module_bytes_after");
  std::vector<int64_t> module_bytes(modules_.size(), 0);
  std::vector<uint8_t> module_present(modules_.size(), 0);
  for (size_t i = 0; i <= event_index; ++i) {
    const Event& e = events_[i];
    if (e.kind != EventKind::kAlloc || e.category != category ||
        !live_after_index(i, event_index)) {
      continue;
    }
    module_bytes[e.module] += e.bytes;
    module_present[e.module] = 1;
  }
  return sorted_by_bytes(module_bytes, module_present, [this](size_t i) {
    return module_name(static_cast<uint32_t>(i));
  });
}

std::vector<Timeline::PhaseSummary> Timeline::phase_summaries() const {
  std::vector<PhaseSummary> out;
  out.reserve(spans_.size());
  // Spans are ordered and never overlap, so one pass serves them all.
  int64_t live = 0;
  size_t i = 0;
  for (const PhaseSpan& span : spans_) {
    for (; i < span.first_event; ++i) live += signed_bytes(i);
    PhaseSummary s;
    s.name = phase_name(span.phase);
    s.iteration = span.iteration;
    s.live_before = live;
    s.peak = live;
    for (; i < span.end_event; ++i) {
      live += signed_bytes(i);
      if (live > s.peak) {
        s.peak = live;
        s.peak_event = i;
      }
    }
    s.live_after = live;
    s.delta = s.live_after - s.live_before;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<int64_t> Timeline::live_curve() const {
  std::vector<int64_t> out(events_.size());
  int64_t live = 0;
  for (size_t i = 0; i < events_.size(); ++i) {
    live += signed_bytes(i);
    out[i] = live;
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> Timeline::curve() const {
  std::vector<std::pair<int64_t, int64_t>> out(events_.size());
  int64_t live = 0;
  for (size_t i = 0; i < events_.size(); ++i) {
    live += signed_bytes(i);
    out[i] = {events_[i].time_ns, live};
  }
  return out;
}

std::vector<size_t> Timeline::curve_indices(size_t max_points) const {
  if (max_points < 4) {
    throw std::invalid_argument(
        "[Timeline::curve] max_points " + std::to_string(max_points) +
        " is too small: ask for at least 4 (the first and last points and "
        "one run's lowest and highest)");
  }
  const size_t n = events_.size();
  std::vector<size_t> out;
  if (n <= max_points) {
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  const std::vector<int64_t> live = live_curve();
  // Interior events [1, n-1) split into runs of near-equal length; each run
  // keeps its first lowest and first highest point. The global peak is the
  // first highest of its run, so it always survives.
  const size_t runs = (max_points - 2) / 2;
  const size_t interior = n - 2;
  out.reserve(2 + 2 * runs);
  out.push_back(0);
  for (size_t r = 0; r < runs; ++r) {
    const size_t begin = 1 + interior * r / runs;
    const size_t end = 1 + interior * (r + 1) / runs;
    if (begin == end) continue;
    size_t lo = begin;
    size_t hi = begin;
    for (size_t i = begin + 1; i < end; ++i) {
      if (live[i] < live[lo]) lo = i;
      if (live[i] > live[hi]) hi = i;
    }
    out.push_back(std::min(lo, hi));
    if (lo != hi) out.push_back(std::max(lo, hi));
  }
  out.push_back(n - 1);
  return out;
}

std::vector<std::pair<int64_t, int64_t>> Timeline::curve(
    size_t max_points) const {
  const std::vector<size_t> keep = curve_indices(max_points);
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(keep.size());
  // One pass: the kept indices ascend.
  int64_t live = 0;
  size_t i = 0;
  for (size_t k : keep) {
    for (; i <= k; ++i) live += signed_bytes(i);
    out.emplace_back(events_[k].time_ns, live);
  }
  return out;
}

Timeline Timeline::filtered(Device device) const {
  Timeline out;
  out.phases_ = phases_;
  out.modules_ = modules_;
  out.ops_ = ops_;
  // kept_before[i]: how many events before index i are kept; needed at
  // every span boundary, which ascend, so they are filled in one pass.
  std::vector<std::pair<size_t*, size_t>> boundaries;  // (slot, old index)
  out.spans_ = spans_;
  for (PhaseSpan& s : out.spans_) {
    boundaries.emplace_back(&s.first_event, s.first_event);
    boundaries.emplace_back(&s.end_event, s.end_event);
  }
  size_t b = 0;
  for (size_t i = 0; i < events_.size(); ++i) {
    for (; b < boundaries.size() && boundaries[b].second <= i; ++b) {
      *boundaries[b].first = out.events_.size();
    }
    if (events_[i].device == device) out.record(events_[i]);
  }
  for (; b < boundaries.size(); ++b) *boundaries[b].first = out.events_.size();
  out.phase_open_ = phase_open_;
  out.current_phase_ = current_phase_;
  return out;
}

}  // namespace memfit
