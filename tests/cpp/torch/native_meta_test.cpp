#include "memfit/torch/native_meta.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"
#include "memfit/torch/recorder.h"

namespace memfit {
namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// This binary hosts no Python: the ops only torch's Python package gives a
// meta kernel have none, and NativeMetaKernels fills them (Note [Native meta
// kernels]); torch's own kernels all register on the pinned torch.
TEST(NativeMetaKernelsTest, FillsTheOpsOnlyTorchsPythonGivesAMetaKernel) {
  NativeMetaKernels kernels;
  EXPECT_TRUE(kernels.skipped().empty()) << kernels.skipped().front();
  for (const char* op : {"relu", "convolution", "convolution_backward", "native_batch_norm",
                         "native_batch_norm_backward", "native_layer_norm",
                         "native_layer_norm_backward", "index_select",
                         "embedding_dense_backward", "arange", "arange.start", "arange.start_step",
                         "add_.Scalar"}) {
    EXPECT_TRUE(has(kernels.filled(), op)) << op;
  }
}

TEST(NativeMetaKernelsTest, NothingStaysRegisteredAfterTheScope) {
  const at::Tensor x = at::empty({2, 3}, at::kMeta);
  { NativeMetaKernels kernels; EXPECT_EQ(at::relu(x).sizes(), x.sizes()); }
  EXPECT_THROW(at::relu(x), c10::Error);
}

// arange's C++ kernel resizes an empty tensor, which on meta allocates
// nothing the allocator sees; the filled kernel allocates its output.
TEST(NativeMetaKernelsTest, ArangeOnMetaIsAnAllocationOfItsBytes) {
  NativeMetaKernels kernels;
  Recorder r;
  at::Tensor t = at::arange(128, at::TensorOptions().device(at::kMeta).dtype(at::kLong));
  r.stop();
  EXPECT_EQ(t.numel(), 128);
  int64_t allocated = 0;
  for (const Event& e : r.timeline().events()) {
    if (e.kind == EventKind::kAlloc && e.device == Device::kMeta) allocated += e.bytes;
  }
  EXPECT_EQ(allocated, 128 * 8);
}

// memfit's arange answers in front of torch's Python kernel too: bad bounds
// get torch's errors, not a tensor of a wrong size.
TEST(NativeMetaKernelsTest, ArangeOnMetaRefusesWhatTorchRefuses) {
  NativeMetaKernels kernels;
  const auto meta = at::TensorOptions().device(at::kMeta);
  EXPECT_THROW(at::arange(0, 10, 0, meta), c10::Error);
  EXPECT_THROW(at::arange(10, 0, 1, meta), c10::Error);
  EXPECT_EQ(at::arange(10, 0, -3, meta).numel(), 4);
  EXPECT_EQ(at::arange(0.0, 1.0, 0.3, meta).numel(), 4);
}

// add_ with a scalar answers in front of torch's Python kernel: a result
// that cannot be cast to the tensor's dtype is refused, as on a device.
TEST(NativeMetaKernelsTest, AddAScalarInPlaceOnMetaRefusesWhatTorchRefuses) {
  NativeMetaKernels kernels;
  at::Tensor longs = at::empty({2}, at::TensorOptions().device(at::kMeta).dtype(at::kLong));
  EXPECT_THROW(longs.add_(1.5), c10::Error);
  EXPECT_NO_THROW(longs.add_(1));
  at::Tensor halves = at::empty({2}, at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
  EXPECT_NO_THROW(halves.add_(1.5));
}

class MetaRunsWhole : public ::testing::TestWithParam<std::string> {};

// `memfit profile --mode meta` in this C++-only process: no fallback to cpu.
TEST_P(MetaRunsWhole, ForTheBuiltInModel) {
  ModelOptions mo;  // a small gpt: seconds on two cores
  mo.layers = 2;
  mo.width = 64;
  mo.context = 16;
  mo.vocab = 128;
  auto model = make_model(GetParam(), mo);
  ProfileOptions o;
  o.batch = 2;
  o.mode = "meta";
  const Profile p = profile_model(*model, o);
  EXPECT_EQ(p.report.mode, "meta") << (p.report.notes.empty() ? "" : p.report.notes[0]);
  EXPECT_TRUE(p.report.notes.empty());
}

INSTANTIATE_TEST_SUITE_P(BuiltinModels, MetaRunsWhole,
                         ::testing::Values("mlp", "cnn", "gpt", "resnet18", "lstm"));

}  // namespace
}  // namespace memfit
