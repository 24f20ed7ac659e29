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

// Serial of the outermost op open on this thread that runs a Meta kernel of
// its own; 0 when none.
uint64_t meta_kernel_frame();
// Name of the innermost op open on this thread; nullptr when none. Valid only
// while that op runs.
const char* innermost_op_name();

// Registers the RecordFunction callback that maintains the frames; returns
// its handle for remove_op_frame_callback.
uint64_t add_op_frame_callback();
void remove_op_frame_callback(uint64_t handle);

}  // namespace memfit::impl
