// What a CUDA card's kernels take inside an op and the host's do not (a
// reduction's staging buffer), added to a rehearsal for a card: See Note
// [What a card adds inside an op].
#pragma once

#include <cstdint>
#include <vector>

namespace memfit {
class Recorder;
}

namespace memfit::impl {

// Note [What a card adds inside an op]
// A step rehearsed on the host or on meta records what its kernels allocate
// (less the host's convolution temporaries: See Note [A card's rehearsal
// drops the host's convolution temporaries], op_frames.h); a card's kernels
// take more inside some ops. For a card target the recorder
// adds the staging buffer of a sum or mean split across thread blocks (Note
// [A CUDA reduction's staging buffer], card_kernels.cpp) from the op's
// shapes, as a temporary of the op recorded as it returns (its output live,
// as on the card, where the buffer is allocated after the output and freed
// before the op returns), named after what takes it. cuDNN's convolution
// workspace is not added: See Note [cuDNN's convolution workspace] for why.
// Each convolution's forward and each backward records an empty temporary
// instead (kCudnnWorkspaceMark) and its workspaces' bound, which the report
// says as a range: See Note [cuDNN's workspace at the step's peak].

// Makes `r` receive those transients (Recorder::record_transient) from the
// ops every thread runs; returns a handle for remove_card_ops.
uint64_t add_card_ops(Recorder* r);
void remove_card_ops(uint64_t handle);

// The bounds of the convolution forwards and backwards `r` recorded since
// add_card_ops, in the order of their marks (cudnn_conv_forward_workspace,
// cudnn_conv_backward_workspace), taken: a
// second call returns none. Take them before the recorder stops, which
// drops them.
std::vector<int64_t> take_conv_workspaces(const Recorder* r);

}  // namespace memfit::impl
