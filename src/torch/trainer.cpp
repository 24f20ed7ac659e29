#include "memfit/torch/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <sstream>

#include "memfit/core/model/chunk_schedule.h"
#include "memfit/core/model/units.h"
#include "memfit/torch/cpu_autocast.h"
#include "memfit/torch/tracking.h"

namespace memfit {
namespace {

// Live and peak tracked bytes since it was created; cheap enough for every
// step (no timeline).
class PeakWatcher final : public AllocationObserver {
 public:
  // Starts from what is live on the simulated device (CPU) already.
  PeakWatcher() : live_(tracking::live_bytes(Device::kCPU)), peak_(live_) {
    tracking::add_observer(this);
  }
  ~PeakWatcher() override { tracking::remove_observer(this); }
  void on_alloc(const Allocation& a) override {
    live_ += a.bytes;
    peak_ = std::max(peak_, live_);
  }
  void on_free(const Allocation& a, bool) override { live_ -= a.bytes; }
  int64_t peak() const { return peak_; }  // read after the step: no race

 private:
  int64_t live_;
  int64_t peak_;
};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

Trainer::Trainer(std::vector<at::Tensor> params, std::function<void()> optimizer_step,
                 TrainerOptions options, std::vector<std::string> coupled_layers)
    : optimizer_step_(std::move(optimizer_step)),
      options_(options),
      coupled_(std::move(coupled_layers)),
      micro_(options.micro_batch) {
  for (auto& p : params) {
    if (p.requires_grad()) params_.push_back(p);
  }
  TORCH_CHECK(options.micro_batch >= 0, "[Trainer] micro_batch must be >= 0, got ",
              options.micro_batch);
  TORCH_CHECK(!options.budget || *options.budget >= 0,
              "[Trainer] the budget must be >= 0 bytes");
}

void Trainer::set_budget(std::optional<int64_t> budget) {
  TORCH_CHECK(!budget || *budget >= 0, "[Trainer] the budget must be >= 0 bytes");
  // More room: try the whole batch again; less: the OOMs will say.
  if (!budget || (options_.budget && *budget > *options_.budget)) micro_ = 0;
  options_.budget = budget;
}

void Trainer::set_micro_batch(int64_t micro_batch) {
  TORCH_CHECK(micro_batch >= 0, "[Trainer::set_micro_batch] micro_batch must be >= 0, got ",
              micro_batch);
  micro_ = micro_batch;
}

void Trainer::drop_gradients() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

int64_t Trainer::untracked_parameter_bytes() const {
  // Parameters made before memfit tracked them still occupy the device.
  int64_t bytes = 0;
  for (const auto& p : params_) {
    if (!tracking::allocation_of(p)) bytes += p.storage().nbytes();
  }
  return bytes;
}

// Note [Why a retried micro-batch never counts twice]
// The micro-batches are a ChunkSchedule, their gradients a ChunkCoverage
// over the parameters (see Note [Why a retried chunk never counts twice] in
// chunk_coverage.h). A micro-batch owed by every parameter runs a plain
// backward that accumulates in place and costs no extra memory; a hook on
// each parameter notes which ones received their share before an OOM, and
// those are covered through the failed micro-batch. A redo owed by some
// only asks autograd::grad for them. Gradients that were accumulated stay;
// none is added twice. A gradient the failed backward created (none existed
// before) is dropped instead, and recomputed by the redo: the first
// micro-batch of a step is then redone exactly as if it had been asked for
// at the smaller size.
namespace impl {

// Hooks noting which parameters received a gradient in the current backward;
// removed when the step ends, however it ends.
class TouchHooks {
 public:
  explicit TouchHooks(std::vector<at::Tensor>& params)
      : params_(params), touched_(params.size(), 0) {
    for (size_t i = 0; i < params.size(); ++i) {
      char* flag = &touched_[i];
      handles_.push_back(params[i].register_hook([flag](const at::Tensor&) {
        *flag = 1;
      }));
    }
  }
  ~TouchHooks() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(handles_[i]);
  }
  void reset() { std::fill(touched_.begin(), touched_.end(), 0); }
  bool touched(size_t i) const { return touched_[i] != 0; }

