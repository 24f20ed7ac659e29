#include "memfit/torch/recorder.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "memfit/torch/card_ops.h"
#include "memfit/torch/op_frames.h"

namespace memfit {
namespace {

// Recorders alive now, for ModuleScope.
std::mutex g_active_mu;
std::vector<Recorder*>& active_recorders() {
  static auto* v = new std::vector<Recorder*>;
  return *v;
}

}  // namespace

// See Note [Memory that depends on the batch's values] (op_frames.h).
void note_value_sized(const char* op_name) {
  std::lock_guard<std::mutex> active(g_active_mu);
  for (Recorder* r : active_recorders()) {
    std::lock_guard<std::mutex> lock(r->mu_);
    if (!r->recording_) continue;
    auto& seen = r->value_sized_ops_;
    if (std::find(seen.begin(), seen.end(), op_name) == seen.end()) seen.emplace_back(op_name);
  }
}

Recorder::Recorder() : start_(std::chrono::steady_clock::now()) {
  impl::set_value_sized_listener(&note_value_sized);
  tracking_.emplace();
  tracking::add_observer(this);
  std::lock_guard<std::mutex> lock(g_active_mu);
  active_recorders().push_back(this);
}

std::vector<std::string> Recorder::value_sized_ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return value_sized_ops_;
}

Recorder::~Recorder() { stop(); }

void Recorder::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!recording_) return;
    held_frame_ = 0;  // whatever is held now is an output: record it
    flush_kernel_outputs();
    recording_ = false;
    timeline_.end_phase();
  }
  impl::remove_card_ops(card_ops_);  // outside mu_: its callback takes mu_ under its lock
  card_ops_ = 0;
  tracking::remove_observer(this);
  tracking_.reset();
  std::lock_guard<std::mutex> lock(g_active_mu);
  auto& v = active_recorders();
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
}

bool Recorder::recording() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recording_;
}

void Recorder::begin_phase(std::string_view name, int iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  flush_kernel_outputs();
  timeline_.begin_phase(name, iteration);
  phase_category_ = default_category(name);
  phase_frees_are_temporary_ = name == "optimizer_step" || name == "zero_grad";
  phase_allocations_.clear();
}

void Recorder::end_phase() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_kernel_outputs();
  timeline_.end_phase();
  phase_category_ = Category::kOther;
  phase_frees_are_temporary_ = false;
  phase_allocations_.clear();
}

void Recorder::push_module(std::string_view name, bool absolute) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string path(name);
  if (!absolute && !module_stack_.empty() && !module_stack_.back().empty()) {
    path = module_stack_.back() + "." + path;
  }
  module_index_ = timeline_.module_index(path);
  module_stack_.push_back(std::move(path));
}

void Recorder::pop_module() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(!module_stack_.empty(),
              "[Recorder::pop_module] no module scope is open");
  module_stack_.pop_back();
  module_index_ = module_stack_.empty()
                      ? 0
                      : timeline_.module_index(module_stack_.back());
}

std::string Recorder::module_path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return module_stack_.empty() ? std::string() : module_stack_.back();
}

bool Recorder::classify(const at::Tensor& t, Category c) {
  auto a = tracking::allocation_of(t);
  if (!a) return false;
  std::lock_guard<std::mutex> lock(mu_);
  flush_kernel_outputs();
  return timeline_.set_category(a->id, c);
}

void Recorder::only_device(Device d) {
  std::lock_guard<std::mutex> lock(mu_);
  only_device_ = d;
}

void Recorder::drop_meta_kernel_intermediates() {
  std::lock_guard<std::mutex> lock(mu_);
  drop_meta_kernel_intermediates_ = true;
}

void Recorder::add_card_kernels() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop_host_convolution_intermediates_ = true;
  }
  if (card_ops_ == 0) card_ops_ = impl::add_card_ops(this);  // outside mu_, as in stop()
}

void Recorder::record_transient(int64_t bytes, std::string_view what, Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!recording_ || bytes < 0 || (only_device_ && device != *only_device_)) return;
  flush_kernel_outputs();
  // Ids apart from the tracking allocator's, which count up from 1.
  const uint64_t id = (uint64_t{1} << 63) | ++next_transient_;
  Event e;
  e.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start_)
                  .count();
  e.bytes = bytes;
  e.id = id;
  e.module = module_index_;
  e.phase = timeline_.current_phase();
  e.op = timeline_.op_index(what);
  e.device = device;
  e.category = Category::kTemporary;
  e.kind = EventKind::kAlloc;
  Event f = e;
  f.kind = EventKind::kFree;
  // Inside a kernel frame still running, after the outputs it holds back.
  if (!held_.empty()) {
    held_.push_back(e);
    held_.push_back(f);
    return;
  }
  timeline_.record(e);
  peak_ = std::max(peak_, live_ + bytes);
  timeline_.record(f);
}

