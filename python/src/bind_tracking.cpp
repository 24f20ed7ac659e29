// Simulated device and recorder, held by small Python-side handles whose
// enter/exit create and destroy the C++ RAII objects.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

#include "bindings.h"
#include "memfit/torch/card_ops.h"
#include "memfit/torch/move_parameter.h"
#include "memfit/torch/recorder.h"
#include "memfit/torch/tracking.h"

namespace py = pybind11;

namespace memfit::python {
namespace {

Device device_from(const std::string& name) {
  if (name == "cpu") return Device::kCPU;
  if (name == "meta") return Device::kMeta;
  throw std::invalid_argument("[simulated_device] device must be 'cpu' or "
                              "'meta', got '" + name + "'");
}

}  // namespace

void init_tracking(py::module_& m) {
  py::class_<SimulatedDevice>(m, "SimulatedDevice")
      .def(py::init([](int64_t budget, const std::string& device) {
             return std::make_unique<SimulatedDevice>(budget, device_from(device));
           }),
           py::arg("budget_bytes"), py::arg("device") = "cpu")
      .def_property_readonly("budget_bytes", &SimulatedDevice::budget_bytes,
                             "the cap on tracked bytes while the device lives");

  // Held by memfit.host_memory(): allocations on this thread are the host's
  // (untracked, no budget) while the object lives.
  py::class_<HostMemory>(m, "HostMemory").def(py::init<>());

  py::class_<Recorder>(m, "Recorder")
      .def(py::init<>())
      .def("stop", &Recorder::stop)
      .def_property_readonly("recording", &Recorder::recording,
                             "still receiving events (stop() not called)")
      .def("begin_phase", &Recorder::begin_phase, py::arg("name"),
           py::arg("iteration") = 0)
      .def("end_phase", &Recorder::end_phase)
      .def("push_module", &Recorder::push_module, py::arg("name"),
           py::arg("absolute") = false)
      .def("pop_module", &Recorder::pop_module)
      .def("classify", [](Recorder& r, const at::Tensor& t, const std::string& c) {
        return r.classify(t, category_from_string(c));
      }, py::arg("tensor"), py::arg("category"))
      .def("only_device", [](Recorder& r, const std::string& device) {
        r.only_device(device_from(device));
      }, py::arg("device"),
         "From now on, record only allocations on `device` ('cpu' or 'meta').")
      .def("drop_meta_kernel_intermediates", &Recorder::drop_meta_kernel_intermediates,
           "From now on, leave out what Meta kernels allocate and free again "
           "inside the op they implement (torch's Python decompositions).")
      .def("add_card_kernels", &Recorder::add_card_kernels,
           "From now on, add what a CUDA card's kernels take inside an op and the "
           "host's do not (a reduction's staging buffer), as temporaries of the op.")
      .def("take_conv_workspaces", [](const Recorder& r) {
        return impl::take_conv_workspaces(&r);
      }, "The workspace bound of each convolution forward and backward recorded since "
         "add_card_kernels, in the order of their marks, taken (Note [cuDNN's "
         "workspace at the step's peak]); call it before stop(), which drops them.")
      .def_property_readonly("value_sized_ops", &Recorder::value_sized_ops,
                             "the ops that size their output by the batch's values (unique, "
                             "nonzero, sparse gradients) that ran while recording, each once")
      .def_property_readonly("live_bytes", &Recorder::live_bytes,
                             "tracked bytes live now, since the recording began")
      .def_property_readonly("peak_bytes", &Recorder::peak_bytes,
                             "the most tracked bytes live at once so far")
      .def_property_readonly("timeline", &Recorder::timeline,
                             py::return_value_policy::reference_internal,
                                 "the events recorded so far (a Timeline)");

  m.def("tracked_live_bytes", [](const std::string& device) {
    return tracking::live_bytes(device == "meta" ? Device::kMeta : Device::kCPU);
  }, py::arg("device") = "cpu");
  m.def("set_data", &set_data_any_device, py::arg("variable"),
        py::arg("data"),
        "variable.data = data, also across devices (CPU <-> meta), keeping "
        "the variable object.");
  m.def("tracking_installed", &tracking::installed);
  m.def("allocation_count", [](const std::string& device) {
    return tracking::allocation_count(device_from(device));
  }, py::arg("device") = "cpu",
     "Tracked allocations made on the device since the process started.");
  m.def("budget", [](const std::string& device) -> py::object {
    auto b = tracking::budget(device_from(device));
    return b ? py::cast(*b) : py::none();
  }, py::arg("device") = "cpu",
     "The simulated device's budget in bytes, or None when none is in force.");
  m.def("allocation_id", [](py::handle obj) -> py::object {
    // Only a real tensor: an object that merely claims to be one through
    // __class__ (memfit.lazy's LazyTensor does, for isinstance) passes
    // pybind's at::Tensor check and would be read as one.
    if (!PyType_IsSubtype(Py_TYPE(obj.ptr()), reinterpret_cast<PyTypeObject*>(THPVariableClass))) {
      return py::none();
    }
    auto a = tracking::allocation_of(THPVariable_Unpack(obj.ptr()));
    return a ? py::cast(a->id) : py::none();
  }, py::arg("tensor"),
     "The id of the tracked allocation behind a tensor's storage, or None (not tracked, or "
     "not a tensor).");
  // See Note [What fills the simulated device] (tracking.cpp). The callable
  // is kept for the life of the process (never destroyed: the interpreter
  // may be gone when static destructors run).
  m.def("set_oom_explainer", [](py::object fn) {
    static py::object* held = nullptr;
    if (held == nullptr) held = new py::object();
    *held = fn;
    if (fn.is_none()) {
      tracking::set_oom_explainer({});
      return;
    }
    tracking::set_oom_explainer([](const tracking::OomContext& c) -> std::string {
      // Only a thread Python knows (its own, or one that released the GIL
      // inside a torch call) takes the GIL here: a kernel's worker thread
      // could wait forever for a GIL its caller holds.
      if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return "";
      py::gil_scoped_acquire gil;
      try {
        if (held == nullptr || held->is_none()) return "";
        py::object out = (*held)(c.bytes, c.used, c.budget,
                                 c.device == Device::kMeta ? "meta" : "cpu", c.message);
        return out.is_none() ? std::string() : out.cast<std::string>();
      } catch (py::error_already_set&) {
        return "";
      }
    });
  }, py::arg("explainer"),
     "explainer(bytes, used, budget, device, message) -> the message a simulated device's "
     "OOM raises instead (None or '' keeps it); None removes it.");
  m.def("fail_allocation_after", [](int64_t n, const std::string& device) {
    tracking::fail_allocation_after(device_from(device), n);
  }, py::arg("n"), py::arg("device") = "cpu");
}

}  // namespace memfit::python
