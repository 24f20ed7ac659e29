#include "memfit/core/render/text_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memfit {
namespace {

TEST(TextWidthTest, SumsTheWiderFontsAdvancePerCharacter) {
  // '0' 0.637 em, ' ' 0.318 em, 'B' 0.687 em (DejaVu Sans).
  EXPECT_DOUBLE_EQ(text_width("0 B", 10), 16.42);
  EXPECT_DOUBLE_EQ(text_width("", 11), 0.0);
  EXPECT_GT(text_width("peak", 12, true), text_width("peak", 12, false));
  // A non-ASCII code point (two bytes here) counts one em, once.
  EXPECT_DOUBLE_EQ(text_width("\u00b5", 10), 10.0);
  // Lower case averages over half an em.
  const std::string abc = "abcdefghijklmnopqrstuvwxyz";
  EXPECT_GE(text_width(abc, 10), 0.5 * 10 * abc.size());
}

TEST(BoxTest, TouchingBoxesDoNotOverlap) {
  const Box a{0, 0, 10, 10};
  EXPECT_TRUE(overlaps(a, Box{5, 5, 10, 10}));
  EXPECT_FALSE(overlaps(a, Box{10, 0, 10, 10}));  // side by side
  EXPECT_FALSE(overlaps(a, Box{0, 10, 10, 10}));  // stacked
  EXPECT_TRUE(overlaps(a, Box{2, 2, 1, 1}));      // inside
  EXPECT_TRUE(contains(a, Box{0, 0, 10, 10}));
  EXPECT_FALSE(contains(a, Box{1, 1, 10, 1}));
  const Box b = inflate(a, 2);
  EXPECT_DOUBLE_EQ(b.x, -2);
  EXPECT_DOUBLE_EQ(b.right(), 12);
}

TEST(TextLabelTest, BoxFollowsTheAnchorAndTheBaseline) {
  TextLabel l;
  l.text = "0 B";
  l.size = 10;
  l.x = 100;
  l.y = 50;
  Box b = l.box();
  EXPECT_DOUBLE_EQ(b.x, 100);
  EXPECT_DOUBLE_EQ(b.w, 16.42);
  EXPECT_DOUBLE_EQ(b.y, 50 - 10);
  EXPECT_DOUBLE_EQ(b.bottom(), 50 + 3.4);
  l.anchor = Anchor::kMiddle;
  EXPECT_DOUBLE_EQ(l.box().x, 100 - 8.21);
  l.anchor = Anchor::kEnd;
  EXPECT_DOUBLE_EQ(l.box().right(), 100);
}

TEST(FirstOverlapTest, FindsTheFirstClashingPair) {
  std::vector<TextLabel> labels(3);
  labels[0].text = "forward 1";
  labels[1].text = "backward 1";
  labels[1].x = 200;
  labels[2].text = "x";
  labels[2].x = 205;
  labels[2].y = 5;
  const auto clash = first_overlap(labels);
  ASSERT_TRUE(clash.has_value());
  EXPECT_EQ(*clash, std::make_pair(size_t{1}, size_t{2}));
  labels[2].y = 40;
  EXPECT_FALSE(first_overlap(labels).has_value());
}

TEST(FitTextTest, CutsWithAnEllipsisToTheWidth) {
  EXPECT_EQ(fit_text("blocks.0.attn", 1000, 11), "blocks.0.attn");
  const std::string cut = fit_text("blocks.0.attn.proj", 50, 11);
  EXPECT_LT(cut.size(), std::string("blocks.0.attn.proj").size());
  EXPECT_EQ(cut.substr(cut.size() - 3), "\u2026");
  EXPECT_LE(text_width(cut, 11), 50);
  EXPECT_EQ(fit_text("abc", 2, 11), "");
  // Never cuts inside a UTF-8 sequence.
  const std::string mu = fit_text("\u00b5\u00b5\u00b5\u00b5", 25, 10);
  EXPECT_EQ(mu, "\u00b5\u2026");
}

}  // namespace
}  // namespace memfit
