// Allocators that see every allocation: wrappers around the CPU and Meta
// allocators, installed with c10::SetAllocator while a TrackingScope lives.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "memfit/core/model/event.h"

namespace memfit {

// What the tracker knows of one live allocation.
struct Allocation {
  uint64_t id = 0;
  int64_t bytes = 0;
  Device device = Device::kCPU;
  // Serial of the outermost op open on the allocating thread, 0 if none.
  // See Note [Temporaries are freed inside their op].
  uint64_t op_frame = 0;
};

// Told of every tracked allocation and free. Called under the tracker's lock:
// must not allocate tensors, call into torch, or take the Python GIL.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void on_alloc(const Allocation& a) = 0;
  // `temporary`: freed before the op that allocated it returned.
  virtual void on_free(const Allocation& a, bool temporary) = 0;
};

// Installs the tracking allocators for CPU and Meta while alive; restores the
// allocators found before when the last scope ends. Nestable, thread-safe.
class TrackingScope {
 public:
  TrackingScope();
  ~TrackingScope();
  TrackingScope(const TrackingScope&) = delete;
  TrackingScope& operator=(const TrackingScope&) = delete;
};

// Process-wide view of tracked memory.
namespace tracking {

bool installed();
// Bytes allocated through the tracking allocators and still alive.
int64_t live_bytes(Device d);
void add_observer(AllocationObserver* o);
void remove_observer(AllocationObserver* o);

// The tracked allocation behind a tensor's storage, if memfit allocated it.
std::optional<Allocation> allocation_of(const at::Tensor& t);

// The budget in force on a device (smallest of the active simulated devices).
std::optional<int64_t> budget(Device d);

// Test hook: the n-th tracked allocation from now (1 = the next one) on
// device d throws c10::OutOfMemoryError as if the budget were exceeded, so
// recovery can be tested at every point of a step. 0 disarms; n < 0 throws
// std::invalid_argument.
void fail_allocation_after(Device d, int64_t n);
// How many tracked allocations were made on d since the process started.
int64_t allocation_count(Device d);

// A simulated device's OOM, as the explainer is told of it.
struct OomContext {
  int64_t bytes = 0;   // the allocation refused
  int64_t used = 0;    // tracked bytes live on the device then
  int64_t budget = 0;
  Device device = Device::kCPU;
  std::string message;  // the allocator's own message (figures and generic advice)
};
// Returns the message to raise instead of context.message, "" to keep it.
// Called on the allocating thread without the tracker's lock, before the
// OutOfMemoryError is thrown; an exception it throws is ignored. See Note
// [What fills the simulated device] (tracking.cpp).
using OomExplainer = std::function<std::string(const OomContext&)>;
// Installs `e` (an empty function removes it) for every simulated device.
void set_oom_explainer(OomExplainer e);

}  // namespace tracking

// Host memory beside the simulated device. While alive on this thread,
// allocations go straight to the allocators memfit wraps: they are in no
// recording and count against no budget, as the host RAM beside a GPU is
// not the GPU's. Memory a GPU run would keep on the host (optimizer state
// offloaded to the CPU, see host_offload.h) is allocated under it, so that a
// rehearsal on the CPU shows what the card would hold. Nestable.
class HostMemory {
 public:
  HostMemory();
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
};

// A simulated device: while alive, a tracked allocation on `device` that would
// take live tracked bytes past `budget_bytes` throws c10::OutOfMemoryError
// (torch.cuda.OutOfMemoryError in Python), like a full GPU. Nestable: the
// smallest budget in force applies.
class SimulatedDevice {
 public:
  explicit SimulatedDevice(int64_t budget_bytes, Device device = Device::kCPU);
  ~SimulatedDevice();
  SimulatedDevice(const SimulatedDevice&) = delete;
  SimulatedDevice& operator=(const SimulatedDevice&) = delete;

  int64_t budget_bytes() const { return budget_; }
  Device device() const { return device_; }

 private:
  TrackingScope tracking_;
  int64_t budget_;
  Device device_;
  uint64_t handle_;
};

}  // namespace memfit
