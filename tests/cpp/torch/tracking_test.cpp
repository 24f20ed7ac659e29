#include "memfit/torch/tracking.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>
#include <thread>

#include "memfit/torch/recorder.h"

namespace memfit {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(TrackingTest, CpuTensorIsLiveWhileItLivesAndZeroAfter) {
  Recorder r;
  {
    auto t = torch::empty({1000, 1000}, torch::kFloat32);
    EXPECT_EQ(r.live_bytes(), 4'000'000);
    EXPECT_EQ(tracking::live_bytes(Device::kCPU), 4'000'000);
  }
  EXPECT_EQ(r.live_bytes(), 0);
  EXPECT_EQ(r.peak_bytes(), 4'000'000);
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), 0);
}

TEST(TrackingTest, MetaTensorCountsItsRealSizeAndHoldsNoMemory) {
  Recorder r;
  auto t = torch::empty({1'000'000'000}, torch::TensorOptions()
                                             .dtype(torch::kFloat32)
                                             .device(torch::kMeta));
  EXPECT_EQ(tracking::live_bytes(Device::kMeta), 4'000'000'000);
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), 0);
  EXPECT_EQ(r.live_bytes(), 4'000'000'000);
  t.reset();
  EXPECT_EQ(tracking::live_bytes(Device::kMeta), 0);
}

TEST(TrackingTest, AllocatorBeforeASessionIsRestoredAfterIt) {
  c10::Allocator* cpu = c10::GetAllocator(c10::DeviceType::CPU);
  c10::Allocator* meta = c10::GetAllocator(c10::DeviceType::Meta);
  {
    Recorder outer;
    EXPECT_NE(c10::GetAllocator(c10::DeviceType::CPU), cpu);
    {
      Recorder inner;
      EXPECT_TRUE(tracking::installed());
    }
    EXPECT_TRUE(tracking::installed());  // nested: the outer still tracks
    auto t = torch::ones({10});
    EXPECT_EQ(outer.live_bytes(), 40);
  }
  EXPECT_FALSE(tracking::installed());
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CPU), cpu);
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::Meta), meta);
}

TEST(TrackingTest, TensorOutlivingTheSessionIsFreedByTheWrappedAllocator) {
  torch::Tensor survivor;
  {
    Recorder r;
    survivor = torch::ones({256});
  }
  // Still usable, and resizing it goes through the wrapped allocator.
  EXPECT_EQ(survivor.sum().item<float>(), 256.0f);
  survivor.resize_({1 << 16});
  survivor.reset();
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), 0);
}

TEST(SimulatedDeviceTest, BudgetLetsNineMiBThroughAndRefusesTwoMore) {
  SimulatedDevice device(10 * kMiB);
  auto a = torch::empty({9 * kMiB}, torch::kUInt8);
  try {
    auto b = torch::empty({2 * kMiB}, torch::kUInt8);
    FAIL() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("Tried to allocate 2.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("budget 10.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("9.00 MiB already allocated"), std::string::npos) << msg;
  }
  // The refused allocation left nothing behind; what fits still fits.
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), 9 * kMiB);
  auto c = torch::empty({kMiB}, torch::kUInt8);
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), 10 * kMiB);
}

// See Note [What fills the simulated device].
TEST(SimulatedDeviceTest, AnExplainerWordsTheOutOfMemoryErrorAndCannotHideIt) {
  SimulatedDevice device(4 * kMiB);
  auto a = torch::empty({3 * kMiB}, torch::kUInt8);
  tracking::OomContext seen;
  tracking::set_oom_explainer([&seen](const tracking::OomContext& c) {
    seen = c;
    return std::string("CUDA out of memory. [simulated_device] explained");
  });
  try {
    auto b = torch::empty({2 * kMiB}, torch::kUInt8);
    FAIL() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()),
              "CUDA out of memory. [simulated_device] explained");
  }
  EXPECT_EQ(seen.bytes, 2 * kMiB);
  EXPECT_EQ(seen.used, 3 * kMiB);
  EXPECT_EQ(seen.budget, 4 * kMiB);
  EXPECT_NE(seen.message.find("Tried to allocate 2.00 MiB"), std::string::npos);
  // An explainer that fails leaves the allocator's own message.
  tracking::set_oom_explainer(
      [](const tracking::OomContext&) -> std::string { throw std::runtime_error("no"); });
  try {
    auto b = torch::empty({2 * kMiB}, torch::kUInt8);
    FAIL() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("Tried to allocate 2.00 MiB"),
              std::string::npos);
  }
  tracking::set_oom_explainer({});
  EXPECT_THROW(torch::empty({2 * kMiB}, torch::kUInt8), c10::OutOfMemoryError);
}

