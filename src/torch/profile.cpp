#include "memfit/torch/profile.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "memfit/core/model/card_kernels.h"
#include "memfit/core/model/optimizers.h"
#include "memfit/core/model/units.h"
#include "memfit/core/plan/step_protocol.h"
#include "memfit/torch/card_ops.h"
#include "memfit/torch/cpu_autocast.h"
#include "memfit/torch/host_offload.h"
#include "memfit/torch/move_parameter.h"
#include "memfit/torch/native_meta.h"
#include "memfit/torch/recorder.h"

namespace memfit {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, std::vector<at::Tensor> params, double lr) {
  const OptimizerSpec* spec = find_optimizer(name);
  if (!spec) {
    std::string names;
    for (const auto& n : optimizer_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("[profile] unknown optimizer '" + name +
                                "': choose one of " + names);
  }
  const std::string& cls = spec->torch_class;
  if (cls.empty()) return nullptr;
  if (cls == "Adam" && spec->on_host) return host_offload_adam(std::move(params), lr);
  TORCH_INTERNAL_ASSERT(!spec->on_host, "[make_optimizer] no host offload of ", cls);
  if (cls == "Adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
  }
  if (cls == "SGD") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr).momentum(spec->momentum));
  }
  TORCH_INTERNAL_ASSERT(false, "[make_optimizer] no LibTorch class ", cls, " for ", name);
}

namespace {

void check(const ProfileOptions& o) {
  if (o.batch < 1) {
    throw std::invalid_argument("[profile] batch must be >= 1, got " +
                                std::to_string(o.batch));
  }
  if (o.iterations < 1) {
    throw std::invalid_argument("[profile] iterations must be >= 1, got " +
                                std::to_string(o.iterations));
  }
  if (o.mode != "cpu" && o.mode != "meta") {
    throw std::invalid_argument("[profile] unknown mode '" + o.mode +
                                "': choose cpu or meta");
  }
}

void drop_gradients(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
}

// Gives every parameter and buffer fresh storage on `device`, allocated now
// (so under the recorder): the "model.to(device)" of the step.
void materialize(torch::nn::Module& m, const at::Device& device, Recorder& r) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    set_data_any_device(p, p.detach().to(device, /*non_blocking=*/false,
                                                /*copy=*/true));
    r.classify(p, Category::kParameter);
  }
  for (auto& b : m.buffers()) {
    set_data_any_device(b, b.detach().to(device, false, true));
    r.classify(b, Category::kBuffer);
  }
}

// The batch a step runs on, before it moves to `device`. On the CPU, the
// model's synthetic data. On meta only shapes matter: one real sample gives
// them and the batch is made on meta, so a batch of 2e9 samples costs no
// host memory (meta cannot draw random numbers itself).
Batch step_batch(const TrainableModel& model, int64_t batch, const at::Device& device,
                 uint64_t seed) {
  if (!device.is_meta()) return model.make_batch(batch, at::TensorOptions(), seed);
  const Batch one = model.make_batch(1, at::TensorOptions(), seed);
  auto widen = [&](const at::Tensor& t) {
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes[0] = batch;
    return at::empty(sizes, t.options().device(at::kMeta));
  };
  return {widen(one.inputs), widen(one.target)};
}

// The step's modes (no_grad or inference for an eval step, bf16 autocast),
// on from forward through loss; off in the reverse order they came on.
class StepModes {
 public:
  explicit StepModes(const StepStrategies& st) : st_(st) {}
  void enter() {
    if (st_.step == StepStrategies::Step::kEvalNoGrad) no_grad_.emplace();
    if (st_.step == StepStrategies::Step::kEvalInference) inference_.emplace();
    if (st_.autocast_bf16) autocast_.emplace(true);
  }
  void leave() {
    autocast_.reset();
    inference_.reset();
    no_grad_.reset();
  }
  ~StepModes() { leave(); }

 private:
  const StepStrategies& st_;
  std::optional<torch::NoGradGuard> no_grad_;
  std::optional<c10::InferenceMode> inference_;
  std::optional<CpuAutocast> autocast_;
};

