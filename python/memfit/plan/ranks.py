"""One answer on every rank: find_batch_size, the callbacks' batch and the
Trainer's micro-batch under torch.distributed. Each rank measures its own
device; the ranks agree on the smallest batch, and a rank whose search
fails makes every rank raise instead of leaving the others in a
collective. See Note [One answer on every rank]."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import socket
import sys
import weakref
from typing import Any, Callable

import torch

from .._native import native as _memfit
from .._step.device import host_memory

__all__: list = []

# Note [One answer on every rank]
# Under torch.distributed every rank runs find_batch_size on its own device,
# and the devices differ (another process on one card, a smaller card in
# the mix, a simulated budget per rank). Ranks that train together need one
# batch: the smallest rank's, or that rank runs out of memory. So:
# - Every rank enters the agreement collective (all_gather_object of a
#   RankOutcome) exactly once per round, whether its search returned or
#   raised (DoesNotFit, an OOM the search let through, any Exception): no
#   rank is left waiting in a collective the failing rank never reaches
#   (Lightning's BatchSizeFinder under DDP hangs that way). BaseException
#   (KeyboardInterrupt) is not caught; the others then fail at the process
#   group's timeout.
# - If any rank failed, every rank raises one error naming the failing
#   rank(s) and each one's cause: DoesNotFit when every failure was
#   DoesNotFit (so `except memfit.DoesNotFit` behaves alike on every rank),
#   else RankFailed; on a failing rank it is raised from its own exception.
# - Else the answer is the smallest max_batch. A rank whose own answer is
#   larger searches again on its own measurements capped at that batch:
#   its BatchFit then holds its own device's truth at the common batch
#   (its budget, the peak measured there, verified there), not another
#   rank's budget and peak; max_batch and recommended_batch are the same on
#   every rank. A note on every rank says which rank limited and each
#   rank's own largest batch. If the capped search comes back lower still
#   (it does not, while memory grows with the batch) or fails, another
#   round agrees again, every rank entering it once: max_batch only falls,
#   so the rounds end.
# The collective is the process group's: its timeout bounds a rank that
# never arrives (killed, hung). Under NCCL, all_gather_object sends through
# torch.cuda.current_device(): each rank must have set its own card
# (torch.cuda.set_device), as torch requires for any object collective.


# Note [ZeroRedundancyOptimizer measured on this rank's shard]
# torch's ZeroRedundancyOptimizer.step() steps its local optimizer (`.optim`,
# over the parameters this rank owns) and then broadcasts every rank's shard
# to the others (_sync_params): a collective in every optimizer step.
# find_batch_size runs as many steps as each rank's search takes, and those
# differ between ranks (another budget, another verifying step): one rank's
# broadcasts met another's agreement collective, and both ranks hung until
# the process group's timeout (whose "pair closure" was then read as an
# optimizer that needs a closure). A rank's memory is its local optimizer's:
# the state and temporaries of its shard; the broadcasts write parameters in
# place. So what memfit measures steps `.optim`, no collective in it, and
# the rehearsal puts that optimizer's state back as any other's. With
# overlap_with_ddp=True, `.optim` is made inside DDP's communication hook,
# in the first steps of training: refused until then. The parameters other
# ranks own are in no optimizer of this rank, rightly: their .grad are here,
# their state is not, and no note says to give them an optimizer.

_ZERO_OF: Any = weakref.WeakKeyDictionary()  # local optimizer -> its ZeroRedundancyOptimizer


def rank_local_optimizer(optimizer: Any, what: str = "find_batch_size") -> Any:
    """The optimizer memfit measures for `optimizer`: a
    ZeroRedundancyOptimizer's local one (See Note [ZeroRedundancyOptimizer
    measured on this rank's shard]); anything else as it is."""
    zero = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    if zero is None or not isinstance(optimizer, zero.ZeroRedundancyOptimizer):
        return optimizer
    local = getattr(optimizer, "optim", None)
    if not isinstance(local, torch.optim.Optimizer):
        raise ValueError(
            f"[{what}] this ZeroRedundancyOptimizer (overlap_with_ddp=True) has no local "
            f"optimizer until DDP's communication hook has run a few steps: call {what} after "
            f"them, or size the batch with the optimizer class it wraps")
    _ZERO_OF[local] = optimizer
    return local


