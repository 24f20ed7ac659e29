#include "memfit/torch/tracking.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "memfit/core/model/units.h"
#include "memfit/torch/op_frames.h"

// Note [One device, shared by every thread]
// A GPU's memory belongs to the process: every thread allocates from it, and
// torch.cuda.memory_allocated counts them all. The simulated device does the
// same. Its live bytes are the process's tracked bytes, whatever thread
// allocated them, and a budget set by one thread's SimulatedDevice holds for
// every thread (several active: the smallest, as a card has one size). An
// OOM caused by another thread's budget says so. Recordings (track(), the
// recorder) likewise see every thread's allocations, as the caching
// allocator's statistics do.

// Note [An OOM worded as CUDA words it]
// Code written for a GPU recognises an OOM by its text: Lightning's
// is_oom_error and accelerate's should_reduce_batch_size look for "CUDA" and
// "out of memory" ("CUDA out of memory.") in a RuntimeError's only argument,
// and so do users' own except-clauses. The simulated device rehearses a GPU,
// so its OOM starts with CUDA's words; memfit's own figures (budget, already
// allocated, free) follow in parentheses, naming the simulated device.

// Note [What fills the simulated device]
// The allocator knows how many bytes are live, not what they are. What
// fills the device (parameters, gradients, optimizer state) and the advice
// for that cause (oom_cause.h) are known above it: the Python package
// installs an OomExplainer that reads the live models and optimizers and
// the phase from the stack, and returns the message to raise. Without one
// (C++ alone) the figures and the generic advice stay.

namespace memfit {
namespace {

constexpr int kNumDevices = 3;
// Installed above anything registered with REGISTER_ALLOCATOR (priority 0),
// and the previous allocator is put back with the same priority.
constexpr uint8_t kPriority = UINT8_MAX;

int index_of(Device d) { return static_cast<int>(d); }

struct Entry {
  Allocation allocation;
  c10::DeleterFnPtr inner_deleter = nullptr;
  void* inner_context = nullptr;
};

// See Note [One device, shared by every thread].
struct Budget {
  uint64_t handle;
  Device device;
  int64_t bytes;
  std::thread::id owner;  // the thread whose SimulatedDevice set it
};

// Note [Tracker state outlives everything]
// A tensor allocated under tracking may die after main() returns, and its
// deleter runs our free path. The state is therefore created on first use
// and never destroyed.
struct State {
  std::mutex mu;
  int scopes = 0;
  uint64_t record_function_handle = 0;
  // Keyed by the DataPtr's context: the data pointer on CPU (allocators must
  // keep data == context, see raw_deleter), a tagged id on Meta.
  std::unordered_map<void*, Entry> live;
  std::array<int64_t, kNumDevices> live_bytes{};
  std::array<int64_t, kNumDevices> count{};
  std::array<int64_t, kNumDevices> fail_after{};
  std::vector<AllocationObserver*> observers;
  std::vector<Budget> budgets;
  uint64_t next_id = 1;
  uint64_t next_budget = 1;
  tracking::OomExplainer explainer;  // See Note [What fills the simulated device]
};

State& state() {
  static State* s = new State;  // See Note [Tracker state outlives everything]
  return *s;
}

// The budget in force on `d`: the smallest active one, whichever thread set it.
const Budget* binding_budget_locked(const State& s, Device d) {
  const Budget* b = nullptr;
  for (const auto& budget : s.budgets) {
    if (budget.device == d && (!b || budget.bytes < b->bytes)) b = &budget;
  }
  return b;
}

std::optional<int64_t> budget_locked(const State& s, Device d) {
  const Budget* b = binding_budget_locked(s, d);
  return b ? std::optional<int64_t>(b->bytes) : std::nullopt;
}

void free_tracked(void* context);

// Depth of HostMemory scopes open on this thread.
thread_local int host_memory_depth = 0;

class TrackingAllocator final : public c10::Allocator {
 public:
  TrackingAllocator(Device device, c10::DeviceType type)
      : device_(device), type_(type) {}

