"""What an integration is written with: the door into memfit for a
trainer's callback (Lightning's, Hugging Face's, or a third: Ignite,
Accelerate's own loop). The two callbacks memfit ships (lightning.py,
transformers.py) use this module and nothing below it; docs/integrations.md
walks through adding a trainer.

    UserStep         the trainer's own step as memfit's: step(model, batch)
                     returns the loss; memfit runs backward and the optimizer
    LoopStep         a UserStep and how the loop frees gradients around it
    plan_batch       the batch (and accumulation) the loop can run: a BatchPlan
    plan_eval_batch  the evaluation batch, sized apart
    example_of       a few samples of the loader's first batch, on the host
    kept_rng         a block after which the random generators are where they
                     were: rehearsing the step must not change the run
    host_memory      a block whose allocations are the host's, outside a
                     simulated device's budget, as CPU RAM beside a GPU
    check_options    refuses a bad budget or device when the callback is made
    tell_change      one warning line when the callback changed the batch
    count            an option as an int >= 1, refused otherwise
    batch_size       the samples a batch holds along its batch dimension
    tensors_in       every tensor of a batch (tuples, dicts, dataclasses)
    sequence_length  the length a batch's tensors share along seq_dim
    batch_bytes_per_sample  what the loader's batches hold per sample
    Size             the type of a budget: 1 << 30, "16GiB"
"""

from .._step.batching import batch_size, count, sequence_length, tensors_in
from ..memory.device import host_memory
from .._step.hints import Size
from .._step.user_state import kept_rng
from .._step.user_step import UserStep
from .sizing import (BatchPlan, LoopStep, batch_bytes_per_sample, check_options, example_of,
                     plan_batch, plan_eval_batch, tell_change)

__all__ = ["BatchPlan", "LoopStep", "Size", "UserStep", "batch_bytes_per_sample", "batch_size",
           "check_options", "count", "example_of", "host_memory", "kept_rng", "plan_batch",
           "plan_eval_batch", "sequence_length", "tell_change", "tensors_in"]
