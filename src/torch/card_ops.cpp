#include "memfit/torch/card_ops.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memfit/core/model/card_kernels.h"
#include "memfit/torch/recorder.h"

namespace memfit::impl {
namespace {

std::mutex g_mu;
std::vector<Recorder*>& recorders() {
  static auto* v = new std::vector<Recorder*>;
  return *v;
}
// Each recorder's convolution bounds, until taken or the recorder stops.
std::unordered_map<const Recorder*, std::vector<int64_t>>& conv_bounds() {
  static auto* m = new std::unordered_map<const Recorder*, std::vector<int64_t>>;
  return *m;
}

// What the op's card kernels will take, computed from its inputs as it
// enters, recorded as it returns.
struct CardBytes : at::ObserverContext {
  int64_t bytes[2] = {0, 0};
  const char* what = "";
  Device device = Device::kCPU;
  int64_t conv_bound = -1;  // a convolution's mark: its workspaces' bound
  ConvShape forward;        // a convolution's forward: x and w, y on return
  bool is_forward = false;
};

// Not device_of: at::device_of(const Tensor&) is found by argument lookup
// wherever torch/torch.h is included (the precompiled header), ambiguous.
Device memfit_device(const at::Tensor& t) {
  if (t.is_meta()) return Device::kMeta;
  if (t.is_cuda()) return Device::kCUDA;
  return Device::kCPU;
}

std::unique_ptr<CardBytes> reduction(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensor()) return nullptr;
  const at::Tensor& self = inputs[0].toTensor();
  if (!self.defined() || !self.is_floating_point()) return nullptr;
  std::vector<int64_t> dims;
  if (inputs.size() > 1 && inputs[1].isIntList()) dims = inputs[1].toIntVector();
  const int64_t element = static_cast<int64_t>(self.element_size());
  const ReduceBuffers b =
      cuda_reduce_buffers(self.sizes().vec(), dims, element, element == 8 ? 8 : 4);
  // Recorded at every batch, 0 B where one block reduces each output: two
  // steps then make the same allocations (steps_align), the buffer's size
  // on the line between them. See Note [A card's reserve between two steps].
  auto c = std::make_unique<CardBytes>();
  c->bytes[0] = b.buffer;
  c->bytes[1] = b.semaphores;
  c->what = "CUDA reduction's staging buffer";
  c->device = memfit_device(self);
  return c;
}

// convolution_backward(grad_output, input, weight, ...): See Note [cuDNN's
// convolution workspace].
std::unique_ptr<CardBytes> convolution_backward(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.size() < 3 || !inputs[0].isTensor() || !inputs[1].isTensor() ||
      !inputs[2].isTensor()) {
    return nullptr;
  }
  const at::Tensor& dy = inputs[0].toTensor();
  const at::Tensor& x = inputs[1].toTensor();
  const at::Tensor& w = inputs[2].toTensor();
  if (!dy.defined() || !x.defined() || !w.defined()) return nullptr;
  auto c = std::make_unique<CardBytes>();
  c->what = kCudnnWorkspaceMark;
  c->device = memfit_device(dy);
  c->conv_bound = cudnn_conv_backward_workspace({x.numel(), dy.numel(), w.numel()});
  return c;
}

// convolution(input, weight, bias, ...), the op every convolution's forward
// dispatches through once (conv2d and the rest call it; it calls
// _convolution and the backend's kernel, not itself): its output's size is
// read as it returns. See Note [cuDNN's convolution workspace].
std::unique_ptr<CardBytes> convolution(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.size() < 2 || !inputs[0].isTensor() || !inputs[1].isTensor()) return nullptr;
  const at::Tensor& x = inputs[0].toTensor();
  const at::Tensor& w = inputs[1].toTensor();
  if (!x.defined() || !w.defined()) return nullptr;
  auto c = std::make_unique<CardBytes>();
  c->what = kCudnnWorkspaceMark;
  c->device = memfit_device(x);
  c->forward = {x.numel(), 0, w.numel()};
  c->is_forward = true;
  return c;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (std::strcmp(name, "aten::sum") == 0 || std::strcmp(name, "aten::mean") == 0) {
    return reduction(fn);
  }
  if (std::strcmp(name, "aten::convolution_backward") == 0) return convolution_backward(fn);
  if (std::strcmp(name, "aten::convolution") == 0) return convolution(fn);
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  auto* c = static_cast<CardBytes*>(ctx);
  if (c == nullptr) return;
  if (c->is_forward) {
    const auto outputs = fn.outputs();
    if (outputs.empty() || !outputs[0].isTensor() || !outputs[0].toTensor().defined()) return;
    c->forward.dy_numel = outputs[0].toTensor().numel();
    c->conv_bound = cudnn_conv_forward_workspace(c->forward);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (Recorder* r : recorders()) {
    if (c->conv_bound >= 0) {  // a mark, empty: the bound is said, not added
      r->record_transient(0, c->what, c->device);
      conv_bounds()[r].push_back(c->conv_bound);
      continue;
    }
    for (int64_t bytes : c->bytes) {
      r->record_transient(bytes, c->what, c->device);
    }
  }
}

uint64_t g_callback = 0;

}  // namespace

uint64_t add_card_ops(Recorder* r) {
  std::lock_guard<std::mutex> lock(g_mu);
  recorders().push_back(r);
  conv_bounds().erase(r);  // another recorder's, once at this address
  if (g_callback == 0) {
    g_callback = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                           .needsInputs(true)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
  }
  return reinterpret_cast<uint64_t>(r);
}

void remove_card_ops(uint64_t handle) {
  if (handle == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& v = recorders();
  auto it = std::find(v.begin(), v.end(), reinterpret_cast<Recorder*>(handle));
  if (it != v.end()) v.erase(it);
  conv_bounds().erase(reinterpret_cast<Recorder*>(handle));
  if (v.empty() && g_callback != 0) {
    at::removeCallback(g_callback);
    g_callback = 0;
  }
}

std::vector<int64_t> take_conv_workspaces(const Recorder* r) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = conv_bounds().find(r);
  if (it == conv_bounds().end()) return {};
  std::vector<int64_t> v = std::move(it->second);
  conv_bounds().erase(it);
  return v;
}

}  // namespace memfit::impl
