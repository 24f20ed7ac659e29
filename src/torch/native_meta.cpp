// torch's own C++ meta kernels put back in front of the Python ones, and
// kernels that size the outputs of the ops nothing answers at the Meta key in
// a C++-only process. See Note [Native meta kernels].
//
// Note [Native meta kernels]
// Importing torch registers a Python meta kernel (torch/_meta_registrations.py)
// over the C++ one for ~600 aten ops; `torch._C._dispatch_dump("aten::mul.Tensor")`
// shows the C++ kernel "(inactive)". The Python one costs ~0.8 ms a call against
// tens of microseconds, and an 8B Llama step runs ~70,000 such calls per
// recording: most of a meta recording's time. The C++ kernels are the structured
// kernels' own meta functions, the code that sizes the output on a real CPU or
// GPU, so their shapes, dtypes and strides are the ones a real run gets. While
// a NativeMetaKernels lives, a torch::Library registers them again at the Meta
// key; its end destroys that library, and the dispatcher returns to the
// kernels it had: nothing stays registered after the recording. Only ops with a
// structured C++ meta kernel are listed, and a few composite ops (a Tensor
// with a Scalar, empty_like, zeros_like) whose C++ composite kernel torch runs
// on any device and which lands on the kernels above; the rest keep torch's
// Python kernels.
//
// A process without torch's Python package (the `memfit` program, a C++
// user's) has no Python kernels: relu, convolution, batch and layer norm,
// index_select and a few backward ops then have nothing at the Meta key, and
// a meta recording of mlp, cnn, gpt or resnet18 stopped at the first of them.
// For those ops alone, and only where nothing answers the Meta key, a second
// library registers kernels that allocate the outputs torch's Python meta
// kernels allocate (same shapes, dtypes and count), so a step recorded on meta
// by the program gives the report Python gives (tests/cli/meta_mode.py). Where
// torch's Python kernels are loaded they answer, except for the fill-ins
// registered with replace() (arange, layer norm, embedding, index_select,
// select's, slice's and embedding's backward, add_ with a scalar) and the gpt's ops at
// the end of register_torch_kernels: their Python kernels call torch._check
// or decompose through torch._refs, and the first such call imports sympy
// and torch._dynamo (1.5 s, more than the rest of a gpt's meta recordings),
// so memfit's kernels answer them in any process. bench/meta_vs_cpu.py and
// bench/hf_meta_vs_cpu.py gave the same bytes before and after.

// The per-op headers assume Tensor and c10::string_view are declared.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <ATen/ops/add_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/div_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/empty_like_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/masked_fill_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/mul_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/ones_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/ones_like_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/_unsafe_view_compositeexplicitautograd_dispatch.h>
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
#include <ATen/ops/fill_meta_dispatch.h>
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
#include <ATen/ops/nll_loss_backward_meta_dispatch.h>
#include <ATen/ops/nll_loss_forward_meta_dispatch.h>
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
#include <ATen/ops/triu_meta_dispatch.h>
#include <ATen/ops/zero_meta_dispatch.h>
#include <ATen/ops/_reshape_alias_meta_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>

#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/result_type.h>

#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "memfit/torch/native_meta.h"

