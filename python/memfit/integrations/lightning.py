"""memfit inside Lightning's Trainer: callbacks that size the batch from the
LightningModule's own training_step, write the HTML page of the first
training step, and run the doctor over the fit loop.

    trainer = pl.Trainer(callbacks=[FitBatchSize(budget="16GiB")])
    trainer.fit(module)          # module.batch_size set before the loop starts

Needs Lightning (`lightning.pytorch`, or the older `pytorch_lightning`)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import logging
import time
from typing import Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from lightning.pytorch.utilities.parsing import (lightning_getattr, lightning_hasattr,
                                                      lightning_setattr)
except ImportError:
    try:
        import pytorch_lightning as pl
        from pytorch_lightning.utilities.combined_loader import CombinedLoader
        from pytorch_lightning.utilities.model_helpers import is_overridden
        from pytorch_lightning.utilities.parsing import (lightning_getattr, lightning_hasattr,
                                                          lightning_setattr)
    except ImportError:
        raise ImportError(
            "[memfit.integrations.lightning] Lightning is not installed: pip install lightning"
        ) from None

from .api import (Size, UserStep, batch_size, count, host_memory, kept_rng,
                  sequence_length)
from ..diagnosis import Doctor
from ..report.profile import Report, profile
from .._native import native as _memfit
from .sizing import (BatchPlan, LoopStep, batch_bytes_per_sample, check_options, example_of,
                     largest_divisor, plan_batch, plan_eval_batch, tell_change)
from ..train.length_sampler import LengthBatchSampler
from .averaging import check_averaging, moved_average_bytes
from .length_batches import (check_length_options, dimensions_of, fit_per_length,
                             longest_example, longest_labels, pad_multiple, rebatched,
                             sample_lengths, token_accumulation)
from .lightning_rehearsal import (EpochPile, PassedToFit, epoch_pile, kept_per_sample,
                                  passed_loaders, pile_step, quiet_log, samples_validated,
                                  side_copy, val_loaders, val_source, validation_fits_none,
                                  validation_step)

__all__ = ["FitBatchSize", "MemoryDoctor", "MemoryReport", "lightning_step"]

log = logging.getLogger("memfit")


# Note [How Lightning's loop runs the step]
# Read from Lightning 2.6 (loops/optimization/automatic.py) and measured
# with memfit's tracker between its hooks. The automatic optimization's
# closure runs training_step, then zero_grad, then backward, inside
# optimizer.step: the last step's gradients are alive through this step's
# forward, and freed just before its backward. The plain step (gradients
# freed when the step ends) misses that: memfit's answer for an mlp was 573
# samples where Lightning's loop survives 539. Zeroing in place through the
# whole step (profile(set_to_none=False)) overshoots: its backward holds
# the gradients beside the activations, which Lightning's does not (the
# mlp's peak at 539: 16.8 MB recorded, 15.7 MB in Lightning's loop). So the
# step is recorded with set_to_none=False and the step function frees the
# gradients after training_step, as the closure does. Between the
# micro-batches of accumulate_grad_batches the closure does not zero them:
# there the step keeps them (the in-place order). The next batch is fetched
# after the step ends (2.6: the loop holds one batch while the step runs;
# the previous one is freed once the next is fetched), so nothing more is
# reserved.


def _accumulates(trainer: pl.Trainer) -> bool:
    """Whether the fit loop accumulates gradients over micro-batches: the
    trainer's accumulate_grad_batches, or a GradientAccumulationScheduler
    (which sets it per epoch, after on_fit_start) asking for more than one."""
    if trainer.accumulate_grad_batches > 1:
        return True
    return any(type(c).__name__ == "GradientAccumulationScheduler"
               and max(getattr(c, "scheduling", {1: 1}).values()) > 1 for c in trainer.callbacks)


def _refuse_manual(pl_module, what):
    if not pl_module.automatic_optimization:
        raise ValueError(
            f"[{what}] the module uses manual optimization (automatic_optimization=False): its "
            f"training_step runs backward and the optimizer itself, which memfit measures "
            f"apart; use memfit.find_batch_size(step=...) with a step that returns the loss"
        )


# Note [A training_step that skips batches]
# Lightning's loop skips the backward and the optimizer step at a batch
# whose training_step returns None (a warm-up batch, a filtered one). At
# batch_idx 0 such a step failed the rehearsal ("the step returned
# NoneType") where Lightning's loop trains from the next batch on. So the
# rehearsed step is called at batch_idx 0, 1, ... until it returns a loss,
# and at that index after; the forwards of the skipped calls are freed
# before the next (a skipped batch holds less than a trained one).

_SKIPPED_AT_MOST = 16


def lightning_step(trainer: pl.Trainer, pl_module: pl.LightningModule,
                   what: str = "FitBatchSize", accumulating: bool = False,
                   kept: EpochPile | None = None) -> LoopStep:
    """The LightningModule's training_step as memfit's step (Note [The step
    function's contract]) under the precision plugin's context (autocast
    for mixed precision), in the order Lightning's loop runs it: See Note
    [How Lightning's loop runs the step]. `accumulating`: a micro-batch
    after the first of accumulate_grad_batches (no zero_grad). `kept`: what
    the epoch's earlier steps kept, held beside the step (See Note [What
    training_step keeps over an epoch], lightning_rehearsal.py)."""
    _refuse_manual(pl_module, what)
    takes_index = len(inspect.signature(pl_module.training_step).parameters) >= 2
    trained_at = [0]  # the first batch_idx whose step gives a loss

    def step(model, batch):
        if kept is not None:
            kept.renew(model, batch)
            model = side_copy(trainer, model)  # what this step keeps goes with it
        with trainer.precision_plugin.train_step_context(), quiet_log(model):
            if not takes_index:
                out = model.training_step(batch)
            else:  # See Note [A training_step that skips batches]
                for i in range(trained_at[0], _SKIPPED_AT_MOST):
                    out = model.training_step(batch, i)
                    if out is not None:
                        trained_at[0] = i
                        break
                else:
                    raise ValueError(
                        f"[{what}] training_step returned None at batch_idx 0 to "
                        f"{_SKIPPED_AT_MOST - 1}: Lightning skips those batches, and memfit "
                        f"measures one that trains; return the loss")
        if not accumulating:
            model.zero_grad(set_to_none=True)  # the closure's zero_grad, before backward
        return out

    return LoopStep(UserStep(step=step, what=what), set_to_none=False)


def _loader_source(trainer, pl_module):
    """What builds the training loader: the datamodule, else the module."""
    dm = trainer.datamodule
    return dm if dm is not None and is_overridden("train_dataloader", dm) else pl_module


def _as_the_loop_gives(trainer, pl_module, batch):
    """`batch` as Lightning's training loop hands it to training_step (2.6,
    loops/training_epoch_loop.py): the precision plugin's convert_input
    (precision="bf16-true", "16-true", "64-true" cast the floating-point
    tensors), the on_before_batch_transfer hook, then the strategy's
    transfer (transfer_batch_to_device, on_after_batch_transfer). Without the
    first, a "bf16-true" module's training_step got float32 inputs and
    FitBatchSize raised where Lightning's own loop trains."""
    batch = trainer.precision_plugin.convert_input(batch)
    before = getattr(pl_module, "_on_before_batch_transfer", None)  # Lightning 1.6 and later
    if before is not None:
        batch = before(batch, dataloader_idx=0)
    return trainer.strategy.batch_to_device(batch)


