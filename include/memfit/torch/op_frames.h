// The ops open on each thread, seen through at::RecordFunction: names for
// attribution and frames for telling temporaries from outputs.
#pragma once

#include <cstdint>

namespace memfit::impl {

// Note [Temporaries are freed inside their op]
// An allocation made while an aten op or autograd node runs, and freed before
// that op returns, is a temporary of the op (a workspace, an intermediate of a
// composite op). One that outlives it is an output. Frames are counted per
// outermost op on a thread: an allocation in aten::mm called by aten::linear,
// freed before linear returns, is linear's temporary. User scopes
// (torch.autograd.profiler.record_function, which wraps e.g. Python's
// Optimizer.step) are not frames: they would turn a whole step's activations
// into "temporaries".

// Serial of the outermost op open on this thread; 0 when none.
uint64_t outermost_op_frame();
// Whether `frame` is still open on this thread.
bool is_open_op_frame(uint64_t frame);
// Note [Meta kernels allocate only their outputs]
// On the meta device torch implements many ops' Meta kernels in Python by
// decomposition (torch._refs, torch/_meta_registrations.py): log_softmax
// becomes amax, sub, exp, sum, log, each allocating a meta tensor that the
// real kernel never holds. A step on meta would count those intermediates
// (+5% in the forward of a small Llama). So an op with a Meta kernel of its
// own (not a CompositeImplicitAutograd op, which decomposes on every device
// and whose intermediates are real) is one frame: what its kernel allocates
// and frees again before it returns is no memory of the real step, and the
// recorder drops it (Recorder::drop_meta_kernel_intermediates).

// Note [A card's rehearsal drops the host's convolution temporaries]
// A step for a CUDA card rehearsed on the host runs the host's convolution
// kernels, and oneDNN's take scratchpads and reorders of the input, weight
// and gradients into its blocked layouts, freed before the op returns. Their
// size is the host CPU's: in two steps of resnet18 x 16 the convolution
// backwards allocate 731 MiB of them under oneDNN's AVX2 kernels and 280 MiB
// under its AVX-512 ones, which put the predicted peak +19.5% or -2.9% off
// the H200's. A card never
// has them: what cuDNN takes inside the op is its workspace, said apart
// (Note [cuDNN's workspace at the step's peak], card_kernels.cpp). So for a
// card target (Recorder::add_card_kernels) an op of the convolution family
// is one frame, as a Meta kernel is: what it allocates on the host and frees
// before it returns is dropped, its outputs kept. The family: a name with
// "convolution" (aten::convolution and convolution_backward, through which
// every convolution dispatches, and the backends' kernels under them), not
// CompositeImplicitAutograd (_convolution_mode pads the input of a "same"
// convolution, on a card too). Only that family: widened to every op with a
// kernel of its own, mlp's and gpt's H200 predictions stay exact, but cnn's
// falls from -4.9% to -6.5% of the card's (its peak is in the backward):
// what other host kernels free inside the op is not the host's alone. A
// card's own in-op memory is added from the shapes (Note [What a card adds
// inside an op], card_ops.h).

// The kernels whose intermediates a recorder can drop: See the Notes above.
enum class KernelFrames : uint8_t {
  kMeta,             // ops with a Meta kernel of their own
  kHostConvolution,  // the convolution family, run on the host for a card
};

// Serial of the outermost op open on this thread that is a frame of
// `which`; 0 when none.
uint64_t kernel_frame(KernelFrames which);
// Note [Memory that depends on the batch's values]
// memfit measures a batch larger than the user's example by repeating its
// samples (resize_batch): faithful where memory follows shapes alone. Some
// ops size their output by the values: torch.unique, nonzero (and boolean
// indexing, which calls it), masked_select, bincount, repeat_interleave, and
// sparse gradients (nn.Embedding(sparse=True): coalescing keeps a row per
// distinct id). Repeated samples bring no new values, so a probe or a
// verification above the example's batch allocates less there than the
// user's data would: under SparseAdam, find_batch_size answered 507,
// verified, where plain steps on fresh ids ran out above 164. The recorder
// is told each time such an op runs (set_value_sized_listener), and the
// fit says so, its answer above the example unverified.
using ValueSizedListener = void (*)(const char* op_name);
// `listener` is called with the op's name whenever one of those ops begins
// on any thread (nullptr: none). Each Recorder sets it, always to the same
// function; it must be thread-safe.
void set_value_sized_listener(ValueSizedListener listener);

// Name of the innermost op open on this thread; nullptr when none. Valid only
// while that op runs.
const char* innermost_op_name();

// Registers the RecordFunction callback that maintains the frames; returns
// its handle for remove_op_frame_callback.
uint64_t add_op_frame_callback();
void remove_op_frame_callback(uint64_t handle);

}  // namespace memfit::impl
