"""memfit inside the trainers people use. Each submodule imports its
framework when it is imported, never before: `import memfit` needs torch
alone.

    memfit.integrations.lightning      FitBatchSize, MemoryReport, MemoryDoctor
    memfit.integrations.transformers   FitBatchSize (the Hugging Face Trainer)

accelerate needs no module: memfit.auto_batch_size takes an
accelerator.prepare()d model and optimizer (and accelerator=)."""

__all__: list = []