  c10::DataPtr allocate(size_t n) override {
    State& s = state();
    const auto bytes = static_cast<int64_t>(n);
    uint64_t id = 0;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      // Zero-byte storages carry no memory; a storage created under tracking
      // keeps this allocator after tracking ends (resize calls it): both go
      // straight to the allocator we wrap, as does host memory (HostMemory).
      if (n == 0 || s.scopes == 0 || host_memory_depth > 0) {
        lock.unlock();
        return inner_->allocate(n);
      }
      const int d = index_of(device_);
      if (s.fail_after[d] > 0 && --s.fail_after[d] == 0) {
        lock.unlock();
        throw_oom(bytes, "forced by fail_allocation_after");
      }
      if (const Budget* b = binding_budget_locked(s, device_);
          b && s.live_bytes[d] + bytes > b->bytes) {
        const int64_t used = s.live_bytes[d], limit = b->bytes;
        const bool elsewhere = b->owner != std::this_thread::get_id();
        lock.unlock();
        throw_budget_oom(bytes, used, limit, elsewhere);
      }
      id = s.next_id++;
      // Counted before the inner allocation so concurrent allocations cannot
      // both slip under the budget.
      s.live_bytes[d] += bytes;
      ++s.count[d];
    }
    c10::DataPtr inner;
    try {
      inner = inner_->allocate(n);
    } catch (...) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.live_bytes[index_of(device_)] -= bytes;
      throw;
    }
    Entry entry;
    entry.allocation = Allocation{id, bytes, device_, impl::outermost_op_frame()};
    void* data = inner.get();
    void* context = data;
    if (device_ == Device::kMeta) {
      // Meta storages have no data; an odd tag never equals a real pointer.
      context = reinterpret_cast<void*>(static_cast<uintptr_t>(id << 1 | 1));
    } else {
      TORCH_INTERNAL_ASSERT(inner.get_context() == data,
                            "the wrapped CPU allocator must keep data == "
                            "context");
      entry.inner_deleter = inner.get_deleter();
      entry.inner_context = inner.release_context();
    }
    {
      std::lock_guard<std::mutex> lock(s.mu);
      auto [it, inserted] = s.live.try_emplace(context, entry);
      if (!inserted) {
        // A block we tracked was raw-freed after tracking ended, straight to
        // the wrapped allocator, which handed the address out again: the old
        // entry died unseen. Count it freed now.
        const Allocation stale = it->second.allocation;
        s.live_bytes[index_of(stale.device)] -= stale.bytes;
        for (auto* o : s.observers) o->on_free(stale, false);
        it->second = entry;
      }
      for (auto* o : s.observers) o->on_alloc(entry.allocation);
    }
    return c10::DataPtr(data, context, &free_tracked, c10::Device(type_));
  }

  c10::DeleterFnPtr raw_deleter() const override {
    // raw_allocate needs data == context, true on CPU only.
    return device_ == Device::kCPU ? &free_tracked : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }

  void set_inner(c10::Allocator* a) { inner_ = a; }
  c10::Allocator* inner() const { return inner_; }
  c10::DeviceType type() const { return type_; }

 private:
  [[noreturn]] void throw_budget_oom(int64_t bytes, int64_t used, int64_t budget,
                                     bool set_elsewhere) const {
    std::ostringstream msg;
    // See Note [An OOM worded as CUDA words it].
    msg << "CUDA out of memory. Tried to allocate " << format_bytes(bytes)
        << " (memfit simulated " << to_string(device_) << " device: budget "
        << format_bytes(budget)
        << (set_elsewhere ? ", set by another thread's simulated device (the smallest "
                            "active budget holds for every thread, as one GPU's memory does)"
                          : "")
        << "; " << format_bytes(used) << " already allocated by all threads; "
        << format_bytes(std::max<int64_t>(0, budget - used))
        << " free). Use a smaller batch, or let memfit find one that fits "
           "(`memfit fit`, memfit.find_batch_size).";
    tracking::OomContext context{bytes, used, budget, device_, msg.str()};
    C10_THROW_ERROR(OutOfMemoryError, explained(context));
  }
  static std::string explained(const tracking::OomContext& context) {
    tracking::OomExplainer explainer;
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mu);
      explainer = s.explainer;
    }
    if (!explainer) return context.message;
    try {
      std::string better = explainer(context);
      return better.empty() ? context.message : better;
    } catch (...) {
      return context.message;  // the OOM is what the caller must see
    }
  }
  [[noreturn]] void throw_oom(int64_t bytes, const char* why) const {
    std::ostringstream msg;
    msg << "CUDA out of memory. Tried to allocate " << format_bytes(bytes)
        << " (memfit simulated " << to_string(device_) << " device: " << why << ").";
    C10_THROW_ERROR(OutOfMemoryError, msg.str());
  }

  Device device_;
  c10::DeviceType type_;
  c10::Allocator* inner_ = nullptr;
};

