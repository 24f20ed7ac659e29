// What a CUDA card's kernels allocate inside an op beyond its outputs, from
// the op's shapes: the bytes a rehearsal on the host or on meta never sees.
// Plain arithmetic, no LibTorch (the torch layer reads the shapes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/model/timeline.h"

namespace memfit {

// The card a reduction is launched on: its multiprocessors and the threads
// each can hold decide how many blocks share one output. The default is an
// H100/H200 (sm_90: 132 SMs, 2048 threads each); see Note [A CUDA
// reduction's staging buffer] for why a larger card only takes more.
struct ReduceCard {
  int sm_count = 132;
  int max_threads_per_sm = 2048;
};

// The two blocks torch's reduction kernel (ATen's Reduce.cuh) takes through
// the caching allocator when one output's inputs are split across thread
// blocks; zero when they are not.
struct ReduceBuffers {
  int64_t buffer = 0;      // partial results, one accumulator per block and lane
  int64_t semaphores = 0;  // one int per block column
  int64_t total() const { return buffer + semaphores; }
};

// A sum or mean over `reduced_dims` of a contiguous tensor of `sizes`, with
// elements of `element_bytes` accumulated in `acc_bytes` (float: 4 for
// float, half and bfloat16; 8 for double). See Note [A CUDA reduction's
// staging buffer] (card_kernels.cpp). Dims may be negative; an empty
// `reduced_dims` reduces all of them.
ReduceBuffers cuda_reduce_buffers(const std::vector<int64_t>& sizes,
                                  std::vector<int64_t> reduced_dims,
                                  int64_t element_bytes, int64_t acc_bytes,
                                  ReduceCard card = {});

// A convolution's operands, in elements.
struct ConvShape {
  int64_t x_numel = 0;   // the input
  int64_t dy_numel = 0;  // the output's gradient (for a forward, the output)
  int64_t w_numel = 0;   // the weight
};

// A bound of the workspaces cuDNN's engines took in a convolution's
// backward on an H200: exact for Winograd's, above the others. Not added to
// a card's rehearsal: See Note [cuDNN's convolution workspace]
// (card_kernels.cpp) for the measurements and why.
int64_t cudnn_conv_backward_workspace(const ConvShape& c);
// The same for a convolution's forward, from x, its output y (dy_numel) and
// w: above what each forward took on an H200 (See Note [cuDNN's convolution
// workspace]).
int64_t cudnn_conv_forward_workspace(const ConvShape& c);

// The op name of the empty temporary a card rehearsal records as each
// convolution's forward and each backward returns: where its workspaces
// would be taken.
inline constexpr const char* kCudnnWorkspaceMark = "cuDNN convolution's workspace (not counted)";

// What cuDNN's workspaces may add to a rehearsed step's peak: See Note
// [cuDNN's workspace at the step's peak] (card_kernels.cpp).
struct ConvWorkspaceAtPeak {
  int convolutions = 0;  // convolution forwards and backwards recorded; 0: none
  int64_t bytes = 0;     // the most the step's peak can rise by
  std::string phase;     // where that bound is reached ("" for none)
  int64_t batch = 0;     // the step's batch, said in the note; 0: not said
};

// From `timeline`, whose kCudnnWorkspaceMark temporaries are, in order, the
// convolution forwards and backwards whose bounds
// (cudnn_conv_forward_workspace, cudnn_conv_backward_workspace) are
// `bounds`. A timeline holding another number of marks than bounds (a mark
// left out) gets the largest bound, which holds wherever the peak is.
ConvWorkspaceAtPeak cudnn_workspace_at_peak(const Timeline& timeline,
                                            const std::vector<int64_t>& bounds);

// The report's note saying so; "" without convolutions.
std::string cudnn_workspace_note(const ConvWorkspaceAtPeak& w);
// The bytes such a note says, read back from a report's notes; -1 where no
// note says them (no convolution recorded, or not a card's rehearsal).
int64_t cudnn_workspace_in_notes(const std::vector<std::string>& notes);

}  // namespace memfit
