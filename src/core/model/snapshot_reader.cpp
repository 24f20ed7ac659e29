#include "memfit/core/model/snapshot_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace memfit {

// Note [Reading a snapshot in bounded memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A snapshot is a pickle of plain data (torch/cuda/memory.py documents it in
// _snapshot(); torch/cuda/_memory_viz.py reads it): {"segments": [...],
// "device_traces": [[entry, ...] per device], "allocator_settings": {...}}.
// Every trace entry carries its stack, a list of frame dicts, and Python
// frames are new dicts in every stack, so pickle.load of a 1 GB snapshot
// builds several GB of objects (the browser viewer crashes on such files).
//
// This reader is a pickle machine for the opcodes of plain data only (dicts,
// lists, tuples, sets, strings, numbers; a class or a call is refused, so
// nothing in the file is ever run), reading the file in chunks. As each part
// completes it is made small:
// - a list of frames, once it is a dict's "frames" value, becomes an index
//   into one table of distinct stacks, and each frame dict an index into
//   one table of distinct frames;
// - a trace entry, once appended to a list, becomes a row of that list's
//   columns (SnapshotTrace), and the list stands for the columns;
// - a block (a dict with "state" and "size" appended to a list) becomes a
//   SnapshotBlock.
// The pickle's memo (what the file may refer back to, one slot for every
// string, dict and list it wrote) holds the small forms in 4 bytes a slot;
// containers are reference counted, so a dict made small is freed as soon as
// nothing refers to it. What stays is the columns (45 bytes an event), the
// distinct frames, stacks and strings, and the memo.
//
// A hostile file must not make the reader take more than a multiple of its
// own size, nor crash it: a length is checked against the bytes the file
// has left before anything is allocated for it, a memo slot against the
// bytes read so far (each stored object took at least one), a block may be
// listed once, nested containers are freed without recursion, and a
// value's text is cut short. Sizes, addresses and times that are not
// integers, or that no device could have (see kMaxBytes), are refused with
// the entry they are in, rather than read as 0.

const char* to_string(TraceAction a) {
  static const char* names[kNumTraceActions] = {
      "alloc",        "free_requested", "free_completed",
      "segment_alloc", "segment_free",  "segment_map",
      "segment_unmap", "oom",           "snapshot"};
  return names[static_cast<int>(a)];
}

namespace {

enum class Tag : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,    // v: string id
  kObj,    // v: container index (see Reader::arena_)
  kFrame,  // v: frame id
  kStack,  // v: stack id
  kTrace,  // v: index into Reader::traces_
  kBlock,  // v: index into Reader::blocks_
  kDead,   // made small and dropped: nothing the reader keeps
  kBigInt, // an integer wider than 64 bits: its value is not kept
};

struct Val {
  Tag tag = Tag::kNone;
  int64_t v = 0;
};

struct Container {
  enum Kind : uint8_t { kDict, kList, kTuple, kSet };
  Kind kind = kDict;
  bool compacted = false;  // made small: `compact` stands for it
  int32_t refs = 0;
  int64_t memo = -1;  // its memo slot, while the memo holds it
  Val compact;
  std::vector<Val> items;  // a dict's as key, value, key, value, ...
};

struct FrameKey {
  uint32_t filename;
  int64_t line;
  uint32_t name;
  bool operator==(const FrameKey& o) const {
    return filename == o.filename && line == o.line && name == o.name;
  }
};
struct FrameKeyHash {
  size_t operator()(const FrameKey& k) const {
    return (static_cast<size_t>(k.filename) * 1000003u) ^
           (static_cast<size_t>(k.line) * 7919u) ^ k.name;
  }
};
struct StackHash {
  size_t operator()(const std::vector<uint32_t>& s) const {
    size_t h = s.size();
    for (uint32_t f : s) h = h * 1000003u ^ f;
    return h;
  }
};

constexpr size_t kChunk = 8 << 20;
constexpr uint64_t kNoAddress = ~0ull;
// The most bytes one size may hold (1 PiB), and the most a device's sizes
// may add up to: every sum memfit makes of them then fits in 64 bits.
constexpr int64_t kMaxBytes = int64_t{1} << 50;
constexpr int64_t kMaxTotalBytes = int64_t{1} << 62;
// time_us past this (the year 2112) is corrupt; (t - t0) * 1000 fits then.
constexpr int64_t kMaxTimeUs = int64_t{1} << 52;
// How much of a value the reader keeps as text, and how much a message shows.
constexpr size_t kReprChars = 1000;
constexpr size_t kQuotedChars = 60;

