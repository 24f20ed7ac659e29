"""What FitBatchSize rehearses beside Lightning's training_step: a copy of
the module for the rehearsed steps to run on (See Note [Rehearsed on a copy
of the module]), and the validation the fit loop runs between training
steps (See Note [The validation inside the fit loop])."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import warnings
from typing import Any

import torch
import torch.optim.optimizer as optimizer_hooks

try:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers.logger import DummyLogger
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_setattr
except ImportError:
    import pytorch_lightning as pl
    from pytorch_lightning.loggers.logger import DummyLogger
    from pytorch_lightning.utilities.combined_loader import CombinedLoader
    from pytorch_lightning.utilities.model_helpers import is_overridden
    from pytorch_lightning.utilities.parsing import lightning_getattr, lightning_setattr

from .._native import native as _memfit
from .api import UserStep, batch_size, host_memory, kept_rng
from ..plan.strategies.eval_step import profile_eval

__all__: list = []


def quiet_log(pl_module):
    """LightningModule.log raises outside the fit loop's result collection:
    a rehearsed training_step logs nothing."""

    @contextlib.contextmanager
    def block():
        pl_module.log = pl_module.log_dict = lambda *a, **k: None
        try:
            yield
        finally:
            del pl_module.log, pl_module.log_dict

    return block()


# Note [Rehearsed on a copy of the module]
# The steps memfit rehearses (training_step at probes and verifying sizes,
# validation_step) run what the module's code does besides the step: a
# list of outputs, a counter (the tensors a module keeps, a metric's
# state, profile puts back itself). Run on the module itself, they left
# the rehearsal's 18 steps in the list of losses Lightning's docs keep for
# on_train_epoch_end, beside the loop's 3. So they run on a copy of the
# module: its parameters and buffers are the module's own (the rehearsal
# swaps copies in and puts the values back), and so are the trainer, the
# datamodule, datasets and loaders and any tensor of 1 MiB or more kept as
# an attribute (a table, not a metric's state); the rest, lists, metrics,
# counters and generators, is the copy's. A module that cannot be copied
# is rehearsed itself.
# A LightningModule's copy forgets its trainer (its __getstate__): a
# training_step reading self.trainer (current_epoch, a schedule) raised
# "not attached to a `Trainer`" in the rehearsal where Lightning's loop
# trains. The copy is given the trainer seen through a _RehearsedTrainer:
# read through, but its loggers write nowhere (a step that logs an image
# through self.logger.experiment at batch_idx 0 would log it at each
# rehearsed step) and what a step sets on it stays on the view.

_SHARED_FROM = 1 << 20


class _RehearsedTrainer:
    """The fit's trainer as a rehearsed step sees it: See Note [Rehearsed
    on a copy of the module]."""

    def __init__(self, trainer):
        self.__dict__["trainer_"] = trainer
        self.logger = None if trainer.logger is None else DummyLogger()
        self.loggers = [DummyLogger() for _ in trainer.loggers]

    def __getattr__(self, name):
        return getattr(self.__dict__["trainer_"], name)


def _shared(trainer, pl_module, owners):
    """The deepcopy memo keeping what a copy shares with the run: the
    trainer, the module's parameters and buffers, and the datasets, loaders
    and tensors of 1 MiB or more that `owners` hold as attributes."""
    shared = [trainer, trainer.datamodule, *pl_module.parameters(), *pl_module.buffers()]
    for m in owners:
        shared += [v for v in vars(m).values()
                   if isinstance(v, (torch.utils.data.Dataset, torch.utils.data.DataLoader))
                   or (isinstance(v, torch.Tensor) and v.nbytes >= _SHARED_FROM)]
    return {id(v): v for v in shared if v is not None}


def side_copy(trainer, pl_module):
    """A copy of the module for the rehearsed steps: See Note [Rehearsed on
    a copy of the module]."""
    memo = _shared(trainer, pl_module, pl_module.modules())
    try:
        with host_memory():
            side = copy.deepcopy(pl_module, memo)
    except Exception:  # a lock, a compiled module: not copyable
        return pl_module
    _uncompiled(side)
    if isinstance(side, pl.LightningModule) and pl_module._trainer is not None:
        seen = trainer if isinstance(trainer, _RehearsedTrainer) else _RehearsedTrainer(trainer)
        side.trainer = seen  # the module's LightningModule children too
    return side


# Note [A module compiled whole]
# trainer.fit(torch.compile(module)) hands Lightning an OptimizedModule,
# which it unwraps (from_compiled): the module's forward and steps become
# instance attributes, each dynamo's wrapper of the module's own bound
# method. A copy shares those wrappers (a function is copied as itself), so
# the copy's training_step ran the user's module: the losses it keeps held
# the rehearsal's steps beside the loop's. Wrapped again over the copy's
# methods, each copy would compile anew (the code's cache has a limit,
# after which the user's own steps run eager), and the second rehearsed
# step's compile was taken for what a step keeps (1.75 MiB a sample: "no
# batch fits" where the loop runs 577). So the copy runs its own methods
# uncompiled: eager, which holds at least what the compiled step holds
# (557 where the loop runs 577).

_COMPILED = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def _uncompiled(side):
    """The copy's steps its own, uncompiled: See Note [A module compiled
    whole]."""
    ctx = getattr(side, "_compiler_ctx", None)
    if not isinstance(ctx, dict):
        return
    for name in _COMPILED:
        original = ctx.get(f"original_{name}")  # the copy's: deepcopy rebinds a bound method
        if getattr(original, "__self__", None) is side:
            setattr(side, name, original)


# Note [The validation inside the fit loop]
# Lightning's fit loop runs validation_step between training steps
# (val_check_interval, each epoch's end) with the model in eval mode, while
# the optimizer's state is alive (the gradients it frees first, but in the
# middle of an accumulation: on_validation_model_zero_grad). Its batch
# comes from val_dataloader, which most modules build from the same
# batch_size (often twice it: no activations are kept for a backward). A
# validation costing more than the training step ran out there: the batch
# fitted to the training step was 548 where a validation_step of 8
# test-time augmentations runs 136 at most, and a loader of twice the
# batch 547. So where the module validates, its validation_step is
# measured at the batch val_dataloader builds for the fitted one, beside
# the optimizer's state (and the gradients where they stay), on a copy of
# the module (See Note [Rehearsed on a copy of the module]); where it does
# not fit, the batch set is the largest whose validation batch fits.
# What validation_step keeps after it returns (outputs appended to a list
# for on_validation_epoch_end) piles up over the validation's batches:
# kept features of 4 batches, concatenated at the epoch's end, ran out of
# memory at 548 where 286 run. So the bytes it keeps per sample are
# measured (alive after one step on a fresh copy, the module's and the
# callbacks' on_validation_batch_end run after it: a callback keeping the
# outputs said 557 where 177 run), and
# on_validation_epoch_end, where the module has one, is taken to make as
# many again (a torch.cat of them; it is not run: it may write to the
# logger or to files). The last step is sized beside what the earlier
# batches kept (limit_val_batches of the loader's), the epoch's end beside
# all of it and its copy.
# Loaders passed to fit() (val_dataloaders=) replace any val_dataloader and
# keep their batch: unchecked, 8 augmentations at their batch of 160 ran out
# of memory at any training batch where memfit said 556. They are what is
# measured, and where their batch does not fit the fit raises, saying so.


def passed_loaders(loop):
    """What was passed to fit() for `loop` (the fit loop, or its validation
    loop): loaders, whose batch is fixed; None where the module or the
    datamodule builds them."""
    instance = getattr(getattr(loop, "_data_source", None), "instance", None)
    if instance is None or isinstance(instance, (pl.LightningModule, pl.LightningDataModule)):
        return None
    return instance


@dataclasses.dataclass
class PassedToFit:
    """val_dataloaders passed to fit() as a source: Lightning runs them
    instead of any val_dataloader, at their own batch."""

    loaders: Any

    def val_dataloader(self):
        return self.loaders


def val_source(trainer, pl_module):
    """What builds the validation loader the fit loop runs (a PassedToFit
    for loaders given to fit()), or None where the fit does not validate
    (no validation_step, limit_val_batches=0)."""
    if trainer.limit_val_batches == 0 or not is_overridden("validation_step", pl_module):
        return None
    passed = passed_loaders(trainer.fit_loop.epoch_loop.val_loop)
    if passed is not None:
        return PassedToFit(passed)
    dm = trainer.datamodule
    for source in (dm, pl_module):
        if source is not None and is_overridden("val_dataloader", source):
            return source
    return None


def _val_loader(source, pl_module, name, batch):
    """source.val_dataloader() built with the batch attribute at `batch`
    (put back after)."""
    was = lightning_getattr(pl_module, name)
    lightning_setattr(pl_module, name, batch)
    try:
        with kept_rng(), host_memory():
            return source.val_dataloader()
    finally:
        lightning_setattr(pl_module, name, was)


def _val_args(pl_module, loader_index):
    """validation_step's arguments after the batch: batch_idx, and the
    dataloader_idx where there are several loaders."""
    params = len(inspect.signature(pl_module.validation_step).parameters)
    return ((0,) if params >= 2 else ()) + (
        (loader_index,) if loader_index is not None and params >= 3 else ())


def kept_per_sample(trainer, pl_module, batch, what, index, batch_dim):
    """(bytes per validated sample that validation_step, and the module's
    and the user's callbacks' on_validation_batch_end, keep after it
    returns, what on_validation_epoch_end is taken to make of them, the
    notes on callbacks not rehearsed, who ran: "validation_step and
    Keeps.on_validation_batch_end"): See Note [The validation inside the
    fit loop] and Note [What the callbacks keep at each batch's end]."""
    side, args = side_copy(trainer, pl_module), _val_args(pl_module, index)
    hook = is_overridden("on_validation_batch_end", pl_module)
    callbacks = BatchEndCallbacks.of(trainer, "on_validation_batch_end")
    copies, seen = callbacks.copies(trainer, pl_module), _RehearsedTrainer(trainer)
    # The loop passes dataloader_idx to the hooks only where there are several.
    at = (0,) if index is None else (0, index)

    def step(model, batch):
        with trainer.precision_plugin.val_step_context(), quiet_log(model):
            out = model.validation_step(batch, *args)
            callbacks.call(copies, seen, model, out, batch, *at)  # the loop's order
            if hook:
                model.on_validation_batch_end(out, batch, *at)
            out = None
        return torch.zeros(())

    with kept_rng():
        report = profile_eval(side, batch, None, UserStep(step=step, what=what), "no_grad",
                              batch_dim)
    left = report.timeline.breakdown_after(len(report.timeline) - 1)["categories"]
    kept = sum(v for k, v in left.items() if k not in ("parameter", "buffer", "input"))
    copies = None
    who = " and ".join(["validation_step"] + [f"{n}.on_validation_batch_end" for n in (
        (["the module"] if hook else []) + callbacks.keepers())])
    if not kept:
        return 0.0, 0.0, callbacks.notes(what), who
    # on_validation_epoch_end is not run (it may write to the logger or to
    # files): taken as a torch.cat of what was kept, one byte a byte.
    end = kept if is_overridden("on_validation_epoch_end", pl_module) else 0
    return kept / report.batch, end / report.batch, callbacks.notes(what), who


def validation_fits_none(what, who, per_sample, samples, without) -> str:
    """The one-line error where no validation batch fits beside what `who`
    keeps, `per_sample` bytes for each of the validation's `samples` (at a
    batch of 1), and `without` fit without it (0: none)."""
    fmt = _memfit.format_bytes
    kept = fmt(int(per_sample * samples)) if samples else "more"
    return (f"[{what}] no validation batch fits beside what {who} "
            f"keep{'' if ' and ' in who else 's'} over the validation: "
            f"{fmt(int(per_sample))} a sample, {kept} over its {samples or 'unknown'} samples "
            f"({without} fit without them); keep numbers (.item()) or host copies "
            f"(.detach().cpu()), not the tensors on the device")


def pile_step(what, per_sample):
    """A step holding `per_sample` bytes per sample of its batch and
    nothing else: on_validation_epoch_end beside what the steps kept."""

    def step(model, batch):
        pile = torch.empty(int(per_sample * batch_size(batch, 0, what)), dtype=torch.uint8)
        del pile
        return torch.zeros(())

    return UserStep(step=step, what=what)


def samples_validated(trainer, loader):
    """(batches, samples): one validation runs limit_val_batches batches
    of `loader` (batches: an int limit, whose samples grow with the batch)
    or a share of its samples (samples; None where its length is unknown)."""
    limit = trainer.limit_val_batches
    if isinstance(limit, int):
        return limit, None
    try:
        samples = max(1, int(len(loader) * limit)) * loader.batch_size
    except TypeError:
        return None, None
    try:  # the last batch is short where the batch does not divide the data
        return None, min(samples, len(loader.dataset))
    except TypeError:
        return None, samples


def val_loaders(source, pl_module, name, batch):
    """The validation loaders built at `batch`: val_dataloader may return
    several (a list, a dict, a CombinedLoader), which the loop runs one
    after the other."""
    built = _val_loader(source, pl_module, name, batch)
    if not isinstance(built, CombinedLoader):
        built = CombinedLoader(built, "sequential")
    return built.flattened


def validation_step(trainer, pl_module, what, loader_index=None, piled=0.0):
    """validation_step as memfit's step (its output dropped, as the loop
    keeps none), under the precision plugin's validation context;
    `loader_index`: the dataloader_idx the loop passes where there are
    several loaders; `piled`: bytes per sample of the step's batch held
    beside it (what earlier batches kept: See Note [The validation inside
    the fit loop])."""
    args = _val_args(pl_module, loader_index)

    def step(model, batch):
        n = int(piled * batch_size(batch, 0, what)) if piled else 0
        pile = torch.empty(n, dtype=torch.uint8) if n else None
        # Each probe on a copy of its own: what one keeps goes with it.
        model = side_copy(trainer, model)
        with trainer.precision_plugin.val_step_context(), quiet_log(model):
            _ = model.validation_step(batch, *args)
        del pile, model
        return torch.zeros(())

    return UserStep(step=step, what=what)


# Note [What training_step keeps over an epoch]
# A training_step may keep what it computes after it returns: Lightning's
# docs append each step's outputs (in training_step, or in the module's
# on_train_batch_end, run here too) to a list that on_train_epoch_end reads
# and clears. Kept per sample (predictions, features for an epoch-level
# metric), it piles up over the epoch beside every later step: a module
# keeping its 512-wide features was set 174 where Lightning's loop over 12
# batches runs 59. So the bytes training_step keeps per sample are measured
# (what a second step keeps beside the first's, on a fresh copy of the
# module: an attribute each step replaces does not pile up), and each
# rehearsed step runs on a fresh copy beside a block of as many bytes for
# every sample the epoch trains before it ends (the batches
# limit_train_batches as an int or max_steps allow, at the step's batch; at
# most the samples of the loader's share), freed after the optimizer step.
# Where that leaves no batch (a whole epoch's features kept), "even a batch
# of 1 ran out of memory ... use a smaller batch" sent the user after the
# batch: the error says who keeps how much a sample, and what to keep
# instead (a number, a host copy), where a batch fits without them.


# Note [What the callbacks keep at each batch's end]
# Lightning's loop runs each callback's on_train_batch_end after the step
# (before the module's), given the step's outputs and the module: a callback
# appending outputs["h"], or a tensor the module holds, to a list for its
# on_train_epoch_end keeps it over the epoch as the module's own hook does.
# Not run, it went uncounted: FitBatchSize said 419 beside such a callback,
# where Lightning's loop ran out of memory and runs 59 at most. So where
# what a step keeps is measured (See Note [What training_step keeps over an
# epoch]) the user's callbacks that define the hook run too, each a copy of
# its own (its lists and counters the copy's, the user's untouched; the
# trainer, the module, datasets and tensors of 1 MiB or more shared, as in
# Note [Rehearsed on a copy of the module]) given the module's copy and the
# trainer as a rehearsed step sees it (its loggers write nowhere).
# Lightning's own callbacks (checkpoints, progress bars; an average is
# sized apart) are not run. A callback extending one of them (a
# ModelCheckpoint's hook saves), one that cannot be copied or whose hook
# raises in the rehearsal is not run either: a note names it and says the
# batch is unverified beside it. What a hook writes elsewhere (a file) it
# writes in the rehearsal too, as the module's own hook does. The same for
# on_validation_batch_end (See Note [The validation inside the fit loop]).

_LIGHTNINGS_OWN = ("lightning", "pytorch_lightning", "lightning_fabric", "memfit")


def _lightnings_own(cls) -> bool:
    return cls.__module__.split(".")[0] in _LIGHTNINGS_OWN


@dataclasses.dataclass
class BatchEndCallbacks:
    """The user's callbacks with the hook `hook` (on_train_batch_end,
    on_validation_batch_end): those rehearsed (`run`), and why each of the
    others is not (`unrehearsed`, by name). See Note [What the callbacks
    keep at each batch's end]."""

    hook: str
    run: list
    unrehearsed: dict

    @classmethod
    def of(cls, trainer, hook="on_train_batch_end") -> "BatchEndCallbacks":
        run, unrehearsed = [], {}
        for cb in trainer.callbacks:
            defines = [k for k in type(cb).__mro__
                       if hook in vars(k) and k is not pl.Callback]
            if not defines or _lightnings_own(defines[0]):
                continue
            base = next((k for k in defines if _lightnings_own(k)), None)
            if base is None:
                run.append(cb)
            else:
                unrehearsed[type(cb).__name__] = f"it extends Lightning's {base.__name__}"
        return cls(hook, run, unrehearsed)

    def copies(self, trainer, pl_module) -> list:
        """A copy of each rehearsed callback, sharing what the module's
        copy shares, and the module (the hook is given its copy)."""
        made = []
        for cb in self.run:
            memo = _shared(trainer, pl_module, [cb])
            memo[id(pl_module)] = pl_module
            try:
                with host_memory():
                    made.append(copy.deepcopy(cb, memo))
            except Exception:  # a lock, a file: not copyable
                self.unrehearsed[type(cb).__name__] = "it cannot be copied"
        return made

    def call(self, copies, *args) -> None:
        """Each copy's hook(*args); one that raises is dropped."""
        for c in list(copies):
            try:
                getattr(c, self.hook)(*args)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:
                copies.remove(c)
                self.unrehearsed[type(c).__name__] = (f"its {self.hook} raised "
                                                      f"{type(e).__name__} in the rehearsal")

    def keepers(self) -> list:
        return [type(c).__name__ for c in self.run if type(c).__name__ not in self.unrehearsed]

    def notes(self, what: str) -> list:
        """A note for each callback not rehearsed, each warned too."""
        notes = [f"{name}.{self.hook} was not rehearsed ({why}): what it keeps is not "
                 f"counted, and the batch is unverified beside it"
                 for name, why in self.unrehearsed.items()]
        for note in notes:
            warnings.warn(f"[{what}] {note}", UserWarning, stacklevel=4)
        return notes


@dataclasses.dataclass
class KeptPerSample:
    """Bytes per sample a training step leaves kept after it, piling up
    over the epoch: by the module's training_step and on_train_batch_end
    (`module`), and with the user's callbacks' on_train_batch_end
    (`total`); `callbacks`: what ran of those."""

    module: float
    total: float
    callbacks: BatchEndCallbacks

    def who(self) -> str:
        """Who keeps them, for a note: "training_step and Keeps.on_train_batch_end"."""
        keepers = self.callbacks.keepers() if self.total > self.module else []
        return " and ".join((["training_step"] if self.module else [])
                            + [f"{n}.on_train_batch_end" for n in keepers])


def kept_per_training_sample(trainer, pl_module, batch, what, batch_dim) -> KeptPerSample:
    """What training_step keeps per sample after it returns and piles up
    over the steps (what a second step keeps beside the first's; an
    attribute each step replaces does not pile), and the user's callbacks'
    on_train_batch_end with it: See Note [What training_step keeps over an
    epoch] and Note [What the callbacks keep at each batch's end]."""
    takes_index = len(inspect.signature(pl_module.training_step).parameters) >= 2
    hook = is_overridden("on_train_batch_end", pl_module)
    callbacks, seen = BatchEndCallbacks.of(trainer), _RehearsedTrainer(trainer)

    def kept_after(steps, with_callbacks):
        side = side_copy(trainer, pl_module)
        copies = callbacks.copies(trainer, pl_module) if with_callbacks else []

        def step(model, batch):
            # As the loop runs it: with gradients (a step may take autograd.grad).
            with torch.enable_grad(), trainer.precision_plugin.train_step_context(), \
                    quiet_log(model):
                for i in range(steps):
                    out = model.training_step(batch, i) if takes_index else \
                        model.training_step(batch)
                    if out is not None and (hook or copies):
                        after, out = _as_after_backward(out), None
                        callbacks.call(copies, seen, model, after, batch, i)  # the loop's order
                        if hook:
                            model.on_train_batch_end(after, batch, i)
                    out = after = None
            return torch.zeros(())

        with kept_rng():
            report = profile_eval(side, batch, None, UserStep(step=step, what=what),
                                  "no_grad", batch_dim)
        left = report.timeline.breakdown_after(len(report.timeline) - 1)["categories"]
        return sum(v for k, v in left.items() if k not in ("parameter", "buffer", "input")), \
            report.batch

    def per_sample(with_callbacks):
        (once, n), (twice, _) = kept_after(1, with_callbacks), kept_after(2, with_callbacks)
        return max(0, twice - once) / n

    module = per_sample(False)
    total = per_sample(True) if callbacks.run else module
    return KeptPerSample(module, max(module, total), callbacks)


def _as_after_backward(out):
    """training_step's output as the loop hands it to on_train_batch_end
    (a dict with the loss), its tensors detached: after the backward their
    graphs hold nothing."""
    out = out if isinstance(out, dict) else {"loss": out}
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def epoch_samples(trainer, dataset_samples):
    """(batches, samples): at most how many batches of the step's batch
    one training epoch runs (limit_train_batches as an int, max_steps), and
    at most how many samples (the loader's share of a dataset of
    `dataset_samples`); None where not bounded."""
    limit, batches, samples = trainer.limit_train_batches, None, None
    if isinstance(limit, int):
        batches = limit
    elif dataset_samples:
        samples = max(1, int(dataset_samples * limit))
    if trainer.max_steps is not None and trainer.max_steps > 0:
        steps = trainer.max_steps * trainer.accumulate_grad_batches
        batches = steps if batches is None else min(batches, steps)
    return batches, samples


class EpochPile:
    """What the epoch's earlier training steps kept, for a rehearsed step
    to hold beside it (See Note [What training_step keeps over an epoch]):
    `per_sample` bytes for each of at most `batches` batches and at most
    `samples` samples (None: not bounded); `who`: who keeps them, for the
    notes. A block that drops it at its end."""

    def __init__(self, per_sample, batches, samples, batch_dim, what, who="training_step"):
        self.per_sample, self.batches, self.samples = per_sample, batches, samples
        self.batch_dim, self.what, self.who = batch_dim, what, who
        self.pile = None

    def keeps(self) -> str:
        """"<who> keeps", or "keep" for several."""
        return f"{self.who} keep" + ("" if " and " in self.who else "s")

    def emptied(self) -> "EpochPile":
        """The same epoch with nothing kept."""
        return EpochPile(0.0, self.batches, self.samples, self.batch_dim, self.what, self.who)

    def fits_none(self, what: str, without: int) -> str:
        """The one-line error where no batch fits beside the pile, and
        `without` fit without it."""
        fmt = _memfit.format_bytes
        return (f"[{what}] no batch fits beside what {self.keeps()} over the epoch: "
                f"{fmt(int(self.per_sample))} a sample after each step, "
                f"{fmt(self.bytes_at(1))} over the epoch's {self.samples_at(1)} samples even at "
                f"a batch of 1 ({without} fit without them); keep numbers (.item()) or host copies "
                f"(.detach().cpu()), not the tensors on the device")

    def samples_at(self, batch: int) -> int:
        """The samples an epoch trains before it ends, at `batch` a step."""
        return min(n for n in (self.samples, None if self.batches is None
                               else self.batches * batch) if n is not None)

    def bytes_at(self, batch: int) -> int:
        """The bytes kept before the epoch ends, at `batch` samples a step."""
        return int(self.per_sample * self.samples_at(batch))

    def renew(self, model, batch) -> None:
        """The last step's pile freed, and one for a step of `batch` held
        (on the model's device) until the next step or drop()."""
        self.pile = None
        n = self.bytes_at(batch_size(batch, self.batch_dim, self.what))
        first = next(model.parameters(), None)
        device = None if first is None else first.device
        self.pile = torch.empty(n, dtype=torch.uint8, device=device) if n else None

    def drop(self) -> None:
        self.pile = None

    def __enter__(self):
        # Freed after the optimizer step, as the step ends: alive after it,
        # the planning took it for memory the device keeps.
        self._hook = optimizer_hooks.register_optimizer_step_post_hook(
            lambda *_: self.drop())
        return self

    def __exit__(self, *exc):
        self._hook.remove()
        self.drop()


def epoch_pile(trainer, pl_module, batch, dataset_samples, what, batch_dim):
    """(an EpochPile or None, the notes to add): See Note [What
    training_step keeps over an epoch]. `dataset_samples`: the training
    loader's dataset length, or None."""
    kept = kept_per_training_sample(trainer, pl_module, batch, what, batch_dim)
    notes = kept.callbacks.notes(what)
    if not kept.total:
        return None, notes
    batches, samples = epoch_samples(trainer, dataset_samples)
    pile = EpochPile(kept.total, batches, samples, batch_dim, what, kept.who())
    said = (f"{pile.keeps()} {_memfit.format_bytes(int(kept.total))} a sample after "
            f"{'it returns' if kept.who() == 'training_step' else 'each step'}")
    if batches is None and samples is None:
        return None, notes + [f"{said}, and the epoch's length is unknown: what it keeps over "
                              f"the epoch was not counted"]
    return pile, notes + [f"{said}: held beside each step for the samples an epoch trains "
                          f"before it ends"]
