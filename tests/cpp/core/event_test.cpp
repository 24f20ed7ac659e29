#include "memfit/core/model/event.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace memfit {
namespace {

TEST(EventTest, DeviceNames) {
  EXPECT_EQ(to_string(Device::kCPU), "cpu");
  EXPECT_EQ(to_string(Device::kMeta), "meta");
  EXPECT_EQ(to_string(Device::kCUDA), "cuda");
}

TEST(EventTest, CategoryNamesInEnumOrder) {
  const char* expected[kNumCategories] = {
      "parameter", "buffer",          "input",     "activation",
      "gradient",  "optimizer_state", "temporary", "other",
      "workspace"};
  for (int i = 0; i < kNumCategories; ++i) {
    EXPECT_EQ(to_string(static_cast<Category>(i)), expected[i]) << i;
  }
}

TEST(EventTest, CategoryFromStringInvertsToString) {
  for (int i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    EXPECT_EQ(category_from_string(to_string(c)), c);
  }
}

TEST(EventTest, UnknownCategoryNameThrowsNamingAcceptedNames) {
  try {
    category_from_string("Activation");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "[category_from_string] unknown category 'Activation': use one "
              "of parameter, buffer, input, activation, gradient, "
              "optimizer_state, temporary, other, workspace");
  }
  EXPECT_THROW(category_from_string(""), std::invalid_argument);
}

}  // namespace
}  // namespace memfit
