#include "memfit/core/render/module_bars.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/model/units.h"

namespace memfit {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

std::vector<ModuleRow> gpt_modules() {
  return {{"blocks.0", 6 * kMiB},       {"blocks.1", 6 * kMiB},
          {"head", 4 * kMiB},           {"blocks.0.fc", 2 * kMiB},
          {"blocks.1.fc", 2 * kMiB},    {"blocks.0.ln1", 520 * 1024},
          {"blocks.0.ln2", 520 * 1024}, {"blocks.1.ln1", 520 * 1024},
          {"blocks.1.ln2", 520 * 1024}, {"ln", 520 * 1024},
          {"tok_emb", 256 * 1024},      {"(top level)", 8}};
}

void expect_readable(const ModuleBars& c) {
  const Box picture{0, 0, double(c.options.width), double(c.height)};
  const auto clash = first_overlap(c.labels);
  EXPECT_FALSE(clash.has_value())
      << "'" << c.labels[clash->first].text << "' overlaps '"
      << c.labels[clash->second].text << "'";
  for (const TextLabel& l : c.labels) {
    EXPECT_TRUE(contains(picture, l.box())) << l.text;
    for (const ModuleBar& b : c.bars) {
      EXPECT_FALSE(overlaps(l.box(), b.rect)) << l.text << " over " << b.path;
    }
  }
}

TEST(ModuleBarsTest, BarsAreTheModulesLargestFirstWithExactBytes) {
  const ModuleBars c = module_bars(gpt_modules());
  ASSERT_EQ(c.bars.size(), 12u);
  EXPECT_EQ(c.bars[0].path, "blocks.0");
  EXPECT_EQ(c.bars[0].bytes, 6 * kMiB);
  EXPECT_EQ(c.bars[2].path, "head");
  EXPECT_DOUBLE_EQ(c.bars[2].rect.w, c.bars[0].rect.w * 4 / 6);
  int64_t total = 0;
  for (const ModuleRow& m : gpt_modules()) total += m.activation_bytes;
  EXPECT_EQ(c.total, total);
  const std::string svg = c.svg();
  EXPECT_NE(svg.find("data-path=\"head\" data-bytes=\"4194304\""),
            std::string::npos);
  EXPECT_NE(svg.find("<title>head: 4.00 MiB (4194304 B)</title>"),
            std::string::npos);
  std::vector<std::string> values;
  for (const TextLabel& l : c.labels) {
    if (l.role == "value") values.push_back(l.text);
  }
  ASSERT_EQ(values.size(), 12u);
  EXPECT_EQ(values[2].rfind("4.00 MiB  ", 0), 0u) << values[2];
  expect_readable(c);
}

TEST(ModuleBarsTest, ModulesPastMaxBarsShareOneBar) {
  ModuleBarsOptions o;
  o.max_bars = 4;
  const ModuleBars c = module_bars(gpt_modules(), o);
  ASSERT_EQ(c.bars.size(), 4u);
  EXPECT_EQ(c.bars[3].path, "9 more modules");
  EXPECT_EQ(c.bars[3].modules, 9u);
  EXPECT_EQ(c.bars[3].bytes, 4 * kMiB + 5 * 520 * 1024 + 256 * 1024 + 8);
  expect_readable(c);
}

TEST(ModuleBarsTest, LongNamesAreCutAndNothingOverlapsAtAnyWidth) {
  std::vector<ModuleRow> rows = gpt_modules();
  rows.push_back(
      {std::string(300, 'x') + ".attention.output.projection", 3 * kMiB});
  for (int width : {320, 480, 800, 1200, 1920}) {
    ModuleBarsOptions o;
    o.width = width;
    SCOPED_TRACE(width);
    expect_readable(module_bars(rows, o));
  }
}

TEST(ModuleBarsTest, NoModulesSaysSo) {
  const ModuleBars c = module_bars({});
  EXPECT_TRUE(c.bars.empty());
  EXPECT_NE(c.svg().find("no activations were attributed to modules"),
            std::string::npos);
  EXPECT_THROW(module_bars({}, ModuleBarsOptions{"t", 100, 12}),
               std::invalid_argument);
  EXPECT_THROW(module_bars({}, ModuleBarsOptions{"t", 1200, 0}),
               std::invalid_argument);
}

}  // namespace
}  // namespace memfit
