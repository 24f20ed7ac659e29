// A recording session: every tracked allocation and free while it lives,
// stamped with the phase, module path and op it happened in.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "memfit/core/model/phase_category.h"
#include "memfit/core/model/timeline.h"
#include "memfit/torch/op_frames.h"
#include "memfit/torch/tracking.h"

namespace memfit {

class Recorder final : private AllocationObserver {
 public:
  // Starts recording: installs the tracking allocators (see TrackingScope).
  Recorder();
  ~Recorder() override;
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Stops receiving events; the timeline stays readable. Idempotent.
  void stop();
  bool recording() const;

  // Phases do not nest; beginning one ends the one open.
  void begin_phase(std::string_view name, int iteration = 0);
  void end_phase();

  // Module scopes nest: push("encoder"), push("0") -> "encoder.0". An
  // absolute push replaces the path (Python hooks know full paths).
  void push_module(std::string_view name, bool absolute = false);
  void pop_module();
  std::string module_path() const;

  // Reclassifies the allocation behind t's storage. False if this recorder
  // did not see it allocated.
  bool classify(const at::Tensor& t, Category c);

  // From now on, records only allocations on `d`: a step run on the meta
  // device keeps some tensors on the host (AdamW's step counts), which the
  // device it stands for would not hold either.
  void only_device(Device d);

  // From now on, drops what Meta kernels allocate and free again inside the
  // op they implement: See Note [Meta kernels allocate only their outputs].
  void drop_meta_kernel_intermediates();

  // From now on, adds what a CUDA card's kernels take inside an op and the
  // host's do not (a reduction's staging buffer): See Note [What a card adds
  // inside an op] (card_ops.h); and drops what the host's convolution kernels
  // allocate and free again inside the op: See Note [A card's rehearsal drops
  // the host's convolution temporaries] (op_frames.h).
  void add_card_kernels();
  // Records `bytes` (0 too) allocated and freed again now on `device`, a
  // temporary named `what`: one of those transients.
  void record_transient(int64_t bytes, std::string_view what, Device device);

  // The ops that size their output by the batch's values that ran while
  // recording, each once, in the order first seen: See Note [Memory that
  // depends on the batch's values] (op_frames.h).
  std::vector<std::string> value_sized_ops() const;

  // Bytes recorded live now / at most, since the recording started; the
  // outputs of a kernel frame that has returned on this thread count.
  int64_t live_bytes();
  int64_t peak_bytes();

  // The recorded events. Read it after stop(), or while no other thread runs
  // torch ops.
  const Timeline& timeline() const { return timeline_; }

 private:
  // An event for `a` stamped with the time, phase and module now (mu_ held).
  Event stamped(const Allocation& a, EventKind kind) const;
  void on_alloc(const Allocation& a) override;
  void on_free(const Allocation& a, bool temporary) override;
  // Called for every active recorder when a value-sized op begins.
  friend void note_value_sized(const char* op_name);
  // The kernel frame open on this thread whose intermediates on `d` are
  // dropped, 0 when none; `kind` set to its KernelFrames (mu_ held).
  uint64_t dropping_frame(Device d, impl::KernelFrames& kind) const;
  // Records the allocations held back while a kernel frame ran, once it has
  // returned (mu_ held).
  void flush_kernel_outputs();

  // Released by stop(): a stopped recorder whose timeline is still read must
  // not keep every later allocation tracked.
  std::optional<TrackingScope> tracking_;
  mutable std::mutex mu_;
  Timeline timeline_;
  std::chrono::steady_clock::time_point start_;
  bool recording_ = true;
  std::optional<Device> only_device_;
  bool drop_meta_kernel_intermediates_ = false;
  bool drop_host_convolution_intermediates_ = false;
  uint64_t card_ops_ = 0;          // add_card_ops's handle; 0: none
  uint64_t next_transient_ = 0;    // ids of record_transient's events
  uint64_t held_frame_ = 0;    // the kernel frame holding back (op_frames.h)
  impl::KernelFrames held_kind_ = impl::KernelFrames::kMeta;  // held_frame_'s
  std::vector<Event> held_;    // its allocations still live, in order
  std::vector<std::string> module_stack_;
  uint32_t module_index_ = 0;  // interned module_stack_.back()
  Category phase_category_ = Category::kOther;
  // Allocations of a phase whose leftovers are state, not outputs: what such
  // a phase allocates and frees again is a temporary (Adam's sqrt buffers).
  bool phase_frees_are_temporary_ = false;
  std::unordered_set<uint64_t> phase_allocations_;
  std::vector<std::string> value_sized_ops_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

// Module scope on every active recorder, for C++ models:
// `ModuleScope scope("fc1");` around a submodule's forward.
class ModuleScope {
 public:
  explicit ModuleScope(std::string_view name);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  std::vector<Recorder*> recorders_;
};

}  // namespace memfit
