#include "memfit/torch/strategies.h"

#include "chain_calibration.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "memfit/core/json_writer.h"
#include "memfit/core/oom_cause.h"
#include "memfit/core/text_table.h"
#include "memfit/core/units.h"
#include "memfit/torch/checkpoint.h"
#include "memfit/torch/cpu_autocast.h"

namespace memfit {

namespace {

using Step = StepStrategies::Step;

// Parameter and buffer values (and the model's checkpointing), put back on
// destruction: advising trains the model.
class Restore {
 public:
  explicit Restore(TrainableModel& m)
      : model_(m), checkpointing_(m.checkpointing()) {
    torch::NoGradGuard no_grad;
    for (auto& p : m.module().parameters())
      saved_.emplace_back(p, p.detach().clone());
    for (auto& b : m.module().buffers())
      saved_.emplace_back(b, b.detach().clone());
  }
  ~Restore() {
    torch::NoGradGuard no_grad;
    for (auto& [t, v] : saved_) t.detach().copy_(v);
    for (auto& p : model_.module().parameters())
      p.mutable_grad() = at::Tensor();
    model_.set_checkpointing(checkpointing_);
  }

 private:
  TrainableModel& model_;
  std::vector<bool> checkpointing_;
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string join_indices(const std::vector<bool>& flags) {
  std::string out;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i]) out += (out.empty() ? "" : ",") + std::to_string(i);
  }
  return out;
}

int count(const std::vector<bool>& flags) {
  return static_cast<int>(std::count(flags.begin(), flags.end(), true));
}

std::string describe(const StepStrategies& s, const std::string& optimizer,
                     const std::string& user_optimizer, int64_t micro_batch) {
  std::vector<std::string> parts;
  if (count(s.checkpoint) > 0) {
    parts.push_back("checkpoint blocks " + join_indices(s.checkpoint) + " (" +
                    std::to_string(count(s.checkpoint)) + " of " +
                    std::to_string(s.checkpoint.size()) + ")");
  }
  if (s.autocast_bf16) parts.push_back("autocast bf16");
  if (optimizer != user_optimizer) parts.push_back("optimizer " + optimizer);
  if (micro_batch > 0)
    parts.push_back("micro-batches of " + std::to_string(micro_batch));
  if (parts.empty()) return "the plain step";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

// Runs steps of the model the way the Trainer runs them, for time and memory.
class Bench {
 public:
  Bench(TrainableModel& model, const AdviseOptions& o) : model_(model), o_(o) {}

  Profile profile(const StepStrategies& s, const std::string& optimizer,
                  int64_t batch) {
    ProfileOptions p;
    p.batch = batch;
    p.optimizer = optimizer;
    p.seed = o_.seed;
    p.lr = o_.lr;
    p.strategies = s;
    return profile_model(model_, p);
  }

  // Median milliseconds of a Trainer step on `batch` samples with the
  // strategies, in micro-batches of `micro_batch` (0: whole); the first call
  // runs one untimed step before (the allocator's and the threads' warm-up).
  // Eval steps time forward and loss under their guard.
  double step_ms(const StepStrategies& s, const std::string& optimizer,
                 int64_t batch, int64_t micro_batch = 0) {
    Restore restore(model_);
    auto& module = model_.module();
    if (!model_.set_checkpointing(s.checkpoint)) {
      throw std::invalid_argument(
          "[advise] " + model_.name() + " cannot checkpoint " +
          std::to_string(s.checkpoint.size()) + " blocks");
    }
    Batch b = model_.make_batch(batch, at::TensorOptions(), o_.seed);
    std::vector<double> ms;
    if (s.step != Step::kTrain) {
      module.eval();
      for (int r = warm_ ? 1 : 0; r <= o_.timing_repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        {
          std::optional<torch::NoGradGuard> no_grad;
          std::optional<c10::InferenceMode> inference;
          if (s.step == Step::kEvalNoGrad) no_grad.emplace();
          if (s.step == Step::kEvalInference) inference.emplace();
          std::optional<CpuAutocast> autocast;
          if (s.autocast_bf16) autocast.emplace(true);
          model_.loss(model_.forward(b.inputs), b.target).item<double>();
        }
        if (r > 0) ms.push_back(since(t0));
      }
      module.train();
      warm_ = true;
      return median(ms);
    }
    module.train();
    auto opt = make_optimizer(optimizer, module.parameters(), o_.lr);
    TrainerOptions to;
    to.micro_batch = micro_batch;
    to.autocast_bf16 = s.autocast_bf16;
    to.coupled =
        CoupledLayers::kAllow;  // timed only; advise notes the coupling
    Trainer trainer(
        module.parameters(),
        [&] {
          if (opt) opt->step();
        },
        to, coupled_layers_of(module));
    auto forward = [&](const at::Tensor& x) { return model_.forward(x); };
    auto loss = [&](const at::Tensor& out, const at::Tensor& y) {
      return model_.loss(out, y);
    };
    for (int r = warm_ ? 1 : 0; r <= o_.timing_repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      trainer.step(b.inputs, b.target, forward, loss);
      if (r > 0) ms.push_back(since(t0));
    }
    warm_ = true;
    return median(ms);
  }

 private:
  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - t0)
        .count();
  }
  TrainableModel& model_;
  const AdviseOptions& o_;
  bool warm_ = false;
};

