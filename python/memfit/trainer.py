"""memfit.Trainer: the batch you asked for, in micro-batches that fit."""

import torch

from . import _memfit
from .batching import batch_size, map_tensors
from .device import to_bytes
from .distributed import DistributedStep, batch_signature, is_distributed
from .profile import _call, _compute_loss


def coupled_layers(model):
    """Paths of the layers that mix the samples of a batch in training mode
    (BatchNorm); splitting the batch changes what they compute."""
    return [
        path or type(m).__name__
        for path, m in model.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
    ]


def _reduction(loss_fn, reduction):
    if reduction is not None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"[Trainer] reduction must be 'mean' or 'sum', got {reduction!r}")
        return reduction
    r = getattr(loss_fn, "reduction", "mean")
    if r not in ("mean", "sum"):
        raise ValueError(
            f"[Trainer] the loss reduces with {r!r}; memfit weights micro-batches for "
            f"'mean' or 'sum' losses: pass reduction= to say which yours is"
        )
    return r


class Trainer:
    """Run one optimizer step on a batch of any size under a memory budget.

        trainer = memfit.Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(),
                                 budget="4GiB")
        report = trainer.step(inputs, target)   # never OOMs while 1 sample fits

    The batch is split along `batch_dim` into micro-batches that fit; each
    micro-batch's loss is weighted (mean: its share of the batch; sum: 1) so
    the accumulated gradients equal the full batch's; then one optimizer step
    and zero_grad(set_to_none=True). An OOM in a micro-batch halves it and
    redoes it: gradients already accumulated stay, no sample is dropped or
    counted twice, and later steps start from the size that worked.

    - budget: "16GiB", bytes, or None. On CPU it simulates a device of that
      size (the model's parameters count); on CUDA leave it None: the card
      is the limit.
    - coupled: "error" (default) refuses to split a model with BatchNorm in
      training mode, naming the layers; "allow" splits anyway (each
      micro-batch uses its own statistics).
    - reduction: "mean" or "sum"; read from loss_fn.reduction when omitted.
    - split=False runs the batch whole and lets an OOM out.

    A DistributedDataParallel model runs distributed: each rank splits its own
    batch, the ranks agree on the micro-batch to start from, and the gradients
    are synced once, before the optimizer step: the mean of the ranks'
    local-batch gradients, as DDP computes. step() then returns a
    DistributedStepReport (rank, world_size, local_batches, global_batch,
    start_micro_batch), and a failed collective or rank raises
    memfit.DistributedError. See Note [Micro-batches under
    DistributedDataParallel] (distributed.py).
    """

    def __init__(self, model, optimizer, loss_fn=None, budget=None, batch_dim=0,
                 target_batch_dim=0, coupled="error", reduction=None, split=True,
                 micro_batch=0):
        if coupled not in ("error", "allow"):
            raise ValueError(f"[Trainer] coupled must be 'error' or 'allow', got {coupled!r}")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.batch_dim = batch_dim
        self.target_batch_dim = target_batch_dim
        budget = None if budget is None else to_bytes(budget, "Trainer")
        self._dist = DistributedStep(model) if is_distributed(model) else None
        self._module = model.module if self._dist else model
        self._native = _memfit.Trainer(
            [p for p in model.parameters() if p.requires_grad],
            self._dist.optimizer_step(optimizer.step) if self._dist else optimizer.step,
            budget,
            split,
            coupled == "allow",
            _reduction(loss_fn, reduction) == "mean",
            micro_batch,
            coupled_layers(self._module),
        )

    @property
    def micro_batch(self):
        """The micro-batch size the next step starts from (0: whole batch)."""
        return self._native.micro_batch

    def set_budget(self, budget):
        """Change the budget (bytes, "8GiB", or None) for the next steps."""
        self._native.set_budget(None if budget is None else to_bytes(budget, "Trainer"))

    def step(self, inputs, target=None):
        """One optimizer step on the whole batch; returns a StepReport with
        batch, micro_batch, micro_batches, ooms_recovered, samples, loss,
        peak_bytes and chunks."""
        if self._dist is not None:
            return self._distributed_step(inputs, target)
        # The native step sets the parameters' gradients to None before and
        # after (see Note [The order of a training iteration]).
        return self._native.step(self._batch(inputs, target), self._chunk_loss(inputs, target))

    def _batch(self, inputs, target):
        n = batch_size(inputs, self.batch_dim, "Trainer.step")
        if target is not None:
            nt = batch_size(target, self.target_batch_dim, "Trainer.step target")
            if nt != n:
                raise ValueError(
                    f"[Trainer.step] inputs hold {n} samples but the target holds "
                    f"{nt}: they must hold the same samples"
                )
        return n

    def _chunk_loss(self, inputs, target):
        model, loss_fn, bd, tbd = self._module, self.loss_fn, self.batch_dim, self.target_batch_dim

        def chunk_loss(start, count):
            x = map_tensors(inputs, lambda t: t.narrow(bd, start, count))
            y = None if target is None else map_tensors(target, lambda t: t.narrow(tbd, start, count))
            return _compute_loss(_call(model, x), y, loss_fn)

        return chunk_loss

    def _distributed_step(self, inputs, target):
        try:
            n = self._batch(inputs, target)
        except ValueError as e:
            n = e  # the other ranks must hear of it, not wait for this rank
        return self._dist.step(self._native, n, batch_signature(inputs, target),
                               self._chunk_loss(inputs, target))
