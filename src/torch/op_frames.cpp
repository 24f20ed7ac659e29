#include "memfit/torch/op_frames.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace memfit::impl {
namespace {

constexpr size_t kKernelFrames = 2;  // the KernelFrames

// The outermost open op of a KernelFrames: its serial, and the depth of the
// names stack it was pushed at.
struct KernelFrame {
  uint64_t serial = 0;
  size_t depth = 0;
};

struct Frames {
  std::vector<const char*> names;
  uint64_t outermost = 0;
  std::array<KernelFrame, kKernelFrames> kernels;
};

thread_local Frames t_frames;
std::atomic<uint64_t> g_next_frame{1};
std::atomic<ValueSizedListener> g_value_sized{nullptr};

// A bit of kernel_frames_of's answer beside the KernelFrames: the op sizes
// its output by the values (See Note [Memory that depends on the batch's
// values], op_frames.h).
constexpr unsigned kValueSized = 1u << 7;
constexpr std::array<const char*, 13> kValueSizedOps = {
    "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::unique_dim_consecutive", "aten::nonzero", "aten::argwhere",
    "aten::masked_select", "aten::bincount", "aten::repeat_interleave",
    "aten::embedding_sparse_backward", "aten::_embedding_bag_sparse_backward",
    "aten::_coalesce"};

// Which KernelFrames the op opens, a bit each; cached per name. See Note
// [Meta kernels allocate only their outputs] and Note [A card's rehearsal
// drops the host's convolution temporaries] (op_frames.h).
unsigned kernel_frames_of(const at::RecordFunction& fn) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<const char*, unsigned>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(fn.name());
  if (it != cache->end()) return it->second;
  unsigned kinds = 0;
  for (const char* op : kValueSizedOps) {
    if (std::strcmp(fn.name(), op) == 0) kinds |= kValueSized;
  }
  if (auto name = fn.operator_name()) {
    auto op = c10::Dispatcher::singleton().findOp(*name);
    // A composite decomposes on every device: its intermediates are real.
    if (op && !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      if (op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
        kinds |= 1u << static_cast<unsigned>(KernelFrames::kMeta);
      }
      if (std::strstr(fn.name(), "convolution") != nullptr) {
        kinds |= 1u << static_cast<unsigned>(KernelFrames::kHostConvolution);
      }
    }
  }
  return cache->emplace(fn.name(), kinds).first->second;
}

bool is_frame(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::FUNCTION ||
         fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
}

std::unique_ptr<at::ObserverContext> push_frame(const at::RecordFunction& fn) {
  if (is_frame(fn)) {
    if (t_frames.names.empty()) t_frames.outermost = g_next_frame++;
    t_frames.names.push_back(fn.name());
    const unsigned kinds =
        fn.scope() == at::RecordScope::FUNCTION ? kernel_frames_of(fn) : 0;
    if ((kinds & kValueSized) != 0) {
      if (ValueSizedListener tell = g_value_sized.load()) tell(fn.name());
    }
    for (size_t k = 0; k < kKernelFrames; ++k) {
      KernelFrame& f = t_frames.kernels[k];
      if (f.serial == 0 && (kinds & (1u << k)) != 0) {
        f.serial = g_next_frame++;
        f.depth = t_frames.names.size();
      }
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
    for (KernelFrame& f : t_frames.kernels) {
      if (t_frames.names.size() < f.depth) f = KernelFrame{};
    }
  }
}

}  // namespace

void set_value_sized_listener(ValueSizedListener listener) { g_value_sized = listener; }

uint64_t outermost_op_frame() { return t_frames.outermost; }

bool is_open_op_frame(uint64_t frame) {
  return frame != 0 && t_frames.outermost == frame;
}

uint64_t kernel_frame(KernelFrames which) {
  return t_frames.kernels[static_cast<size_t>(which)].serial;
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
  return at::addGlobalCallback(at::RecordFunctionCallback(&push_frame, &pop_frame)
                                   .scopes({at::RecordScope::FUNCTION,
                                            at::RecordScope::BACKWARD_FUNCTION}));
}

void remove_op_frame_callback(uint64_t handle) {
  if (handle != 0) at::removeCallback(handle);
}

}  // namespace memfit::impl
