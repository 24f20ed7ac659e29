// torch's own C++ meta kernels for the ops a training step runs most, put
// back in front of the Python ones while memfit records on the meta device.
// See Note [Native meta kernels].
//
// Note [Native meta kernels]
// Importing torch registers a Python meta kernel (torch/_meta_registrations.py)
// over the C++ one for ~600 aten ops; `torch._C._dispatch_dump("aten::mul.Tensor")`
// shows the C++ kernel "(inactive)". The Python one costs ~0.8 ms a call against
// tens of microseconds, and an 8B Llama step runs ~70,000 such calls per
// recording: most of a meta recording's time. The C++ kernels are the structured
// kernels' own meta functions, the code that sizes the output on a real CPU or
// GPU, so their shapes, dtypes and strides are the ones a real run gets. While
// a NativeMetaKernels is open, a torch::Library registers them again at the Meta
// key; closing it destroys that library, and the dispatcher returns to the
// Python kernels: nothing stays registered after the recording. Only ops with a
// structured C++ meta kernel are listed, and a few composite ops (a Tensor
// with a Scalar, empty_like, zeros_like) whose C++ composite kernel torch runs
// on any device and which lands on the kernels above; the rest keep torch's
// Python kernels.

// The per-op headers assume Tensor and c10::string_view are declared.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <ATen/ops/add_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/div_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/empty_like_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/mul_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/sub_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/zeros_like_compositeexplicitautograd_dispatch.h>

#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/addcdiv_meta_dispatch.h>
#include <ATen/ops/addcmul_meta_dispatch.h>
#include <ATen/ops/addmm_meta_dispatch.h>
#include <ATen/ops/amax_meta_dispatch.h>
#include <ATen/ops/baddbmm_meta_dispatch.h>
#include <ATen/ops/bmm_meta_dispatch.h>
#include <ATen/ops/cat_meta_dispatch.h>
#include <ATen/ops/clamp_max_meta_dispatch.h>
#include <ATen/ops/clamp_meta_dispatch.h>
#include <ATen/ops/clamp_min_meta_dispatch.h>
#include <ATen/ops/cumsum_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/erf_meta_dispatch.h>
#include <ATen/ops/exp_meta_dispatch.h>
#include <ATen/ops/gelu_backward_meta_dispatch.h>
#include <ATen/ops/gelu_meta_dispatch.h>
#include <ATen/ops/ge_meta_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/le_meta_dispatch.h>
#include <ATen/ops/lerp_meta_dispatch.h>
#include <ATen/ops/linalg_vector_norm_meta_dispatch.h>
#include <ATen/ops/log_meta_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/maximum_meta_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/minimum_meta_dispatch.h>
#include <ATen/ops/mm_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <ATen/ops/neg_meta_dispatch.h>
#include <ATen/ops/pow_meta_dispatch.h>
#include <ATen/ops/reciprocal_meta_dispatch.h>
#include <ATen/ops/rsqrt_meta_dispatch.h>
#include <ATen/ops/sigmoid_backward_meta_dispatch.h>
#include <ATen/ops/sigmoid_meta_dispatch.h>
#include <ATen/ops/silu_backward_meta_dispatch.h>
#include <ATen/ops/silu_meta_dispatch.h>
#include <ATen/ops/sqrt_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <ATen/ops/tanh_backward_meta_dispatch.h>
#include <ATen/ops/tanh_meta_dispatch.h>
#include <ATen/ops/threshold_backward_meta_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"

namespace memfit::python {
namespace {

using at::Scalar;
using at::Tensor;
using OptScalar = std::optional<Scalar>;
using OptTensor = std::optional<Tensor>;
using OptDtype = std::optional<at::ScalarType>;

// Registers one kernel; an op this torch does not have, or has with
// another signature (torch >= 2.4 is supported), keeps torch's Python
// kernel and is named in `skipped` instead of failing the recording.
class Registrar {
 public:
  Registrar(torch::Library& lib, std::vector<std::string>& skipped)
      : lib_(lib), skipped_(skipped) {}
  template <typename F>
  void impl(const char* name, F&& kernel) {
    try {
      lib_.impl(name, std::forward<F>(kernel));
    } catch (const c10::Error&) {
      skipped_.emplace_back(name);
    }
  }

