"""Variable-length data in a framework's loop: the largest batch per length
measured from the framework's own step, each sample's length, and the
framework's loader batched again by a LengthBatchSampler (see Note [A
loader batched by length]). Shared by the Lightning and Hugging Face
callbacks."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import DataLoader

from .._step.batching import batch_size, count, resize_length, sequence_length
from .._step.user_state import kept_rng
from ..memory.device import host_memory
from ..plan.lengths import LengthFit, fit_lengths, padded_example
from ..train.length_sampler import LengthBatchSampler
from .sizing import LoopStep, one_step_peak, plan_batch

__all__: list = []


# Note [A loader batched by length]
# A framework builds its training loader from the user's dataset with a
# fixed batch size. With lengths= a callback fits the largest batch at each
# length from the framework's own step (fit_lengths over plan_batch, as for
# one shape), reads each sample's length, and hands the framework a loader
# over the same dataset and collate function whose batch_sampler is a
# LengthBatchSampler: each batch, padded to its longest sample, fits. With
# tokens_per_step= the user asks for a fixed effective batch in tokens:
# accumulation k = ceil(tokens_per_step / fit.max_tokens) micro-batches, each
# capped at tokens_per_step // k padded tokens (max_tokens=, below what
# fits at every length): an optimizer step holds about tokens_per_step
# tokens, whatever the lengths, as fairseq's max_tokens with update_freq.
# Between accumulated micro-batches the gradients stay alive, so the fit is
# measured with them kept whenever the loop accumulates.


def check_length_options(what: str, seq_dim: Any, lengths: Any, sample_lengths: Any,
                         tokens_per_step: Any) -> int | None:
    """Refuses, when a callback is made, length options its fit would trip
    on later; returns tokens_per_step as an int (or None)."""
    if lengths is None:
        if seq_dim is not None or sample_lengths is not None or tokens_per_step is not None:
            raise ValueError(f"[{what}] seq_dim=, sample_lengths= and tokens_per_step= batch by "
                             f"length, and need lengths= (the lengths to fit, e.g. [128, 512, "
                             f"2048])")
        return None
    if seq_dim is None:
        raise ValueError(f"[{what}] lengths= needs seq_dim= (the dimension of a batch that "
                         f"indexes tokens, e.g. 1)")
    if isinstance(lengths, int) or not hasattr(lengths, "__iter__"):
        raise ValueError(f"[{what}] lengths must be a list of ints, got {lengths!r}")
    for n in lengths:
        count(n, what, "each of lengths")
    if sample_lengths is not None and not callable(sample_lengths):
        for n in sample_lengths:
            count(n, what, "each of sample_lengths")
    return None if tokens_per_step is None else count(tokens_per_step, what, "tokens_per_step")


def pad_multiple(collate_fn: Any) -> int | None:
    """The collate function's pad_to_multiple_of (DataCollatorWithPadding's),
    or None."""
    multiple = getattr(collate_fn, "pad_to_multiple_of", None)
    return multiple if isinstance(multiple, int) and multiple > 1 else None


def _padded(length: int, multiple: int | None) -> int:
    """`length` rounded up to `multiple` (pad_multiple's), where there is one."""
    return -(-length // multiple) * multiple if multiple else length


def fit_per_length(model: torch.nn.Module, batch: Any, optimizer: Any, loop: LoopStep, *,
                   seq_dim: Any, lengths: Sequence[int], budget: Any, what: str,
                   batch_dim: int = 0, reserve_bytes: int = 0,
                   reserved_for: str | None = None, target_device: str | None = None,
                   pad_to_multiple_of: int | None = None,
                   plans: list | None = None) -> LengthFit:
    """The largest batch at each of `lengths` that `loop` fits, each
    verified: the example `batch` cut or repeated along seq_dim (token
    labels with it) and the batch (plan_batch's search, one shape at a
    time). pad_to_multiple_of: the collate function pads every batch to a
    multiple, so each length is fitted rounded up to it (a batch never runs
    shorter). plans: a list given gets each length's BatchPlan."""
    if pad_to_multiple_of:
        lengths = sorted({_padded(count(n, what, "each of lengths"), pad_to_multiple_of)
                          for n in lengths})

    def fit_one(x, _):
        plan = plan_batch(model, x, optimizer, whole=loop, budget=budget, what=what,
                          batch_dim=batch_dim, reserve_bytes=reserve_bytes,
                          reserved_for=reserved_for, target_device=target_device)
        if plans is not None:
            plans.append(plan)
        return plan.fits[-1]

    checked = one_step_peak(model, optimizer, loop, batch_dim=batch_dim,
                            target_device=target_device, what=what)
    return fit_lengths(fit_one, batch, None, seq_dim, lengths, batch_dim, step_peak=checked)


def token_accumulation(tokens_per_step: int, fit: LengthFit) -> tuple[int, int]:
    """(micro-batches per optimizer step, padded tokens per micro-batch) that
    hold `tokens_per_step` tokens per step: See Note [A loader batched by
    length]."""
    k = max(1, math.ceil(tokens_per_step / fit.max_tokens))
    return k, tokens_per_step // k


def _main_part(obj):
    """What a sample's (or a batch's) length is read from: its input_ids (a
    dict or another mapping, such as the BatchEncoding a tokenizer returns),
    else its entry of the most dimensions (the first of them: not a class
    label before the tokens, {"label": 1, "tokens": [...]}, which the scan
    of the samples took for a sample it cannot read, silently), a tuple's
    first item (and that item's), else itself."""
    if isinstance(obj, (tuple, list)) and obj and not isinstance(obj[0], (int, float)):
        obj = obj[0]
    if hasattr(obj, "keys") and hasattr(obj, "__getitem__"):
        keys = list(obj.keys())
        if not keys:
            return None
        obj = obj["input_ids"] if "input_ids" in keys else max(
            (obj[k] for k in keys), key=_dimensions)
    return obj


def _dimensions(value) -> int:
    """A tensor's dimensions; 1 for a list or tuple (of ids); else 0."""
    if isinstance(value, torch.Tensor):
        return value.dim()
    return 1 if isinstance(value, (list, tuple)) else 0


def _length_of(sample, seq_dim, what, batch_dim=0, batch_dims=None):
    """A sample's length (see _main_part), along the dimension that is
    seq_dim in a batch: a sample has no batch_dim (seq_dim - 1 where the
    batch dimension comes before it), unless it has as many dimensions as
    the batch (`batch_dims`): tokenizer(text, return_tensors="pt") gives a
    sample (1, L) that its collate function concatenates."""
    part = _main_part(sample)
    if part is None:
        raise ValueError(f"[{what}] a sample is an empty mapping: pass sample_lengths=")
    if isinstance(seq_dim, dict):  # per input: the one the length is read from
        mapping = sample[0] if isinstance(sample, (tuple, list)) and sample else sample
        keys = list(mapping.keys()) if hasattr(mapping, "keys") else []
        seq_dim = seq_dim.get("input_ids" if "input_ids" in keys else keys[0]) if keys else None
    if isinstance(part, torch.Tensor):
        if batch_dims is not None and part.dim() == batch_dims and isinstance(seq_dim, int) \
                and -batch_dims <= seq_dim < batch_dims:
            return int(part.shape[seq_dim])
        d = _sample_dim(part.dim(), seq_dim, batch_dim)
        if d is None:
            raise ValueError(f"[{what}] cannot read a sample's length along seq_dim={seq_dim!r} "
                             f"(batch_dim={batch_dim!r}; a sample of shape "
                             f"{tuple(part.shape)}): pass sample_lengths=")
        return int(part.shape[d])
    try:
        return len(part)
    except TypeError:
        raise ValueError(f"[{what}] cannot read the length of a sample of type "
                         f"{type(part).__name__}: pass sample_lengths=") from None


def _sample_dim(sample_dims, seq_dim, batch_dim):
    """The dimension of a sample (`sample_dims` dimensions, a batch's
    without batch_dim) that is seq_dim in its batch; None where there is
    none."""
    if not isinstance(seq_dim, int) or not isinstance(batch_dim, int):
        return None
    dims = sample_dims + 1
    if not (-dims <= seq_dim < dims and -dims <= batch_dim < dims):
        return None
    seq, batch = seq_dim % dims, batch_dim % dims
    if seq == batch:
        return None
    return seq - 1 if seq > batch else seq


def sample_lengths(dataset: Any, seq_dim: Any, given: Sequence[int] | Callable | None,
                   what: str, batch_dim: Any = 0, batch_dims: int | None = None) -> list[int]:
    """Each sample's length, in dataset order: `given` (a list, or a
    function of a sample), else read from each sample (see _length_of;
    batch_dims, dimensions_of(a batch the loader gave), tells a sample that
    keeps a batch dimension of its own)."""
    try:
        n = len(dataset)
    except TypeError:
        raise ValueError(f"[{what}] lengths= batches the training set by each sample's length, "
                         f"and this one ({type(dataset).__name__}) has no len() (an "
                         f"IterableDataset?): "
                         f"batching by length needs a map-style dataset; leave lengths= out "
                         f"to fit one batch size") from None
    if given is not None and not callable(given):
        out = [count(v, what, "each of sample_lengths") for v in given]
        if len(out) != n:
            raise ValueError(f"[{what}] sample_lengths has {len(out)} lengths for a training "
                             f"set of {n} samples")
        return out
    read = given if given is not None else (
        lambda s: _length_of(s, seq_dim, what, batch_dim, batch_dims))
    return [count(read(dataset[i]), what, "a sample's length") for i in range(n)]


def dimensions_of(batch: Any) -> int | None:
    """How many dimensions the tensor a batch's length is read from has
    (see _main_part), or None."""
    main = _main_part(batch)
    return main.dim() if isinstance(main, torch.Tensor) else None


def rebatched(loader: DataLoader, sampler: LengthBatchSampler) -> DataLoader:
    """A loader over `loader`'s dataset and collate function whose batches
    are `sampler`'s (its workers and pinning kept)."""
    workers = loader.num_workers
    extra = {}
    if workers > 0:
        extra = dict(persistent_workers=loader.persistent_workers,
                     prefetch_factor=loader.prefetch_factor,
                     multiprocessing_context=loader.multiprocessing_context)
    return DataLoader(loader.dataset, batch_sampler=sampler, collate_fn=loader.collate_fn,
                      num_workers=workers, pin_memory=loader.pin_memory,
                      worker_init_fn=loader.worker_init_fn, **extra)


# Note [A first batch shorter than the data]
# A collate function that pads each batch to its own longest sample
# (DataCollatorWithPadding, pad_sequence) makes the first batch, the one a
# callback measures, only as long as its samples: the batch fitted there ran
# out of memory at the first batch holding a longer sample. Without
# lengths= and with a collate function that may pad (not torch's
# default_collate nor HF's default_data_collator, which only stack samples
# of one shape: an image set is not read through), a callback reads the
# training samples' shapes (a dataset with
# len(); up to SCANNED samples: a dict's input_ids or first value, a tuple's
# first tensor, a list of ids); where they differ along one dimension
# alone, that is the length, and where a sample is longer than the first
# batch the batch is fitted at the longest (the example's tokens and token
# labels repeated to it, as fit_lengths does; rounded up to the collate
# function's pad_to_multiple_of): every batch, padded to its longest, fits.
# A seq2seq sample's labels have their own length (the target's, padded by
# DataCollatorForSeq2Seq apart from input_ids): where a sample's labels
# are longer than the first batch's, its labels and the decoder_* tensors
# of their length are repeated to the longest too (the decoder's memory
# and the logits over the vocabulary grow with them).
SCANNED = 200_000


def _shape_of(sample):
    """The shape of a sample's first tensor (or list of ids), or None; of a
    tuple's first mapping's ((encoding, label) samples)."""
    sample = _main_part(sample)
    if isinstance(sample, torch.Tensor):
        return tuple(sample.shape)
    if isinstance(sample, (list, tuple)) and all(isinstance(v, int) for v in sample[:8]):
        return (len(sample),)
    return None


def _labels_shape(sample):
    """The shape of a dict sample's labels when they are a sequence (a
    tensor with dimensions, or a list of ids), else None."""
    if not (hasattr(sample, "keys") and hasattr(sample, "__getitem__")):
        return None
    if "labels" not in sample.keys():
        return None
    labels = sample["labels"]
    if isinstance(labels, torch.Tensor):
        return tuple(labels.shape) if labels.dim() else None
    if isinstance(labels, (list, tuple)) and all(isinstance(v, int) for v in labels[:8]):
        return (len(labels),)
    return None


def _longest_labels(batch, labels, multiple, what, batch_dim=0, samples="training"):
    """(batch, note): `batch` with its labels, and the decoder_* tensors of
    their length, repeated to the longest labels' length `labels` where
    shorter (See Note [A first batch shorter than the data]); else as it
    was, note None."""
    shapes = set(labels)
    if len(shapes) < 2 or len({len(s) for s in shapes}) != 1 \
            or not (hasattr(batch, "keys") and "labels" in batch.keys()):
        return batch, None
    varying = [d for d in range(len(next(iter(shapes)))) if len({s[d] for s in shapes}) > 1]
    target = batch["labels"]
    if len(varying) != 1 or not isinstance(target, torch.Tensor) \
            or target.dim() != len(next(iter(shapes))) + 1:
        return batch, None
    seq_dim = _batch_dim_of(varying[0], batch_dim, target.dim())
    longest = _padded(max(s[varying[0]] for s in shapes), multiple)
    if seq_dim is None:
        return batch, None
    have = int(target.shape[seq_dim])
    if longest <= have:
        return batch, None
    keys = [k for k in batch.keys() if k == "labels" or str(k).startswith("decoder_")]
    with host_memory():
        grown = resize_length({k: batch[k] for k in keys}, longest, seq_dim, have, what)
        batch = _replaced(batch, grown)
    return batch, (f"the first batch's labels are {have} long and {_a(samples)} sample's "
                   f"{longest}: its labels (and decoder inputs) are fitted at {longest}")


def _a(word):
    """'a training', 'an evaluation'."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _replaced(batch, items):
    """`batch` (a dict or a BatchEncoding) with `items` in place of its own."""
    out = dict(batch.items())
    out.update(items)
    if type(batch) is dict:
        return out
    try:
        return type(batch)(out)
    except Exception:  # noqa: BLE001 (any mapping whose constructor takes no dict)
        return out


def _batch_dim_of(d, batch_dim, batch_dims):
    """The dimension of a batch (`batch_dims` dimensions) that is a
    sample's dimension `d` (the sample has no batch_dim); None where
    batch_dim is not one of the batch's."""
    if not -batch_dims <= batch_dim < batch_dims:
        return None
    return d if d < batch_dim % batch_dims else d + 1


def _stacks_only(collate_fn):
    """Whether collate_fn is torch's default_collate or Hugging Face's
    default_data_collator, which stack samples without padding them."""
    return collate_fn is None or (
        getattr(collate_fn, "__name__", "") in ("default_collate", "default_data_collator")
        and getattr(collate_fn, "__module__", "").split(".")[0] in ("torch", "transformers"))


@dataclasses.dataclass
class LongestExample:
    """The example batch as long as the longest training sample (`note`
    says how, None where it was not changed) and `rows`, the rows the
    collate function gives that sample alone (See Note [A collate function
    that makes rows of a sample])."""

    batch: Any
    note: str | None = None
    rows: int = 1


def at_longest_sample(dataset: Any, collate_fn: Any, batch: Any, what: str,
                      batch_dim: int = 0, samples: str = "training") -> tuple[Any, str | None]:
    """(batch, note): longest_example's batch and note."""
    found = longest_example(dataset, collate_fn, batch, what, batch_dim, samples)
    return found.batch, found.note


def longest_example(dataset: Any, collate_fn: Any, batch: Any, what: str,
                    batch_dim: int = 0, samples: str = "training") -> LongestExample:
    """The example batch as long as the longest sample of `dataset` read,
    where it is shorter; the note says so, and when more samples than
    SCANNED were not read; else None. `samples` names them in the note
    ("training", "evaluation"). See Note [A first batch shorter than the
    data]."""
    if _stacks_only(collate_fn):  # samples of one shape: nothing to read
        return LongestExample(batch)
    try:
        n = len(dataset)
    except TypeError:
        return LongestExample(batch)
    if not isinstance(batch_dim, int) or isinstance(batch_dim, bool) or n == 0:
        return LongestExample(batch)
    shapes, labels = {}, set()
    with host_memory():
        for i in range(min(n, SCANNED)):
            sample = dataset[i]
            shape = _shape_of(sample)
            if shape is None:
                return LongestExample(batch)
            shapes.setdefault(shape, i)
            label = _labels_shape(sample)
            if label is not None:
                labels.add(label)
    found = _longest_inputs(batch, shapes, dataset, collate_fn, n, what, batch_dim, samples)
    batch, note = found.batch, found.note
    batch, grown = _longest_labels(batch, labels, pad_multiple(collate_fn), what, batch_dim,
                                   samples)
    # Samples of several lengths make padded batches: See Note [A mask
    # without padding] (plan/lengths.py). A mask is (batch, length).
    batch, padded = padded_example(batch, -1) if len(shapes) > 1 else (batch, None)
    for more in (grown, padded):
        if more:
            note = more if note is None else f"{note}; {more}"
    return LongestExample(batch, note, found.rows)


# Note [A collate function that makes rows of a sample]
# A collate function may cut a sample into windows (a sliding-window
# tokenizer collator: ceil(L / W) rows of W) or truncate it: its batches are
# never longer than W, and a long sample gives more rows. Resized to the
# longest sample's 128 tokens, the example ran a GPT-2 of 32 positions out
# of its position table (IndexError in memfit, where the Trainer trains);
# and the rows a sample gives were read from the first batch, of short
# samples (1 each), where the longest gives 4. So the longest sample is
# collated alone (the generators put back): its length is the one fitted,
# and its rows are the rows a sample may give (the callbacks plan in rows,
# `rows` a sample). A collate function that fails on one sample alone
# leaves the scan's length.
def _collated_alone(dataset, collate_fn, index, seq_dim, batch_dim, what):
    """(length along seq_dim, rows along batch_dim) of the sample `index`
    collated alone, or None where that fails."""
    try:
        with kept_rng(), host_memory():
            alone = collate_fn([dataset[index]])
            return sequence_length(alone, seq_dim, what), batch_size(alone, batch_dim, what)
    except Exception:  # noqa: BLE001 (any collate function's own error: the scan stands)
        return None


# Note [Labels of their own length under lengths=]
# With lengths= a fit per length resizes what seq_dim names; a seq2seq
# target padded apart from input_ids (DataCollatorForSeq2Seq) is left at
# the first batch's, and the sampler batches by input_ids alone. The HF
# callback's T5 fit {16: 78, 64: 17} at 16 MiB (targets of 8 in the first
# batch) ran out of memory in the Trainer's loop at the batch holding a
# target of 96. So before the fit the training samples' labels are read
# (up to SCANNED), and where a sample's labels are not its input_ids'
# length (token labels follow their inputs) the example's labels are
# fitted at the longest, at every length: a batch never holds a longer one.
def longest_labels(dataset: Any, collate_fn: Any, batch: Any, what: str,
                   batch_dim: int = 0) -> tuple[Any, str | None]:
    """(batch, note): the example's labels (and decoder_* tensors) as long
    as the longest training sample's where they have a length of their
    own; else (batch, None). See Note [Labels of their own length under
    lengths=]."""
    try:
        n = len(dataset)
    except TypeError:
        return batch, None
    if _stacks_only(collate_fn) or n == 0 or _labels_shape(dataset[0]) is None:
        return batch, None
    labels, own = set(), False
    with host_memory():
        for i in range(min(n, SCANNED)):
            sample = dataset[i]
            shape = _labels_shape(sample)
            if shape is None:
                return batch, None
            labels.add(shape)
            own = own or shape != _shape_of(sample)
    if not own:
        return batch, None
    return _longest_labels(batch, labels, pad_multiple(collate_fn), what, batch_dim)


def _longest_inputs(batch, shapes, dataset, collate_fn, n, what, batch_dim=0,
                    samples="training"):
    """longest_example's LongestExample over the inputs' `shapes` (each
    with the first sample of that shape)."""
    # Past SCANNED a sample is not read: one longer there runs past the fit.
    unread = (f"only the first {SCANNED} of the {n} {samples} samples were read, and a "
              f"longer one after them would run past this batch: pass lengths= to batch by "
              f"length (every sample is read)" if n > SCANNED else None)
    if len(shapes) == 1:
        return LongestExample(batch, unread)
    if len({len(s) for s in shapes}) != 1:
        return LongestExample(batch)
    varying = [d for d in range(len(next(iter(shapes)))) if len({s[d] for s in shapes}) > 1]
    if len(varying) != 1:
        return LongestExample(batch)
    seq_dim = _batch_dim_of(varying[0], batch_dim, len(next(iter(shapes))) + 1)
    if dimensions_of(batch) == len(next(iter(shapes))):
        seq_dim = varying[0]  # samples (1, L) that keep their own batch dimension
    if seq_dim is None:
        return LongestExample(batch)
    widest = max(shapes, key=lambda s: s[varying[0]])
    longest, rows = _padded(widest[varying[0]], pad_multiple(collate_fn)), 1
    try:
        have = sequence_length(batch, seq_dim, what)
    except ValueError:
        return LongestExample(batch)
    # See Note [A collate function that makes rows of a sample].
    alone = _collated_alone(dataset, collate_fn, shapes[widest], seq_dim, batch_dim, what)
    cut = alone is not None and alone[0] < longest
    if alone is not None:
        longest, rows = alone
    said = (f"the collate function makes {rows} rows of {longest} of {_a(samples)} sample of "
            f"{widest[varying[0]]}: {rows} rows a sample are fitted" if rows > 1 or cut
            else None)
    if longest <= have:
        return LongestExample(batch, said or unread, rows)
    with host_memory():
        batch = resize_length(batch, longest, seq_dim, have, what)
    return LongestExample(batch, (
        f"the first batch is {have} long along dimension {seq_dim} and {_a(samples)} sample "
        f"{longest}: the batch is fitted at {longest} (seq_dim={seq_dim}"
        + (", lengths=[...] fits one per length and batches the data by length)"
           if samples == "training" else ")") + (f"; {unread}" if unread else "")), rows)
