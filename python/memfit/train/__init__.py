"""Training with a batch that does not fit: memfit.Trainer's micro-batches,
and its data-parallel form."""

__all__: list = []
