#include "memfit/core/model/card_kernels.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "memfit/core/model/units.h"

namespace memfit {
namespace {

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t last_pow2(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// One dimension of the reduction's iteration, innermost first.
struct IterDim {
  int64_t size;
  int64_t stride;  // in elements of the input
  bool reduced;
};

}  // namespace

// Note [A CUDA reduction's staging buffer]
// torch's CUDA reductions (sum, mean, ... : ATen's Reduce.cuh) choose a
// launch (ReduceConfig) from the iteration's shape. The iteration puts the
// reduced dimensions first, each group innermost first, and merges
// neighbours that are contiguous. When the innermost dimension is reduced,
// lanes of a warp split one output's inputs; otherwise they split outputs,
// four at a time where the sizes allow (output_vec_size). Warps of a block
// split the inputs too when each thread still has at least
// min(16 x block height, 256) of them. Then, if a thread would still sum 256
// or more values and the grid is no larger than the card holds at once,
// ctas_per_output = max(min(ceil(target grid / grid), ceil(values / 16)),
// ceil(values / 256)) blocks share each output, and the kernel allocates,
// through the caching allocator, a buffer of one accumulator per output and
// block (times block.x x output_vec_size lanes when lanes split outputs) and
// an int semaphore per block column, both freed as the op returns. A bias's
// gradient, the sum over the batch of a [batch, 512] float gradient, is
// such a reduction: 512 outputs in 4 block columns, and about 8 bytes of
// buffer per input element (58 MiB at batch 14712 on an H200, where a fit
// that left it out ran out of memory). A card with more multiprocessors
// only raises min(...) towards ceil(values / 16), so the H200's figure is
// the smaller card's bound too. A reduction torch splits for 32-bit
// indexing (over 2^31 elements) is taken as one.
ReduceBuffers cuda_reduce_buffers(const std::vector<int64_t>& sizes,
                                  std::vector<int64_t> reduced_dims,
                                  int64_t element_bytes, int64_t acc_bytes,
                                  ReduceCard card) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  std::vector<bool> is_reduced(sizes.size(), reduced_dims.empty());
  for (int64_t d : reduced_dims) {
    const int64_t k = d < 0 ? d + ndim : d;
    if (k < 0 || k >= ndim) {
      throw std::invalid_argument("[cuda_reduce_buffers] dim " + std::to_string(d) +
                                  " out of range for " + std::to_string(ndim) + " dims");
    }
    is_reduced[k] = true;
  }
  // Innermost first, size-1 dims dropped, reduced ones first (stable).
  std::vector<IterDim> dims;
  int64_t stride = 1;
  for (int64_t d = ndim - 1; d >= 0; --d) {
    if (sizes[d] == 0) return {};
    if (sizes[d] != 1) dims.push_back({sizes[d], stride, is_reduced[d]});
    stride *= sizes[d];
  }
  std::stable_partition(dims.begin(), dims.end(), [](const IterDim& d) { return d.reduced; });
  std::vector<IterDim> merged;
  for (const IterDim& d : dims) {
    if (!merged.empty() && merged.back().reduced == d.reduced &&
        merged.back().stride * merged.back().size == d.stride) {
      merged.back().size *= d.size;
    } else {
      merged.push_back(d);
    }
  }
  int64_t num_outputs = 1, inputs_per_output = 1, num_reduce_dims = 0;
  for (const IterDim& d : merged) {
    (d.reduced ? inputs_per_output : num_outputs) *= d.size;
    num_reduce_dims += d.reduced ? 1 : 0;
  }
  if (merged.empty() || num_reduce_dims == 0) return {};
  const int64_t iter_ndim = static_cast<int64_t>(merged.size());
  const bool on_fastest = num_reduce_dims == iter_ndim ||
                          merged[0].stride < merged[num_reduce_dims].stride;
  int64_t dim0 = on_fastest ? inputs_per_output : num_outputs;
  int64_t dim1 = on_fastest ? num_outputs : inputs_per_output;
  const int64_t fastest_stride = on_fastest ? merged[0].stride : merged[num_reduce_dims].stride;
  int64_t output_vec_size = 1;
  if (fastest_stride == 1) {
    constexpr int64_t kInputVecSize = 4;
    if (on_fastest && dim0 > 128 && num_reduce_dims == 1) {
      dim0 /= kInputVecSize;
    } else if (!on_fastest) {
      // get_output_vec_size: 4, halved until it divides the outputs'
      // innermost size and every other input stride (aligned storage).
      output_vec_size = 4;
      auto fit = [&](int64_t n) {
        while (n % output_vec_size != 0) output_vec_size /= 2;
      };
      fit(merged[num_reduce_dims].size);
      for (int64_t i = 0; i < iter_ndim; ++i) {
        if (i != num_reduce_dims) fit(merged[i].stride);
      }
      dim0 /= output_vec_size;
    }
  }
  // set_block_dimension: 512 threads at most (256 for complex double).
  const int64_t max_threads = (acc_bytes > 8 ? 256 : 512) / output_vec_size;
  const int64_t dim0_pow2 = dim0 < max_threads ? last_pow2(dim0) : max_threads;
  const int64_t dim1_pow2 = dim1 < max_threads ? last_pow2(dim1) : max_threads;
  int64_t block_width = std::min<int64_t>(dim0_pow2, 32);
  const int64_t block_height = std::min(dim1_pow2, max_threads / block_width);
  block_width = std::min(dim0_pow2, max_threads / block_height);
  const int64_t num_threads = block_width * block_height;