// One recorded run of `iterations` training iterations on `device`;
// `host_bytes`: what an offloading optimizer kept on the host (not recorded).
Timeline run_recorded(TrainableModel& model, const ProfileOptions& o,
                      const at::Device& device, int64_t& host_bytes,
                      std::vector<int64_t>& conv_workspaces) {
  auto& module = model.module();
  const StepStrategies& st = o.strategies;
  const bool train = st.step == StepStrategies::Step::kTrain;
  module.train(train);
  drop_gradients(module);
  const std::vector<bool> was_checkpointing = model.checkpointing();
  if (!st.checkpoint.empty() && !model.set_checkpointing(st.checkpoint)) {
    throw std::invalid_argument(
        "[profile] cannot checkpoint " + std::to_string(st.checkpoint.size()) +
        " blocks of " + model.name() + ": it has " +
        std::to_string(model.chain().size()) + " in its chain");
  }
  struct Restore {
    TrainableModel& m;
    const std::vector<bool>& flags;
    ~Restore() {
      m.set_checkpointing(flags);
      m.module().train();
    }
  } restore{model, was_checkpointing};
  // Data is made outside the recording; moving it to the device is the
  // recorded "inputs" phase.
  Batch cpu_batch = step_batch(model, o.batch, device, o.seed);
  // torch's C++ meta kernels for the step, and kernels for the ops only
  // torch's Python package gives one (Note [Native meta kernels]).
  std::optional<NativeMetaKernels> meta_kernels;
  if (device.is_meta()) meta_kernels.emplace(__FILE__, __LINE__);
  Recorder r;
  // See Note [Meta kernels allocate only their outputs] (op_frames.h).
  if (device.is_meta()) r.drop_meta_kernel_intermediates();
  // See Note [What a card adds inside an op] (card_ops.h).
  if (o.cuda_target) r.add_card_kernels();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Batch b;
  at::Tensor out, loss;
  StepModes modes(st);
  StepCallbacks cb;
  cb.train = train;
  cb.has_optimizer = o.optimizer != "none";
  cb.begin_phase = [&](const std::string& phase, int it) { r.begin_phase(phase, it); };
  cb.materialize = [&] {
    materialize(module, device, r);
    optimizer = make_optimizer(o.optimizer, module.parameters(), o.lr);
    TORCH_INTERNAL_ASSERT(static_cast<bool>(optimizer) == cb.has_optimizer);
  };
  cb.inputs = [&] {
    b = Batch{cpu_batch.inputs.to(device, false, /*copy=*/true),
              cpu_batch.target.to(device, false, /*copy=*/true)};
  };
  cb.forward = [&] {
    modes.enter();
    out = model.forward(b.inputs);
  };
  cb.loss = [&] {
    loss = model.loss(out, b.target);
    out.reset();  // See Note [The order of a training iteration].
    modes.leave();
    if (loss.dim() != 0) {
      throw std::invalid_argument("[profile] the loss must be a scalar, got "
                                  "shape " + c10::str(loss.sizes()));
    }
    if (!train) loss.reset();
  };
  cb.backward = [&] { loss.backward(); };
  cb.optimizer_step = [&] { optimizer->step(); };
  cb.zero_grad = [&] {
    if (st.zero_grad_set_to_none) {
      drop_gradients(module);
    } else {
      torch::NoGradGuard no_grad;
      for (auto& p : module.parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
  };
  cb.end_phase = [&] {
    r.end_phase();
    // In the order an iteration's locals went: the loss, then the batch.
    loss.reset();
    b.target.reset();
    b.inputs.reset();
  };
  run_step_protocol(cb, o.iterations, o.progress,
                    "record batch " + std::to_string(o.batch) + " on " + device.str());
  // See Note [cuDNN's workspace at the step's peak] (card_kernels.cpp).
  conv_workspaces = impl::take_conv_workspaces(&r);
  r.stop();
  drop_gradients(module);
  if (auto* offload = dynamic_cast<HostOffloadOptimizer*>(optimizer.get())) {
    host_bytes = offload->host_bytes();
  }
  return r.timeline();
}

// Parameter and buffer values, put back on destruction.
class ModelSnapshot {
 public:
  explicit ModelSnapshot(torch::nn::Module& m)
      : params_(m.parameters()), buffers_(m.buffers()) {
    torch::NoGradGuard no_grad;
    for (auto& p : params_) param_values_.push_back(p.detach().clone());
    for (auto& b : buffers_) buffer_values_.push_back(b.detach().clone());
  }
  // Hands the saved values themselves back: a destructor that allocated
  // could throw an OOM during the unwinding of another (a step that did not
  // fit a simulated device) and end the process.
  ~ModelSnapshot() { put_back(/*copy=*/false); }
  // Puts copies back, keeping the snapshot for a later run.
  void restore() { put_back(/*copy=*/true); }

 private:
  void put_back(bool copy) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() = at::Tensor();
      set_data_any_device(
          params_[i], copy ? param_values_[i].clone() : param_values_[i]);
    }
    for (size_t i = 0; i < buffers_.size(); ++i) {
      set_data_any_device(
          buffers_[i], copy ? buffer_values_[i].clone() : buffer_values_[i]);
    }
  }

  std::vector<at::Tensor> params_, buffers_;
  std::vector<at::Tensor> param_values_, buffer_values_;
};

}  // namespace