def sharded_optimizer(optimizer: Any) -> Any:
    """The ZeroRedundancyOptimizer whose local optimizer `optimizer` is
    (rank_local_optimizer gave it), or None."""
    try:
        return _ZERO_OF.get(optimizer)
    except TypeError:  # not weakly referable: no optimizer
        return None


class RankFailed(RuntimeError):
    """A rank's find_batch_size raised something other than DoesNotFit:
    raised on every rank of the group, naming the rank(s) and the cause."""


@dataclasses.dataclass
class LocalAnswer:
    """What one rank's find_batch_size found on its own device: the fit, and
    how to fit again capped at a smaller batch (same measurements, same
    budget) when another rank limits."""

    fit: Any  # a BatchFit, or what has its max_batch and notes (a MicroBatchPlan)
    capped: Callable[[int], Any]  # max_batch -> BatchFit no larger


@dataclasses.dataclass
class RankOutcome:
    """One rank's answer in a round: its largest batch, or why it has none."""

    rank: int
    host: str
    max_batch: int = 0
    error_type: str = ""
    error: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error_type)

    def name(self) -> str:
        return f"rank {self.rank} ({self.host})"


def group_of(across_ranks: Any, what: str = "find_batch_size"):
    """The process group to agree in, or None for this rank alone:
    across_ranks True (the default group, when torch.distributed is
    initialized and has more than one rank), False, or a ProcessGroup."""
    if across_ranks is False or across_ranks is None:
        return None
    dist = torch.distributed
    if across_ranks is not True and not (dist.is_available()
                                         and isinstance(across_ranks, dist.ProcessGroup)):
        raise ValueError(f"[{what}] across_ranks must be True, False or a torch.distributed "
                         f"ProcessGroup, got {type(across_ranks).__name__} {across_ranks!r}")
    if not dist.is_available() or not dist.is_initialized():
        if across_ranks is True:
            return None
        raise ValueError(f"[{what}] across_ranks is a process group but torch.distributed is "
                         f"not initialized: call init_process_group first, or pass "
                         f"across_ranks=False")
    group = dist.group.WORLD if across_ranks is True else across_ranks
    if dist.get_world_size(group) < 2:
        return None
    return group


def _outcome(max_batch: int = 0, error: BaseException | None = None) -> RankOutcome:
    out = RankOutcome(rank=torch.distributed.get_rank(), host=socket.gethostname(),
                      max_batch=max_batch)
    if error is not None:
        out.error_type = type(error).__name__
        text = str(error) or repr(error)
        out.error = text if len(text) <= 600 else text[:600] + " ..."
    return out


def _raise_failed(outcomes: list, size: int, mine: BaseException | None, what: str):
    failed = [o for o in outcomes if o.failed]
    causes = "; ".join(f"{o.name()} raised {o.error_type}: {o.error}" for o in failed)
    ranks = ", ".join(str(o.rank) for o in failed)
    message = (f"[{what}] {'rank' if len(failed) == 1 else 'ranks'} {ranks} of {size} failed, "
               f"so every rank raises this: {causes}")
    kind = (_memfit.DoesNotFit if all(o.error_type == "DoesNotFit" for o in failed)
            else RankFailed)
    raise kind(message) from mine


