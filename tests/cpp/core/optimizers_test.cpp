#include "memfit/core/model/optimizers.h"

#include <gtest/gtest.h>

#include "memfit/core/plan/advise_plan.h"

namespace memfit {
namespace {

// The names fit_batch's advice and the report's notes read.
TEST(OptimizerNames, AdamAndHostOffload) {
  for (const char* adam : {"adam", "Adam", "AdamW", "adam-offload", "Adam-offload"}) {
    EXPECT_TRUE(optimizer_is_adam(adam)) << adam;
  }
  for (const char* other : {"sgd", "momentum", "SGD", "none"}) {
    EXPECT_FALSE(optimizer_is_adam(other)) << other;
  }
  EXPECT_TRUE(optimizer_on_host("adam-offload"));
  EXPECT_TRUE(optimizer_on_host("Adam-offload"));
  for (const char* on_device : {"adam", "-offload", "offload", "adam-offloaded"}) {
    EXPECT_FALSE(optimizer_on_host(on_device)) << on_device;
  }
}

TEST(BuiltinOptimizers, NamesInTheOrderTheCommandListsThem) {
  EXPECT_EQ(optimizer_names(),
            (std::vector<std::string>{"adam", "adam-offload", "momentum", "sgd", "none"}));
  ASSERT_EQ(builtin_optimizers().size(), optimizer_names().size());
  for (size_t i = 0; i < optimizer_names().size(); ++i) {
    EXPECT_EQ(builtin_optimizers()[i].name, optimizer_names()[i]);
    EXPECT_EQ(find_optimizer(optimizer_names()[i]), &builtin_optimizers()[i]);
  }
  EXPECT_EQ(find_optimizer("adagrad"), nullptr);
  EXPECT_EQ(find_optimizer("Adam"), nullptr);  // a Python class name, not a built-in
}

// Each spec says what a front builds, and the offloaded one is its
// on-device twin with the state on the host.
TEST(BuiltinOptimizers, SpecsSayTheClassAndItsState) {
  const OptimizerSpec& adam = *find_optimizer("adam");
  EXPECT_EQ(adam.torch_class, "Adam");
  EXPECT_EQ(adam.states, 2);
  EXPECT_FALSE(adam.on_host);
  const OptimizerSpec& offload = *find_optimizer("adam-offload");
  EXPECT_EQ(offload.torch_class, "Adam");
  EXPECT_TRUE(offload.on_host);
  EXPECT_TRUE(optimizer_on_host(offload.name));
  EXPECT_EQ(find_optimizer("momentum")->torch_class, "SGD");
  EXPECT_DOUBLE_EQ(find_optimizer("momentum")->momentum, 0.9);
  EXPECT_EQ(find_optimizer("momentum")->states, 1);
  EXPECT_DOUBLE_EQ(find_optimizer("sgd")->momentum, 0);
  EXPECT_EQ(find_optimizer("sgd")->states, 0);
  EXPECT_TRUE(find_optimizer("none")->torch_class.empty());
  for (const auto& s : builtin_optimizers()) EXPECT_DOUBLE_EQ(s.lr, 1e-3) << s.name;
}

TEST(BuiltinOptimizers, StateOfAnyNameAndItsWords) {
  EXPECT_EQ(optimizer_states("adam"), 2);
  EXPECT_EQ(optimizer_states("momentum"), 1);
  EXPECT_EQ(optimizer_states("sgd"), 0);
  EXPECT_EQ(optimizer_states("none"), 0);
  EXPECT_EQ(optimizer_states("Adafactor"), 2);  // another class: Adam's two, as advise takes it
  EXPECT_EQ(optimizer_state_label("adam"), "Adam exp_avg and exp_avg_sq");
  EXPECT_EQ(optimizer_state_label("AdamW"), "Adam exp_avg and exp_avg_sq");
  EXPECT_EQ(optimizer_state_label("adam-offload"), "Adam exp_avg and exp_avg_sq");
  EXPECT_EQ(optimizer_state_label("momentum"), "momentum buffers");
  EXPECT_EQ(optimizer_state_label("sgd"), "optimizer state");
  EXPECT_EQ(optimizer_state_label("SGD"), "optimizer state");
}

// advise's rows and lighter choices follow the list: every on-device
// built-in with a class is a row, lighter ones by their state, most first.
TEST(BuiltinOptimizers, AdviseChoicesFollowTheList) {
  using V = std::vector<std::string>;
  EXPECT_EQ(optimizer_choices("adam").others, (V{"momentum", "sgd"}));
  EXPECT_EQ(optimizer_choices("adam").lighter, (V{"momentum", "sgd"}));
  EXPECT_EQ(optimizer_choices("Adafactor").lighter, (V{"momentum", "sgd"}));
  EXPECT_EQ(optimizer_choices("momentum").others, (V{"adam", "sgd"}));
  EXPECT_TRUE(optimizer_choices("none").others.empty());
  EXPECT_FALSE(optimizer_choices("none").can_offload);
}

}  // namespace
}  // namespace memfit