 private:
  std::vector<at::Tensor>& params_;
  std::vector<char> touched_;
  std::vector<unsigned> handles_;
};

}  // namespace impl

void Trainer::run_chunk(const Chunk& chunk, int64_t batch, ChunkCoverage& coverage,
                        impl::TouchHooks& hooks, const ChunkLoss& chunk_loss,
                        StepReport& report) {
  const int64_t count = chunk.size;
  const std::vector<size_t> needed = coverage.owed(chunk);
  std::vector<char> had_grad(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) had_grad[i] = params_[i].grad().defined();
  at::Tensor loss;
  phase_ = OomPhase::kForward;
  {
    std::optional<CpuAutocast> autocast;
    if (options_.autocast_bf16) autocast.emplace(true);
    loss = chunk_loss(chunk.start, count);
  }
  if (!loss.defined() || loss.dim() != 0) {
    throw std::invalid_argument(
        "[Trainer::step] the loss must be a scalar tensor, got " +
        (loss.defined() ? "shape " + c10::str(loss.sizes()) : std::string("none")) +
        ": reduce it (mean or sum) in the loss function");
  }
  const double weight = options_.mean_loss
                            ? static_cast<double>(count) / static_cast<double>(batch)
                            : 1.0;
  // Unsplit, the loss is used as it is: not one byte more than a plain step.
  at::Tensor weighted = weight == 1.0 ? loss : loss * weight;
  phase_ = OomPhase::kBackward;
  if (needed.size() == params_.size()) {
    hooks.reset();
    try {
      weighted.backward();
    } catch (const c10::OutOfMemoryError&) {
      // A gradient that did not exist before is dropped: the redo computes
      // it again, in the same micro-batches as everyone else's (the same
      // rounding as accumulating them by hand, under bf16 too), and its
      // memory is free for the redo. One that existed was updated in place
      // right after its hook: it keeps this micro-batch's share.
      std::vector<size_t> kept;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!had_grad[i]) {
          params_[i].mutable_grad() = at::Tensor();
        } else if (hooks.touched(i)) {
          kept.push_back(i);
        }
      }
      coverage.add(chunk, kept);
      throw;
    }
  } else {
    std::vector<at::Tensor> inputs;
    for (size_t i : needed) inputs.push_back(params_[i]);
    auto grads = torch::autograd::grad({weighted}, inputs, /*grad_outputs=*/{},
                                       /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < needed.size(); ++k) {
      if (!grads[k].defined()) continue;
      at::Tensor& g = params_[needed[k]].mutable_grad();
      if (g.defined()) {
        g.add_(grads[k]);
      } else {
        g = grads[k];
      }
      grads[k].reset();
    }
  }
  coverage.add(chunk, needed);
  report.loss += loss.item<double>() * weight;
}

// What fills the memory when a step cannot go on, and the advice that fits
// that cause (see oom_cause.h): the model's own bytes, the batch's data, or
// what else is alive, rather than "a smaller batch".
std::string Trainer::out_of_memory(const std::string& what, const std::string& oom,
                                   int64_t batch_bytes) const {
  OomMemory m;
  for (const auto& p : params_) {
    m.parameters += p.storage().nbytes();
    if (p.grad().defined()) m.gradients += p.grad().storage().nbytes();
  }
  const int64_t live = tracking::live_bytes(Device::kCPU) + untracked_parameter_bytes();
  m.batch = std::min(batch_bytes, std::max<int64_t>(0, live - m.parameters - m.gradients));
  // The rest: optimizer state, what the failed micro-batch held is gone.
  const int64_t rest = std::max<int64_t>(0, live - m.parameters - m.gradients - m.batch);
  if (phase_ == OomPhase::kOptimizerStep) {
    m.optimizer_state = rest;
  } else {
    m.other = rest;
  }
  // The budget in force: the Trainer's own, or a simulated device around it.
  const std::optional<int64_t> budget =
      options_.budget ? options_.budget : tracking::budget(Device::kCPU);
  std::string context = what;
  if (budget) context += " in the budget of " + format_bytes(*budget);
  return explain_oom("Trainer::step", context, phase_, m, budget, /*state_on_host=*/false,
                     allocator_figures(oom))
      .message;
}

