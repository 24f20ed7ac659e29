// What a CUDA card's kernels take inside an op and the host's do not (a
// reduction's staging buffer), added to a rehearsal for a card: See Note
// [What a card adds inside an op].
#pragma once

#include <cstdint>

namespace memfit {
class Recorder;
}

namespace memfit::impl {

// Note [What a card adds inside an op]
// A step rehearsed on the host or on meta records what its kernels allocate;
// a card's kernels take more inside some ops. For a card target the recorder
// adds the staging buffer of a sum or mean split across thread blocks (Note
// [A CUDA reduction's staging buffer], card_kernels.cpp) from the op's
// shapes, as a temporary of the op recorded as it returns (its output live,
// as on the card, where the buffer is allocated after the output and freed
// before the op returns), named after what takes it. cuDNN's convolution
// workspace is not added: See Note [cuDNN's convolution workspace] for why.

// Makes `r` receive those transients (Recorder::record_transient) from the
// ops every thread runs; returns a handle for remove_card_ops.
uint64_t add_card_ops(Recorder* r);
void remove_card_ops(uint64_t handle);

}  // namespace memfit::impl
