// Every difference between the torch 2.x versions memfit builds against
// (>= 2.4: pip's wheels, CI's 2.13, the GPU machines' 2.11) lives here.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <memory>
#include <type_traits>
#include <utility>

static_assert(TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4),
              "memfit needs torch >= 2.4");

namespace memfit::compat {

// A new autograd node of type T. torch 2.13 made torch::autograd::Node an
// intrusive_ptr_target (set_history takes c10::intrusive_ptr<Node>) and
// dropped deleteNode; before, nodes were held by std::shared_ptr. Decided
// from the type itself, so any 2.x compiles.
template <typename T>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, T>) {
    return c10::make_intrusive<T>();
  } else {
    return std::make_shared<T>();
  }
}

}  // namespace memfit::compat