// The dict keys the reader looks up, interned first.
enum Key : int {
  k_frames,
  k_action,
  k_addr,
  k_size,
  k_stream,
  k_time_us,
  k_device_free,
  k_filename,
  k_line,
  k_name,
  k_state,
  k_address,
  k_requested_size,
  k_total_size,
  k_device,
  k_segment_type,
  k_allocated_size,
  k_active_size,
  k_is_expandable,
  k_blocks,
  k_segments,
  k_device_traces,
  k_allocator_settings,
  kNumKeys
};
const char* const kKeyNames[kNumKeys] = {
    "frames",
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "device_free",
    "filename",
    "line",
    "name",
    "state",
    "address",
    "requested_size",
    "total_size",
    "device",
    "segment_type",
    "allocated_size",
    "active_size",
    "is_expandable",
    "blocks",
    "segments",
    "device_traces",
    "allocator_settings",
};


class Reader {
 public:
  Reader(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {
    stacks_.emplace_back();
    stack_index_.emplace(std::vector<uint32_t>{}, 0);
    for (int k = 0; k < kNumKeys; ++k) key_[k] = intern(kKeyNames[k]);
    for (int a = 0; a < kNumTraceActions; ++a) {
      action_[a] = intern(to_string(static_cast<TraceAction>(a)));
    }
  }

  Snapshot run();

 private:
  [[noreturn]] void bad(const std::string& why) const {
    throw SnapshotFormatError(path_ + ": not a torch memory snapshot (" + why + ")");
  }
  [[noreturn]] void corrupt(const std::string& why) const {
    throw SnapshotFormatError(path_ + ": a corrupted snapshot: " + why +
                              "; dump it again with torch.cuda.memory._dump_snapshot");
  }
  // Bytes of the file read by the machine so far.
  uint64_t offset() const { return read_ - (end_ - pos_); }

  // --- input
  void fill(size_t need) {
    if (end_ - pos_ >= need) return;
    // Nothing is allocated for bytes the file does not have.
    if (need - (end_ - pos_) > file_size_ - std::min(read_, file_size_)) {
      bad("the file ends in the middle of the pickle");
    }
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    if (buf_.size() < need) buf_.resize(need);
    if (buf_.size() < kChunk) buf_.resize(kChunk);
    while (end_ < need && !eof_) {
      const size_t got = std::fread(buf_.data() + end_, 1, buf_.size() - end_, f_);
      if (got == 0) {
        if (std::ferror(f_)) {
          throw std::runtime_error(path_ + ": cannot read: " + std::strerror(errno));
        }
        eof_ = true;
      }
      end_ += got;
      read_ += got;
    }
    if (end_ - pos_ < need) bad("the file ends in the middle of the pickle");
  }
  uint8_t byte() {
    fill(1);
    return static_cast<uint8_t>(buf_[pos_++]);
  }
  template <typename T>
  T le() {
    fill(sizeof(T));
    T v;
    std::memcpy(&v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;  // little-endian hosts only (x86, arm64)
  }
  std::string_view bytes(size_t n) {
    fill(n);
    std::string_view s(buf_.data() + pos_, n);
    pos_ += n;
    return s;
  }

  // --- strings, frames, stacks
  uint32_t intern(std::string_view s) {
    auto it = string_index_.find(s);
    if (it != string_index_.end()) return it->second;
    strings_.emplace_back(s);
    const uint32_t id = static_cast<uint32_t>(strings_.size() - 1);
    string_index_.emplace(strings_.back(), id);
    return id;
  }
  uint32_t key(Key k) const { return key_[k]; }

  // --- containers and references
  int64_t new_container(Container::Kind kind) {
    int64_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
      arena_[i] = Container{};
    } else {
      arena_.emplace_back();
      i = static_cast<int64_t>(arena_.size() - 1);
    }
    arena_[i].kind = kind;
    return i;
  }
  void retain(const Val& x) {
    if (x.tag == Tag::kObj) ++arena_[x.v].refs;
  }
  // Without recursion: a file may nest a million lists.
  void release(const Val& x) {
    if (x.tag != Tag::kObj) return;
    std::vector<int64_t> dying{x.v};
    while (!dying.empty()) {
      const int64_t i = dying.back();
      dying.pop_back();
      Container& c = arena_[i];
      if (--c.refs > 0) continue;
      std::vector<Val> items = std::move(c.items);
      c.items = {};
      free_.push_back(i);
      for (const Val& item : items) {
        if (item.tag == Tag::kObj) dying.push_back(item.v);
      }
    }
  }
  // What a value stands for now: a container made small reads as its
  // small form.
  Val resolve(const Val& x) const {
    if (x.tag == Tag::kObj && arena_[x.v].compacted) return arena_[x.v].compact;
    return x;
  }
  // `c` becomes `small`: its items are dropped and the memo refers to the
  // small form.
  void compact(int64_t index, Val small) {
    Container& c = arena_[index];
    c.compacted = true;
    c.compact = small;
    std::vector<Val> items = std::move(c.items);
    c.items = {};
    const int64_t slot = c.memo;
    for (const Val& i : items) release(i);
    if (slot >= 0) {
      arena_[index].memo = -1;
      memo_[slot] = pack(small);
      release(Val{Tag::kObj, index});  // the memo's reference
    }
  }

  // --- the memo: 4 bytes a slot, the tag in the top 4 bits.
  static constexpr uint32_t kPayload = (1u << 28) - 1;
  uint32_t pack(const Val& x) {
    switch (x.tag) {
      case Tag::kStr:
      case Tag::kObj:
      case Tag::kFrame:
      case Tag::kStack:
      case Tag::kTrace:
      case Tag::kBlock:
      case Tag::kDead:
      case Tag::kBigInt:
        if (x.v < 0 || x.v > kPayload) bad("more objects than this reader can index");
        return (static_cast<uint32_t>(x.tag) << 28) | static_cast<uint32_t>(x.v);
      default:  // numbers, None: memoized only by hand-made pickles
        others_.push_back(x);
        if (others_.size() > kPayload) bad("more objects than this reader can index");
        return (15u << 28) | static_cast<uint32_t>(others_.size() - 1);
    }
  }
  Val unpack(uint32_t m) const {
    const uint32_t tag = m >> 28;
    const int64_t v = m & kPayload;
    if (tag == 15u) return others_[v];
    return Val{static_cast<Tag>(tag), v};
  }
  static constexpr uint32_t kUnset = 14u << 28;
  void memo_put(size_t slot, const Val& x) {
    if (slot >= memo_.size()) {
      // Each object stored took a byte of the file at least.
      if (slot > offset()) bad("a memo index past the objects the file holds");
      memo_.resize(slot + 1, kUnset);
    }
    retain(x);
    if (memo_[slot] != kUnset) {
      const Val old = unpack(memo_[slot]);
      if (old.tag == Tag::kObj && arena_[old.v].memo == static_cast<int64_t>(slot)) {
        arena_[old.v].memo = -1;
      }
      release(old);
    }
    memo_[slot] = pack(x);
    if (x.tag == Tag::kObj) arena_[x.v].memo = static_cast<int64_t>(slot);
  }
  Val memo_get(size_t slot) {
    if (slot >= memo_.size() || memo_[slot] == kUnset) {
      bad("a reference to an object never stored");
    }
    return unpack(memo_[slot]);
  }

  // --- the VM stack
  void push(const Val& x) { stack_.push_back(x); }
  Val pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      bad("the pickle's stack underflows");
    }
    Val x = stack_.back();
    stack_.pop_back();
    return x;
  }
  std::vector<Val> pop_mark() {
    if (marks_.empty()) bad("a MARK is missing");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) bad("the pickle's stack underflows");
    std::vector<Val> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Val& top() {
    if (stack_.empty()) bad("the pickle's stack underflows");
    return stack_.back();
  }

  // --- dict fields
  const Val* field(const Container& d, uint32_t k) const {
    for (size_t i = 0; i + 1 < d.items.size(); i += 2) {
      if (d.items[i].tag == Tag::kStr && d.items[i].v == k) return &d.items[i + 1];
    }
    return nullptr;
  }
  int64_t int_field(const Container& d, Key k, int64_t fallback = 0) const {
    const Val* v = field(d, key(k));
    if (v == nullptr) return fallback;
    if (v->tag == Tag::kInt || v->tag == Tag::kBool) return v->v;
    return fallback;
  }
  // An integer field of `where` (an entry, a segment, a block) in [lo, hi];
  // `fallback` when absent. Anything else is refused, naming the entry.
  int64_t number(const Container& d, Key k, const std::string& where, int64_t lo,
                 int64_t hi, int64_t fallback = 0) const {
    const Val* v = field(d, key(k));
    if (v == nullptr) return fallback;
    const Val r = resolve(*v);
    if (r.tag != Tag::kInt && r.tag != Tag::kBool) {
      corrupt(where + " has " + kKeyNames[k] + " " + quoted(r) + ", not an integer");
    }
    if (r.v < lo || r.v > hi) {
      corrupt(where + " has " + kKeyNames[k] + " " + std::to_string(r.v) + ", outside " +
              std::to_string(lo) + ".." + std::to_string(hi) + (k == k_time_us ? "" : " bytes"));
    }
    return r.v;
  }
  // A byte count: 0..kMaxBytes.
  int64_t bytes_field(const Container& d, Key k, const std::string& where,
                      int64_t fallback = 0) const {
    return number(d, k, where, 0, kMaxBytes, fallback);
  }
  // Any 64-bit integer (an address, a stream).
  int64_t any_int(const Container& d, Key k, const std::string& where) const {
    return number(d, k, where, INT64_MIN, INT64_MAX);
  }
  std::string str_field(const Container& d, Key k) const {
    const Val* v = field(d, key(k));
    return v && v->tag == Tag::kStr ? strings_[v->v] : std::string();
  }
  bool is_dict_with(const Val& x, Key k) const {
    const Val r = resolve(x);
    return r.tag == Tag::kObj && arena_[r.v].kind == Container::kDict &&
           field(arena_[r.v], key(k)) != nullptr;
  }

  // --- making parts small
  uint32_t frame_id(const Val& x) {
    const Val r = resolve(x);
    if (r.tag == Tag::kFrame) return static_cast<uint32_t>(r.v);
    if (r.tag != Tag::kObj || arena_[r.v].kind != Container::kDict) {
      bad("a stack frame that is not a dict");
    }
    const Container& d = arena_[r.v];
    const Val* fn = field(d, key(k_filename));
    const Val* nm = field(d, key(k_name));
    FrameKey k{fn && fn->tag == Tag::kStr ? static_cast<uint32_t>(fn->v) : intern("?"),
               int_field(d, k_line),
               nm && nm->tag == Tag::kStr ? static_cast<uint32_t>(nm->v) : intern("?")};
    auto it = frame_index_.find(k);
    uint32_t id;
    if (it != frame_index_.end()) {
      id = it->second;
    } else {
      id = static_cast<uint32_t>(frame_keys_.size());
      frame_keys_.push_back(k);
      frame_index_.emplace(k, id);
    }
    compact(r.v, Val{Tag::kFrame, id});
    return id;
  }
  Val stack_id(const Val& x) {
    const Val r = resolve(x);
    if (r.tag == Tag::kStack) return r;
    if (r.tag != Tag::kObj || arena_[r.v].kind != Container::kList) {
      return Val{Tag::kStack, 0};
    }
    std::vector<uint32_t> key;
    key.reserve(arena_[r.v].items.size());
    for (size_t i = 0; i < arena_[r.v].items.size(); ++i) {
      key.push_back(frame_id(arena_[r.v].items[i]));
    }
    auto it = stack_index_.find(key);
    uint32_t id;
    if (it != stack_index_.end()) {
      id = it->second;
    } else {
      id = static_cast<uint32_t>(stacks_.size());
      stacks_.push_back(key);
      stack_index_.emplace(std::move(key), id);
    }
    compact(r.v, Val{Tag::kStack, id});
    return Val{Tag::kStack, id};
  }
  void add_entry(SnapshotTrace& t, const Val& x) {
    const Val r = resolve(x);
    if (r.tag != Tag::kObj || arena_[r.v].kind != Container::kDict) {
      bad("a trace entry that is not a dict");
    }
    const Container& e = arena_[r.v];
    const Val* a = field(e, key(k_action));
    int code = -1;
    for (int i = 0; a && a->tag == Tag::kStr && i < kNumTraceActions; ++i) {
      if (a->v == action_[i]) code = i;
    }
    if (code < 0) {
      ++unknown_actions_[a && a->tag == Tag::kStr ? strings_[a->v] : repr(a ? *a : Val{})];
      compact(r.v, Val{Tag::kDead, 0});
      return;
    }
    const std::string where = "trace entry " + std::to_string(t.size_of()) + " (" +
                              to_string(static_cast<TraceAction>(code)) + ")";
    const bool oom = code == static_cast<int>(TraceAction::kOom);
    const uint64_t addr = static_cast<uint64_t>(
        oom ? bytes_field(e, k_device_free, where) : any_int(e, k_addr, where));
    const int64_t size = bytes_field(e, k_size, where);
    const int64_t stream = any_int(e, k_stream, where);
    const int64_t time_us = number(e, k_time_us, where, 0, kMaxTimeUs);
    t.action.push_back(static_cast<uint8_t>(code));
    t.addr.push_back(addr);
    t.size.push_back(size);
    t.stream.push_back(stream);
    t.time_us.push_back(time_us);
    const Val* fr = field(e, key(k_frames));
    t.stack.push_back(fr ? static_cast<uint32_t>(stack_id(*fr).v) : 0);
    compact(r.v, Val{Tag::kDead, 0});  // the row holds it now
  }
  Val make_block(const Val& x) {
    const Val r = resolve(x);
    if (r.tag != Tag::kObj || arena_[r.v].kind != Container::kDict) return x;
    const Container& d = arena_[r.v];
    SnapshotBlock b;
    // Blocks without an address (torch's _profile_to_snapshot writes none)
    // get one from their segment: see segment().
    const std::string where = "block " + std::to_string(blocks_.size());
    b.address = field(d, key(k_address)) ? static_cast<uint64_t>(any_int(d, k_address, where))
                                         : kNoAddress;
    b.size = bytes_field(d, k_size, where);
    b.requested_size = bytes_field(d, k_requested_size, where, b.size);
    b.state = str_field(d, k_state);
    const Val* fr = field(d, key(k_frames));
    b.stack = fr ? static_cast<uint32_t>(stack_id(*fr).v) : 0;
    blocks_.push_back(std::move(b));
    const Val small{Tag::kBlock, static_cast<int64_t>(blocks_.size() - 1)};
    compact(r.v, small);
    release(x);
    return small;
  }

  void setitems(const Val& target, std::vector<Val> items) {
    const Val r = resolve(target);
    if (r.tag != Tag::kObj || arena_[r.v].kind != Container::kDict || items.size() % 2) {
      bad("dict items set on something that is not a dict");
    }
    for (size_t i = 0; i + 1 < items.size(); i += 2) {
      if (items[i].tag == Tag::kStr && items[i].v == key(k_frames)) {
        const Val s = stack_id(items[i + 1]);
        release(items[i + 1]);
        items[i + 1] = s;
      }
    }
    auto& dst = arena_[r.v].items;
    dst.insert(dst.end(), items.begin(), items.end());
  }
  void appends(Val& target, std::vector<Val> items) {
    Val r = resolve(target);
    if (r.tag == Tag::kTrace) {
      for (const Val& x : items) {
        add_entry(traces_[r.v], x);
        release(x);
      }
      return;
    }
    if (r.tag != Tag::kObj || (arena_[r.v].kind != Container::kList &&
                               arena_[r.v].kind != Container::kSet)) {
      bad("list items appended to something that is not a list");
    }
    if (!items.empty() && is_dict_with(items.front(), k_action)) {
      traces_.emplace_back();
      const Val trace{Tag::kTrace, static_cast<int64_t>(traces_.size() - 1)};
      // Entries appended one at a time before (pickle protocol 0 or 1).
      std::vector<Val> before = std::move(arena_[r.v].items);
      arena_[r.v].items = {};
      for (const Val& x : before) {
        add_entry(traces_[trace.v], x);
        release(x);
      }
      for (const Val& x : items) {
        add_entry(traces_[trace.v], x);
        release(x);
      }
      compact(r.v, trace);
      return;
    }
    if (!items.empty() && is_dict_with(items.front(), k_state) &&
        is_dict_with(items.front(), k_size)) {
      for (Val& x : items) x = make_block(x);
    }
    auto& dst = arena_[r.v].items;
    dst.insert(dst.end(), items.begin(), items.end());
  }

  Val new_obj(Container::Kind kind, std::vector<Val> items = {}) {
    const Val x{Tag::kObj, new_container(kind)};
    arena_[x.v].items = std::move(items);
    ++arena_[x.v].refs;  // the stack's
    return x;
  }

  Val machine();
  Snapshot result(const Val& top);
  SnapshotSegment segment(const Val& x);
  SnapshotTrace trace_of(const Val& x);
  // A value as Python would print it, cut to about kReprChars characters.
  std::string repr(const Val& x, size_t limit = kReprChars) const {
    std::string out;
    repr_into(x, 0, out, limit);
    return out;
  }
  void repr_into(const Val& x, int depth, std::string& out, size_t limit) const;
  // A value for a message: a string quoted, anything else as repr.
  std::string quoted(const Val& x) const {
    const Val r = resolve(x);
    const std::string text = repr(r, kQuotedChars);
    return r.tag == Tag::kStr ? "'" + text + "'" : text;
  }

  std::FILE* f_;
  std::string path_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;

  std::deque<std::string> strings_;
  std::unordered_map<std::string_view, uint32_t> string_index_;
  uint32_t key_[kNumKeys] = {};
  uint32_t action_[kNumTraceActions] = {};
  std::vector<FrameKey> frame_keys_;
  std::unordered_map<FrameKey, uint32_t, FrameKeyHash> frame_index_;
  std::vector<std::vector<uint32_t>> stacks_;
  std::unordered_map<std::vector<uint32_t>, uint32_t, StackHash> stack_index_;

  std::vector<Container> arena_;
  std::vector<int64_t> free_;
  std::vector<uint32_t> memo_;
  std::vector<Val> others_;
  std::vector<Val> stack_;
  std::vector<size_t> marks_;
  std::vector<SnapshotTrace> traces_;
  std::vector<SnapshotBlock> blocks_;
  std::map<std::string, int64_t> unknown_actions_;
  uint64_t file_size_ = 0;  // bytes the file holds
  uint64_t read_ = 0;       // bytes read from it into buf_ so far
  int64_t segments_read_ = 0;
  std::vector<bool> block_taken_;  // per block: a segment listed it
};

