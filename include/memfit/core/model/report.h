// The answer to "where did my step's memory go?": phases with their deltas
// explained, categories at the peak, activations per module. Built from a
// Timeline recorded with the phase names of memfit's training step.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/model/data_parallel.h"
#include "memfit/core/model/event.h"
#include "memfit/core/model/timeline.h"

namespace memfit {

// Note [The order of a training iteration]
// memfit runs inputs, forward, loss, backward, optimizer_step, zero_grad
// (set_to_none): PyTorch's quickstart order. Gradients die before the next
// forward, so they never sit beside activations; a loop that zeroes them
// just before backward instead holds them through the next forward, and
// peaks higher. The model's output: memfit's own steps (profile_model's,
// the Trainer's micro-batches) drop it once the loss exists (the loss's
// backward keeps what it needs). The user's loop usually keeps it until the
// next forward replaces it (PyTorch's quickstart `pred = model(X); loss =
// loss_fn(pred, y)`, Hugging Face's `outputs = model(**batch)`), and a
// language model's logits are its largest tensor: a tied-weight LM fitted
// with them dropped answered 73 where that loop ran 58. So Python's
// profile, find_batch_size and advise keep it by default (keep_output=True,
// Loop in _step/loop.py), and keep_output=False records the one-line loop
// `loss_fn(model(x), y).backward()`. The Trainer runs the step it measures,
// which is what lets `fit` predict the steps `train` runs. "parameters"
// comes once, first.
inline constexpr const char* kPhaseParameters = "parameters";
inline constexpr const char* kPhaseInputs = "inputs";
inline constexpr const char* kPhaseForward = "forward";
inline constexpr const char* kPhaseLoss = "loss";
inline constexpr const char* kPhaseZeroGrad = "zero_grad";
inline constexpr const char* kPhaseBackward = "backward";
inline constexpr const char* kPhaseOptimizerStep = "optimizer_step";

struct PhaseRow {
  std::string name;
  int iteration = 0;
  int64_t live_after = 0;
  int64_t delta_bytes = 0;
  int64_t peak_bytes = 0;
  std::string note;  // one line explaining the delta (and a transient peak)
};

// A PhaseRow's fields, listed once, by the names its JSON and Python give
// them: f(name, &PhaseRow::member, one line saying what it is) for each, in
// the order shown.
template <typename F>
void for_each_phase_row_field(F&& f) {
  f("name", &PhaseRow::name, "the phase");
  f("iteration", &PhaseRow::iteration, "its iteration (1 for parameters)");
  f("live_bytes_after", &PhaseRow::live_after, "live bytes when the phase ended");
  f("delta_bytes", &PhaseRow::delta_bytes, "live bytes after less live bytes before");
  f("peak_bytes", &PhaseRow::peak_bytes, "the most live bytes during the phase");
  f("note", &PhaseRow::note, "one line explaining the delta (and a transient peak)");
}

struct ModuleRow {
  std::string path;
  int64_t activation_bytes = 0;  // saved for backward, at the end of forward
};

// What the CUDA caching allocator would make of the same step.
// The cuBLAS workspaces go through the caching allocator (torch 2.x), so
// they are counted in allocated and reserved: all of them in reserved, in
// allocated all but the other half of cuBLASLt's 2 MiB segment, which the
// step's own small blocks fill (Note [cuBLAS workspaces on the card]).
struct CudaEstimate {
  int64_t peak_allocated = 0;  // requests rounded as the allocator does
  int64_t peak_reserved = 0;   // segments held from the device
  int64_t workspace_bytes = 0; // fixed per-device extra, as reserved
};

// Note [cuBLAS workspaces on the card]
// torch keeps one cuBLAS workspace per (handle, stream), and one handle per
// thread: the step's forward runs on the caller's thread, its backward on
// autograd's device thread, so a step that multiplies matrices in both holds
// two. Each is 32 MiB on Hopper (sm_90) and 8 MiB + 128 KiB on older cards
// (CUBLAS_WORKSPACE_CONFIG changes it); a Linear with a bias adds
// cuBLASLt's 1 MiB, a small block whose 2 MiB segment the step's small
// blocks share (Note [cuBLASLt's block in the replay]). All stay
// allocated from their first use on. Seen on an H200 (torch 2.11, CUDA 13):
// 32 MiB at the forward's first Linear, 1 MiB beside it, 32 MiB at the
// backward's first matmul, and nothing else persistent
// (bench/gpu/record_snapshots.py). The default is Hopper's, the largest:
// on an older card memfit then counts 48 MiB too many rather than too few.
constexpr int64_t kCublasWorkspacePerHandleBytes = int64_t{32} << 20;
constexpr int64_t kDefaultCudaWorkspaceBytes =
    2 * kCublasWorkspacePerHandleBytes + (int64_t{2} << 20);

// The caching allocator replayed on the step's events, with a fixed
// `workspace_bytes` per device (Note [Caching allocator rules], allocator_model.cpp).
CudaEstimate estimate_cuda(const Timeline& timeline,
                           int64_t workspace_bytes = kDefaultCudaWorkspaceBytes);

// The same step on each of world_size ranks (Note [One rank's memory under
// data parallelism], data_parallel.cpp).
struct DataParallelEstimate {
  DataParallelSetup setup;
  std::vector<RankPeak> per_rank;  // one per Sharding, in enum order
};

// Read as a table or JSON by render/report_text.h.
struct Report {
  std::string model;
  int64_t batch = 0;
  std::string optimizer;  // a built-in's name (optimizers.h) or a Python class name
  std::string mode;       // device | cpu | meta (the mode used, after any fallback)
  // Where the figures were measured, in words ("measured on the simulated
  // device (8.00 MiB budget)", "rehearsed on the CPU"); "" says nothing.
  std::string truth;
  int64_t peak_bytes = 0;
  std::string peak_phase;
  int peak_iteration = 0;
  std::string peak_op;
  int64_t parameter_bytes = 0;
  std::vector<PhaseRow> phases;
  std::array<int64_t, kNumCategories> categories_at_peak{};
  std::vector<ModuleRow> modules;  // largest first
  std::vector<std::string> notes;  // e.g. "meta mode unavailable: ..."
  std::optional<CudaEstimate> cuda;
  std::optional<DataParallelEstimate> data_parallel;

  // The peak a memory budget is held against: on a CUDA target (cuda
  // estimated) the caching allocator's reserved bytes, which a card must
  // hold and which exceed the allocated bytes; else the recorded peak.
  int64_t budget_peak() const {
    return cuda ? std::max(peak_bytes, cuda->peak_reserved) : peak_bytes;
  }
};

struct ReportInputs {
  std::string model;
  int64_t batch = 0;
  std::string optimizer;
  std::string mode;
};

// Reads a timeline whose phases are named as above. Throws
// std::invalid_argument if it holds no events.
Report make_report(const Timeline& timeline, const ReportInputs& inputs);

}  // namespace memfit