def _agree(answer: Callable[[], LocalAnswer], group, what: str):
    """Rounds of all_gather_object until every rank holds the same
    max_batch, or every rank raises: See Note [One answer on every rank]."""
    dist = torch.distributed
    size = dist.get_world_size(group)
    local, mine = None, None
    try:
        local = answer()
        outcome = _outcome(local.fit.max_batch)
    except Exception as e:  # noqa: B902: every failure is told to the other ranks
        mine = e
        outcome = _outcome(error=e)
    fit = None if local is None else local.fit
    first = None
    while True:
        outcomes: list = [None] * size
        with host_memory():  # the collective's buffers, not the step's: no simulated budget
            dist.all_gather_object(outcomes, outcome, group=group)
        first = first or outcomes
        if any(o.failed for o in outcomes):
            _raise_failed(outcomes, size, mine, what)
        smallest = min(o.max_batch for o in outcomes)
        if all(o.max_batch == smallest for o in outcomes):
            break
        if fit.max_batch > smallest:
            try:
                fit = local.capped(smallest)
                outcome = _outcome(fit.max_batch)
            except Exception as e:  # noqa: B902: told to the other ranks next round
                mine = e
                outcome = _outcome(error=e)
    fit.notes = list(fit.notes) + [_agreed_note(first, smallest, local.fit.max_batch)]
    return fit


def _agreed_note(first: list, smallest: int, own: int) -> str:
    """The note every rank's answer gets: the batch, whose it is, each
    rank's own; on a rank fitted again, its own largest."""
    each = ", ".join(f"rank {o.rank}: {o.max_batch}" for o in first)
    limiting = " and ".join(f"rank {o.rank}'s" for o in first if o.max_batch == smallest)
    if all(o.max_batch == smallest for o in first):
        line = f"torch.distributed: the {len(first)} ranks' largest batches agree: {smallest}"
    elif limiting:
        line = (f"torch.distributed: the {len(first)} ranks take {limiting} largest batch, "
                f"{smallest}, the smallest (each rank's own: {each})")
    else:
        line = (f"torch.distributed: the {len(first)} ranks take {smallest}, the smallest after "
                f"fitting again (each rank's own: {each})")
    if own > smallest:
        line += f"; this rank's own {own}, fitted again at most {smallest} here"
    return line


def agree(answer: Callable[[], LocalAnswer], across_ranks: Any = True,
          what: str = "find_batch_size"):
    """answer() on this rank, the BatchFit every rank of `across_ranks`
    (True: the default process group; False: none; or a ProcessGroup)
    agrees on: See Note [One answer on every rank]. Every rank of the group
    must call it, once per search; without a group (torch.distributed not
    initialized, one rank) it is answer().fit."""
    group = group_of(across_ranks, what)
    if group is None:
        return answer().fit
    return _agree(answer, group, what)


def gathered_from_ranks(local: Callable[[], Any], across_ranks: Any = True,
                        what: str = "find_batch_size"):
    """(local() on this rank, every rank's local() in rank order): what
    ranks share beside one batch (a fit per length's lines between its
    lengths). When any rank's local() raises, every rank raises one error
    naming it, none left waiting (See Note [One answer on every rank]).
    Without a group: (local(), None)."""
    group = group_of(across_ranks, what)
    if group is None:
        return local(), None
    dist = torch.distributed
    mine, error = None, None
    try:
        mine = local()
        sent = (_outcome(), mine)
    except Exception as e:  # noqa: B902: every failure is told to the other ranks
        error = e
        sent = (_outcome(error=e), None)
    size = dist.get_world_size(group)
    every: list = [None] * size
    with host_memory():  # the collective's buffers, not the step's: no simulated budget
        dist.all_gather_object(every, sent, group=group)
    if any(outcome.failed for outcome, _ in every):
        _raise_failed([outcome for outcome, _ in every], size, error, what)
    return mine, [value for _, value in every]


def agreed_across_ranks(fn: Callable) -> Callable:
    """find_batch_size under torch.distributed: the same answer on every
    rank, or the same error (See Note [One answer on every rank]). `fn`
    takes across_ranks (True, False or a ProcessGroup) and returns a
    LocalAnswer, or, with seq_dim or lengths, a LengthFit whose per-length
    calls agree each. The wrapped function returns the BatchFit."""
    signature = inspect.signature(fn)
    what = fn.__name__

    @functools.wraps(fn)
    def run(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        if arguments.get("seq_dim") is not None or arguments.get("lengths") is not None:
            return fn(*args, **kwargs)  # one call per length, each agreed
        return agree(lambda: fn(*args, **kwargs), arguments.get("across_ranks", True), what)

    return run