Profile profile_model(TrainableModel& model, const ProfileOptions& options) {
  check(options);
  std::vector<std::string> notes;
  std::string mode = options.mode;
  Timeline timeline;
  int64_t host_bytes = 0;
  std::vector<int64_t> conv_workspaces;
  // Profiling trains (and meta mode empties the weights): the model is given
  // back as it came, whatever happens.
  ModelSnapshot snapshot(model.module());
  if (mode == "meta") {
    try {
      timeline = run_recorded(model, options, at::Device(at::kMeta), host_bytes,
                              conv_workspaces);
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      what = what.substr(0, what.find('\n'));
      // torch's message for an op without a meta kernel is a paragraph:
      // keep the op's name. Many of torch 2.x's meta kernels are registered
      // by its Python package, so a C++-only process lacks them.
      const size_t cut = what.find(": attempted to run this operator with Meta tensors");
      if (cut != std::string::npos) what = "no meta kernel for " + what.substr(0, cut);
      notes.push_back("meta mode unavailable for " + model.name() + " (" + what +
                      "); fell back to cpu mode. torch registers many meta kernels from "
                      "Python: run `memfit` as installed by pip, or python -m memfit");
      mode = "cpu";
      snapshot.restore();
      if (options.progress.enabled()) {
        options.progress.step("meta mode unavailable (" + what + "): again on cpu");
      }
    }
  }
  if (mode == "cpu") {
    timeline = run_recorded(model, options, at::Device(at::kCPU), host_bytes,
                            conv_workspaces);
  }
  if (options.progress.enabled()) {
    options.progress.step("explain " + std::to_string(timeline.events().size()) +
                          " allocations and frees");
  }
  Profile p;
  p.report = make_report(timeline, {model.name(), options.batch,
                                    options.optimizer, mode});
  if (host_bytes > 0) {
    notes.push_back("optimizer state and step on the host: " +
                    format_bytes(host_bytes) +
                    " of host memory (parameter copies, gradient buffers, "
                    "state), not in the device's figures");
  }
  p.report.notes = std::move(notes);
  if (options.cuda_target) {
    options.progress.step("replay " + std::to_string(timeline.events().size()) +
                          " allocations and frees through the CUDA caching allocator");
    p.report.cuda = estimate_cuda(timeline, options.cuda_workspace);
    ConvWorkspaceAtPeak conv_at_peak = cudnn_workspace_at_peak(timeline, conv_workspaces);
    conv_at_peak.batch = options.batch;
    const std::string conv = cudnn_workspace_note(conv_at_peak);
    if (!conv.empty()) p.report.notes.push_back(conv);
  }
  p.timeline = std::move(timeline);
  return p;
}

PeakModel probe_peak_model(TrainableModel& model, const ProfileOptions& options,
                           const std::vector<int64_t>& probe_batches) {
  std::vector<Profile> profiles;
  for (int64_t b : probe_batches) {
    ProfileOptions o = options;
    o.batch = b;
    profiles.push_back(profile_model(model, o));
  }
  return fit_peak_model(probe_batches, profiles);
}

PeakModel fit_peak_model(const std::vector<int64_t>& batches,
                         const std::vector<Profile>& profiles) {
  std::vector<Report> reports;
  std::vector<const Timeline*> timelines;
  for (const auto& p : profiles) {
    reports.push_back(p.report);
    timelines.push_back(&p.timeline);
  }
  return fit_peak_model(batches, reports, timelines);
}

}  // namespace memfit
