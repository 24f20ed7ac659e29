"""memfit inside the trainers people use. Each submodule imports its
framework when it is imported, never before: `import memfit` needs torch
alone.

    memfit.integrations.lightning      FitBatchSize, MemoryReport, MemoryDoctor
    memfit.integrations.transformers   FitBatchSize (the Hugging Face Trainer)

accelerate needs no module: memfit.auto_batch_size takes an
accelerator.prepare()d model and optimizer (and accelerator=).

A new trainer's callback is written with the names below (memfit.integrations.api,
which says what each is for; docs/integrations.md walks through one)."""

from .api import (BatchPlan, LoopStep, Size, UserStep, batch_bytes_per_sample, batch_size,
                  check_options, count, example_of, host_memory, kept_rng, plan_batch,
                  plan_eval_batch, sequence_length, tell_change, tensors_in)

__all__ = ["BatchPlan", "LoopStep", "Size", "UserStep", "batch_bytes_per_sample", "batch_size",
           "check_options", "count", "example_of", "host_memory", "kept_rng", "plan_batch",
           "plan_eval_batch", "sequence_length", "tell_change", "tensors_in"]
