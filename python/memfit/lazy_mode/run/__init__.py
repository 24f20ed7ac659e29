"""Running recorded lazy computations: chunk size, chunked execution, loss
weighting, OOM recovery, and the values read back.

How a backward() on a lazy loss runs:

1. The loss is analysed: its "roots" are the nodes that reduce batched
   values (a mean, a sum, a loss function's reduction); the "tail" is what
   combines the roots into the loss (loss_a + 0.1 * loss_b). Each root says
   how chunk results add up: a sum adds, a mean weighs chunk i by c_i/B,
   cross_entropy/nll_loss with mean reduction by the share of counted
   targets (class weights and ignore_index included). The tail must be
   linear in the roots that need gradients (+, -, * and / by constants).
2. The chunk size: the largest c whose memory fits what is available
   (CUDA: free + cached; CPU: the simulated device's budget minus what is
   tracked now; no budget: one chunk), keeping a 10% margin. The memory of a
   chunk of c samples is measured once per graph signature by running
   forward+backward on the first 2 and 3 samples: on CPU the live bytes
   after every allocation are fitted as a + b*c (the step's peak may move
   from the gradients to the activations as c grows), on CUDA the peaks are
   (M0 + m*c). Later chunks run with the first chunk's .grad allocated, and
   are planned so.
3. Chunks run the recorded graph on narrowed leaves; each chunk's loss is
   sum_j G_j * w_ij * R_ij (G_j: d loss / d root j, w_ij the chunk weight), so
   accumulated gradients equal the full batch's.
4. An OOM in a chunk drops everything the chunk held, halves the chunk and
   redoes it. Parameters whose .grad the failed backward had already
   completed are left out of the redo (backward(inputs=the others)), so no
   sample is counted twice and none is dropped.
"""

from .run_info import LazyRun, last_run
from .values import read

__all__ = ["LazyRun", "last_run", "read"]
