// memfit.advise's planner (core/plan/advise_plan.h) and the checkpointing
// planner under it (core/plan/checkpoint_plan.h): Python records the user's
// model when the planner asks, the planner does the rest.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/model/optimizers.h"
#include "memfit/core/plan/advise_plan.h"
#include "memfit/core/plan/checkpoint_plan.h"
#include "memfit/core/plan/progress.h"
#include "memfit/core/render/advice_table.h"

namespace py = pybind11;

namespace memfit::python {

void init_strategies(py::module_& m) {
  py::class_<ChainSegment>(m, "ChainSegment")
      .def(py::init([](std::string name, int64_t activation_bytes,
                       int64_t input_bytes, int64_t backward_extra_bytes,
                       double recompute_ns) {
             return ChainSegment{std::move(name), activation_bytes, input_bytes,
                                 backward_extra_bytes, recompute_ns};
           }),
           py::arg("name") = "", py::arg("activation_bytes") = 0,
           py::arg("input_bytes") = 0, py::arg("backward_extra_bytes") = 0,
           py::arg("recompute_ns") = 0.0)
      .def_readwrite("name", &ChainSegment::name, "the block's path")
      .def_readwrite("activation_bytes", &ChainSegment::activation_bytes,
                     "saved for backward by its forward, its output excluded")
      .def_readwrite("input_bytes", &ChainSegment::input_bytes,
                     "kept from forward to its backward when checkpointed (0 when kept anyway)")
      .def_readwrite("backward_extra_bytes",
                     &ChainSegment::backward_extra_bytes,
                         "extra live above its activations while its backward runs")
      .def_readwrite("recompute_ns", &ChainSegment::recompute_ns,
                     "its forward time: the price of checkpointing it, in nanoseconds")
      .def("__repr__", [](const ChainSegment& c) {
        return "ChainSegment(" + quoted(c.name) + ", activation_bytes=" +
               std::to_string(c.activation_bytes) + ", input_bytes=" +
               std::to_string(c.input_bytes) + ")";
      });

  py::class_<ChainMemory>(m, "ChainMemory")
      .def(py::init([](int64_t forward_fixed, int64_t backward_fixed,
                       int64_t other_peak) {
             return ChainMemory{forward_fixed, backward_fixed, other_peak};
           }),
           py::arg("forward_fixed") = 0, py::arg("backward_fixed") = 0,
           py::arg("other_peak") = 0)
      .def_readwrite("forward_fixed", &ChainMemory::forward_fixed,
                     "live outside the chain at the end of forward")
      .def_readwrite("backward_fixed", &ChainMemory::backward_fixed,
                     "live outside the chain while its backward runs")
      .def_readwrite("other_peak", &ChainMemory::other_peak,
                     "peaks the chain does not touch (the optimizer step)")
      .def("__repr__", [](const ChainMemory& c) {
        return "ChainMemory(forward_fixed=" + std::to_string(c.forward_fixed) +
               ", backward_fixed=" + std::to_string(c.backward_fixed) +
               ", other_peak=" + std::to_string(c.other_peak) + ")";
      });

  py::class_<ChainPlan>(m, "ChainPlan")
      .def_readonly("rule", &ChainPlan::rule,
                    "none, every layer, every 2nd layer, sqrt(n) or optimal")
      .def_readonly("checkpointed", &ChainPlan::checkpointed, "one flag per block: checkpointed")
      .def_readonly("predicted_peak", &ChainPlan::predicted_peak,
                    "the chain model's peak under this plan")
      .def_readonly("recompute_ns", &ChainPlan::recompute_ns,
                    "the forward time checkpointing adds, in nanoseconds")
      .def_readonly("fits", &ChainPlan::fits, "predicted_peak is within the budget it was made for")
      .def("count", &ChainPlan::count)
      .def("indices", &ChainPlan::indices)
      .def("__repr__", [](const ChainPlan& p) {
        return "ChainPlan(" + quoted(p.rule) + ", blocks=" + quoted(p.indices()) +
               ", predicted_peak=" + std::to_string(p.predicted_peak) +
               ", fits=" + (p.fits ? std::string("True") : std::string("False")) + ")";
      });

  m.def("chain_peak", &chain_peak, py::arg("segments"), py::arg("memory"),
        py::arg("checkpointed"),
        "Predicted peak of a choice. See Note [The chain's memory model].");
  m.def("chain_recompute_ns", &chain_recompute_ns, py::arg("segments"),
        py::arg("checkpointed"));
  m.def("chain_plan_none", &chain_plan_none, py::arg("segments"),
        py::arg("memory"), py::arg("budget"));
  m.def("chain_plan_every_k", &chain_plan_every_k, py::arg("segments"),
        py::arg("memory"), py::arg("budget"), py::arg("k"));
  m.def("chain_plan_sqrt", &chain_plan_sqrt, py::arg("segments"),
        py::arg("memory"), py::arg("budget"));
  m.def("chain_plan_optimal", &chain_plan_optimal, py::arg("segments"),
        py::arg("memory"), py::arg("budget"),
        "The least recompute whose predicted peak fits the budget (dynamic "
        "programming); fits is false when no choice does.");
  m.def("compare_chain_plans", &compare_chain_plans, py::arg("segments"),
        py::arg("memory"), py::arg("budget"));

  py::class_<StepVariant>(m, "StepVariant")
      .def(py::init([](std::vector<bool> checkpoint, bool autocast_bf16, bool zero_grad_in_place,
                       std::string optimizer, bool host_state, std::string step,
                       std::string setting, bool setting_exact) {
             StepVariant v;
             v.checkpoint = std::move(checkpoint);
             v.autocast_bf16 = autocast_bf16;
             v.zero_grad_in_place = zero_grad_in_place;
             v.optimizer = std::move(optimizer);
             v.host_state = host_state;
             v.step = step == "no_grad"          ? StepKind::kEvalNoGrad
                      : step == "inference_mode" ? StepKind::kEvalInference
                                                 : StepKind::kTrain;
             v.setting = std::move(setting);
             v.setting_exact = setting_exact;
             return v;
           }),
           py::arg("checkpoint") = std::vector<bool>{}, py::arg("autocast_bf16") = false,
           py::arg("zero_grad_in_place") = false, py::arg("optimizer") = "",
           py::arg("host_state") = false, py::arg("step") = "train", py::arg("setting") = "",
           py::arg("setting_exact") = false)
      .def_readonly("checkpoint", &StepVariant::checkpoint,
                    "one flag per block of the chain; empty: none checkpointed")
      .def_readonly("autocast_bf16", &StepVariant::autocast_bf16,
                    "forward and loss under bf16 autocast")
      .def_readonly("zero_grad_in_place", &StepVariant::zero_grad_in_place,
                    "zero_grad(set_to_none=False)")
      .def_readonly("optimizer", &StepVariant::optimizer,
                    "'': the user's optimizer; else adam, momentum or sgd")
      .def_readonly("host_state", &StepVariant::host_state,
                    "the optimizer's state and step on the host")
      .def_property_readonly("step", [](const StepVariant& v) { return to_string(v.step); },
                             "train, no_grad or inference_mode")
      .def_readonly("setting", &StepVariant::setting,
                    "'': none; else the label of the front's AdviseSetting applied")
      .def_readonly("setting_exact", &StepVariant::setting_exact,
                    "that setting keeps what is trained")
      .def("exact", &StepVariant::exact);

  py::class_<AdviseSetting>(m, "AdviseSetting")
      .def(py::init([](std::string label, bool exact, bool checkpoints) {
             return AdviseSetting{std::move(label), exact, checkpoints};
           }),
           py::arg("label"), py::arg("exact") = false, py::arg("checkpoints") = false)
      .def_readonly("label", &AdviseSetting::label, "the row's name and StepVariant.setting")
      .def_readonly("exact", &AdviseSetting::exact,
                    "keeps what is trained; False: the plan may use it only with allow_approximate")
      .def_readonly("checkpoints", &AdviseSetting::checkpoints,
                    "it checkpoints the model itself: the planner adds no checkpointing");

  py::class_<OptimizerSpec>(m, "OptimizerSpec")
      .def_readonly("name", &OptimizerSpec::name, "as optimizer=\"...\" takes it")
      .def_readonly("torch_class", &OptimizerSpec::torch_class,
                    "the torch.optim class it builds; \"\": no optimizer")
      .def_readonly("lr", &OptimizerSpec::lr, "the learning rate it is built with")
      .def_readonly("momentum", &OptimizerSpec::momentum, "SGD's momentum; 0: none")
      .def_readonly("on_host", &OptimizerSpec::on_host,
                    "its state and step on the host (memfit.offload)")
      .def_readonly("states", &OptimizerSpec::states,
                    "tensors of state per trainable parameter, each its size")
      .def("__repr__", [](const OptimizerSpec& s) { return "OptimizerSpec('" + s.name + "')"; });
  m.def("builtin_optimizers", &builtin_optimizers,
        "The optimizers memfit builds by name, in order (core/model/optimizers.h): the "
        "one list both fronts read.");
  m.def("optimizer_names", &optimizer_names, "The built-in optimizers' names, in order.");
  m.attr("OFFLOAD_SUFFIX") = kOffloadSuffix;  // "adam-offload": Adam's state on the host

  py::class_<OptimizerChoices>(m, "OptimizerChoices")
      .def_readonly("others", &OptimizerChoices::others, "optimizers compared in rows, in order")
      .def_readonly("lighter", &OptimizerChoices::lighter,
                    "optimizers the plan may switch to with allow_approximate, in order")
      .def_readonly("can_offload", &OptimizerChoices::can_offload,
                    "the optimizer has state, not on the host yet");
  m.def("mixing_layers_phrase", &mixing_layers_phrase, py::arg("paths"),
        "the BatchNorm layers that mix a batch's samples, named as messages say them");
  m.def("optimizer_choices", &optimizer_choices, py::arg("user_kind"),
        "The optimizers advise compares with the user's kind (adam, momentum, sgd, none, "
        "<kind>-offload, a class name): others (rows), lighter (in the order the plan tries "
        "them), can_offload.");

  py::class_<AdviseRow>(m, "AdviseRow")
      .def_readonly("name", &AdviseRow::name, "the strategy, in words")
      .def_property_readonly("kind", [](const AdviseRow& r) { return to_string(r.kind); },
          "baseline, memory, checkpointing, precision, optimizer, eval, combination or setting")
      .def_readonly("variant", &AdviseRow::variant, "the StepVariant recorded")
      .def_readonly("peak_bytes", &AdviseRow::peak_bytes, "its peak at the whole batch")
      .def_readonly("saving_bytes", &AdviseRow::saving_bytes,
                    "the plain step's peak (same device) less this one")
      .def_readonly("meta", &AdviseRow::meta, "recorded on the meta device")
      .def_readonly("time_ratio", &AdviseRow::time_ratio,
                    "step time over the plain step's; < 0: unknown")
      .def_readonly("time_measured", &AdviseRow::time_measured,
                    "False: estimated from the recorded times")
      .def_readonly("fits", &AdviseRow::fits, "its peak is within the budget (False without one)")
      .def_readonly("recompute_ns", &AdviseRow::recompute_ns,
                    "checkpointing: the forward time recomputed; -1 otherwise")
      .def_readonly("predicted_peak_bytes", &AdviseRow::predicted_peak_bytes,
                    "checkpointing: the chain model's peak; -1 otherwise")
      .def_readonly("predicted", &AdviseRow::predicted,
                    "peak_bytes predicted from the recordings, not recorded (Note [Rows "
                    "advise predicts])");

  py::class_<AdvisePlan>(m, "AdvisePlan")
      .def_readonly("found", &AdvisePlan::found, "False: nothing fits; the fields say the closest")
      .def_readonly("variant", &AdvisePlan::variant, "the StepVariant the plan runs")
      .def_readonly("micro_batch", &AdvisePlan::micro_batch, "its micro-batch; 0: the whole batch")
      .def_readonly("peak_bytes", &AdvisePlan::peak_bytes, "recorded at micro_batch")
      .def_readonly("time_ratio", &AdvisePlan::time_ratio,
                    "step time over the plain step's; < 0: unknown")
      .def_readonly("time_measured", &AdvisePlan::time_measured, "False: estimated")
      .def_readonly("exact", &AdvisePlan::exact, "the plan keeps the numbers of the plain step")
      .def_readonly("verified", &AdvisePlan::verified,
                    "recorded on a real device within the budget (False: meta only)")
      .def_readonly("optimizer", &AdvisePlan::optimizer,
                    "what it trains with: the user's, a lighter one, or '<x>-offload'")
      .def_readonly("summary", &AdvisePlan::summary, "the plan in one line");

  py::class_<CardPlan>(m, "CardPlan")
      .def_readonly("budget", &CardPlan::budget, "the card's budget, bytes")
      .def_readonly("plan", &CardPlan::plan, "the AdvisePlan for it (found False: none fits)");

  py::class_<Advice>(m, "NativeAdvice")
      .def_readwrite("model", &Advice::model, "the model's name")
      .def_readwrite("chain_description", &Advice::chain_description,
                     "the chain found, in words; '' for none")
      .def_readwrite("parameter_bytes", &Advice::parameter_bytes,
                     "the parameters' and buffers' bytes")
      .def_readonly("batch", &Advice::batch, "the user's batch")
      .def_readonly("budget", &Advice::budget, "bytes; -1: no budget")
      .def_readonly("optimizer", &Advice::optimizer, "the user's optimizer, as the rows name it")
      .def_readonly("plain_peak", &Advice::plain_peak,
                    "the plain step's peak, recorded on a real device")
      .def_readonly("cuda_reserved", &Advice::cuda_reserved,
                    "peaks are the CUDA caching allocator's reserved bytes")
      .def_readonly("plain_step_ms", &Advice::plain_step_ms,
                    "the plain step's recorded time in milliseconds")
      .def_readonly("rows", &Advice::rows, "one AdviseRow per strategy at the whole batch")
      .def_readonly("chain_batch", &Advice::chain_batch,
                    "the batch the chain below was measured at")
      .def_readonly("segments", &Advice::segments, "the chain's ChainSegments as calibrated")
      .def_readonly("chain_memory", &Advice::chain_memory, "the ChainMemory outside the chain")
      .def_readonly("chain_plans", &Advice::chain_plans,
                    "the checkpointing rules compared (ChainPlan)")
      .def_readonly("plan", &Advice::plan, "the AdvisePlan")
      .def_readonly("recordings", &Advice::recordings, "real-device recordings the plan ran")
      .def_readonly("estimated_from", &Advice::estimated_from,
                    "what times were estimated from; '' for the recorded times")
      .def_readwrite("notes", &Advice::notes, "what the rows and the plan rest on, one line each")
      .def_readonly("does_not_fit", &Advice::does_not_fit,
                    "with a budget nothing meets: the one line a front raises; else ''")
      .def_readonly("cards", &Advice::cards,
                    "with cards=: each card's CardPlan, smallest card first")
      .def("cards_table", [](const Advice& a) { return cards_table(a); },
           "What fits on which card, as `memfit advise --cards` prints it.")
      .def("table", [](const Advice& a) { return to_text(a); },
           "The table `memfit advise` prints (render/advice_table.h).")
      .def("to_json", [](const Advice& a, bool pretty) { return to_json(a, pretty); },
           py::arg("pretty") = true, "The JSON `memfit advise --json` prints.");

  py::class_<AdviseSettings>(m, "AdviseSettings",
                             "What memfit.advise asks of the planner (core/plan/advise_plan.h).")
      .def(py::init([](int64_t batch, std::string optimizer, int64_t budget, bool has_optimizer,
                       bool can_offload, std::vector<std::string> other_optimizers,
                       std::vector<std::string> lighter, std::vector<std::string> chain,
                       std::vector<AdviseSetting> settings, bool allow_approximate,
                       const Progress& progress, std::vector<int64_t> cards) {
             AdviseSettings s;
             s.cards = std::move(cards);
             s.batch = batch;
             s.budget = budget;
             s.optimizer = std::move(optimizer);
             s.has_optimizer = has_optimizer;
             s.can_offload = can_offload;
             s.offload_label = "memfit.offload";
             s.other_optimizers = std::move(other_optimizers);
             s.lighter = std::move(lighter);
             s.chain = std::move(chain);
             s.settings = std::move(settings);
             s.allow_approximate = allow_approximate;
             s.approximate_flag = "allow_approximate=True";  // as a Python user writes it
             s.progress = progress;
             return s;
           }),
           py::kw_only(), py::arg("batch"), py::arg("optimizer"), py::arg("budget") = -1,
           py::arg("has_optimizer") = true, py::arg("can_offload") = false,
           py::arg("other_optimizers") = std::vector<std::string>{},
           py::arg("lighter") = std::vector<std::string>{},
           py::arg("chain") = std::vector<std::string>{},
           py::arg("settings") = std::vector<AdviseSetting>{},
           py::arg("allow_approximate") = false, py::arg("progress") = Progress(),
           py::arg("cards") = std::vector<int64_t>{})
      .def_readwrite("batch", &AdviseSettings::batch, "the user's whole batch")
      .def_readwrite("budget", &AdviseSettings::budget, "bytes; -1: no budget (rows only)")
      .def_readwrite("reserve_bytes", &AdviseSettings::reserve_bytes,
                     "kept free for the full batch's data")
      .def_readwrite("optimizer", &AdviseSettings::optimizer, "the user's, as the rows name it")
      .def_readwrite("has_optimizer", &AdviseSettings::has_optimizer,
                     "False: zero_grad and optimizer rows do not apply")
      .def_readwrite("can_offload", &AdviseSettings::can_offload,
                     "the user's optimizer can keep its state on the host")
      .def_readwrite("offload_label", &AdviseSettings::offload_label,
                     "how the front offloads, as the rows say it")
      .def_readwrite("other_optimizers", &AdviseSettings::other_optimizers,
                     "optimizers compared in rows: adam, momentum, sgd")
      .def_readwrite("lighter", &AdviseSettings::lighter,
                     "optimizers tried with allow_approximate, in order")
      .def_readwrite("chain", &AdviseSettings::chain, "the chain's block paths; empty: none")
      .def_readwrite("settings", &AdviseSettings::settings,
                     "the front's AdviseSettings, in the order it prefers them")
      .def_readwrite("allow_approximate", &AdviseSettings::allow_approximate,
                     "the plan may change the numbers (bf16, a lighter optimizer, a setting)")
      .def_readwrite("approximate_flag", &AdviseSettings::approximate_flag,
                     "how the user allows approximate strategies, as messages say it")
      .def_readwrite("progress", &AdviseSettings::progress,
                     "told before each recording; silent by default")
      .def_readwrite("cards", &AdviseSettings::cards,
                     "budgets of cards, bytes: each card's plan too (Note [What fits on which "
                     "card])")
      .def_readwrite("predict_rows", &AdviseSettings::predict_rows,
                     "rows that follow from other recordings are predicted (True) or "
                     "recorded; the plan is recorded either way")
      .def_readwrite("split_changes", &AdviseSettings::split_changes,
                     "the layers that mix a batch's samples (BatchNorm in training), named; "
                     "'': none. Micro-batches then only with allow_approximate");

  m.def(
      "plan_advice",
      [](py::function record, const AdviseSettings& settings, py::object time_ratio,
         py::object estimate_ratio, std::string estimated_from) {
        AdviseMeasurer m;
        m.record = [record](const StepVariant& v, int64_t b, bool cheap) {
          // (report, timeline, meta), or a str: why this variant cannot be recorded.
          py::object r = record(v, b, cheap);
          VariantRecording out;
          if (py::isinstance<py::str>(r)) {
            out.unavailable = r.cast<std::string>();
            return out;
          }
          py::tuple t = r;
          out.report = t[0].cast<Report>();
          out.timeline = t[1].cast<Timeline>();
          out.meta = t[2].cast<bool>();
          return out;
        };
        if (!time_ratio.is_none()) {
          m.time_ratio = [time_ratio](const StepVariant& v, int64_t micro_batch) {
            return time_ratio(v, micro_batch).cast<double>();
          };
        }
        if (!estimate_ratio.is_none()) {
          m.estimate_ratio = [estimate_ratio](const StepVariant& v, int64_t micro_batch) {
            return estimate_ratio(v, micro_batch).cast<double>();
          };
          m.estimated_from = std::move(estimated_from);
        }
        return plan_advice(m, settings);
      },
      py::arg("record"), py::arg("settings"), py::kw_only(), py::arg("time_ratio") = py::none(),
      py::arg("estimate_ratio") = py::none(), py::arg("estimated_from") = "",
      "memfit.advise's planner: see Note [How advise plans]. record(variant, batch, cheap) "
      "returns (native report, timeline, recorded on meta) or a str saying why it cannot; "
      "settings: an AdviseSettings; time_ratio(variant, micro_batch) or None; "
      "estimate_ratio(variant, micro_batch) or None: a time ratio estimated where the plain "
      "step has no recorded times (what it counts: estimated_from).");
}

}  // namespace memfit::python