 private:
  torch::Library& lib_;
  std::vector<std::string>& skipped_;
};

// Elementwise ops of one input, out of place and in place.
#define MEMFIT_UNARY(name)                                                     \
  lib.impl(#name, [](const Tensor& a) { return at::meta::name(a); });          \
  lib.impl(#name "_", [](Tensor& a) -> Tensor& { return at::meta::name##_(a); })

// Binary ops of two Tensors: out of place, in place and out=.
#define MEMFIT_BINARY(name)                                                                    \
  lib.impl(#name ".Tensor",                                                                    \
           [](const Tensor& a, const Tensor& b) { return at::meta::name(a, b); });             \
  lib.impl(#name "_.Tensor",                                                                   \
           [](Tensor& a, const Tensor& b) -> Tensor& { return at::meta::name##_(a, b); });     \
  lib.impl(#name ".out", [](const Tensor& a, const Tensor& b, Tensor& out) -> Tensor& {        \
    return at::meta::name##_outf(a, b, out);                                                   \
  })

// The same with add's and sub's alpha.
#define MEMFIT_BINARY_ALPHA(name)                                                              \
  lib.impl(#name ".Tensor", [](const Tensor& a, const Tensor& b, const Scalar& s) {            \
    return at::meta::name(a, b, s);                                                            \
  });                                                                                          \
  lib.impl(#name "_.Tensor", [](Tensor& a, const Tensor& b, const Scalar& s) -> Tensor& {      \
    return at::meta::name##_(a, b, s);                                                         \
  });                                                                                          \
  lib.impl(#name ".out",                                                                       \
           [](const Tensor& a, const Tensor& b, const Scalar& s, Tensor& out) -> Tensor& {     \
             return at::meta::name##_outf(a, b, s, out);                                       \
           })

// A Tensor with a Scalar, out of place and in place (one overload each).
#define MEMFIT_WITH_SCALAR(name)                                                               \
  lib.impl(#name, [](const Tensor& a, const Scalar& v) { return at::meta::name(a, v); });      \
  lib.impl(#name "_", [](Tensor& a, const Scalar& v) -> Tensor& { return at::meta::name##_(a, v); })

// Binary ops with a Tensor and a Scalar overload, in and out of place
// (comparisons, pow).
#define MEMFIT_BINARY_TS(name, tensor_overload, scalar_overload)                              \
  lib.impl(#name "." tensor_overload,                                                          \
           [](const Tensor& a, const Tensor& b) { return at::meta::name(a, b); });             \
  lib.impl(#name "_." tensor_overload,                                                         \
           [](Tensor& a, const Tensor& b) -> Tensor& { return at::meta::name##_(a, b); });     \
  lib.impl(#name "." scalar_overload,                                                          \
           [](const Tensor& a, const Scalar& b) { return at::meta::name(a, b); });             \
  lib.impl(#name "_." scalar_overload,                                                         \
           [](Tensor& a, const Scalar& b) -> Tensor& { return at::meta::name##_(a, b); })

void register_kernels(Registrar& lib) {
  // Arithmetic, with its out= forms: the composite in-place ops with a
  // Scalar land on them (mul_.Scalar is mul_out(self, self, scalar);
  // foreach Adam calls it).
  MEMFIT_BINARY_ALPHA(add);
  MEMFIT_BINARY_ALPHA(sub);
  MEMFIT_BINARY(mul);
  MEMFIT_BINARY(div);
  lib.impl("maximum", [](const Tensor& a, const Tensor& b) { return at::meta::maximum(a, b); });
  lib.impl("minimum", [](const Tensor& a, const Tensor& b) { return at::meta::minimum(a, b); });
  lib.impl("pow.Tensor_Scalar",
           [](const Tensor& a, const Scalar& e) { return at::meta::pow(a, e); });
  lib.impl("pow_.Scalar", [](Tensor& a, const Scalar& e) -> Tensor& { return at::meta::pow_(a, e); });
  lib.impl("pow.Tensor_Tensor",
           [](const Tensor& a, const Tensor& e) { return at::meta::pow(a, e); });
  // Composite: a Scalar operand becomes a wrapped scalar tensor, as on a CPU.
  namespace cea = at::compositeexplicitautograd;
  lib.impl("mul.Scalar", [](const Tensor& a, const Scalar& b) { return cea::mul(a, b); });
  lib.impl("mul_.Scalar", [](Tensor& a, const Scalar& b) -> Tensor& { return cea::mul_(a, b); });
  lib.impl("div.Scalar", [](const Tensor& a, const Scalar& b) { return cea::div(a, b); });
  lib.impl("div_.Scalar", [](Tensor& a, const Scalar& b) -> Tensor& { return cea::div_(a, b); });
  lib.impl("add.Scalar", [](const Tensor& a, const Scalar& b, const Scalar& s) {
    return cea::add(a, b, s);
  });
  lib.impl("sub.Scalar", [](const Tensor& a, const Scalar& b, const Scalar& s) {
    return cea::sub(a, b, s);
  });
  lib.impl("empty_like", [](const Tensor& a, OptDtype dt, std::optional<at::Layout> layout,
                            std::optional<at::Device> device, std::optional<bool> pin,
                            std::optional<at::MemoryFormat> format) {
    return cea::empty_like(a, dt, layout, device, pin, format);
  });
  lib.impl("zeros_like", [](const Tensor& a, OptDtype dt, std::optional<at::Layout> layout,
                            std::optional<at::Device> device, std::optional<bool> pin,
                            std::optional<at::MemoryFormat> format) {
    return cea::zeros_like(a, dt, layout, device, pin, format);
  });
  MEMFIT_UNARY(neg);
  MEMFIT_UNARY(sqrt);
  MEMFIT_UNARY(rsqrt);
  MEMFIT_UNARY(reciprocal);
  MEMFIT_UNARY(exp);
  MEMFIT_UNARY(log);
  MEMFIT_UNARY(erf);
  MEMFIT_UNARY(tanh);
  MEMFIT_UNARY(sigmoid);
  MEMFIT_UNARY(silu);
  MEMFIT_BINARY_TS(eq, "Tensor", "Scalar");
  MEMFIT_BINARY_TS(ne, "Tensor", "Scalar");
  MEMFIT_BINARY_TS(gt, "Tensor", "Scalar");
  MEMFIT_BINARY_TS(ge, "Tensor", "Scalar");
  MEMFIT_BINARY_TS(lt, "Tensor", "Scalar");
  MEMFIT_BINARY_TS(le, "Tensor", "Scalar");
  lib.impl("clamp", [](const Tensor& a, const OptScalar& lo, const OptScalar& hi) {
    return at::meta::clamp(a, lo, hi);
  });
  lib.impl("clamp_", [](Tensor& a, const OptScalar& lo, const OptScalar& hi) -> Tensor& {
    return at::meta::clamp_(a, lo, hi);
  });
  MEMFIT_WITH_SCALAR(clamp_min);
  MEMFIT_WITH_SCALAR(clamp_max);

  // The optimizers' fused elementwise updates.
  lib.impl("lerp_.Scalar", [](Tensor& a, const Tensor& end, const Scalar& w) -> Tensor& {
    return at::meta::lerp_(a, end, w);
  });
  lib.impl("lerp_.Tensor", [](Tensor& a, const Tensor& end, const Tensor& w) -> Tensor& {
    return at::meta::lerp_(a, end, w);
  });
  lib.impl("addcmul_", [](Tensor& a, const Tensor& t1, const Tensor& t2, const Scalar& v) -> Tensor& {
    return at::meta::addcmul_(a, t1, t2, v);
  });
  lib.impl("addcdiv_", [](Tensor& a, const Tensor& t1, const Tensor& t2, const Scalar& v) -> Tensor& {
    return at::meta::addcdiv_(a, t1, t2, v);
  });
  lib.impl("addcmul", [](const Tensor& a, const Tensor& t1, const Tensor& t2, const Scalar& v) {
    return at::meta::addcmul(a, t1, t2, v);
  });
  lib.impl("addcdiv", [](const Tensor& a, const Tensor& t1, const Tensor& t2, const Scalar& v) {
    return at::meta::addcdiv(a, t1, t2, v);
  });

  // Activations' backward.
  lib.impl("silu_backward",
           [](const Tensor& g, const Tensor& x) { return at::meta::silu_backward(g, x); });
  lib.impl("sigmoid_backward",
           [](const Tensor& g, const Tensor& y) { return at::meta::sigmoid_backward(g, y); });
  lib.impl("tanh_backward",
           [](const Tensor& g, const Tensor& y) { return at::meta::tanh_backward(g, y); });
  lib.impl("threshold_backward", [](const Tensor& g, const Tensor& x, const Scalar& t) {
    return at::meta::threshold_backward(g, x, t);
  });
  lib.impl("gelu", [](const Tensor& a, c10::string_view approx) { return at::meta::gelu(a, approx); });
  lib.impl("gelu_backward", [](const Tensor& g, const Tensor& x, c10::string_view approx) {
    return at::meta::gelu_backward(g, x, approx);
  });

  // Reductions and softmax.
  lib.impl("mean.dim", [](const Tensor& a, at::OptionalIntArrayRef dim, bool keep, OptDtype dt) {
    return at::meta::mean(a, dim, keep, dt);
  });
  lib.impl("sum.dim_IntList",
           [](const Tensor& a, at::OptionalIntArrayRef dim, bool keep, OptDtype dt) {
             return at::meta::sum(a, dim, keep, dt);
           });
  lib.impl("amax", [](const Tensor& a, at::IntArrayRef dim, bool keep) {
    return at::meta::amax(a, dim, keep);
  });
  lib.impl("linalg_vector_norm", [](const Tensor& a, const Scalar& ord, at::OptionalIntArrayRef dim,
                                    bool keep, OptDtype dt) {
    return at::meta::linalg_vector_norm(a, ord, dim, keep, dt);
  });
  lib.impl("cumsum", [](const Tensor& a, int64_t dim, OptDtype dt) {
    return at::meta::cumsum(a, dim, dt);
  });
  lib.impl("_softmax", [](const Tensor& a, int64_t dim, bool half_to_float) {
    return at::meta::_softmax(a, dim, half_to_float);
  });
  lib.impl("_log_softmax", [](const Tensor& a, int64_t dim, bool half_to_float) {
    return at::meta::_log_softmax(a, dim, half_to_float);
  });
  lib.impl("_softmax_backward_data",
           [](const Tensor& g, const Tensor& y, int64_t dim, at::ScalarType in) {
             return at::meta::_softmax_backward_data(g, y, dim, in);
           });
  lib.impl("_log_softmax_backward_data",
           [](const Tensor& g, const Tensor& y, int64_t dim, at::ScalarType in) {
             return at::meta::_log_softmax_backward_data(g, y, dim, in);
           });

  // Matrix products and concatenation.
  lib.impl("mm", [](const Tensor& a, const Tensor& b) { return at::meta::mm(a, b); });
  lib.impl("bmm", [](const Tensor& a, const Tensor& b) { return at::meta::bmm(a, b); });
  lib.impl("addmm", [](const Tensor& c, const Tensor& a, const Tensor& b, const Scalar& beta,
                       const Scalar& alpha) { return at::meta::addmm(c, a, b, beta, alpha); });
  lib.impl("baddbmm", [](const Tensor& c, const Tensor& a, const Tensor& b, const Scalar& beta,
                         const Scalar& alpha) { return at::meta::baddbmm(c, a, b, beta, alpha); });
  lib.impl("cat", [](const at::ITensorListRef& ts, int64_t dim) { return at::meta::cat(ts, dim); });
}

#undef MEMFIT_UNARY
#undef MEMFIT_BINARY
#undef MEMFIT_BINARY_ALPHA
#undef MEMFIT_WITH_SCALAR
#undef MEMFIT_BINARY_TS

// Open: the C++ kernels answer at the Meta key. Close (or the object's end):
// the library is destroyed and torch's Python kernels answer again.
class NativeMetaKernels {
 public:
  void open() {
    if (lib_) return;
    lib_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                            __FILE__, __LINE__);
    skipped_.clear();
    Registrar r(*lib_, skipped_);
    register_kernels(r);
  }
  void close() { lib_.reset(); }
  bool is_open() const { return lib_ != nullptr; }
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  std::unique_ptr<torch::Library> lib_;
  std::vector<std::string> skipped_;
};

}  // namespace

void init_native_meta(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<NativeMetaKernels>(m, "NativeMetaKernels",
                                "torch's C++ meta kernels for the hot aten ops, registered at "
                                "the Meta key while open (a context manager); see Note [Native "
                                "meta kernels] in bind_native_meta.cpp")
      .def(py::init<>())
      .def("__enter__", [](NativeMetaKernels& k) -> NativeMetaKernels& {
        k.open();
        return k;
      }, py::return_value_policy::reference)
      .def("__exit__", [](NativeMetaKernels& k, py::args) {
        k.close();
        return false;
      })
      .def_property_readonly("is_open", &NativeMetaKernels::is_open)
      .def_property_readonly("skipped", &NativeMetaKernels::skipped,
                             "ops this torch has not (or with another signature): torch's "
                             "Python kernel answers them");
}

}  // namespace memfit::python
