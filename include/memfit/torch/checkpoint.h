// Activation checkpointing for LibTorch C++, which has no
// torch::utils::checkpoint: a segment's forward keeps only its input, and
// backward runs it again with grad to get what it needs.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace memfit {

// Note [How a checkpointed segment runs]
// Forward runs fn(input) under no_grad: none of the segment's intermediates
// is saved, only `input` (held by the backward node) and the output. The
// output's grad_fn is a node whose edges go to `input` and to `params`, so
// autograd sees the segment as one op of (input, params...). Its backward
// runs fn again on a detached copy of the input with grad enabled (and the
// autocast state of the forward), then torch::autograd::grad of that output
// with respect to the input and the parameters, and returns those: nothing
// is accumulated into .grad behind autograd's back, so backward(), grad()
// and memfit's Trainer (which may ask for some parameters only) all see
// the same gradients as without checkpointing. fn must be deterministic
// (no dropout: memfit's models have none; the CPU RNG is not replayed) and
// must read no parameter other than `params`.
//
// Without grad mode, or when neither the input nor any parameter requires
// grad, it is fn(input).
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn,
                      const at::Tensor& input,
                      const std::vector<at::Tensor>& params);

}  // namespace memfit