uint64_t Recorder::dropping_frame(Device d, impl::KernelFrames& kind) const {
  if (d == Device::kMeta && drop_meta_kernel_intermediates_) {
    kind = impl::KernelFrames::kMeta;
  } else if (d == Device::kCPU && drop_host_convolution_intermediates_) {
    kind = impl::KernelFrames::kHostConvolution;
  } else {
    return 0;
  }
  return impl::kernel_frame(kind);
}

void Recorder::flush_kernel_outputs() {
  if (held_.empty() || (held_frame_ != 0 && held_frame_ == impl::kernel_frame(held_kind_))) {
    return;
  }
  // Stamped now: frees recorded while the kernel ran must not follow them.
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start_)
                          .count();
  for (Event& e : held_) {
    e.time_ns = now;
    timeline_.record(e);
    if (e.kind == EventKind::kFree) {  // a record_transient's, held after its alloc
      live_ -= e.bytes;
      continue;
    }
    if (phase_frees_are_temporary_) phase_allocations_.insert(e.id);
    live_ += e.bytes;
    peak_ = std::max(peak_, live_);
  }
  held_.clear();
  held_frame_ = 0;
}

int64_t Recorder::live_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_kernel_outputs();
  return live_;
}

int64_t Recorder::peak_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_kernel_outputs();
  return peak_;
}

Event Recorder::stamped(const Allocation& a, EventKind kind) const {
  Event e;
  e.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start_)
                  .count();
  e.bytes = a.bytes;
  e.id = a.id;
  e.frame = a.op_frame;
  e.module = module_index_;
  e.phase = timeline_.current_phase();
  e.kind = kind;
  e.device = a.device;
  return e;
}

void Recorder::on_alloc(const Allocation& a) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!recording_ || (only_device_ && a.device != *only_device_)) return;
  flush_kernel_outputs();
  Event e = stamped(a, EventKind::kAlloc);
  const char* op = impl::innermost_op_name();
  e.op = op ? timeline_.op_index(op) : 0;
  e.category = phase_category_;
  // See Note [Meta kernels allocate only their outputs] and Note [A card's
  // rehearsal drops the host's convolution temporaries] (op_frames.h).
  impl::KernelFrames kind{};
  const uint64_t frame = dropping_frame(a.device, kind);
  if (frame != 0) {
    held_frame_ = frame;
    held_kind_ = kind;
    held_.push_back(e);
    return;
  }
  timeline_.record(e);
  if (phase_frees_are_temporary_) phase_allocations_.insert(a.id);
  live_ += a.bytes;
  peak_ = std::max(peak_, live_);
}

void Recorder::on_free(const Allocation& a, bool temporary) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!recording_) return;
  flush_kernel_outputs();
  auto held = std::find_if(held_.begin(), held_.end(), [&](const Event& e) {
    return e.id == a.id && e.kind == EventKind::kAlloc;
  });
  if (held != held_.end()) {  // an intermediate of a kernel frame: never was
    held_.erase(held);
    return;
  }
  if (!timeline_.is_live(a.id)) return;
  if (temporary || phase_allocations_.erase(a.id) > 0) {
    timeline_.set_category(a.id, Category::kTemporary);
  }
  timeline_.record(stamped(a, EventKind::kFree));
  live_ -= a.bytes;
}

ModuleScope::ModuleScope(std::string_view name) {
  std::lock_guard<std::mutex> lock(g_active_mu);
  recorders_ = active_recorders();
  for (Recorder* r : recorders_) r->push_module(name);
}

ModuleScope::~ModuleScope() {
  // A recorder stopped inside the scope has left active_recorders(); only
  // pop those still there.
  std::lock_guard<std::mutex> lock(g_active_mu);
  const auto& active = active_recorders();
  for (Recorder* r : recorders_) {
    if (std::find(active.begin(), active.end(), r) != active.end()) {
      r->pop_module();
    }
  }
}

}  // namespace memfit
