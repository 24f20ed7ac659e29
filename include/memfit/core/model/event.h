// A memory event: the unit everything in memfit is built from.
// Plain data, no LibTorch: see src/core/CMakeLists.txt for why.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace memfit {

enum class EventKind : uint8_t {
  kAlloc,  // bytes became live under `id`
  kFree,   // the allocation `id` died; bytes repeat the allocation's size
};

enum class Device : uint8_t { kCPU, kMeta, kCUDA };

// Why a byte is live. Decided when it is allocated (by phase) and refined
// later, e.g. a tensor found in optimizer.state becomes kOptimizerState.
enum class Category : uint8_t {
  kParameter,
  kBuffer,
  kInput,
  kActivation,
  kGradient,
  kOptimizerState,
  kTemporary,  // freed before the op that allocated it returned
  kOther,
  // What a library keeps for its kernels while the process lives (cuBLAS and
  // cuBLASLt workspaces per thread and stream): never gradients or
  // activations, though a backward or a forward allocated it.
  kWorkspace,
};
constexpr int kNumCategories = 9;

std::string_view to_string(Device d);
std::string_view to_string(Category c);
// Inverse of to_string(Category); throws std::invalid_argument naming the
// accepted names.
Category category_from_string(std::string_view name);

struct Event {
  int64_t time_ns = 0;  // since the recording started
  int64_t bytes = 0;    // Timeline::record() sets a free's from its alloc
  uint64_t id = 0;      // shared by an allocation and its free
  uint32_t module = 0;  // index into Timeline::module_name(); 0 is "" (none)
  uint32_t op = 0;      // index into Timeline::op_name(); 0 is "" (none)
  uint16_t phase = 0;   // index into Timeline::phase_name(); 0 is "" (none)
  // Serial of the outermost op or autograd node open when it was made (its
  // allocations share it); 0: none, or not known (a timeline from elsewhere).
  uint64_t frame = 0;
  EventKind kind = EventKind::kAlloc;
  Device device = Device::kCPU;
  Category category = Category::kOther;
};

}  // namespace memfit
