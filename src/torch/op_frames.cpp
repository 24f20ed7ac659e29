#include "memfit/torch/op_frames.h"

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <vector>

namespace memfit::impl {
namespace {

struct Frames {
  std::vector<const char*> names;
  uint64_t outermost = 0;
};

thread_local Frames t_frames;
std::atomic<uint64_t> g_next_frame{1};

bool is_frame(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::FUNCTION ||
         fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (is_frame(fn)) {
    if (t_frames.names.empty()) t_frames.outermost = g_next_frame++;
    t_frames.names.push_back(fn.name());
  }
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  // An op entered before the callback was added is never pushed; the stack
  // may be empty when it exits.
  if (is_frame(fn) && !t_frames.names.empty()) {
    t_frames.names.pop_back();
    if (t_frames.names.empty()) t_frames.outermost = 0;
  }
}

}  // namespace

uint64_t outermost_op_frame() { return t_frames.outermost; }

bool is_open_op_frame(uint64_t frame) {
  return frame != 0 && t_frames.outermost == frame;
}

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
  return at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                   .scopes({at::RecordScope::FUNCTION,
                                            at::RecordScope::BACKWARD_FUNCTION}));
}

void remove_op_frame_callback(uint64_t handle) {
  if (handle != 0) at::removeCallback(handle);
}

}  // namespace memfit::impl
