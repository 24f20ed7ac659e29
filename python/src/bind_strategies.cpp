// memfit.advise's planner (core/advise_plan.h) and the checkpointing
// planner under it (core/checkpoint_plan.h): Python records the user's
// model when the planner asks, the planner does the rest.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/advise_plan.h"
#include "memfit/core/checkpoint_plan.h"
#include "memfit/core/progress.h"

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
      .def_readwrite("name", &ChainSegment::name)
      .def_readwrite("activation_bytes", &ChainSegment::activation_bytes)
      .def_readwrite("input_bytes", &ChainSegment::input_bytes)
      .def_readwrite("backward_extra_bytes",
                     &ChainSegment::backward_extra_bytes)
      .def_readwrite("recompute_ns", &ChainSegment::recompute_ns)
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
      .def_readwrite("forward_fixed", &ChainMemory::forward_fixed)
      .def_readwrite("backward_fixed", &ChainMemory::backward_fixed)
      .def_readwrite("other_peak", &ChainMemory::other_peak)
      .def("__repr__", [](const ChainMemory& c) {
        return "ChainMemory(forward_fixed=" + std::to_string(c.forward_fixed) +
               ", backward_fixed=" + std::to_string(c.backward_fixed) +
               ", other_peak=" + std::to_string(c.other_peak) + ")";
      });

  py::class_<ChainPlan>(m, "ChainPlan")
      .def_readonly("rule", &ChainPlan::rule)
      .def_readonly("checkpointed", &ChainPlan::checkpointed)
      .def_readonly("predicted_peak", &ChainPlan::predicted_peak)
      .def_readonly("recompute_ns", &ChainPlan::recompute_ns)
      .def_readonly("fits", &ChainPlan::fits)
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
      .def_readonly("checkpoint", &StepVariant::checkpoint)
      .def_readonly("autocast_bf16", &StepVariant::autocast_bf16)
      .def_readonly("zero_grad_in_place", &StepVariant::zero_grad_in_place)
      .def_readonly("optimizer", &StepVariant::optimizer)
      .def_readonly("host_state", &StepVariant::host_state)
      .def_property_readonly("step", [](const StepVariant& v) { return to_string(v.step); })
      .def_readonly("setting", &StepVariant::setting)
      .def_readonly("setting_exact", &StepVariant::setting_exact)
      .def("exact", &StepVariant::exact);

  py::class_<AdviseSetting>(m, "AdviseSetting")
      .def(py::init([](std::string label, bool exact, bool checkpoints) {
             return AdviseSetting{std::move(label), exact, checkpoints};
           }),
           py::arg("label"), py::arg("exact") = false, py::arg("checkpoints") = false)
      .def_readonly("label", &AdviseSetting::label)
      .def_readonly("exact", &AdviseSetting::exact)
      .def_readonly("checkpoints", &AdviseSetting::checkpoints);

  py::class_<OptimizerChoices>(m, "OptimizerChoices")
      .def_readonly("others", &OptimizerChoices::others)
      .def_readonly("lighter", &OptimizerChoices::lighter)
      .def_readonly("can_offload", &OptimizerChoices::can_offload);
  m.def("optimizer_choices", &optimizer_choices, py::arg("user_kind"),
        "The optimizers advise compares with the user's kind (adam, momentum, sgd, none, "
        "<kind>-offload, a class name): others (rows), lighter (in the order the plan tries "
        "them), can_offload.");

  py::class_<AdviseRow>(m, "AdviseRow")
      .def_readonly("name", &AdviseRow::name)
      .def_property_readonly("kind", [](const AdviseRow& r) { return to_string(r.kind); })
      .def_readonly("variant", &AdviseRow::variant)
      .def_readonly("peak_bytes", &AdviseRow::peak_bytes)
      .def_readonly("saving_bytes", &AdviseRow::saving_bytes)
      .def_readonly("meta", &AdviseRow::meta)
      .def_readonly("time_ratio", &AdviseRow::time_ratio)
      .def_readonly("time_measured", &AdviseRow::time_measured)
      .def_readonly("fits", &AdviseRow::fits)
      .def_readonly("recompute_ns", &AdviseRow::recompute_ns)
      .def_readonly("predicted_peak_bytes", &AdviseRow::predicted_peak_bytes);

  py::class_<AdvisePlan>(m, "AdvisePlan")
      .def_readonly("found", &AdvisePlan::found)
      .def_readonly("variant", &AdvisePlan::variant)
      .def_readonly("micro_batch", &AdvisePlan::micro_batch)
      .def_readonly("peak_bytes", &AdvisePlan::peak_bytes)
      .def_readonly("time_ratio", &AdvisePlan::time_ratio)
      .def_readonly("time_measured", &AdvisePlan::time_measured)
      .def_readonly("exact", &AdvisePlan::exact)
      .def_readonly("verified", &AdvisePlan::verified)
      .def_readonly("optimizer", &AdvisePlan::optimizer)
      .def_readonly("summary", &AdvisePlan::summary);

  py::class_<CardPlan>(m, "CardPlan")
      .def_readonly("budget", &CardPlan::budget)
      .def_readonly("plan", &CardPlan::plan);

  py::class_<Advice>(m, "NativeAdvice")
      .def_readwrite("model", &Advice::model)
      .def_readwrite("chain_description", &Advice::chain_description)
      .def_readwrite("parameter_bytes", &Advice::parameter_bytes)
      .def_readonly("batch", &Advice::batch)
      .def_readonly("budget", &Advice::budget)
      .def_readonly("optimizer", &Advice::optimizer)
      .def_readonly("plain_peak", &Advice::plain_peak)
      .def_readonly("cuda_reserved", &Advice::cuda_reserved)
      .def_readonly("plain_step_ms", &Advice::plain_step_ms)
      .def_readonly("rows", &Advice::rows)
      .def_readonly("chain_batch", &Advice::chain_batch)
      .def_readonly("segments", &Advice::segments)
      .def_readonly("chain_memory", &Advice::chain_memory)
      .def_readonly("chain_plans", &Advice::chain_plans)
      .def_readonly("plan", &Advice::plan)
      .def_readonly("recordings", &Advice::recordings)
      .def_readonly("estimated_from", &Advice::estimated_from)
      .def_readwrite("notes", &Advice::notes)
      .def_readonly("does_not_fit", &Advice::does_not_fit)
      .def_readonly("cards", &Advice::cards)
      .def("cards_table", &Advice::cards_table)
      .def("table", &Advice::table)
      .def("to_json", &Advice::to_json, py::arg("pretty") = true);

  m.def(
      "plan_advice",
      [](py::function record, py::object time_ratio, int64_t batch, int64_t budget,
         std::string optimizer, bool has_optimizer, bool can_offload,
         std::vector<std::string> other_optimizers, std::vector<std::string> lighter,
         std::vector<std::string> chain, bool allow_approximate, py::object progress,
         std::vector<AdviseSetting> settings, py::object estimate_ratio,
         std::string estimated_from, std::vector<int64_t> cards) {
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
        s.allow_approximate = allow_approximate;
        s.approximate_flag = "allow_approximate=True";  // as a Python user writes it
        s.settings = std::move(settings);
        if (!progress.is_none()) {
          s.progress = Progress([progress](const std::string& line) { progress(line); });
        }
        AdviseMeasurer m;
        m.record = [record](const StepVariant& v, int64_t b, bool cheap) {
          // (report, timeline, meta), or a str: why this variant cannot be recorded.
          py::object r = record(v, b, cheap);
          RecordedStep out;
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
        return plan_advice(m, s);
      },
      py::arg("record"), py::arg("time_ratio"), py::arg("batch"), py::arg("budget"),
      py::arg("optimizer"), py::arg("has_optimizer"), py::arg("can_offload"),
      py::arg("other_optimizers"), py::arg("lighter"), py::arg("chain"),
      py::arg("allow_approximate"), py::arg("progress") = py::none(),
      py::arg("settings") = std::vector<AdviseSetting>{}, py::arg("estimate_ratio") = py::none(),
      py::arg("estimated_from") = "", py::arg("cards") = std::vector<int64_t>{},
      "memfit.advise's planner: see Note [How advise plans]. record(variant, batch, cheap) "
      "returns (native report, timeline, recorded on meta); time_ratio(variant, "
      "micro_batch) or None; settings: the front's AdviseSettings, applied by record when a "
      "variant names one; estimate_ratio(variant, micro_batch) or None: a time ratio "
      "estimated where the plain step has no recorded times (what it counts: estimated_from); cards: budgets in bytes, each card's plan "
      "in .cards (See Note [What fits on which card]).");
}

}  // namespace memfit::python
