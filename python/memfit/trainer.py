"""memfit.Trainer: the batch you asked for, in micro-batches that fit."""

import torch

from . import _memfit
from .batching import batch_size, count, map_tensors, tensors_in
from .device import to_bytes
from .distributed import DistributedStep, batch_signature, is_distributed
from .profile import _call, _compute_loss, check_loss_trains, check_optimizer


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

    The parameters that train and the BatchNorm layers in training mode are
    read at each step: freezing a layer or putting it in eval mode after
    the Trainer was made counts. A forward that writes into its inputs in
    place (x.mul_(2)) changes each sample once, as one eager step would; a
    micro-batch that ran out of memory after such a write is not redone
    (the write would count twice): step() raises ValueError saying so.

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
        check_optimizer(model, optimizer, "Trainer", instance_only=True)
        micro_batch = count(micro_batch, "Trainer", "micro_batch", minimum=0)
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.batch_dim = batch_dim
        self.target_batch_dim = target_batch_dim
        budget = None if budget is None else to_bytes(budget, "Trainer")
        self._dist = DistributedStep(model) if is_distributed(model) else None
        self._module = model.module if self._dist else model
        self._options = (
            self._dist.optimizer_step(optimizer.step) if self._dist else optimizer.step,
            split,
            coupled == "allow",
            _reduction(loss_fn, reduction) == "mean",
        )
        self._shape = None
        self._native_now(budget, micro_batch)

    def _native_now(self, budget=None, micro_batch=0):
        """The native Trainer over the parameters that train now and the
        layers that mix samples now; rebuilt, keeping its budget and
        micro-batch, when either changed since the last step."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        layers = coupled_layers(self._module)
        shape = ([id(p) for p in params], layers)
        if shape != self._shape:
            if self._shape is not None:
                budget, micro_batch = self._native.budget, self._native.micro_batch
            step, split, allow, mean = self._options
            self._native = _memfit.Trainer(params, step, budget, split, allow, mean,
                                           micro_batch, layers)
            self._shape = shape
        return self._native

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
        native = self._native_now()
        if self._dist is not None:
            return self._distributed_step(native, inputs, target)
        # The native step sets the parameters' gradients to None before and
        # after (see Note [The order of a training iteration]).
        return native.step(self._batch(inputs, target), self._chunk_loss(inputs, target))

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
        # The micro-batches are views of the user's tensors: a forward that
        # writes into them changes each sample once, as an eager step would.
        # A micro-batch is only ever asked for twice when it is redone after
        # an OOM: if the failed attempt wrote into it (the tensors' version
        # counters moved), the redo would write twice, so it is refused.
        users = tensors_in(inputs) + tensors_in(target)
        written = []  # [start, end) of the micro-batches whose forward wrote

        def chunk_loss(start, n):
            for a, b in written:
                if a < start + n and start < b:
                    raise ValueError(
                        f"[Trainer.step] samples {a}..{b - 1} ran out of memory after the "
                        f"forward or loss wrote into them in place (their tensors' version "
                        f"changed); redoing them would apply that write twice. Write out of "
                        f"place (x = x * 2, not x.mul_(2)), or pass a micro_batch= that fits"
                    )
            versions = [t._version for t in users]
            try:
                x = map_tensors(inputs, lambda t: t.narrow(bd, start, n))
                y = None if target is None else map_tensors(
                    target, lambda t: t.narrow(tbd, start, n))
                loss = _compute_loss(_call(model, x), y, loss_fn)
            finally:
                if any(t._version != v for t, v in zip(users, versions)):
                    written.append((start, start + n))
            check_loss_trains(loss, model, "Trainer.step")
            return loss

        return chunk_loss

    def _distributed_step(self, native, inputs, target):
        try:
            n = self._batch(inputs, target)
        except ValueError as e:
            n = e  # the other ranks must hear of it, not wait for this rank
        return self._dist.step(native, n, batch_signature(inputs, target),
                               self._chunk_loss(inputs, target))