Val Reader::machine() {
  fill(2);
  if (static_cast<uint8_t>(buf_[pos_]) != 0x80) {
    bad("it is not a pickle of protocol 2 or later");
  }
  while (true) {
    const uint8_t op = byte();
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t p = byte();
        if (p > 5) bad("pickle protocol " + std::to_string(p) + " is newer than this reader");
        break;
      }
      case 0x95:  // FRAME: a length prefix only
        le<uint64_t>();
        break;
      case 0x68:  // BINGET
        push(memo_get(byte()));
        retain(stack_.back());
        break;
      case 0x6A:  // LONG_BINGET
        push(memo_get(le<uint32_t>()));
        retain(stack_.back());
        break;
      case 0x94:  // MEMOIZE
        memo_put(memo_.size(), top());
        break;
      case 0x71:  // BINPUT
        memo_put(byte(), top());
        break;
      case 0x72:  // LONG_BINPUT
        memo_put(le<uint32_t>(), top());
        break;
      case 0x8C: {  // SHORT_BINUNICODE
        const size_t n = byte();
        push(Val{Tag::kStr, intern(bytes(n))});
        break;
      }
      case 0x58: {  // BINUNICODE
        const size_t n = le<uint32_t>();
        push(Val{Tag::kStr, intern(bytes(n))});
        break;
      }
      case 0x8D: {  // BINUNICODE8
        const uint64_t n = le<uint64_t>();
        if (n > (1ull << 32)) bad("a string over 4 GB");
        push(Val{Tag::kStr, intern(bytes(n))});
        break;
      }
      case 0x43: {  // SHORT_BINBYTES: kept as a string (never in a snapshot)
        const size_t n = byte();
        push(Val{Tag::kStr, intern(bytes(n))});
        break;
      }
      case 0x42: {  // BINBYTES
        const size_t n = le<uint32_t>();
        push(Val{Tag::kStr, intern(bytes(n))});
        break;
      }
      case 0x8E:    // BINBYTES8
      case 0x96: {  // BYTEARRAY8
        const uint64_t n = le<uint64_t>();
        if (n > (1ull << 32)) bad("a byte string over 4 GB");
        push(Val{Tag::kStr, intern(bytes(n))});
        break;
      }
      case 0x4B:  // BININT1
        push(Val{Tag::kInt, byte()});
        break;
      case 0x4D:  // BININT2
        push(Val{Tag::kInt, le<uint16_t>()});
        break;
      case 0x4A:  // BININT
        push(Val{Tag::kInt, le<int32_t>()});
        break;
      case 0x8A: {  // LONG1: little-endian two's complement
        const size_t n = byte();
        const std::string_view b = bytes(n);
        if (n > 9 || (n == 9 && b[8] != 0)) {
          push(Val{Tag::kBigInt, 0});  // refused where a field needs its value
          break;
        }
        uint64_t u = 0;
        for (size_t i = 0; i < n && i < 8; ++i) {
          u |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
        }
        if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) {
          u |= ~0ull << (8 * n);  // sign-extend
        }
        push(Val{Tag::kInt, static_cast<int64_t>(u)});
        break;
      }
      case 0x8B: {  // LONG4: as LONG1, with a 4-byte length
        const int32_t n = le<int32_t>();
        if (n < 0) bad("an integer of negative length");
        const std::string_view b = bytes(static_cast<size_t>(n));
        bool wide = n > 9 || (n == 9 && b[8] != 0);
        uint64_t u = 0;
        for (int32_t i = 0; !wide && i < n && i < 8; ++i) {
          u |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
        }
        if (!wide && n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) {
          u |= ~0ull << (8 * n);
        }
        push(wide ? Val{Tag::kBigInt, 0} : Val{Tag::kInt, static_cast<int64_t>(u)});
        break;
      }
      case 0x47: {  // BINFLOAT: big-endian double
        uint64_t u = 0;
        const std::string_view b = bytes(8);
        for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(b[i]);
        push(Val{Tag::kFloat, static_cast<int64_t>(u)});
        break;
      }
      case 0x4E:  // NONE
        push(Val{Tag::kNone, 0});
        break;
      case 0x88:  // NEWTRUE
        push(Val{Tag::kBool, 1});
        break;
      case 0x89:  // NEWFALSE
        push(Val{Tag::kBool, 0});
        break;
      case 0x28:  // MARK
        marks_.push_back(stack_.size());
        break;
      case 0x7D:  // EMPTY_DICT
        push(new_obj(Container::kDict));
        break;
      case 0x5D:  // EMPTY_LIST
        push(new_obj(Container::kList));
        break;
      case 0x29:  // EMPTY_TUPLE
        push(new_obj(Container::kTuple));
        break;
      case 0x8F:  // EMPTY_SET
        push(new_obj(Container::kSet));
        break;
      case 0x75: {  // SETITEMS
        std::vector<Val> items = pop_mark();
        setitems(top(), std::move(items));
        break;
      }
      case 0x73: {  // SETITEM
        const Val v = pop();
        const Val k = pop();
        setitems(top(), {k, v});
        break;
      }
      case 0x65:    // APPENDS
      case 0x90: {  // ADDITEMS
        std::vector<Val> items = pop_mark();
        appends(top(), std::move(items));
        break;
      }
      case 0x61: {  // APPEND
        const Val v = pop();
        appends(top(), {v});
        break;
      }
      case 0x74:    // TUPLE
      case 0x91: {  // FROZENSET
        std::vector<Val> items = pop_mark();
        push(new_obj(op == 0x74 ? Container::kTuple : Container::kSet, std::move(items)));
        break;
      }
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87: {  // TUPLE3
        const size_t n = op - 0x84u;
        if (stack_.size() < n + (marks_.empty() ? 0 : marks_.back())) {
          bad("the pickle's stack underflows");
        }
        std::vector<Val> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(new_obj(Container::kTuple, std::move(items)));
        break;
      }
      case 0x6C: {  // LIST
        std::vector<Val> items = pop_mark();
        Val l = new_obj(Container::kList);
        push(l);
        appends(top(), std::move(items));
        break;
      }
      case 0x64: {  // DICT
        std::vector<Val> items = pop_mark();
        push(new_obj(Container::kDict));
        setitems(top(), std::move(items));
        break;
      }
      case 0x2E:  // STOP
        if (stack_.size() != 1 || !marks_.empty()) {
          bad("the pickle does not end with exactly one object");
        }
        return stack_.back();
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        bad(std::string("pickle opcode ") + hex +
            ": a snapshot holds plain data only (no classes, no calls)");
      }
    }
  }
}