def _first_of(loaders):
    """(the first batch the fit loop draws from what train_dataloader
    returned, its one loader or None). The loop wraps a loader, or a dict or
    list of loaders, in a CombinedLoader ("max_size_cycle": a batch of each,
    in that structure) whose iterator gives (batch, batch_idx,
    dataloader_idx): given the dict itself, FitBatchSize took its first key
    for a batch, and given a CombinedLoader that tuple. The loaders' own
    generators are put back (generator=self.g), and a CombinedLoader
    returned is reset."""
    combined = (loaders if isinstance(loaders, CombinedLoader)
                else CombinedLoader(loaders, "max_size_cycle"))
    with kept_rng(*combined.flattened):
        batch, _, _ = next(iter(combined))
    combined.reset()
    return batch, (combined.flattened[0] if len(combined.flattened) == 1 else None)


# Note [A dataset the loader holds on the device]
# A train_dataloader may build its dataset on the device (tensors made in
# it: torch.randn(...).cuda(), or any tensor on a simulated device). The
# fit loop builds its loader after on_fit_start, and holds it, dataset and
# all, beside every step; built in host memory, as memfit builds the
# example, it was in the room: FitBatchSize said 556 where Lightning's loop
# beside a 1 MiB dataset made in train_dataloader runs 388 at most. So the
# loader is built as the loop builds it, on the device, and held through
# the planning: the room is taken after it (See Note [The budget is the
# whole device], plan/budget.py). Only the example batch is drawn in host
# memory. The validation loaders the loop holds from its first validation
# on are held too, built at the user's batch.


def _train_loaders(trainer, pl_module, what):
    """What train_dataloader returns, built on the device as the fit loop
    builds it: See Note [A dataset the loader holds on the device]."""
    source = _loader_source(trainer, pl_module)
    if passed_loaders(trainer.fit_loop) is not None:
        raise ValueError(
            f"[{what}] train_dataloaders were passed to fit(): their batch is fixed, and "
            f"Lightning runs them instead of train_dataloader; define train_dataloader on the "
            f"module (or a datamodule) reading its batch_size, and pass no loader to fit()")
    if not is_overridden("train_dataloader", source):
        raise ValueError(
            f"[{what}] no train_dataloader on the module or datamodule: memfit takes an example "
            f"batch from it (dataloaders passed to fit() have a fixed batch size)"
        )
    with kept_rng():
        return source.train_dataloader()


def _first_batch(trainer, pl_module, loaders, what, batch_dim=0, longest=False, multiple=False):
    """The first samples of the first training batch of `loaders` (what
    train_dataloader returned) as training_step gets them (the module's
    transfer hooks, on its device); the generators are put back, so the fit
    loop draws the same order. longest=True: (batch, note, the rows the
    whole first batch holds along batch_dim, the rows the longest training
    sample gives alone), the batch as long as that sample (See Notes [A
    first batch shorter than the data], [A collate function that makes rows
    of a sample], length_batches.py). multiple=True: (batch, the multiple the loader's
    collate function pads to or None, note), the batch's labels as long as
    the longest training sample's where theirs is a length of its own."""
    # On the host, as beside a GPU: only the few samples memfit keeps go to
    # the device.
    note, per = None, 1
    with kept_rng(), host_memory():
        batch, loader = _first_of(loaders)
        rows = batch_size(batch, batch_dim, what)
        batch = example_of(batch, batch_dim)
        if longest:
            found = longest_example(getattr(loader, "dataset", None),
                                    getattr(loader, "collate_fn", None), batch, what, batch_dim)
            batch, note, per = found.batch, found.note, found.rows
        elif multiple:  # See Note [Labels of their own length under lengths=] (length_batches.py)
            batch, note = longest_labels(getattr(loader, "dataset", None),
                                         getattr(loader, "collate_fn", None), batch, what,
                                         batch_dim)
    batch = _as_the_loop_gives(trainer, pl_module, batch)
    if multiple:
        return batch, pad_multiple(getattr(loader, "collate_fn", None)), note
    return (batch, note, rows, per) if longest else batch


# Note [A collate function that makes rows]
# A collate_fn may give training_step more rows than the loader's
# batch_size (two augmented views of each sample, concatenated: 8 rows for
# a batch of 4). memfit sizes the rows; set as the batch_size, 557 rows
# that fit made batches of 1114, and Lightning's loop ran out of memory. So
# where the first batch holds more rows than the loader's batch, k rows a
# sample rounded up (texts of 1 or 2 windows: 6 rows for 4), the batch set
# is the rows that fit over k.


