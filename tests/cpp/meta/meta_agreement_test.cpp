// Meta mode against the CPU, output by output: every allocation that
// outlives its op has the same size on both devices, phase by phase (backward:
// see the comment in the test).
// Runs in a process that hosts Python (main.cpp): see Note [Meta kernels
// live in torch's Python].
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

namespace memfit {
namespace {

// Allocation sizes that outlive their op, per (phase, iteration), sorted.
std::map<std::string, std::vector<int64_t>> outputs_by_phase(const Timeline& t) {
  std::map<std::string, std::vector<int64_t>> out;
  const auto& spans = t.phase_spans();
  for (const auto& span : spans) {
    auto& v = out[t.phase_name(span.phase) + "#" + std::to_string(span.iteration)];
    for (size_t i = span.first_event; i < span.end_event; ++i) {
      const Event& e = t.events()[i];
      if (e.kind == EventKind::kAlloc &&
          t.category_of(e.id) != Category::kTemporary) {
        v.push_back(e.bytes);
      }
    }
    std::sort(v.begin(), v.end());
  }
  return out;
}

class MetaAgreesWithCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaAgreesWithCpu, OnEveryOutputByte) {
  ModelOptions mo;  // a small gpt: seconds on two cores
  mo.layers = 2;
  mo.width = 64;
  mo.context = 16;
  mo.vocab = 128;
  auto model = make_model(GetParam(), mo);
  ProfileOptions o;
  o.batch = 4;
  Profile cpu = profile_model(*model, o);
  o.mode = "meta";
  Profile meta = profile_model(*model, o);
  ASSERT_EQ(meta.report.mode, "meta") << meta.report.notes.front();
  const auto m = outputs_by_phase(meta.timeline), c = outputs_by_phase(cpu.timeline);
  ASSERT_EQ(m.size(), c.size());
  for (const auto& [name, sizes] : c) {
    std::vector<int64_t> only_cpu, only_meta;
    std::set_difference(sizes.begin(), sizes.end(), m.at(name).begin(),
                        m.at(name).end(), std::back_inserter(only_cpu));
    std::set_difference(m.at(name).begin(), m.at(name).end(), sizes.begin(),
                        sizes.end(), std::back_inserter(only_meta));
    // Backward on meta may add outputs, never lose one: autograd sums the
    // gradients of a tensor used twice (a residual, q/k/v of one tensor) in
    // place on the CPU, out of place on meta, which torch counts as
    // "subclass-like" (at::isTensorSubclassLike includes the Meta backend,
    // so InputBuffer::accumulate never adds in place). Every other phase
    // agrees exactly.
    const bool backward = name.rfind("backward#", 0) == 0;
    EXPECT_TRUE(only_cpu.empty() && (backward || only_meta.empty()))
        << name << ": " << only_cpu.size() << " outputs only on cpu (first "
        << (only_cpu.empty() ? 0 : only_cpu[0]) << " B), " << only_meta.size()
        << " only on meta (first " << (only_meta.empty() ? 0 : only_meta[0])
        << " B)";
  }
}

// Not lstm: the CPU runs LSTM through its own kernels (weight gradients
// summed by one mm over concatenated steps), meta through the composite
// (one mm and add per step): different outputs, by design of the kernels.
INSTANTIATE_TEST_SUITE_P(BuiltinModels, MetaAgreesWithCpu,
                         ::testing::Values("mlp", "cnn", "gpt", "resnet18"));


}  // namespace
}  // namespace memfit