TEST(SimulatedDeviceTest, NestedBudgetsApplyTheSmallest) {
  SimulatedDevice outer(10 * kMiB);
  {
    SimulatedDevice inner(2 * kMiB);
    EXPECT_EQ(*tracking::budget(Device::kCPU), 2 * kMiB);
    EXPECT_THROW(torch::empty({3 * kMiB}, torch::kUInt8), c10::OutOfMemoryError);
  }
  EXPECT_EQ(*tracking::budget(Device::kCPU), 10 * kMiB);
  EXPECT_NO_THROW(torch::empty({3 * kMiB}, torch::kUInt8));
}

// See Note [One device, shared by every thread].
TEST(SimulatedDeviceTest, EveryThreadSharesOneDeviceAndAnotherThreadsBudgetIsNamed) {
  std::promise<void> set, done;
  std::thread small([&] {
    SimulatedDevice device(kMiB);
    set.set_value();
    done.get_future().wait();
  });
  set.get_future().wait();
  {
    SimulatedDevice mine(100 * kMiB);
    EXPECT_EQ(*tracking::budget(Device::kCPU), kMiB);  // a card has one size
    try {
      auto t = torch::empty({4 * kMiB}, torch::kUInt8);
      ADD_FAILURE() << "expected the other thread's 1 MiB budget to hold here";
    } catch (const c10::OutOfMemoryError& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("budget 1.00 MiB, set by another thread's simulated device"),
                std::string::npos) << msg;
    }
  }
  done.set_value();
  small.join();
  // Its own budget, once alone, is not attributed to anyone else.
  SimulatedDevice mine(kMiB);
  try {
    auto t = torch::empty({4 * kMiB}, torch::kUInt8);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()).find("another thread"), std::string::npos);
  }
}

TEST(SimulatedDeviceTest, AnotherThreadsAllocationsCountAgainstTheBudget) {
  SimulatedDevice device(10 * kMiB);
  at::Tensor held;
  std::thread other([&] { held = torch::empty({6 * kMiB}, torch::kUInt8); });
  other.join();
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), 6 * kMiB);
  EXPECT_THROW(torch::empty({5 * kMiB}, torch::kUInt8), c10::OutOfMemoryError);
  held = at::Tensor();
  EXPECT_NO_THROW(torch::empty({5 * kMiB}, torch::kUInt8));
}

TEST(SimulatedDeviceTest, BudgetOnCpuDoesNotLimitMeta) {
  SimulatedDevice device(kMiB);
  EXPECT_NO_THROW(torch::empty({kMiB}, torch::TensorOptions().device(torch::kMeta)));
}

TEST(SimulatedDeviceTest, NegativeBudgetIsRejected) {
  EXPECT_THROW(SimulatedDevice(-1), c10::Error);
}

TEST(SimulatedDeviceTest, ForcedFailureHitsTheNthAllocation) {
  TrackingScope scope;
  tracking::fail_allocation_after(Device::kCPU, 3);
  auto a = torch::ones({4});
  auto b = torch::ones({4});
  EXPECT_THROW(torch::ones({4}), c10::OutOfMemoryError);
  EXPECT_NO_THROW(torch::ones({4}));  // one-shot
}

TEST(TrackingTest, ConcurrentAllocationsAreAllCounted) {
  Recorder r;
  auto work = [] {
    for (int i = 0; i < 2000; ++i) {
      auto t = torch::empty({64});
      (void)t;
    }
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  r.stop();
  EXPECT_EQ(r.live_bytes(), 0);
  EXPECT_EQ(r.timeline().size(), 2u * 2u * 2000u);
}

TEST(TrackingTest, AllocationOfFindsTheTrackedStorage) {
  Recorder r;
  auto t = torch::ones({8, 8});
  auto view = t.slice(0, 2, 4);
  auto a = tracking::allocation_of(t);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->bytes, 256);
  EXPECT_EQ(tracking::allocation_of(view)->id, a->id);
  EXPECT_FALSE(tracking::allocation_of(torch::Tensor()).has_value());
}

}  // namespace
}  // namespace memfit
