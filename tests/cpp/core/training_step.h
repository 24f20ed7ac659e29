// A recorded training step as memfit's recorder makes one, for the tests of
// the pictures and the page: "parameters", then two iterations of inputs,
// forward, loss, backward, optimizer_step (Adam-like: its state in the
// first, 200 small temporaries in each), zero_grad, with categories,
// modules, ops and wall times.
//
// The peak is in backward 2 at aten::_log_softmax_backward_data, 29.53 MiB:
// activations 16 MiB (blocks.0 6, blocks.1 6, head 4, the loss 8 B),
// optimizer state 6 MiB, parameters 3 MiB, a temporary of 4 MiB (head),
// gradients 512 KiB, inputs 32 KiB. By module (any category): head 8 MiB,
// blocks.0 6 MiB, blocks.1 6 MiB.
//
// Also what those tests share to read what they draw: count().
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "memfit/core/model/timeline.h"

namespace memfit::testing {

inline constexpr int64_t kKiB = 1024;
inline constexpr int64_t kMiB = 1024 * 1024;

// How many times `needle` stands in `s`, overlapping ones included.
inline size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = s.find(needle); pos != std::string::npos;
       pos = s.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

inline Timeline training_step(bool with_times = true) {
  Timeline t;
  int64_t clock = 0;
  uint64_t next_id = 1;
  auto event = [&](EventKind kind, uint64_t id, int64_t bytes, Category c,
                   std::string_view module, std::string_view op,
                   int64_t step_ns) {
    Event e;
    e.kind = kind;
    e.id = id;
    e.bytes = bytes;
    e.category = c;
    e.phase = t.current_phase();
    e.module = t.module_index(module);
    e.op = t.op_index(op);
    clock += step_ns;
    e.time_ns = with_times ? clock : 0;
    t.record(e);
  };
  auto alloc = [&](int64_t bytes, Category c, std::string_view module = "",
                   std::string_view op = "", int64_t step_ns = 1000) {
    const uint64_t id = next_id++;
    event(EventKind::kAlloc, id, bytes, c, module, op, step_ns);
    return id;
  };
  auto free = [&](uint64_t id, int64_t step_ns = 1000) {
    event(EventKind::kFree, id, 0, Category::kOther, "", "", step_ns);
  };
  auto phase = [&](const char* name, int iteration) {
    clock += 50000;  // the Python between phases
    t.begin_phase(name, iteration);
  };

  phase("parameters", 1);
  const int64_t params[] = {1 * kMiB, 1 * kMiB, 512 * kKiB, 512 * kKiB};
  for (int64_t p : params) alloc(p, Category::kParameter, "", "aten::empty");
  uint64_t state[8] = {};
  for (int it = 1; it <= 2; ++it) {
    phase("inputs", it);
    const uint64_t x = alloc(16 * kKiB, Category::kInput);
    const uint64_t y = alloc(16 * kKiB, Category::kInput);
    phase("forward", it);
    uint64_t acts[8];
    int n = 0;
    for (const char* block : {"blocks.0", "blocks.1"}) {
      for (int i = 0; i < 3; ++i) {
        acts[n++] = alloc(2 * kMiB, Category::kActivation, block, "aten::mm");
      }
      const uint64_t tmp =
          alloc(1 * kMiB, Category::kTemporary, block, "aten::softmax");
      free(tmp);
    }
    acts[n++] = alloc(4 * kMiB, Category::kActivation, "head", "aten::mm");
    phase("loss", it);
    const uint64_t loss = alloc(8, Category::kActivation, "", "aten::nll_loss");
    phase("backward", it);
    uint64_t grads[4];
    grads[0] = alloc(512 * kKiB, Category::kGradient, "", "aten::mm");
    const uint64_t tmp = alloc(4 * kMiB, Category::kTemporary, "head",
                               "aten::_log_softmax_backward_data");
    free(tmp);
    free(loss);
    free(acts[6]);
    grads[1] = alloc(1 * kMiB, Category::kGradient, "", "aten::mm");
    for (int i = 3; i < 6; ++i) free(acts[i]);
    grads[2] = alloc(1 * kMiB, Category::kGradient, "", "aten::mm");
    grads[3] =
        alloc(512 * kKiB, Category::kGradient, "", "aten::embedding_backward");
    for (int i = 0; i < 3; ++i) free(acts[i]);
    phase("optimizer_step", it);
    if (it == 1) {
      for (int i = 0; i < 8; ++i) {
        state[i] = alloc(params[i / 2], Category::kOptimizerState, "",
                         "aten::zeros_like");
      }
    }
    for (int i = 0; i < 100; ++i) {
      free(alloc(64 * kKiB, Category::kTemporary, "", "aten::div", 200), 200);
    }
    phase("zero_grad", it);
    for (uint64_t g : grads) free(g);
    t.end_phase();
    free(x);
    free(y);
  }
  (void)state;
  return t;
}

}  // namespace memfit::testing