  int64_t step_input = 1, step_output = 1;
  const bool block_x_reduce = on_fastest;
  (on_fastest ? step_input : step_output) *= block_width;
  auto values_per_thread = [&] { return div_up(inputs_per_output, step_input); };
  bool warps_split_input = false;
  if (values_per_thread() >= std::min<int64_t>(block_height * 16, 256)) {
    warps_split_input = true;
    step_input *= block_height;
  } else {
    step_output *= block_height;
  }
  const int64_t target_grid = int64_t{card.sm_count} * (card.max_threads_per_sm / num_threads);
  const int64_t grid_x = div_up(num_outputs / output_vec_size, step_output);
  const int64_t values = values_per_thread();
  if (!warps_split_input || values < 256 || grid_x > target_grid) return {};
  const int64_t ctas = std::max(std::min(div_up(target_grid, grid_x), div_up(values, 16)),
                                div_up(values, 256));
  if (ctas <= 1) return {};
  (void)element_bytes;  // the input's width changes no launch choice above
  ReduceBuffers r;
  r.buffer = acc_bytes * num_outputs * ctas * (block_x_reduce ? 1 : block_width * output_vec_size);
  r.semaphores = 4 * grid_x;
  return r;
}

// Note [cuDNN's convolution workspace]
// A convolution on a card runs cuDNN once in its forward and twice in its
// backward, for the input's gradient and for the weight's, each call with a
// workspace it takes from the caching allocator and frees before the next
// call. Which engine runs, and so how much it takes, torch leaves to cuDNN:
// without torch.backends.cudnn.benchmark it tries cuDNN's heuristic ranking
// in order and runs the first engine whose workspace it can allocate (one
// that runs out of memory drops to the next, down to engines that need
// none). So on a free card the workspace is the top engine's, and under a
// budget a smaller one runs: a workspace never makes a step run out by
// itself.
// What the engines took on an H200 (cuDNN 9.19; resnet18 at 16 x 64x64 and
// the cnn at 32 x 32x32, 14 convolutions): in the backward, the input's
// gradient, x + dy + w bytes (+16) or nothing; the weight's gradient, for
// every 3x3 stride-1 convolution where Winograd's non-fused engine ran,
// exactly its transforms in float, 4 B x (9/4 (x + dy) + 4 w) (each 4x4
// output tile of x and dy becomes 6x6, each 3x3 filter 6x6): 5.06 MiB at 64
// channels and 16x16, 10.13 MiB at 256 and 4x4. Every other engine took less
// than that formula, which cudnn_conv_backward_workspace returns: the bound
// of a backward's two workspaces.
// A forward's Winograd transforms the same tiles, x's and y's (4x4 -> 6x6)
// and each 3x3 filter (-> 6x6), so cudnn_conv_forward_workspace is the same
// formula with y, the output, in place of dy. What each forward took in the
// H200 fixtures (both iterations alike), against that bound: cnn_adam, the
// stem (3 -> 32, 32x32) none of 10335744 B; 32 -> 32 at 32x32, 4231184 of
// 19021824 (twice); 32 -> 64 stride 2, 4268048 of 14450688; 64 -> 64 at
// 16x16, 4341776 of 10027008; 64 -> 128 stride 2, 3440656 of 8257536;
// 128 -> 128 at 8x8, 2686992 of 7077888; the 1x1 shortcuts none. resnet18_adam:
// the 7x7 stem, 5018384 of 11357184; 64 -> 64 at 16x16, 1196048 of 5308416
// (x4); 64 -> 128 stride 2, 1867792 of 4718592; 128 -> 128 at 8x8, 1114128
// of 4718592 (x3); 128 -> 256 stride 2, 1703952 of 6488064; 256 -> 256 at
// 4x4, 2884015 of 10616832 (x3); 256 -> 512 stride 2, 4980752 of 19759104;
// 512 -> 512 at 2x2, 9699631 (9.25 MiB) of 38338560 (x3); the 1x1
// shortcuts, 64 -> 128 none, 128 -> 256 786448 of 2293760, 256 -> 512
// 393232 of 2981888. Each is at most 44% of its bound (the stem's): the
// forwards' engines were not Winograd's non-fused one, and took less.
// Neither bound is added to a card's rehearsal: which engine the heuristic
// ranks first is not a function of the shapes (at 32 channels and 32x32 it
// chose one of 10.0 MiB where the backward's bound says 18.1 MiB, which puts
// the cnn's peak 4% over the card's), and at a 2x2 output (512 channels) the
// bound is 36.6 MiB where cuDNN's backward took 18 KiB (its forward 9.25
// MiB). The report says it as a range above the point instead: See Note
// [cuDNN's workspace at the step's peak].
int64_t cudnn_conv_backward_workspace(const ConvShape& c) {
  constexpr int64_t kFloat = 4;
  return kFloat * (9 * (c.x_numel + c.dy_numel) / 4 + 4 * c.w_numel);
}

// See Note [cuDNN's convolution workspace]: Winograd's forward transforms
// x's tiles, w and y's tiles as the backward does x's, w and dy's.
int64_t cudnn_conv_forward_workspace(const ConvShape& c) {
  return cudnn_conv_backward_workspace(c);
}

// Note [cuDNN's workspace at the step's peak]
// A convolution's workspaces are temporaries of its forward and of its
// backward: taken and freed inside the op, they raise the live bytes only
// while it runs. So what they can add to the step's peak is not the sum,
// nor simply the largest bound, but max over the convolutions' forwards and
// backwards of (live bytes there + its bound), less the peak without them,
// and never below 0: a bound reached where little is live (an early layer's
// backward while the step peaks in the optimizer's step) adds nothing,
// while a forward's can reach past every backward's (a frozen convolution
// has no backward; a late one's forward has every earlier activation
// live). The live bytes are read at the mark the rehearsal records as the
// op returns (aten::convolution's, the output live; convolution_backward's,
// the gradients live): the workspaces are taken before or beside those
// outputs, so this is the most that was live around them. With Note
// [cuDNN's convolution workspace]'s bound per convolution, the card's peak
// on a free card lies between the point prediction and the point plus this;
// capped, cuDNN takes less. It is said in the report's notes, not added: the
// point stays the point.
ConvWorkspaceAtPeak cudnn_workspace_at_peak(const Timeline& timeline,
                                            const std::vector<int64_t>& bounds) {
  ConvWorkspaceAtPeak w;
  w.convolutions = static_cast<int>(bounds.size());
  if (bounds.empty()) return w;
  const auto& events = timeline.events();
  int64_t live = 0, peak = 0, with = 0;
  size_t marks = 0;
  uint16_t phase = 0;
  for (const Event& e : events) {
    live += e.kind == EventKind::kAlloc ? e.bytes : -e.bytes;
    peak = std::max(peak, live);
    if (e.kind != EventKind::kAlloc || e.op == 0 ||
        timeline.op_name(e.op) != kCudnnWorkspaceMark) {
      continue;
    }
    if (marks < bounds.size() && live + bounds[marks] > with) {
      with = live + bounds[marks];
      phase = e.phase;
    }
    ++marks;
  }
  if (marks != bounds.size()) {  // a mark left out: the largest, anywhere
    w.bytes = *std::max_element(bounds.begin(), bounds.end());
    return w;
  }
  w.bytes = std::max<int64_t>(0, with - peak);
  if (phase != 0) w.phase = timeline.phase_name(phase);
  return w;
}

namespace {
constexpr const char* kCudnnNote = "cuDNN convolutions' workspaces are not counted: ";
}  // namespace

std::string cudnn_workspace_note(const ConvWorkspaceAtPeak& w) {
  if (w.convolutions == 0) return "";
  const std::string convs = std::to_string(w.convolutions) +
                            (w.convolutions > 1 ? " convolution forwards and backwards"
                                                : " convolution forward or backward");
  std::string s = kCudnnNote;
  if (w.batch > 0) s += "at batch " + std::to_string(w.batch) + ", ";
  s += "on a free card they can raise the peak allocated bytes by up to " +
       format_bytes(w.bytes) + " (" + std::to_string(w.bytes) + " B)";
  if (!w.phase.empty()) s += ", in " + w.phase;
  s += " (a bound over the " + convs +
       ", from the workspaces cuDNN's engines took on an H200; which engine runs is its "
       "heuristic's choice, so the card's peak can be anywhere from the prediction up to that); "
       "capped, cuDNN falls back to engines that need less";
  return s;
}

int64_t cudnn_workspace_in_notes(const std::vector<std::string>& notes) {
  for (const std::string& n : notes) {
    if (n.rfind(kCudnnNote, 0) != 0) continue;
    const size_t up = n.find("up to ");
    const size_t open = up == std::string::npos ? up : n.find(" (", up);
    const size_t close = open == std::string::npos ? open : n.find(" B)", open);
    if (close == std::string::npos) continue;
    try {
      return std::stoll(n.substr(open + 2, close - open - 2));
    } catch (const std::exception&) {
      continue;
    }
  }
  return -1;
}

}  // namespace memfit