double to_ratio(double ms, double plain_ms) {
  return plain_ms > 0 ? ms / plain_ms : 0;
}

}  // namespace

Advice advise(TrainableModel& model, const AdviseOptions& o) {
  if (o.batch < 1) {
    throw std::invalid_argument("[advise] batch must be >= 1, got " +
                                std::to_string(o.batch));
  }
  if (o.budget < 0) {
    throw std::invalid_argument("[advise] the budget must be >= 0 bytes, got " +
                                std::to_string(o.budget));
  }
  const std::vector<std::string>& optimizers = optimizer_names();
  if (std::find(optimizers.begin(), optimizers.end(), o.optimizer) ==
      optimizers.end()) {
    // make_optimizer's message names the choices.
    make_optimizer(o.optimizer, {}, o.lr);
  }
  Restore restore(model);
  model.set_checkpointing({});
  Bench bench(model, o);
  Advice a;
  a.model = model.name();
  a.batch = o.batch;
  a.budget = o.budget;
  a.optimizer = o.optimizer;
  {
    Batch b = model.make_batch(o.batch, at::TensorOptions(), o.seed);
    a.reserve_bytes =
        static_cast<int64_t>(b.inputs.nbytes() + b.target.nbytes());
  }
  const int64_t limit = o.budget - a.reserve_bytes;
  const std::vector<std::string> chain = model.chain();
  const size_t n = chain.size();

  // --- Every strategy on its own, at the whole batch.
  const StepStrategies plain_s;
  const Profile plain = bench.profile(plain_s, o.optimizer, o.batch);
  a.plain_peak = plain.report.peak_bytes;
  a.plain_step_ms = bench.step_ms(plain_s, o.optimizer, o.batch);
  auto add_row = [&](std::string name, std::string kind,
                     const StepStrategies& s, const std::string& optimizer,
                     bool exact, const Profile* measured = nullptr) {
    StrategyRow r;
    r.name = std::move(name);
    r.kind = std::move(kind);
    r.strategies = s;
    r.optimizer = optimizer;
    r.peak_bytes = measured
                       ? measured->report.peak_bytes
                       : bench.profile(s, optimizer, o.batch).report.peak_bytes;
    r.saving_bytes = a.plain_peak - r.peak_bytes;
    r.time_ratio =
        to_ratio(bench.step_ms(s, optimizer, o.batch), a.plain_step_ms);
    r.fits = r.peak_bytes <= limit;
    r.exact = exact;
    a.rows.push_back(r);
    return r;
  };
  {
    StrategyRow r;
    r.name = "plain (zero_grad set_to_none)";
    r.kind = "baseline";
    r.optimizer = o.optimizer;
    r.peak_bytes = a.plain_peak;
    r.time_ratio = 1.0;
    r.fits = a.plain_peak <= limit;
    a.rows.push_back(r);
  }
  {
    StepStrategies s;
    s.zero_grad_set_to_none = false;
    add_row("zero_grad in place", "memory", s, o.optimizer, true);
  }
  std::optional<Profile> all_ckpt;
  if (n > 0) {
    StepStrategies s;
    s.checkpoint.assign(n, true);
    all_ckpt = bench.profile(s, o.optimizer, o.batch);
    add_row("checkpoint every layer (" + std::to_string(n) + " of " +
                std::to_string(n) + ")",
            "checkpointing", s, o.optimizer, true, &*all_ckpt);
    detail::calibrate(plain, *all_ckpt, chain, a.segments, a.chain_memory);
    a.chain_batch = o.batch;
    const ChainPlan sq = chain_plan_sqrt(a.segments, a.chain_memory, limit);
    if (sq.count() > 0 && sq.count() < static_cast<int>(n)) {
      s.checkpoint = sq.checkpointed;
      add_row("checkpoint sqrt(n): blocks " + sq.indices(), "checkpointing", s,
              o.optimizer, true);
    }
  } else {
    a.notes.push_back(a.model +
                      " has no chain of blocks: activation checkpointing "
                      "does not apply");
  }
  {
    StepStrategies s;
    s.autocast_bf16 = true;
    add_row("autocast bf16 (CPU)", "precision", s, o.optimizer, false);
  }
  if (o.optimizer == "adam") {
    add_row("Adam's state and step on the host (adam-offload)", "optimizer",
            StepStrategies{}, "adam-offload", true);
  }
  for (const std::string opt : {"adam", "momentum", "sgd"}) {
    if (opt == o.optimizer || (opt == "adam" && o.optimizer == "adam-offload"))
      continue;
    add_row("optimizer " + opt + " instead of " + o.optimizer, "optimizer",
            StepStrategies{}, opt, false);
  }
  {
    StepStrategies s;
    s.step = Step::kEvalNoGrad;
    add_row("eval step under no_grad", "eval", s, o.optimizer, true);
    s.step = Step::kEvalInference;
    add_row("eval step under inference_mode", "eval", s, o.optimizer, true);
  }

  // --- The plan: micro-batches halving from the whole batch; at each, the
  // plain step, else the cheapest checkpointing the profiles confirm.
  struct Candidate {
    StepStrategies s;
    std::string optimizer;
    int64_t micro_batch;  // 0: whole
    int64_t peak;
    bool exact;
  };
  std::vector<Candidate> candidates;
  std::map<int64_t, std::pair<std::vector<ChainSegment>, ChainMemory>> chains;
  std::optional<Candidate> closest;
  auto consider = [&](const StepStrategies& s, const std::string& opt,
                      int64_t c, int64_t peak, bool exact) {
    const int64_t mb = c < o.batch ? c : 0;
    if (peak <= limit) {
      candidates.push_back({s, opt, mb, peak, exact});
    } else if (!closest || peak < closest->peak) {
      closest = Candidate{s, opt, mb, peak, exact};
    }
    return peak <= limit;
  };
  std::vector<int64_t> levels;
  for (int64_t c = o.batch;; c = (c + 1) / 2) {
    levels.push_back(c);
    if (c == 1) break;
  }
  // At each micro-batch, with optimizer `opt`: the plain step, else the
  // cheapest checkpointing the profiles confirm.
  auto search_levels = [&](const std::string& opt) {
    const bool users = opt == o.optimizer;  // the whole-batch profiles are its
    for (int64_t c : levels) {
      StepStrategies base;
      // Between micro-batches the gradients stay, as zeroing in place keeps
      // them.
      base.zero_grad_set_to_none = c == o.batch;
      const Profile plain_c =
          users && c == o.batch ? plain : bench.profile(base, opt, c);
      if (consider(StepStrategies{}, opt, c, plain_c.report.peak_bytes, true))
        break;
      if (n == 0) continue;
      StepStrategies every = base;
      every.checkpoint.assign(n, true);
      Profile all = users && c == o.batch && base.zero_grad_set_to_none
                        ? *all_ckpt
                        : bench.profile(every, opt, c);
      if (all.report.peak_bytes > limit) {
        StepStrategies closest_s;
        closest_s.checkpoint = every.checkpoint;
        consider(closest_s, opt, c, all.report.peak_bytes,
                 true);  // the closest
        continue;
      }
      std::vector<ChainSegment> segs;
      ChainMemory mem;
      detail::calibrate(plain_c, all, chain, segs, mem);
      // Of the choices measured to fit at this micro-batch, only the one with
      // the least recompute is timed.
      StepStrategies level_best;
      level_best.checkpoint = every.checkpoint;
      int64_t level_peak = all.report.peak_bytes;
      double level_ns = chain_recompute_ns(segs, every.checkpoint);
      // See Note [Calibrating the chain from two profiles].
      int64_t target = limit;
      std::vector<std::vector<bool>> tried = {every.checkpoint};
      for (int round = 0; round < 4; ++round) {
        const ChainPlan cp = chain_plan_optimal(segs, mem, target);
        if (!cp.fits) break;
        if (std::find(tried.begin(), tried.end(), cp.checkpointed) !=
            tried.end())
          break;
        tried.push_back(cp.checkpointed);
        StepStrategies s = base;
        s.checkpoint = cp.checkpointed;
        const int64_t peak = bench.profile(s, opt, c).report.peak_bytes;
        if (peak <= limit && cp.recompute_ns < level_ns) {
          level_best.checkpoint = cp.checkpointed;
          level_peak = peak;
          level_ns = cp.recompute_ns;
        }
        target += limit - peak;
      }
      consider(level_best, opt, c, level_peak, true);
      chains[c] = {segs, mem};
    }
  };
  search_levels(o.optimizer);
  if (candidates.empty() && o.optimizer == "adam") {
    // Adam's state and step moved to the host: the same training, slower
    // steps (three transfers of the parameters, a step on the CPU), so it
    // comes only when nothing on the device alone fits.
    search_levels("adam-offload");
  }
  if (candidates.empty() && o.allow_approximate) {
    // Precision, then a lighter optimizer, then both, with every block
    // checkpointed, one sample at a time if need be.
    std::vector<std::pair<bool, std::string>> variants = {{true, o.optimizer}};
    std::vector<std::string> lighter;
    if (o.optimizer == "adam" || o.optimizer == "adam-offload")
      lighter = {"momentum", "sgd"};
    if (o.optimizer == "momentum") lighter = {"sgd"};
    for (const auto& opt : lighter) {
      variants.push_back({false, opt});
      variants.push_back({true, opt});
    }
    for (const auto& [bf16, opt] : variants) {
      for (int64_t c : levels) {
        StepStrategies s;
        s.autocast_bf16 = bf16;
        s.checkpoint.assign(n, n > 0);
        StepStrategies measured = s;
        measured.zero_grad_set_to_none = c == o.batch;
        const int64_t peak = bench.profile(measured, opt, c).report.peak_bytes;
        if (consider(s, opt, c, peak, false)) break;
      }
      if (!candidates.empty()) break;
    }
  }
  // The cheapest measured candidate in time; exact ones first.
  std::optional<Candidate> best;
  double best_ratio = 0;
  for (const auto& cand : candidates) {
    if (best && best->exact && !cand.exact) continue;
    const double ratio = to_ratio(
        bench.step_ms(cand.s, cand.optimizer, o.batch, cand.micro_batch),
        a.plain_step_ms);
    if (!best || (cand.exact && !best->exact) || ratio < best_ratio) {
      best = cand;
      best_ratio = ratio;
    }
  }
  // The rules are compared on the chain the plan's checkpointing was made
  // for; else at the whole batch.
  const int64_t chain_c =
      best && best->micro_batch > 0 ? best->micro_batch : o.batch;
  if (chains.count(chain_c) &&
      count(best ? best->s.checkpoint : std::vector<bool>{}) > 0) {
    std::tie(a.segments, a.chain_memory) = chains[chain_c];
    a.chain_batch = chain_c;
  }
  if (!a.segments.empty()) {
    a.chain_plans = compare_chain_plans(a.segments, a.chain_memory, limit);
  }
  int64_t outside_peak = 0;
  for (const auto& ph : plain.report.phases) {
    if (ph.name != kPhaseForward && ph.name != kPhaseLoss &&
        ph.name != kPhaseBackward) {
      outside_peak = std::max(outside_peak, ph.peak_bytes);
    }
  }
  Plan& p = a.plan;
  if (best) {
    p.found = true;
    p.strategies = best->s;
    p.optimizer = best->optimizer;
    p.micro_batch = best->micro_batch;
    p.peak_bytes = best->peak;
    p.time_ratio = best_ratio;
    p.exact = best->exact;
  } else if (closest) {
    p.strategies = closest->s;
    p.optimizer = closest->optimizer;
    p.micro_batch = closest->micro_batch;
    p.peak_bytes = closest->peak;
    p.exact = closest->exact;
    a.notes.push_back(
        "nothing measured fits " + format_bytes(o.budget) +
        ": the lowest peak is " + format_bytes(closest->peak) +
        (o.allow_approximate
             ? ""
             : "; allowing approximate strategies (bf16, a lighter "
               "optimizer) may help") +
        "; outside forward and backward the step peaks at " +
        format_bytes(outside_peak) + " whatever the batch");
    // What fills the plain step's peak, and the advice for that cause.
    const OomPhase phase = oom_phase_of(plain.report.peak_phase);
    const OomDiagnosis d = diagnose_oom(phase, oom_memory_of(plain.report.categories_at_peak),
                                        o.budget, o.optimizer == "adam-offload");
    a.notes.push_back(std::string("the plain step peaks in ") + to_string(phase) + ", with " +
                      d.what_fills + ": " + d.advice);
  }
  if (p.micro_batch > 0 && model.couples_batch()) {
    a.notes.push_back(
        "the plan splits the batch, and " + a.model +
        " has layers that mix the samples of a batch (BatchNorm in "
        "training mode): each micro-batch gets its own statistics");
  }
  p.summary =
      describe(p.strategies, p.optimizer.empty() ? o.optimizer : p.optimizer,
               o.optimizer, p.micro_batch);
  return a;
}