namespace memfit {
namespace {

using at::Scalar;
using at::Tensor;
using OptScalar = std::optional<Scalar>;
using OptTensor = std::optional<Tensor>;
using OptDtype = std::optional<at::ScalarType>;

// Whether anything answers `name` ("op" or "op.overload") at the Meta key:
// torch's C++ kernel, a Python one, or a library open now. An op this torch
// does not have counts as answered (there is nothing to fill).
bool has_meta_kernel(const char* name) {
  const std::string full(name);
  const size_t dot = full.find('.');
  const c10::OperatorName op{"aten::" + full.substr(0, dot),
                             dot == std::string::npos ? "" : full.substr(dot + 1)};
  const auto handle = c10::Dispatcher::singleton().findOp(op);
  return !handle || handle->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

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
  // The same, only when nothing answers `name` at the Meta key yet; `filled`
  // gets the name when it is registered.
  template <typename F>
  void fill(const char* name, F&& kernel, std::vector<std::string>& filled) {
    if (has_meta_kernel(name)) return;
    const size_t before = skipped_.size();
    impl(name, std::forward<F>(kernel));
    if (skipped_.size() == before) filled.emplace_back(name);
  }
  // In front whatever answers `name` now; `filled` gets the name when
  // nothing answered before (a process without torch's Python package).
  template <typename F>
  void replace(const char* name, F&& kernel, std::vector<std::string>& filled) {
    const bool had = has_meta_kernel(name);
    const size_t before = skipped_.size();
    impl(name, std::forward<F>(kernel));
    if (!had && skipped_.size() == before) filled.emplace_back(name);
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

void register_torch_kernels(Registrar& lib) {
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

  // A gpt's other ops: its causal mask (ones, triu, masked_fill), its views
  // and the zeroed buffers of backward. torch's Python kernels for them call
  // torch._check or run through torch._refs, and the first such call imports
  // sympy and torch._dynamo (Note [Native meta kernels]).
  lib.impl("zero_", [](Tensor& a) -> Tensor& { return at::meta::zero_(a); });
  lib.impl("fill_.Scalar", [](Tensor& a, const Scalar& v) -> Tensor& { return at::meta::fill_(a, v); });
  lib.impl("fill_.Tensor", [](Tensor& a, const Tensor& v) -> Tensor& { return at::meta::fill_(a, v); });
  lib.impl("ones", [](at::IntArrayRef size, OptDtype dt, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin) {
    return cea::ones(size, dt, layout, device, pin);
  });
  lib.impl("ones_like", [](const Tensor& a, OptDtype dt, std::optional<at::Layout> layout,
                           std::optional<at::Device> device, std::optional<bool> pin,
                           std::optional<at::MemoryFormat> format) {
    return cea::ones_like(a, dt, layout, device, pin, format);
  });
  lib.impl("triu", [](const Tensor& a, int64_t diagonal) { return at::meta::triu(a, diagonal); });
  // In place, it allocates nothing (libtorch does not export its meta
  // function); the mask's dtype is checked as torch does.
  lib.impl("masked_fill_.Scalar", [](Tensor& a, const Tensor& mask, const Scalar&) -> Tensor& {
    TORCH_CHECK(mask.scalar_type() == at::kBool,
                "masked_fill_ only supports boolean masks, but got mask with dtype ",
                mask.scalar_type());
    return a;
  });
  lib.impl("masked_fill_.Tensor", [](Tensor& a, const Tensor& mask, const Tensor&) -> Tensor& {
    TORCH_CHECK(mask.scalar_type() == at::kBool,
                "masked_fill_ only supports boolean masks, but got mask with dtype ",
                mask.scalar_type());
    return a;
  });
  lib.impl("masked_fill.Scalar", [](const Tensor& a, const Tensor& mask, const Scalar& v) {
    return cea::masked_fill(a, mask, v);
  });
  lib.impl("masked_fill.Tensor", [](const Tensor& a, const Tensor& mask, const Tensor& v) {
    return cea::masked_fill(a, mask, v);
  });
  lib.impl("_reshape_alias", [](const Tensor& a, at::IntArrayRef size, at::IntArrayRef stride) {
    return at::meta::_reshape_alias(a, size, stride);
  });
  lib.impl("_unsafe_view", [](const Tensor& a, at::IntArrayRef size) {
    return cea::_unsafe_view(a, size);
  });
  // The cross-entropy's negative log-likelihood.
  lib.impl("nll_loss_forward", [](const Tensor& a, const Tensor& target, const OptTensor& weight,
                                  int64_t reduction, int64_t ignore_index) {
    return at::meta::nll_loss_forward(a, target, weight, reduction, ignore_index);
  });
  lib.impl("nll_loss_backward",
           [](const Tensor& grad, const Tensor& a, const Tensor& target, const OptTensor& weight,
              int64_t reduction, int64_t ignore_index, const Tensor& total_weight) {
             return at::meta::nll_loss_backward(grad, a, target, weight, reduction, ignore_index,
                                                total_weight);
           });
}

#undef MEMFIT_UNARY
#undef MEMFIT_BINARY
#undef MEMFIT_BINARY_ALPHA
#undef MEMFIT_WITH_SCALAR
#undef MEMFIT_BINARY_TS

// What a statistic of a norm is kept in: float for half and bfloat16 inputs
// (torch's computation dtype), else the input's dtype.
at::TensorOptions stats_options(const Tensor& input) {
  return input.options().dtype(at::toOpMathType(input.scalar_type()));
}

// The spatial sizes of a convolution's output, as torch computes them.
std::vector<int64_t> conv_output_sizes(const Tensor& input, const Tensor& weight,
                                       at::IntArrayRef stride, at::IntArrayRef padding,
                                       at::IntArrayRef dilation, bool transposed,
                                       at::IntArrayRef output_padding, int64_t groups) {
  const int64_t spatial = input.dim() - 2;
  auto at_or_last = [](at::IntArrayRef v, int64_t i) { return v[std::min<int64_t>(i, v.size() - 1)]; };
  std::vector<int64_t> out{input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
  for (int64_t d = 0; d < spatial; ++d) {
    const int64_t in = input.size(d + 2), k = weight.size(d + 2);
    const int64_t s = at_or_last(stride, d), p = at_or_last(padding, d);
    const int64_t dl = at_or_last(dilation, d);
    out.push_back(transposed ? (in - 1) * s - 2 * p + dl * (k - 1) + at_or_last(output_padding, d) + 1
                             : (in + 2 * p - dl * (k - 1) - 1) / s + 1);
  }
  return out;
}

// arange's output: its dtype as torch infers it (int64 when every bound is
// integral), its length ceil((end - start) / step).
Tensor arange_meta(const Scalar& start, const Scalar& end, const Scalar& step, OptDtype dtype,
                   std::optional<at::Layout> layout, std::optional<at::Device> device,
                   std::optional<bool> pin) {
  // torch's own checks (RangeUtils.h): a kernel in front of torch's answers
  // bad bounds as torch does.
  const double xstart = start.to<double>(), xend = end.to<double>(), xstep = step.to<double>();
  TORCH_CHECK(xstep > 0 || xstep < 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(xstart) && std::isfinite(xend), "unsupported range: ", xstart,
              " -> ", xend);
  TORCH_CHECK((xstep > 0 && xend >= xstart) || (xstep < 0 && xend <= xstart),
              "upper bound and larger bound inconsistent with step sign");
  const bool integral = start.isIntegral(false) && end.isIntegral(false) && step.isIntegral(false);
  const at::ScalarType type =
      dtype.value_or(integral ? at::kLong : c10::get_default_dtype_as_scalartype());
  const double span = at::isIntegralType(type, /*includeBool=*/false)
                          ? static_cast<double>(end.to<int64_t>() - start.to<int64_t>()) /
                                static_cast<double>(step.to<int64_t>())
                          : (end.to<double>() - start.to<double>()) / step.to<double>();
  const int64_t size = std::max<int64_t>(static_cast<int64_t>(std::ceil(span)), 0);
  return at::empty({size},
                   at::TensorOptions().dtype(type).layout(layout).device(device).pinned_memory(pin));
}

using Grads = std::tuple<Tensor, Tensor, Tensor>;

// The ops the built-in models run that only torch's Python package gives a
// meta kernel. Each allocates what torch's Python meta kernel returns; see
// Note [Native meta kernels].
void register_fill_ins(Registrar& lib, std::vector<std::string>& filled) {
  // torch's C++ arange makes an empty tensor and resizes it, and a meta
  // tensor's resize allocates nothing the allocator sees: the positions a
  // model makes with arange would be missing from the step.
  // (Its overloads call each other's native function, not the dispatcher:
  // each is filled.)
  lib.replace("arange", [](const Scalar& end, OptDtype dtype, std::optional<at::Layout> layout,
                        std::optional<at::Device> device, std::optional<bool> pin) {
    return arange_meta(0, end, 1, dtype, layout, device, pin);
  }, filled);
  lib.replace("arange.start", [](const Scalar& start, const Scalar& end, OptDtype dtype,
                              std::optional<at::Layout> layout, std::optional<at::Device> device,
                              std::optional<bool> pin) {
    return arange_meta(start, end, 1, dtype, layout, device, pin);
  }, filled);
  lib.replace("arange.start_step", &arange_meta, filled);
  // Composite in C++, it wraps the scalar in a CPU tensor (8 bytes torch's
  // Python kernel does not allocate); in place with a scalar, nothing changes
  // size. The result's dtype must cast to the tensor's, as on a device.
  lib.replace("add_.Scalar", [](Tensor& a, const Scalar& v, const Scalar&) -> Tensor& {
    const at::ScalarType result = at::result_type(a, v);
    TORCH_CHECK(c10::canCast(result, a.scalar_type()), "result type ", result,
                " can't be cast to the desired output type ", a.scalar_type());
    return a;
  }, filled);
  lib.fill("relu", [](const Tensor& a) { return at::empty_like(a); }, filled);
  lib.replace("index_select", [](const Tensor& a, int64_t dim, const Tensor& index) {
    std::vector<int64_t> sizes = a.sizes().vec();
    if (a.dim() > 0) sizes[c10::maybe_wrap_dim(dim, a.dim())] = index.numel();
    return at::empty(sizes, a.options());
  }, filled);
  // embedding is index_select and a view in C++; select's backward, a
  // zeroed tensor of the input's sizes the gradient is copied into.
  lib.replace("embedding", [](const Tensor& weight, const Tensor& indices, int64_t, bool, bool) {
    std::vector<int64_t> sizes = indices.sizes().vec();
    for (int64_t d = 1; d < weight.dim(); ++d) sizes.push_back(weight.size(d));
    return at::empty(sizes, weight.options());
  }, filled);
  lib.replace("select_backward", [](const Tensor& grad, at::IntArrayRef input_sizes, int64_t,
                                    int64_t) { return at::empty(input_sizes, grad.options()); },
              filled);
  // slice's backward, as select's (rotary embeddings' halves: 256 calls a
  // step of an 8B Llama, through a Python decomposition, 14% of its meta
  // recording).
  lib.replace("slice_backward", [](const Tensor& grad, at::IntArrayRef input_sizes, int64_t,
                                   int64_t, int64_t, int64_t) {
    return at::empty(input_sizes, grad.options());
  }, filled);
  lib.replace("embedding_dense_backward", [](const Tensor& grad, const Tensor&, int64_t num_weights,
                                          int64_t, bool) {
    return at::empty({num_weights, grad.size(-1)}, grad.options());
  }, filled);
  lib.fill("convolution", [](const Tensor& input, const Tensor& weight, const OptTensor&,
                             at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef dilation, bool transposed,
                             at::IntArrayRef output_padding, int64_t groups) {
    return at::empty(conv_output_sizes(input, weight, stride, padding, dilation, transposed,
                                       output_padding, groups),
                     input.options());
  }, filled);
  lib.fill("convolution_backward",
           [](const Tensor& grad, const Tensor& input, const Tensor& weight,
              at::OptionalIntArrayRef bias_sizes, at::IntArrayRef, at::IntArrayRef,
              at::IntArrayRef, bool, at::IntArrayRef, int64_t, std::array<bool, 3> mask) {
             return Grads{mask[0] ? at::empty(input.sizes(), grad.options()) : Tensor(),
                          mask[1] ? at::empty(weight.sizes(), grad.options()) : Tensor(),
                          mask[2] && bias_sizes ? at::empty(*bias_sizes, grad.options())
                                                : Tensor()};
           }, filled);
  // Training: the statistics of each channel, in the computation dtype; eval:
  // copies of the running ones (torch's meta kernel keeps them on a device
  // that is not the CPU). The running statistics are updated in place.
  lib.fill("native_batch_norm",
           [](const Tensor& input, const OptTensor&, const OptTensor&, const OptTensor&,
              const OptTensor&, bool, double, double) {
             const int64_t channels = input.dim() > 1 ? input.size(1) : 1;
             return Grads{at::empty_like(input, at::MemoryFormat::Contiguous),
                          at::empty({channels}, stats_options(input)),
                          at::empty({channels}, stats_options(input))};
           }, filled);
  lib.fill("native_batch_norm_backward",
           [](const Tensor& grad, const Tensor& input, const OptTensor& weight, const OptTensor&,
              const OptTensor&, const OptTensor&, const OptTensor&, bool, double,
              std::array<bool, 3> mask) {
             const int64_t channels = input.dim() > 1 ? input.size(1) : 1;
             const at::TensorOptions param =
                 weight && weight->defined() ? weight->options() : input.options();
             return Grads{mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : Tensor(),
                          mask[1] ? at::empty({channels}, param) : Tensor(),
                          mask[2] ? at::empty({channels}, param) : Tensor()};
           }, filled);
  // The statistics keep the normalized dimensions as ones.
  lib.replace("native_layer_norm",
           [](const Tensor& input, at::IntArrayRef normalized, const OptTensor&, const OptTensor&,
              double) {
             std::vector<int64_t> stats = input.sizes().vec();
             for (size_t i = stats.size() - normalized.size(); i < stats.size(); ++i) stats[i] = 1;
             return Grads{at::empty_like(input, at::MemoryFormat::Contiguous),
                          at::empty(stats, stats_options(input)),
                          at::empty(stats, stats_options(input))};
           }, filled);
  lib.replace("native_layer_norm_backward",
           [](const Tensor& grad, const Tensor& input, at::IntArrayRef, const Tensor&,
              const Tensor&, const OptTensor& weight, const OptTensor& bias,
              std::array<bool, 3> mask) {
             auto like = [](const OptTensor& t, bool want) {
               return want && t && t->defined() ? at::empty_like(*t, at::MemoryFormat::Contiguous)
                                                : Tensor();
             };
             return Grads{mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : Tensor(),
                          like(weight, mask[1]), like(bias, mask[2])};
           }, filled);
}

}  // namespace

NativeMetaKernels::NativeMetaKernels(const char* file, uint32_t line) {
  torch_kernels_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                    c10::DispatchKey::Meta, file, line);
  Registrar torch_ops(*torch_kernels_, skipped_);
  register_torch_kernels(torch_ops);
  fill_ins_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                               c10::DispatchKey::Meta, file, line);
  Registrar fill_ins(*fill_ins_, skipped_);
  register_fill_ins(fill_ins, filled_);
}

NativeMetaKernels::~NativeMetaKernels() = default;

}  // namespace memfit