def _rows_per_sample(was, rows, effective, what) -> int:
    """k, the rows the collate function gives a sample of the one training
    loader (`was`: its LoaderBatch; `rows`: its first batch's), else 1:
    See Note [A collate function that makes rows]."""
    size = was[0].size if len(was) == 1 else None
    if not size or not rows or rows <= size:
        return 1
    if effective is not None:
        raise ValueError(
            f"[{what}] train_dataloader's first batch holds {rows} rows for a batch of {size} "
            f"(its collate_fn makes up to {-(-rows // size)} a sample), and "
            f"keep_effective_batch= counts samples: set accumulate_grad_batches yourself, "
            f"without keep_effective_batch")
    return -(-rows // size)


def _val_loaders(trainer, pl_module):
    """The validation loaders val_dataloader returns at the user's batch,
    built on the device as the loop builds them, or None where the fit does
    not validate or they were passed to fit()."""
    source = val_source(trainer, pl_module)
    if source is None or isinstance(source, PassedToFit):
        return None
    with kept_rng():
        return source.val_dataloader()


def _training_samples(loaders):
    """How many samples the training loader's dataset holds, or None where
    it has no length (an IterableDataset) or there are several loaders."""
    try:
        return len(loaders.dataset)
    except (AttributeError, TypeError):
        return None


def _at_most_the_data(plan, samples):
    """The batch set no larger than the training set, as Lightning's own
    BatchSizeFinder caps it: a batch above it trains on one short batch an
    epoch, or on none where the loader drops its last batch (drop_last=True:
    a 1000-sample set at the 687689 samples a 64 MiB budget fits trained no
    step at all)."""
    if samples and plan.batch_size > samples:
        plan.notes.append(f"{plan.batch_size} samples fit, but the training set holds "
                          f"{samples}: the batch is set to {samples}")
        plan.batch_size = samples


# Note [Layers a finetuning callback unfreezes later]
# Lightning's BaseFinetuning (BackboneFinetuning, or the user's own) freezes
# layers in its setup, before configure_optimizers, and unfreezes them at a
# later epoch (unfreeze_and_add_param_group: requires_grad again, and a new
# param group of the optimizer), so on_fit_start sees a step that trains
# only the rest: their gradients, optimizer state and the activations kept
# for their backward come later. FitBatchSize said 1605 for a module whose
# BaseFinetuning unfroze the backbone at epoch 1; Lightning's loop ran out of
# memory there, and runs 557 at most. So beside such a callback the step is
# measured as after the unfreezing: each frozen floating-point parameter is
# made trainable, those outside the optimizer are given a param group of
# it, and both are put back after (below the truth where some layers stay
# frozen to the end: a note says so).


@contextlib.contextmanager
def _unfrozen(trainer, pl_module, optimizer):
    """The module's frozen parameters trainable, and in the optimizer,
    where a BaseFinetuning callback may unfreeze them (See Note [Layers a
    finetuning callback unfreezes later]); yields the note to add, or None."""
    finetuning = [type(c).__name__ for c in trainer.callbacks
                  if isinstance(c, pl.callbacks.BaseFinetuning)]
    frozen = [p for p in pl_module.parameters()
              if not p.requires_grad and (p.is_floating_point() or p.is_complex())]
    if not finetuning or not frozen:
        yield None
        return
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    added = [p for p in frozen if id(p) not in held]
    groups = len(optimizer.param_groups)
    try:
        for p in frozen:
            p.requires_grad_(True)
        if added:
            optimizer.add_param_group({"params": added})
        yield (f"measured with the {len(frozen)} parameters frozen now trainable, as after "
               f"{finetuning[0]} unfreezes them: a smaller batch than the first epochs fit")
    finally:
        del optimizer.param_groups[groups:]
        for p in added:
            optimizer.state.pop(p, None)
        for p in frozen:
            p.requires_grad_(False)


def _moved_average(trainer, pl_module):
    """(bytes kept free, what for): the copies of the weights an averaging
    callback moves onto the device after the fit starts: See Note [An
    average moved onto the device later] (averaging.py)."""
    later, names = moved_average_bytes(trainer.callbacks, pl_module)
    what = f"the weights' copy {' and '.join(names)} moves onto the device later"
    return later, (what if later else None)


# Note [A loader built before the fit starts]
# The fit loop builds its loaders after on_fit_start, unless something asked
# for them before: trainer.estimated_stepping_batches (read in
# configure_optimizers to give OneCycleLR its total steps) builds the
# training loader at the user's batch, and the loop kept it: FitBatchSize
# said 556 and Lightning's loop trained at 4. So, as Lightning's own
# BatchSizeFinder does, the loaders the loops hold are dropped once the
# batch is set, and the loops build them again from it.


# Note [The batch the training loader runs]
# FitBatchSize sets the module's batch attribute; the loop runs whatever
# train_dataloader then builds. Read only as a DataLoader's int batch_size,
# the rest went unchecked: a batch_sampler of fixed buckets of 16 trained
# at 16 while FitBatchSize said 557 (buckets of 1500 ran out of memory), a
# DataLoader(batch_size=None) over a dataset yielding batches of 16 trained
# at 16, and a dict of loaders, one at a fixed 32, failed in the sizing
# ("the tensors disagree on the batch size"). So each loader
# train_dataloader returns is read for the batch it gives: its batch_size,
# else the largest of its batch sampler's first batches (indices only),
# else the first batch it draws (on the host). Several loaders must agree
# at the user's batch, and each must give the batch set (a batch sampler at
# most its dataset), or the fit is refused in one line naming the loader.

_SAMPLER_BATCHES = 64  # a batch sampler's batches read for their largest


@dataclasses.dataclass(frozen=True)
class LoaderBatch:
    """The batch one training loader gives: `size` (None: unknown), `who`
    names the loader among several (" (loader 'b')"), `how` says what must
    batch by the attribute ({name}), `cap` the most a batch sampler can
    give (its dataset's samples)."""

    who: str
    how: str
    size: int | None
    cap: int | None = None


def _named_loaders(loaders):
    """(name, loader) for each loader train_dataloader returned."""
    found = loaders.iterables if isinstance(loaders, CombinedLoader) else loaders
    pairs = (list(found.items()) if isinstance(found, dict) else
             list(enumerate(found)) if isinstance(found, (list, tuple)) else [(None, found)])
    if any(isinstance(v, (dict, list, tuple)) for _, v in pairs):  # nested: by position
        flat = CombinedLoader(found, "max_size_cycle").flattened
        pairs = list(enumerate(flat))
    if len(pairs) == 1:
        return [("", pairs[0][1])]
    return [(f" (loader {k!r})", v) for k, v in pairs]


def _batch_given(who, loader, batch_dim, what) -> LoaderBatch:
    """The batch `loader` gives: See Note [The batch the training loader runs]."""
    size = getattr(loader, "batch_size", None)
    if isinstance(size, int):
        return LoaderBatch(who, "its DataLoader must take batch_size={name}", size)
    sampler = getattr(loader, "batch_sampler", None)
    with kept_rng(loader), host_memory():
        if sampler is not None:
            sizes = [len(b) for b in itertools.islice(iter(sampler), _SAMPLER_BATCHES)]
            try:
                cap = len(loader.dataset)
            except (AttributeError, TypeError):
                cap = None
            return LoaderBatch(who, f"its batch_sampler ({type(sampler).__name__}) must batch "
                               f"by {{name}}", max(sizes, default=None), cap)
        how = ("its dataset, which gives whole batches (DataLoader(batch_size=None)), must "
               "batch by {name}")
        try:
            return LoaderBatch(who, how, batch_size(next(iter(loader)), batch_dim, what))
        except (StopIteration, TypeError, ValueError):
            return LoaderBatch(who, how, None)


def _loader_batches(loaders, batch_dim, what) -> list:
    """A LoaderBatch for each loader train_dataloader returned."""
    return [_batch_given(who, loader, batch_dim, what)
            for who, loader in _named_loaders(loaders)]


def _check_agree(batches, name, old, what):
    """Refuses loaders that give different batches at the user's batch: See
    Note [The batch the training loader runs]."""
    known = [b for b in batches if b.size is not None]
    if len({b.size for b in known}) > 1:
        said = ", ".join(f"{b.who.strip(' ()')}: {b.size}" for b in known)
        raise ValueError(
            f"[{what}] train_dataloader's loaders give batches of different sizes with {name} "
            f"at {old} ({said}): each must batch by {name}, as FitBatchSize sets one batch "
            f"for all of them")


def _set_batch(trainer, pl_module, name, batch, was, what, batch_dim):
    """Sets the module's `name` to `batch`, and checks that each loader
    train_dataloader builds then gives that batch (`was`: the LoaderBatch
    of each before), See Note [The batch the training loader runs], and
    that the loop takes its settings at that batch, See Note [Settings
    counted in batches]; refused, `name` is put back."""
    old = lightning_getattr(pl_module, name)
    lightning_setattr(pl_module, name, batch)
    try:
        loaders = _train_loaders(trainer, pl_module, what)
        for b, before in zip(_loader_batches(loaders, batch_dim, what), was):
            if b.size is None or b.size == min(batch, b.cap or batch):
                continue
            raise ValueError(
                f"[{what}] train_dataloader{b.who} builds batches of {b.size} with {name} set "
                f"to {batch} ({before.size} at {old}): {b.how.format(name=name)}, or "
                f"FitBatchSize sizes a batch the loop does not run; {batch} fits")
        _check_epoch_settings(trainer, pl_module, loaders, name, batch, what)
    except ValueError:
        lightning_setattr(pl_module, name, old)
        raise


# Note [Settings counted in batches]
# Lightning checks some settings against the batches an epoch has, as it
# builds the loaders: limit_train_batches and limit_val_batches given as a
# fraction must keep a batch, and val_check_interval given as a number of
# batches must come within the epoch. Right at the user's batch of 4 (1024
# batches an epoch), they were wrong at the 557 FitBatchSize set (8): the
# loop raised after it ("`val_check_interval` (100) must be less than or
# equal to the number of the training batches (8)"), saying nothing of the
# batch. So they are checked at the batch set, as the loop counts them, and
# the fit is refused in one line naming the setting to change.


def _epoch_batches(stage, loaders, limit, batch, what):
    """How many batches of each loader an epoch runs under `limit`
    (limit_<stage>_batches), inf where it has no length: See Note [Settings
    counted in batches]."""
    counts = []
    for dl in loaders:
        try:
            length = len(dl)
        except TypeError:
            counts.append(float("inf"))
            continue
        if isinstance(limit, float) and limit > 0 and length and int(length * limit) == 0:
            raise ValueError(
                f"[{what}] at the batch of {batch} the {stage} loader has {length} batches, and "
                f"limit_{stage}_batches={limit} of them is none (Lightning raises): give it as a "
                f"number of batches, or a fraction of at least {1 / length:.3g}; {batch} fits")
        counts.append(min(length, limit) if isinstance(limit, int) else int(length * limit))
    return counts


def _check_epoch_settings(trainer, pl_module, loaders, name, batch, what):
    """Refuses the settings the loop raises at `batch`: See Note [Settings
    counted in batches]. `loaders`: what train_dataloader built at it."""
    if trainer.limit_train_batches == 0:
        return
    flat = (loaders if isinstance(loaders, CombinedLoader)
            else CombinedLoader(loaders, "max_size_cycle")).flattened
    train = max(_epoch_batches("train", flat, trainer.limit_train_batches, batch, what))
    source = val_source(trainer, pl_module)
    if source is not None and not isinstance(source, PassedToFit):
        _epoch_batches("val", val_loaders(source, pl_module, name, batch),
                       trainer.limit_val_batches, batch, what)
    interval = trainer.val_check_interval
    if (isinstance(interval, int) and not isinstance(interval, bool) and interval > train
            and trainer.check_val_every_n_epoch is not None and trainer.limit_val_batches > 0):
        raise ValueError(
            f"[{what}] at the batch of {batch} an epoch has {train} training batches, and "
            f"val_check_interval={interval} is past its end (Lightning raises): pass "
            f"check_val_every_n_epoch=None to count it across epochs, or give it as a fraction "
            f"of the epoch; {batch} fits")


def _built_again(trainer) -> bool:
    """Whether the fit loop held a training loader already; the loops'
    loaders are dropped either way: See Note [A loader built before the fit
    starts]."""
    loop = trainer.fit_loop
    built = getattr(loop, "_combined_loader", None) is not None
    loop._combined_loader = None
    loop.epoch_loop.val_loop._combined_loader = None
    return built


# Note [A checkpoint being resumed]
# trainer.fit(ckpt_path=...) loads the checkpoint before on_fit_start, its
# tensors where they were saved (a card's onto the card), and holds it until
# it has restored the weights and the optimizer's state, after on_fit_start
# and before the first step. Taken for memory held beside every step, it
# left no room: FitBatchSize raised "even a batch of 1 ran out of memory"
# where Lightning's loop resumed at 557. So while the batch is sized, the
# checkpoint's weights and optimizer states on the device wait in host
# memory, and go back where they were after (Lightning restores from them
# as it would); the optimizer state they restore is what the rehearsed
# steps make, and the restore itself holds no more than the device holds
# now.


@contextlib.contextmanager
def _checkpoint_on_host(trainer):
    """The loaded checkpoint's device tensors in host memory for the block:
    See Note [A checkpoint being resumed]."""
    connector = getattr(trainer, "_checkpoint_connector", None)
    loaded = getattr(connector, "_loaded_checkpoint", None) or {}
    # By id: the tensors loaded coexist, so their ids are distinct.
    moved, copies = [], {}  # (holder, key, device, id); the host copy by id

    def visit(holder, key):
        v = holder[key]
        if isinstance(v, (dict, list)):
            for k in (list(v) if isinstance(v, dict) else range(len(v))):
                visit(v, k)
        elif isinstance(v, torch.Tensor) and (v.is_cuda or _memfit.allocation_id(v) is not None):
            if id(v) not in copies:
                with host_memory():
                    copies[id(v)] = v.detach().to("cpu", copy=True)
            moved.append((holder, key, v.device, id(v)))
            holder[key] = copies[id(v)]

    for key in ("state_dict", "optimizer_states"):
        if key in loaded:
            visit(loaded, key)
    try:
        yield
    finally:
        back = {}
        for holder, key, device, i in moved:
            if i not in back:
                back[i] = copies[i].to(device, copy=True)
            holder[key] = back[i]
        # visit's closure holds itself: the holders must not wait for the gc.
        moved.clear()
        copies.clear()


def _optimizer(trainer, what):
    optimizers = trainer.optimizers
    if len(optimizers) != 1:
        raise ValueError(
            f"[{what}] the module has {len(optimizers)} optimizers; memfit measures a step with "
            f"one (configure_optimizers returning a single optimizer)"
        )
    return optimizers[0]


def _validation_fits(trainer, side, batch, index, held, batches, samples, kw, kept, end):
    """The largest validation batch that fits: its last step beside what
    the earlier ones kept (`kept` bytes a sample), then the epoch's end
    (`end` more a sample). See Note [The validation inside the fit loop]."""
    what = kw["what"]
    piled = kept * max(0, (batches or 0) - 1)
    fits, _ = plan_eval_batch(side, batch, validation_step(trainer, side, what, index, piled),
                              held_bytes=held + int(kept * (samples or 0)), **kw)
    if kept and (batches or samples):
        at_end, _ = plan_eval_batch(side, batch, pile_step(what, (kept + end) * (batches or 0)),
                                    held_bytes=held + int((kept + end) * (samples or 0)), **kw)
        fits = min(fits, at_end)
    return fits


class FitBatchSize(pl.Callback):
    """A drop-in for Lightning's BatchSizeFinder: the largest batch the fit
    loop can run, measured from the module's own training_step and
    configure_optimizers (probes at small batches and one or two verifying
    steps, on copies), set before the loop starts.

        trainer = pl.Trainer(callbacks=[FitBatchSize(budget="16GiB")])
        trainer.fit(module)

    - budget: "16GiB" or bytes; None: what memfit.simulated_device leaves,
      else the CUDA card's free memory.
    - target_device: "cpu" or "cuda", the device the budget is for; None:
      the module's.
    - keep_effective_batch=N: the batch is the largest divisor of N that
      fits and trainer.accumulate_grad_batches the rest, so that batch x
      accumulation == N exactly; raises, saying why, where Lightning cannot
      accumulate (manual optimization, a GradientAccumulationScheduler, a
      strategy that accumulates itself).
    - batch_arg_name: the attribute set, found as Lightning's finder finds
      it (the module, its hparams, the datamodule, its hparams).

    The step is measured as Lightning's loop runs it: See Note [How
    Lightning's loop runs the step]. After the fit starts,
    `optimal_batch_size` and `plan` (a memfit BatchPlan) say what was set.
    Not for distributed strategies (the ranks must agree, as for
    BatchSizeFinder).

    Variable-length data: FitBatchSize(seq_dim=1, lengths=[128, 512, 2048])
    fits the largest batch at each length from training_step (`length_fit`,
    a LengthFit), and the module's (or datamodule's) train_dataloader is
    batched again by a LengthBatchSampler (`sampler`): the same dataset
    and collate_fn, each batch padded to its longest sample fitting. No
    batch attribute is set. tokens_per_step=N: accumulate_grad_batches
    micro-batches of at most N / k padded tokens each (See Note [A loader
    batched by length], length_batches.py). sample_lengths: each training
    sample's length (a list, or a function of a sample); default: read
    from each sample (its first tensor along seq_dim - 1).
    """

    def __init__(self, budget: Size | None = None, target_device: str | None = None,
                 keep_effective_batch: int | None = None, batch_arg_name: str = "batch_size",
                 batch_dim: int = 0, seq_dim: int | None = None, lengths: Any = None,
                 sample_lengths: Any = None, tokens_per_step: int | None = None) -> None:
        super().__init__()
        check_options("FitBatchSize", budget, target_device, batch_dim)
        self.tokens_per_step = check_length_options("FitBatchSize", seq_dim, lengths,
                                                    sample_lengths, tokens_per_step)
        if lengths is not None and keep_effective_batch is not None:
            raise ValueError("[FitBatchSize] keep_effective_batch= counts samples, and batches by "
                             "length hold as many as fit: for a fixed effective batch pass "
                             "tokens_per_step=")
        self.seq_dim, self.lengths, self.sample_lengths = seq_dim, lengths, sample_lengths
        self.length_fit = None  # a LengthFit, with lengths=
        self.sampler: LengthBatchSampler | None = None
        self.budget = budget
        self.target_device = target_device
        self.keep_effective_batch = (None if keep_effective_batch is None else count(
            keep_effective_batch, "FitBatchSize", "keep_effective_batch"))
        self.batch_arg_name = batch_arg_name
        self.batch_dim = batch_dim
        self.optimal_batch_size: int | None = None
        self.plan: BatchPlan | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
              stage: str | None = None) -> None:
        if stage not in (None, "fit"):
            return
        if trainer.world_size > 1:
            raise ValueError(
                "[FitBatchSize] not with a distributed strategy: the ranks must agree on the "
                "batch (as for Lightning's BatchSizeFinder); size it on one device"
            )
        # Before "the module has 2 optimizers": a GAN's are not the mistake.
        _refuse_manual(pl_module, "FitBatchSize")
        if self.lengths is not None:
            if self.tokens_per_step is not None:
                self._check_accumulation(trainer, pl_module, "tokens_per_step")
            return
        if not lightning_hasattr(pl_module, self.batch_arg_name):
            raise ValueError(
                f"[FitBatchSize] field {self.batch_arg_name} not found in the model, the "
                f"datamodule, nor their hparams: give the module (or datamodule) a "
                f"{self.batch_arg_name} its train_dataloader reads"
            )
        if self.keep_effective_batch is not None:
            self._check_accumulation(trainer, pl_module,
                                     f"keep_effective_batch={self.keep_effective_batch}")

    def _check_accumulation(self, trainer, pl_module, asked):
        why = None  # manual optimization: refused before (_refuse_manual)
        if any(type(c).__name__ == "GradientAccumulationScheduler" for c in trainer.callbacks):
            why = "a GradientAccumulationScheduler sets accumulate_grad_batches per epoch"
        elif trainer.strategy.handles_gradient_accumulation:
            why = f"the {type(trainer.strategy).__name__} accumulates gradients itself"
        if why:
            raise ValueError(
                f"[FitBatchSize] {asked} sets accumulate_grad_batches, but {why}: drop "
                f"{asked.split('=')[0]} or that setting"
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with _checkpoint_on_host(trainer):  # See Note [A checkpoint being resumed]
            if self.lengths is not None:
                self._fit_lengths(trainer, pl_module, time.perf_counter())
            else:
                self._fit_batch(trainer, pl_module)

    def _fit_batch(self, trainer, pl_module):
        """on_fit_start without lengths=: the batch attribute set."""
        what = "FitBatchSize"
        began = time.perf_counter()
        before = str(lightning_getattr(pl_module, self.batch_arg_name))
        if self.keep_effective_batch is not None:
            before += f" x {trainer.accumulate_grad_batches}"
        # Held through the planning: See Note [A dataset the loader holds on the device].
        loaders, val_held = _train_loaders(trainer, pl_module, what), _val_loaders(trainer,
                                                                                   pl_module)
        # See Note [The batch the training loader runs].
        was = _loader_batches(loaders, self.batch_dim, what)
        _check_agree(was, self.batch_arg_name, lightning_getattr(pl_module, self.batch_arg_name),
                     what)
        batch, longer, rows, longest = _first_batch(trainer, pl_module, loaders, what,
                                                    self.batch_dim, longest=True)
        # A batch of samples as long as the longest, each `longest` rows: See Note
        # [A collate function that makes rows of a sample] (length_batches.py).
        most = max(rows, longest * was[0].size) if len(was) == 1 and was[0].size else rows
        per = _rows_per_sample(was, most, self.keep_effective_batch, what)
        # The user's own accumulate_grad_batches (or a scheduler of it): every
        # micro-batch after the first keeps the gradients through its backward.
        accumulating = self.keep_effective_batch is None and _accumulates(trainer)
        optimizer = _optimizer(trainer, what)
        side = side_copy(trainer, pl_module)  # See Note [Rehearsed on a copy of the module]
        later, reserved_for = _moved_average(trainer, pl_module)
        pile, piled = epoch_pile(trainer, pl_module, batch, _training_samples(loaders), what,
                                 self.batch_dim)
        with _unfrozen(trainer, pl_module, optimizer) as unfrozen, \
                (pile or contextlib.nullcontext()):
            plan = self._plan_step(trainer, pl_module, side, batch, optimizer, pile,
                                   accumulating, later, reserved_for)
            # See Note [An average updated beside the step] (averaging.py).
            check_averaging(trainer.callbacks, pl_module, plan,
                            batch_bytes_per_sample(batch, self.batch_dim) * plan.batch_size,
                            what, lowers=True)
            if pile is not None:
                pile.drop()
            self._fit_validation(trainer, pl_module, plan, side,
                                 later + (pile.bytes_at(plan.batch_size) if pile else 0))
        plan.notes += piled
        if later:
            plan.notes.append(f"{reserved_for} ({_memfit.format_bytes(later)}) is kept free "
                              f"beside the step")
        if unfrozen:
            plan.notes.append(unfrozen)
        if longer:
            plan.notes.append(longer)
        if per > plan.batch_size:  # See Note [A collate function that makes rows]
            raise _memfit.DoesNotFit(f"[{what}] {plan.batch_size} rows fit, and a sample of "
                                     f"train_dataloader gives {per}: no batch fits")
        if per > 1:
            plan.notes.append(f"train_dataloader gives up to {per} rows a sample (its first "
                              f"batch: "
                              f"{rows} for {was[0].size}): the {plan.batch_size} rows that fit "
                              f"are a batch of {plan.batch_size // per}")
            plan.batch_size = max(1, plan.batch_size // per)
        if self.keep_effective_batch is None:
            _at_most_the_data(plan, _training_samples(loaders))
        del loaders, val_held  # held through the planning only
        _set_batch(trainer, pl_module, self.batch_arg_name, plan.batch_size, was, what,
                   self.batch_dim)
        if _built_again(trainer):
            plan.notes.append("the training loader was built before the fit started (by "
                              "estimated_stepping_batches?): it is built again at the batch set; "
                              "what configure_optimizers computed from the old batch (a "
                              "schedule's total steps) stays")
        if self.keep_effective_batch is not None:
            trainer.accumulate_grad_batches = plan.accumulation
        self.plan, self.optimal_batch_size = plan, plan.batch_size
        tell_change(what, before, plan, time.perf_counter() - began)
        log.info(plan.summary())
        for note in plan.notes:
            log.info("memfit: %s", note)

    def _plan_step(self, trainer, pl_module, side, batch, optimizer, pile, accumulating,
                   later, reserved_for):
        """plan_batch for the module's training_step beside `pile` (what the
        epoch's earlier steps kept, or None); where no batch fits beside it
        but one fits without it, raises DoesNotFit saying so (See Note [What
        training_step keeps over an epoch], lightning_rehearsal.py)."""
        what = "FitBatchSize"

        def plan(kept):
            return plan_batch(side, batch, optimizer, reserve_bytes=later,
                              reserved_for=reserved_for,
                              whole=lightning_step(trainer, pl_module, what,
                                                   accumulating=accumulating, kept=kept),
                              accumulated=lightning_step(trainer, pl_module, what,
                                                         accumulating=True, kept=kept),
                              budget=self.budget, what=what, batch_dim=self.batch_dim,
                              effective=self.keep_effective_batch,
                              target_device=self.target_device)

        try:
            return plan(pile)
        except _memfit.DoesNotFit:
            if pile is None:
                raise
            pile.drop()
            try:  # each step still on a fresh copy, beside nothing kept
                without = plan(pile.emptied()).batch_size
            except _memfit.DoesNotFit:
                without = None
            if without is None:
                raise
        raise _memfit.DoesNotFit(pile.fits_none(what, without))

    def _fit_validation(self, trainer, pl_module, plan, side, later=0):
        """The batch lowered to the largest whose validation fits: See Note
        [The validation inside the fit loop]. `side`: the module's copy the
        step runs on; `later`: bytes an average moves onto the device later."""
        source = val_source(trainer, pl_module)
        if source is None:
            return
        # The loop frees the gradients before validating (its hook
        # on_validation_model_zero_grad), but inside an accumulation (the
        # user's, or keep_effective_batch's, set after this).
        freed = (plan.effective_batch is None and not _accumulates(trainer)
                 and not is_overridden("on_validation_model_zero_grad", pl_module))
        grads = 0 if freed else sum(p.numel() * p.element_size()
                                    for p in pl_module.parameters() if p.requires_grad)
        loaders = val_loaders(source, pl_module, self.batch_arg_name, plan.batch_size)
        for i, loader in enumerate(loaders):
            self._fit_one_validation(trainer, pl_module, plan, side, source, loader,
                                     plan.optimizer_state_bytes + grads + later,
                                     None if len(loaders) == 1 else i)

    def _fit_one_validation(self, trainer, pl_module, plan, side, source, loader, held, index):
        """_fit_validation for the validation loader `loader` (the index-th)."""
        what, name = "FitBatchSize", self.batch_arg_name
        cap = getattr(loader, "batch_size", None)
        if not isinstance(cap, int):
            plan.notes.append("a validation loader has no batch_size (a batch sampler): its "
                              "batch was not checked beside the training's state")
            return
        with kept_rng(), host_memory(), kept_rng(loader):
            batch = example_of(next(iter(loader)), self.batch_dim)
        batch = _as_the_loop_gives(trainer, pl_module, batch)
        kept, end, notes, who = kept_per_sample(trainer, pl_module, batch, what, index,
                                                self.batch_dim)
        plan.notes += notes
        batches, samples = samples_validated(trainer, loader) if kept else (None, None)
        if kept and batches is None and samples is None:
            plan.notes.append("validation_step keeps tensors after it returns, and the "
                              "validation's length is unknown: they were not counted")
        loader = None
        kw = dict(budget=self.budget, what=what, batch_dim=self.batch_dim, cap=cap,
                  target_device=self.target_device)
        step = (trainer, side, batch, index, held, batches, samples, kw)
        try:
            fits = _validation_fits(*step, kept, end)
        except _memfit.DoesNotFit:
            if not kept:
                raise
            without = _validation_fits(*step, 0.0, 0.0)  # raises where that fits none too
            raise _memfit.DoesNotFit(validation_fits_none(what, who, kept, samples or batches,
                                                          without)) from None
        if fits >= cap:
            return
        if isinstance(source, PassedToFit):
            raise _memfit.DoesNotFit(
                f"[{what}] validation_step runs out of memory at the batch of {cap} of the "
                f"val_dataloaders passed to fit(), beside the training's optimizer state (at "
                f"most {fits} fit), and a loader passed to fit() keeps its batch: pass one of "
                f"{fits} or fewer, or define val_dataloader on the module reading {name}")
        lo, hi = 0, plan.batch_size  # the largest batch whose loader's batch fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            size = val_loaders(source, pl_module, name, mid)[index or 0].batch_size
            lo, hi = (mid, hi) if size <= fits else (lo, mid)
        if lo == 0:
            raise _memfit.DoesNotFit(
                f"[{what}] validation_step runs out of memory at its loader's batch of {cap} "
                f"beside the optimizer's state (at most {fits} fit), and "
                f"val_dataloader's batch does not shrink with {name}: give it a batch of "
                f"{fits} or fewer")
        plan.notes.append(f"validation_step at {cap} does not fit beside the training's "
                          f"optimizer state (at most {fits}): the batch is {lo}, whose "
                          f"validation batch fits")
        if plan.effective_batch is not None:
            lo = largest_divisor(plan.effective_batch, lo)
            plan.accumulation = plan.effective_batch // lo
        plan.batch_size = lo

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        source = getattr(self, "_rebatched", None)
        if source is not None:
            del source.train_dataloader  # the class's own again
            self._rebatched = None

    def _fit_lengths(self, trainer, pl_module, began):
        """on_fit_start with lengths=: See Note [A loader batched by length]."""
        what = "FitBatchSize"
        # Held through the planning: See Note [A dataset the loader holds on the device].
        loaders, val_held = _train_loaders(trainer, pl_module, what), _val_loaders(trainer,
                                                                                   pl_module)
        batch, multiple, longer = _first_batch(trainer, pl_module, loaders, what,
                                               self.batch_dim, multiple=True)
        if longer:
            log.info("memfit: %s", longer)
        accumulating = self.tokens_per_step is not None or _accumulates(trainer)
        plans = []
        optimizer = _optimizer(trainer, what)
        side = side_copy(trainer, pl_module)  # See Note [Rehearsed on a copy of the module]
        later, reserved_for = _moved_average(trainer, pl_module)
        with _unfrozen(trainer, pl_module, optimizer) as unfrozen:
            fit = fit_per_length(side, batch, optimizer,
                                 lightning_step(trainer, pl_module, what,
                                                accumulating=accumulating),
                                 seq_dim=self.seq_dim, lengths=self.lengths,
                                 budget=self.budget, what=what, batch_dim=self.batch_dim,
                                 target_device=self.target_device,
                                 pad_to_multiple_of=multiple, plans=plans,
                                 reserve_bytes=later, reserved_for=reserved_for)
            # See Note [An average updated beside the step] (averaging.py): the
            # longest padded batch's tokens beside it.
            per_token = batch_bytes_per_sample(batch, self.batch_dim) / sequence_length(
                batch, self.seq_dim, what)
            said = len(plans[-1].notes)
            check_averaging(trainer.callbacks, pl_module, plans[-1],
                            per_token * fit.max_tokens, what)
        del loaders, val_held  # held through the planning only
        if later:
            log.info("memfit: %s (%s) is kept free beside the step", reserved_for,
                     _memfit.format_bytes(later))
        if unfrozen:
            log.info("memfit: %s", unfrozen)
        for note in plans[-1].notes[said:]:
            log.info("memfit: %s", note)
        max_tokens = None
        if self.tokens_per_step is not None:
            trainer.accumulate_grad_batches, max_tokens = token_accumulation(
                self.tokens_per_step, fit)
        source = _loader_source(trainer, pl_module)
        built = source.train_dataloader
        dims = dimensions_of(batch)  # not the batch: the loader must not keep it alive

        def train_dataloader():
            loader = built()
            lengths = sample_lengths(loader.dataset, self.seq_dim, self.sample_lengths, what,
                                     self.batch_dim, dims)
            # The collate function pads each batch to a multiple: sized there.
            # The loader's own order and drop_last: a sequential sampler stays
            # in dataset order (grouped), drop_last drops the short batch.
            ordered = isinstance(getattr(loader, "sampler", None),
                                 torch.utils.data.SequentialSampler)
            self.sampler = LengthBatchSampler(lengths, fit, seed=torch.initial_seed() % 2**32,
                                              shuffle=not ordered,
                                              drop_last=bool(getattr(loader, "drop_last", False)),
                                              max_tokens=max_tokens,
                                              pad_to_multiple_of=pad_multiple(loader.collate_fn))
            return rebatched(loader, self.sampler)

        source.train_dataloader = train_dataloader
        self._rebatched = source  # put back on_fit_end
        _built_again(trainer)  # See Note [A loader built before the fit starts]
        self.length_fit = fit
        log.info("memfit: batched by length: %r (%.1f s)", fit, time.perf_counter() - began)


class MemoryReport(pl.Callback):
    """Writes the HTML page of the first training step (memfit.Report's
    save_html: memory by category over time, by module, the peak over
    batch sizes) to `path`, before that step runs: the module's own
    training_step on its first batch, rehearsed on copies (nothing of the
    run changes). `budget` draws the budget line. After it, `report` is
    the memfit Report."""

    def __init__(self, path: str, budget: Size | None = None, predict: bool = True) -> None:
        super().__init__()
        check_options("MemoryReport", budget)
        self.path = path
        self.budget = budget
        self.predict = predict
        self.report: Report | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.report is not None:
            return
        loop = lightning_step(trainer, pl_module, "MemoryReport")
        side = side_copy(trainer, pl_module)  # See Note [Rehearsed on a copy of the module]
        with kept_rng():
            self.report = profile(side, batch, loss_fn=loop.how,
                                  optimizer=_optimizer(trainer, "MemoryReport"),
                                  set_to_none=loop.set_to_none, keep_output=loop.keep_output)
        self.report.save_html(self.path, title=f"memfit: {type(pl_module).__name__}, first "
                              f"training step", budget=self.budget, predict=self.predict)


class MemoryDoctor(pl.Callback):
    """memfit.doctor() over the fit loop: from the start of training to its
    end, the memory mistakes of the module's steps, each with its line and
    fix. `findings` and `report()` after the fit; `path`: the report is also
    written there; trials=False skips re-running the last forward with each
    fix."""

    def __init__(self, path: str | None = None, trials: bool = True) -> None:
        super().__init__()
        self.path = path
        self.trials = trials
        self.doctor: Doctor | None = None

    @property
    def findings(self) -> list:
        return [] if self.doctor is None else self.doctor.findings

    def report(self) -> str:
        return "" if self.doctor is None else self.doctor.report()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.doctor = Doctor(None, _optimizer(trainer, "MemoryDoctor"), trials=self.trials)
        self.doctor.__enter__()

    def _finish(self, exc=None):
        d = self.doctor
        if d is None or getattr(self, "_done", False):
            return
        self._done = True
        d.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        if exc is None:
            text = d.report()
            log.info(text)
            if self.path:
                with open(self.path, "w") as f:
                    f.write(text + "\n")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._finish(exception)