StepReport Trainer::step(int64_t batch, const ChunkLoss& chunk_loss, int64_t batch_bytes) {
  if (batch < 1) {
    throw std::invalid_argument("[Trainer::step] the batch is empty (" +
                                std::to_string(batch) +
                                " samples): pass at least one sample");
  }
  StepReport report;
  report.batch = batch;
  TrackingScope tracking;
  PeakWatcher watcher;
  std::optional<SimulatedDevice> device;
  if (options_.budget) {
    device.emplace(std::max<int64_t>(0, *options_.budget - untracked_parameter_bytes()));
  }
  drop_gradients();
  impl::TouchHooks hooks(params_);
  ChunkCoverage coverage(params_.size());
  // See Note [How chunks are scheduled] (chunk_schedule.h).
  ChunkSchedule schedule(batch, options_.split ? micro_ : 0, options_.split);
  while (!schedule.done()) {
    const Chunk chunk = schedule.next();
    const int64_t n = chunk.size;
    if (n < batch && !coupled_.empty() && options_.coupled == CoupledLayers::kError) {
      // Say why it is split: the memory, or a micro-batch asked for.
      const std::string why =
          schedule.ooms_recovered() > 0 || micro_ == 0
              ? " does not fit whole and must be split"
              : " is to be split into micro-batches of " + std::to_string(schedule.size()) +
                    " (micro_batch, or what fitted last step)";
      throw std::invalid_argument(
          "[Trainer::step] the batch of " + std::to_string(batch) + why +
          ", but these layers mix the samples of a batch (BatchNorm in training mode): " +
          join(coupled_) +
          ". Split anyway (each micro-batch gets its own statistics: "
          "coupled=allow), put them in eval mode, replace them (GroupNorm, "
          "LayerNorm), or give the step more memory.");
    }
    try {
      run_chunk(chunk, batch, coverage, hooks, chunk_loss, report);
    } catch (const c10::OutOfMemoryError& e) {
      // Whatever the micro-batch held died with the stack. See Note [Why a
      // retried micro-batch never counts twice].
      if (!schedule.failed()) {
        const std::string msg = out_of_memory(
            n == 1 ? "even one sample does not fit"
                   : "the batch of " + std::to_string(n) + " does not fit whole (split=False)",
            e.what_without_backtrace(), batch_bytes);
        drop_gradients();
        C10_THROW_ERROR(OutOfMemoryError, msg);
      }
      continue;
    } catch (...) {
      // Any other error (the user's forward or loss, a refused in-place
      // write): no half-accumulated gradients are left behind.
      drop_gradients();
      throw;
    }
    schedule.succeeded();
    report.chunks.push_back(n);
    report.micro_batch = std::max(report.micro_batch, n);
  }
  report.ooms_recovered = schedule.ooms_recovered();
  report.micro_batches = static_cast<int64_t>(report.chunks.size());
  report.samples = schedule.position();
  phase_ = OomPhase::kOptimizerStep;
  try {
    optimizer_step_();
  } catch (const c10::OutOfMemoryError& e) {
    const std::string msg =
        out_of_memory("the optimizer step does not fit",
                      e.what_without_backtrace(), batch_bytes);
    drop_gradients();
    C10_THROW_ERROR(OutOfMemoryError, msg);
  }
  drop_gradients();  // See Note [The order of a training iteration].
  // Later steps start from the size that worked.
  if (schedule.ooms_recovered() > 0 || schedule.size() < batch) micro_ = schedule.size();
  report.peak_bytes = watcher.peak();
  return report;
}

StepReport Trainer::step(
    const at::Tensor& inputs, const at::Tensor& target,
    const std::function<at::Tensor(const at::Tensor&)>& forward,
    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& loss,
    int64_t batch_dim) {
  TORCH_CHECK(batch_dim >= 0 && batch_dim < inputs.dim(),
              "[Trainer::step] batch dimension ", batch_dim,
              " is out of range for inputs of shape ", inputs.sizes(),
              ": pass the dimension that indexes samples");
  const int64_t batch = inputs.size(batch_dim);
  TORCH_CHECK(target.dim() >= 1 && target.size(0) == batch,
              "[Trainer::step] inputs hold ", batch, " samples along dimension ",
              batch_dim, " but the target holds ",
              target.dim() >= 1 ? target.size(0) : 0,
              ": they must hold the same samples");
  // What of the batch sits on the (simulated) device: memory allocated under
  // HostMemory, or before tracking, is the host's.
  int64_t batch_bytes = 0;
  for (const at::Tensor* t : {&inputs, &target}) {
    if (tracking::allocation_of(*t)) batch_bytes += t->storage().nbytes();
  }
  return step(
      batch,
      [&](int64_t start, int64_t count) {
        return loss(forward(inputs.narrow(batch_dim, start, count)),
                    target.narrow(0, start, count));
      },
      batch_bytes);
}

std::vector<std::string> coupled_layers_of(const torch::nn::Module& module) {
  auto coupled = [](const torch::nn::Module& m) {
    return m.name().find("BatchNorm") != std::string::npos && m.is_training();
  };
  std::vector<std::string> out;
  if (coupled(module)) out.push_back(module.name());
  // include_self=false: the root may live on the stack, not in a shared_ptr.
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (coupled(*item.value())) out.push_back(item.key());
  }
  return out;
}

}  // namespace memfit