SnapshotTrace Reader::trace_of(const Val& x) {
  const Val r = resolve(x);
  if (r.tag == Tag::kTrace) return std::move(traces_[r.v]);
  if (r.tag == Tag::kObj && arena_[r.v].kind == Container::kList) {
    SnapshotTrace t;  // empty, or entries never appended in a batch
    for (const Val& e : arena_[r.v].items) add_entry(t, e);
    return t;
  }
  bad("device_traces holds something other than lists");
}

SnapshotSegment Reader::segment(const Val& x) {
  const Val r = resolve(x);
  if (r.tag != Tag::kObj || arena_[r.v].kind != Container::kDict ||
      field(arena_[r.v], key(k_total_size)) == nullptr) {
    bad("a segment without total_size");
  }
  const Container& d = arena_[r.v];
  const std::string where = "segment " + std::to_string(segments_read_++);
  SnapshotSegment s;
  s.device = number(d, k_device, where, 0, 1 << 20);
  s.address = static_cast<uint64_t>(any_int(d, k_address, where));
  s.total_size = bytes_field(d, k_total_size, where);
  s.stream = any_int(d, k_stream, where);
  s.segment_type = str_field(d, k_segment_type);
  s.allocated_size = bytes_field(d, k_allocated_size, where);
  s.active_size = bytes_field(d, k_active_size, where);
  s.is_expandable = int_field(d, k_is_expandable) != 0;
  if (const Val* b = field(d, key(k_blocks))) {
    const Val rb = resolve(*b);
    if (rb.tag == Tag::kObj) {
      std::vector<Val> items = arena_[rb.v].items;
      for (const Val& i : items) {
        Val blk = resolve(i);
        if (blk.tag == Tag::kObj) {
          retain(blk);
          blk = make_block(blk);
        }
        if (blk.tag == Tag::kBlock) {
          // A block shared by segments would be copied once per segment.
          if (block_taken_.size() <= static_cast<size_t>(blk.v)) {
            block_taken_.resize(blocks_.size());
          }
          if (block_taken_[blk.v]) corrupt(where + " lists a block listed before");
          block_taken_[blk.v] = true;
          s.blocks.push_back(blocks_[blk.v]);
        }
      }
    }
  }
  // Blocks lie in address order from the segment's start (as torch's
  // snapshot writes their addresses): fill in those written without one.
  uint64_t at = s.address;
  for (SnapshotBlock& b : s.blocks) {
    if (b.address == kNoAddress) b.address = at;
    at = b.address + static_cast<uint64_t>(b.size);
  }
  return s;
}