TrainerOptions apply_plan(const Plan& plan, TrainableModel& model,
                          TrainerOptions base) {
  if (!model.set_checkpointing(plan.strategies.checkpoint)) {
    throw std::invalid_argument(
        "[apply_plan] " + model.name() + " cannot checkpoint " +
        std::to_string(plan.strategies.checkpoint.size()) +
        " blocks: its chain has " + std::to_string(model.chain().size()));
  }
  base.micro_batch = plan.micro_batch;
  base.autocast_bf16 = plan.strategies.autocast_bf16;
  return base;
}

std::string Advice::table() const {
  std::ostringstream out;
  out << "memfit advise: " << model << ", batch " << batch << ", optimizer "
      << optimizer << ", budget " << format_bytes(budget) << "\n";
  out << "plain step: peak " << format_bytes(plain_peak) << ", "
      << std::lround(plain_step_ms) << " ms per step (CPU)"
      << (reserve_bytes > 0 ? ", " + format_bytes(reserve_bytes) +
                                  " kept for the batch's data"
                            : std::string())
      << "\n\n";
  auto ratio = [](double r) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(2);
    s << r << "x";
    return s.str();
  };
  TextTable t({"strategy", "peak", "saving", "time", "fits", "result"},
              {Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
               Align::kLeft, Align::kLeft});
  for (const auto& r : rows) {
    t.add_row({r.name, format_bytes(r.peak_bytes), format_bytes(r.saving_bytes),
               ratio(r.time_ratio), r.fits ? "yes" : "no",
               r.kind == "eval" ? "no training"
               : r.exact        ? "same"
                                : "changes"});
  }
  out << t.str();
  if (!chain_plans.empty()) {
    const ChainPlan* every = nullptr;
    for (const auto& c : chain_plans) {
      if (c.rule == "every layer") every = &c;
    }
    out << "\ncheckpointing rules on the chain at batch " << chain_batch
        << " (predicted; recompute as a share of checkpointing every "
           "layer's)\n";
    TextTable c({"rule", "blocks", "predicted peak", "recompute", "fits"},
                {Align::kLeft, Align::kLeft, Align::kRight, Align::kRight,
                 Align::kLeft});
    for (const auto& p : chain_plans) {
      const double share = every && every->recompute_ns > 0
                               ? p.recompute_ns / every->recompute_ns
                               : 0;
      c.add_row({p.rule, p.indices(), format_bytes(p.predicted_peak),
                 ratio(share), p.fits ? "yes" : "no"});
    }
    out << c.str();
  }
  out << "\nplan: " << plan.summary;
  if (plan.found) {
    out << ": peak " << format_bytes(plan.peak_bytes) << " (measured), time "
        << ratio(plan.time_ratio) << " of the plain step, "
        << (plan.exact ? "same result" : "changes the numbers") << "\n";
  } else {
    out << ": does not fit (lowest measured peak "
        << format_bytes(plan.peak_bytes) << ")\n";
  }
  for (const auto& n : notes) out << "note: " << n << "\n";
  return out.str();
}

