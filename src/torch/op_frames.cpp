#include "memfit/torch/op_frames.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace memfit::impl {
namespace {

struct Frames {
  std::vector<const char*> names;
  uint64_t outermost = 0;
  // See Note [Meta kernels allocate only their outputs].
  uint64_t meta_kernel = 0;
  size_t meta_kernel_depth = 0;
};

thread_local Frames t_frames;
std::atomic<uint64_t> g_next_frame{1};

// Whether the op has a kernel of its own for the Meta key (not the
// composite that runs on every device); cached per name.
bool has_own_meta_kernel(const at::RecordFunction& fn) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<const char*, bool>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(fn.name());
  if (it != cache->end()) return it->second;
  bool own = false;
  if (auto name = fn.operator_name()) {
    auto op = c10::Dispatcher::singleton().findOp(*name);
    own = op && op->hasKernelForDispatchKey(c10::DispatchKey::Meta) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  }
  return cache->emplace(fn.name(), own).first->second;
}

bool is_frame(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::FUNCTION ||
         fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
}

std::unique_ptr<at::ObserverContext> push_frame(const at::RecordFunction& fn) {
  if (is_frame(fn)) {
    if (t_frames.names.empty()) t_frames.outermost = g_next_frame++;
    t_frames.names.push_back(fn.name());
    if (t_frames.meta_kernel == 0 && fn.scope() == at::RecordScope::FUNCTION &&
        has_own_meta_kernel(fn)) {
      t_frames.meta_kernel = g_next_frame++;
      t_frames.meta_kernel_depth = t_frames.names.size();
    }
  }
  return nullptr;
}

void pop_frame(const at::RecordFunction& fn, at::ObserverContext*) {
  // An op entered before the callback was added is never pushed; the stack
  // may be empty when it exits.
  if (is_frame(fn) && !t_frames.names.empty()) {
    t_frames.names.pop_back();
    if (t_frames.names.empty()) t_frames.outermost = 0;
    if (t_frames.names.size() < t_frames.meta_kernel_depth) {
      t_frames.meta_kernel = 0;
      t_frames.meta_kernel_depth = 0;
    }
  }
}

}  // namespace

uint64_t outermost_op_frame() { return t_frames.outermost; }

bool is_open_op_frame(uint64_t frame) {
  return frame != 0 && t_frames.outermost == frame;
}

uint64_t meta_kernel_frame() { return t_frames.meta_kernel; }

const char* innermost_op_name() {
  const auto& names = t_frames.names;
  if (names.empty()) return nullptr;
  // torch's Python meta kernels allocate their outputs with torch.empty*
  // inside the op they implement: name that op, not the factory.
  if (names.size() > 1 && std::strncmp(names.back(), "aten::empty", 11) == 0) {
    return names[names.size() - 2];
  }
  return names.back();
}

uint64_t add_op_frame_callback() {
  return at::addGlobalCallback(at::RecordFunctionCallback(&push_frame, &pop_frame)
                                   .scopes({at::RecordScope::FUNCTION,
                                            at::RecordScope::BACKWARD_FUNCTION}));
}

void remove_op_frame_callback(uint64_t handle) {
  if (handle != 0) at::removeCallback(handle);
}

}  // namespace memfit::impl