void Reader::repr_into(const Val& x, int depth, std::string& out, size_t limit) const {
  if (out.size() > limit) return;
  const Val r = resolve(x);
  switch (r.tag) {
    case Tag::kNone:
      out += "None";
      break;
    case Tag::kBool:
      out += r.v ? "True" : "False";
      break;
    case Tag::kInt:
      out += std::to_string(r.v);
      break;
    case Tag::kBigInt:
      out += "<an integer wider than 64 bits>";
      break;
    case Tag::kFloat: {
      double d;
      std::memcpy(&d, &r.v, sizeof d);
      char text[32];
      std::snprintf(text, sizeof text, "%g", d);
      out += text;
      break;
    }
    case Tag::kStr:
      out += strings_[r.v].substr(0, limit);
      break;
    case Tag::kObj: {
      if (depth > 3) {
        out += "...";
        break;
      }
      const Container& c = arena_[r.v];
      out += c.kind == Container::kDict ? "{" : "[";
      for (size_t i = 0; i < c.items.size(); ++i) {
        if (out.size() > limit) break;
        if (i) out += c.kind == Container::kDict && i % 2 ? ": " : ", ";
        repr_into(c.items[i], depth + 1, out, limit);
      }
      out += c.kind == Container::kDict ? "}" : "]";
      break;
    }
    default:
      out += "?";
  }
  if (out.size() > limit) {
    out.resize(limit);
    out += "...";
  }
}