TrackingAllocator& cpu_allocator() {
  static auto* a = new TrackingAllocator(Device::kCPU, c10::DeviceType::CPU);
  return *a;
}
TrackingAllocator& meta_allocator() {
  static auto* a = new TrackingAllocator(Device::kMeta, c10::DeviceType::Meta);
  return *a;
}

void free_tracked(void* context) {
  State& s = state();
  c10::DeleterFnPtr deleter = nullptr;
  void* inner_context = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.live.find(context);
    if (it == s.live.end()) {
      // Note [Raw frees of blocks we did not track]
      // raw_deallocate frees through whatever CPU allocator is installed
      // now. A block from raw_allocate(0), or one allocated while tracking
      // was off, came from the wrapped allocator: it goes back there.
      // oneDNN's convolutions do both.
      deleter = cpu_allocator().inner()->raw_deleter();
      TORCH_INTERNAL_ASSERT(deleter != nullptr, "memfit freed an unknown block");
      inner_context = context;
    } else {
      const Allocation a = it->second.allocation;
      deleter = it->second.inner_deleter;
      inner_context = it->second.inner_context;
      s.live.erase(it);
      s.live_bytes[index_of(a.device)] -= a.bytes;
      const bool temporary =
          a.op_frame != 0 && impl::is_open_op_frame(a.op_frame);
      for (auto* o : s.observers) o->on_free(a, temporary);
    }
  }
  if (deleter) deleter(inner_context);
}

}  // namespace

TrackingScope::TrackingScope() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.scopes++ > 0) return;
  for (TrackingAllocator* a : {&cpu_allocator(), &meta_allocator()}) {
    c10::Allocator* current = c10::GetAllocator(a->type());
    if (current != a) a->set_inner(current);
    c10::SetAllocator(a->type(), a, kPriority);
  }
  s.record_function_handle = impl::add_op_frame_callback();
}

TrackingScope::~TrackingScope() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (--s.scopes > 0) return;
  for (TrackingAllocator* a : {&cpu_allocator(), &meta_allocator()}) {
    c10::SetAllocator(a->type(), a->inner(), kPriority);
  }
  impl::remove_op_frame_callback(s.record_function_handle);
  s.record_function_handle = 0;
}

namespace tracking {

bool installed() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.scopes > 0;
}

int64_t live_bytes(Device d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.live_bytes[index_of(d)];
}

int64_t allocation_count(Device d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.count[index_of(d)];
}

void add_observer(AllocationObserver* o) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.observers.push_back(o);
}

void remove_observer(AllocationObserver* o) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.observers.erase(std::remove(s.observers.begin(), s.observers.end(), o),
                    s.observers.end());
}

std::optional<Allocation> allocation_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return std::nullopt;
  // A Python wrapper subclass (memfit.lazy's LazyTensor, FakeTensor) holds
  // no memory of its own, and reading its storage is not allowed.
  if (t.key_set().has(c10::DispatchKey::Python)) return std::nullopt;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &free_tracked) return std::nullopt;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(dp.get_context());
  if (it == s.live.end()) return std::nullopt;
  return it->second.allocation;
}

std::optional<int64_t> budget(Device d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return budget_locked(s, d);
}

void fail_allocation_after(Device d, int64_t n) {
  // An option of the caller's: see docs/checks.md.
  if (n < 0) {
    throw std::invalid_argument("[fail_allocation_after] n must be >= 0 allocations, got " +
                                std::to_string(n));
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.fail_after[index_of(d)] = n;
}

void set_oom_explainer(OomExplainer e) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.explainer = std::move(e);
}

}  // namespace tracking

HostMemory::HostMemory() { ++host_memory_depth; }
HostMemory::~HostMemory() { --host_memory_depth; }

SimulatedDevice::SimulatedDevice(int64_t budget_bytes, Device device)
    : budget_(budget_bytes), device_(device) {
  TORCH_CHECK(budget_bytes >= 0, "[simulated_device] the budget must be >= 0 "
              "bytes, got ", budget_bytes);
  TORCH_CHECK(device != Device::kCUDA, "[simulated_device] simulates a device "
              "on cpu or meta; on CUDA the real card sets the limit");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  handle_ = s.next_budget++;
  s.budgets.push_back(Budget{handle_, device_, budget_, std::this_thread::get_id()});
}

SimulatedDevice::~SimulatedDevice() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.budgets.erase(std::remove_if(s.budgets.begin(), s.budgets.end(),
                                 [&](const Budget& b) { return b.handle == handle_; }),
                  s.budgets.end());
}

}  // namespace memfit
