#include "memfit/torch/flop_count.h"

#include <ATen/record_function.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace memfit {
namespace {
enum class Formula { kMm, kAddmm, kBmm, kBaddbmm, kUncounted };
}  // namespace

struct FlopCount::Counts {
  std::mutex mu;
  std::unordered_map<std::string, Formula> formulas;  // of the registry's ops
  bool counting = false;
  int64_t block = -1;
  int64_t total = 0;
  std::map<int64_t, int64_t> by_block;
  std::set<std::string> uncounted;
  uint64_t serial = 0;  // tells this FlopCount's depth from an older one's
};

namespace {
using Counts = FlopCount::Counts;
std::atomic<Counts*> g_counts{nullptr};
std::atomic<uint64_t> g_next_serial{1};
// Registry ops open on this thread: only the outermost one counts. Of the
// FlopCount t_serial names: one stopped inside an op leaves no depth behind.
thread_local int t_registry_depth = 0;
thread_local uint64_t t_serial = 0;

// A marker: the op entered was one of the registry's.
struct RegistryOp : at::ObserverContext {};

bool sizes_of(const c10::IValue& v, size_t dims, std::vector<int64_t>& out) {
  if (!v.isTensor()) return false;
  auto s = v.toTensor().sizes();
  if (s.size() != dims) return false;
  out.assign(s.begin(), s.end());
  return true;
}

// torch.utils.flop_counter's mm_flop and bmm_flop: 2 * m * n * k (times b).
int64_t flops_of(Formula f, c10::ArrayRef<const c10::IValue> in, bool& known) {
  std::vector<int64_t> a, b;
  known = true;
  switch (f) {
    case Formula::kMm:
    case Formula::kAddmm: {
      size_t i = f == Formula::kAddmm ? 1 : 0;
      if (in.size() > i + 1 && sizes_of(in[i], 2, a) && sizes_of(in[i + 1], 2, b)) {
        return 2 * a[0] * a[1] * b[1];
      }
      break;
    }
    case Formula::kBmm:
    case Formula::kBaddbmm: {
      size_t i = f == Formula::kBaddbmm ? 1 : 0;
      if (in.size() > i + 1 && sizes_of(in[i], 3, a) && sizes_of(in[i + 1], 3, b)) {
        return 2 * a[0] * a[1] * a[2] * b[2];
      }
      break;
    }
    default:
      break;
  }
  known = false;
  return 0;
}

std::unique_ptr<at::ObserverContext> count_on_enter(const at::RecordFunction& fn) {
  Counts* c = g_counts.load();
  if (c == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(c->mu);
  auto it = c->formulas.find(fn.name());
  if (it == c->formulas.end()) return nullptr;
  if (t_serial != c->serial) {
    t_serial = c->serial;
    t_registry_depth = 0;
  }
  if (t_registry_depth++ == 0 && c->counting) {
    bool known = false;
    int64_t n = flops_of(it->second, fn.inputs(), known);
    if (!known) {
      c->uncounted.insert(fn.name());
    } else {
      c->total += n;
      if (c->block >= 0) c->by_block[c->block] += n;
    }
  }
  return std::make_unique<RegistryOp>();
}

void count_on_exit(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx != nullptr && t_registry_depth > 0) --t_registry_depth;
}

}  // namespace

FlopCount::FlopCount(const std::vector<std::string>& registry_ops)
    : counts_(std::make_unique<Counts>()) {
  Counts* c = counts_.get();
  c->serial = g_next_serial++;
  for (const auto& op : registry_ops) c->formulas[op] = Formula::kUncounted;
  for (auto [name, f] : {std::pair{"aten::mm", Formula::kMm},
                         std::pair{"aten::addmm", Formula::kAddmm},
                         std::pair{"aten::bmm", Formula::kBmm},
                         std::pair{"aten::baddbmm", Formula::kBaddbmm},
                         // In place: outside torch's registry, real matmuls
                         // (the chunked loss's weight gradient).
                         std::pair{"aten::addmm_", Formula::kAddmm},
                         std::pair{"aten::baddbmm_", Formula::kBaddbmm}}) {
    c->formulas[name] = f;
  }
  Counts* expected = nullptr;
  if (!g_counts.compare_exchange_strong(expected, c)) {
    throw std::logic_error("[FlopCount] another FlopCount is counting: one at a time");
  }
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&count_on_enter, &count_on_exit)
                                      .needsInputs(true)
                                      .scopes({at::RecordScope::FUNCTION}));
}

FlopCount::~FlopCount() { stop(); }

void FlopCount::stop() {
  if (handle_ == 0) return;
  at::removeCallback(handle_);
  handle_ = 0;
  Counts* mine = counts_.get();
  g_counts.compare_exchange_strong(mine, nullptr);
}

void FlopCount::set_counting(bool on) {
  Counts& c = *counts_;
  std::lock_guard<std::mutex> lock(c.mu);
  c.counting = on;
}

void FlopCount::set_block(int64_t block) {
  Counts& c = *counts_;
  std::lock_guard<std::mutex> lock(c.mu);
  c.block = block;
}

void FlopCount::reset() {
  Counts& c = *counts_;
  std::lock_guard<std::mutex> lock(c.mu);
  c.total = 0;
  c.by_block.clear();
  c.uncounted.clear();
}

int64_t FlopCount::total() const {
  Counts& c = *counts_;
  std::lock_guard<std::mutex> lock(c.mu);
  return c.total;
}

std::map<int64_t, int64_t> FlopCount::by_block() const {
  Counts& c = *counts_;
  std::lock_guard<std::mutex> lock(c.mu);
  return c.by_block;
}

std::vector<std::string> FlopCount::uncounted() const {
  Counts& c = *counts_;
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.uncounted.begin(), c.uncounted.end()};
}

}  // namespace memfit