Snapshot Reader::result(const Val& top_val) {
  Val top = resolve(top_val);
  Snapshot s;
  if (top.tag == Tag::kObj && arena_[top.v].kind == Container::kList) {
    // torch's "segments only" form (what _memory_viz._read accepts)
    for (const Val& x : std::vector<Val>(arena_[top.v].items)) {
      s.segments.push_back(segment(x));
    }
  } else if (top.tag == Tag::kObj && arena_[top.v].kind == Container::kDict &&
             field(arena_[top.v], key(k_segments)) != nullptr) {
    const Container& d = arena_[top.v];
    const Val segs = resolve(*field(d, key(k_segments)));
    if (segs.tag != Tag::kObj) bad("'segments' is not a list");
    for (const Val& x : std::vector<Val>(arena_[segs.v].items)) {
      s.segments.push_back(segment(x));
    }
    if (const Val* t = field(arena_[top.v], key(k_device_traces))) {
      const Val traces = resolve(*t);
      if (traces.tag != Tag::kObj) bad("'device_traces' is not a list");
      s.has_traces = true;
      for (const Val& x : std::vector<Val>(arena_[traces.v].items)) {
        s.traces.push_back(trace_of(x));
      }
    }
    if (const Val* a = field(arena_[top.v], key(k_allocator_settings))) {
      const Val settings = resolve(*a);
      if (settings.tag == Tag::kObj && arena_[settings.v].kind == Container::kDict) {
        const auto& items = arena_[settings.v].items;
        for (size_t i = 0; i + 1 < items.size(); i += 2) {
          s.allocator_settings[repr(items[i])] = repr(items[i + 1]);
        }
      }
    }
  } else {
    bad("no 'segments': write one with torch.cuda.memory._dump_snapshot");
  }
  // Each size is at most kMaxBytes; their sums must fit what memfit adds.
  const auto check_total = [&](const std::string& what, auto each) {
    int64_t total = 0;
    each([&](int64_t n) {
      total += n;
      if (total > kMaxTotalBytes) {
        corrupt(what + " add up to more than 2^62 bytes: no device holds that");
      }
    });
  };
  check_total("the segments' sizes", [&](auto add) {
    for (const SnapshotSegment& seg : s.segments) add(seg.total_size);
  });
  for (size_t d = 0; d < s.traces.size(); ++d) {
    check_total("the sizes in device " + std::to_string(d) + "'s trace", [&](auto add) {
      for (int64_t n : s.traces[d].size) add(n);
    });
  }
  s.frames.reserve(frame_keys_.size());
  for (const FrameKey& k : frame_keys_) {
    s.frames.push_back(SnapshotFrame{strings_[k.filename], k.line, strings_[k.name]});
  }
  s.stacks = std::move(stacks_);
  s.unknown_actions = std::move(unknown_actions_);
  return s;
}

Snapshot Reader::run() {
  if (std::fseek(f_, 0, SEEK_END) != 0) {
    throw std::runtime_error(path_ + ": cannot read: not a regular file");
  }
  const long size = std::ftell(f_);
  if (size < 0 || std::fseek(f_, 0, SEEK_SET) != 0) {
    throw std::runtime_error(path_ + ": cannot read: not a regular file");
  }
  file_size_ = static_cast<uint64_t>(size);
  buf_.resize(std::min<uint64_t>(kChunk, std::max<uint64_t>(file_size_, 1)));
  end_ = std::fread(buf_.data(), 1, buf_.size(), f_);
  read_ = end_;
  if (end_ == 0) {
    if (std::ferror(f_)) {
      throw std::runtime_error(path_ + ": cannot read: " + std::strerror(errno));
    }
    bad("the file is empty");
  }
  return result(machine());
}

}  // namespace

Snapshot read_snapshot(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"),
                                                    &std::fclose);
  if (!f) {
    throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  }
  Reader reader(f.get(), path);
  return reader.run();
}

}  // namespace memfit