std::string Advice::to_json(bool pretty) const {
  JsonWriter w(pretty);
  w.begin_object()
      .member("model", model)
      .member("batch", batch)
      .member("budget_bytes", budget)
      .member("reserve_bytes", reserve_bytes)
      .member("optimizer", optimizer)
      .member("plain_peak_bytes", plain_peak)
      .member("plain_step_ms", plain_step_ms);
  w.key("strategies").begin_array();
  for (const auto& r : rows) {
    w.begin_object()
        .member("name", r.name)
        .member("kind", r.kind)
        .member("optimizer", r.optimizer)
        .member("peak_bytes", r.peak_bytes)
        .member("saving_bytes", r.saving_bytes)
        .member("time_ratio", r.time_ratio)
        .member("fits", r.fits)
        .member("exact", r.exact)
        .end_object();
  }
  w.end_array();
  w.key("checkpoint_rules").begin_array();
  for (const auto& p : chain_plans) {
    w.begin_object()
        .member("rule", p.rule)
        .member("blocks", p.indices())
        .member("predicted_peak_bytes", p.predicted_peak)
        .member("recompute_ns", p.recompute_ns)
        .member("fits", p.fits)
        .end_object();
  }
  w.end_array();
  w.key("plan")
      .begin_object()
      .member("found", plan.found)
      .member("summary", plan.summary)
      .member("checkpoint", join_indices(plan.strategies.checkpoint))
      .member("autocast_bf16", plan.strategies.autocast_bf16)
      .member("optimizer", plan.optimizer)
      .member("micro_batch", plan.micro_batch)
      .member("peak_bytes", plan.peak_bytes)
      .member("time_ratio", plan.time_ratio)
      .member("exact", plan.exact)
      .end_object();
  w.key("notes").begin_array();
  for (const auto& n : notes) w.value(n);
  w.end_array();
  w.end_object();
  return w.str();
}

}  // namespace memfit
