"""memfit.Trainer on a DistributedDataParallel model: every rank splits its
own batch, and the ranks meet twice a step (agree, then sync gradients)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist

from .._step.batching import tensors_in

__all__ = ["DistributedError", "DistributedStepReport"]

# Note [Micro-batches under DistributedDataParallel]
# The micro-batches run on `ddp.module` directly, not through DDP's forward
# under no_sync():
# - DDP's forward broadcasts the buffers from rank 0 on every call: a
#   collective per micro-batch would force the ranks into lock-step, and a
#   rank redoing a micro-batch after an OOM would pair its broadcast with
#   another rank's next one.
# - DDP's reducer all-reduces the gradients inside the last micro-batch's
#   backward: a rank that OOMs during that backward redoes it, and the others
#   stay blocked in the all-reduce for ever.
# Calling ddp.module bypasses the reducer: on torch 1.13 the reducer's
# autograd hooks return at once unless DDP's forward armed them
# (`expect_autograd_hooks_`, set by prepare_for_backward in
# DistributedDataParallel.forward, cleared when the reduction finishes), so a
# backward through the plain module accumulates local gradients and launches
# nothing. So a step is:
#   1. agree: one all_gather of a small record per rank (local batch, the
#      micro-batch it wants, optimizer steps taken, what its batch looks like,
#      or why it is bad, or that it would plan its micro-batch); every rank
#      starts from the smallest micro-batch any wants, and bad input raises
#      the same ValueError on every rank. When any rank would plan, every
#      rank plans and they agree first, then exchange again (See Note [One
#      micro-batch on every rank], trainer.py);
#   2. broadcast the buffers from the group's rank 0 (if ddp.broadcast_buffers
#      and there are buffers), as DDP's forward would, once;
#   3. run every micro-batch locally: the native Trainer's OOM recovery is per
#      rank and stays exact, and no collective can be left half-done;
#   4. sync, in the optimizer step callable: one all_gather of the same record
#      (this rank succeeded, and which parameters have a gradient), then an
#      in-place all_reduce(SUM) of each gradient and a division by the world
#      size: DDP's semantics, the mean of the ranks' local-batch gradients;
#      then optimizer.step(). A rank whose micro-batches failed sends its
#      error instead; every rank then skips the optimizer step (the replicas
#      stay equal) and raises.
# Each gradient is all-reduced in place, asynchronously, and all are waited
# for: flattening into buckets would copy every gradient (+1x gradients at the
# peak, the memory memfit is there to save) for fewer, larger messages.
# DDP's communication hooks, find_unused_parameters and static_graph do not
# apply; a parameter without a gradient on some rank counts as zeros there
# and keeps None only where no rank has one.


@dataclasses.dataclass
class RankPlan:
    """This rank's part in planning the micro-batch before a step: whether
    it would plan, and run(batches), which every rank calls together when
    any would (batches: every rank's local batch). See Note [One
    micro-batch on every rank] (trainer.py)."""

    wanted: bool
    run: Callable[[list], None]


class DistributedError(RuntimeError):
    """A collective of a distributed memfit step failed (another rank probably
    died or hung), or another rank failed its part of the step."""


def is_distributed(model):
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


_OK, _BAD_INPUT, _FAILED, _PLAN = 0, 1, 2, 3  # _PLAN: OK, and this rank would plan
_AGREE, _SYNC = 0x6D660001, 0x6D660002  # "mf" + phase: catches ranks out of step
_HEADER = 6  # tag, code, local batch, wanted micro-batch, optimizer steps, text bytes
_TEXT = 512  # bytes of text per rank: a batch signature or an error's first line


def _first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def batch_signature(inputs, target):
    """What every rank's batch must share: its tensors' dtypes and dimensions
    (sizes may differ: each rank may pad to its own sequence length)."""

    def sig(obj):
        return ", ".join(
            f"{str(t.dtype).replace('torch.', '')} {t.dim()}-d" for t in tensors_in(obj)
        )

    return f"inputs ({sig(inputs)})" + ("" if target is None else f", target ({sig(target)})")


class DistributedStepReport:
    """One rank's StepReport (batch, micro_batch, chunks, loss ... are this
    rank's) plus rank, world_size, local_batches (every rank's), global_batch
    and start_micro_batch (the micro-batch the ranks agreed to start from)."""

    def __init__(self, report: Any, rank: int, world_size: int, local_batches: list[int],
                 start_micro_batch: int) -> None:
        self._report = report
        self.rank = rank
        self.world_size = world_size
        self.local_batches = local_batches
        self.global_batch = sum(local_batches)
        self.start_micro_batch = start_micro_batch

    def __getattr__(self, name):
        if name == "_report":  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self._report, name)

    def __repr__(self):
        r = self._report
        return (
            f"DistributedStepReport(rank={self.rank}, world_size={self.world_size}, "
            f"global_batch={self.global_batch}, batch={r.batch}, "
            f"start_micro_batch={self.start_micro_batch}, micro_batch={r.micro_batch}, "
            f"micro_batches={r.micro_batches}, ooms_recovered={r.ooms_recovered}, "
            f"loss={self.loss:.6g}, peak_bytes={r.peak_bytes})"
        )


class DistributedStep:
    """The collectives of a memfit step on a DistributedDataParallel model.
    See Note [Micro-batches under DistributedDataParallel]."""

    def __init__(self, ddp):
        self.ddp = ddp
        c10d = dist.distributed_c10d
        self.group = getattr(ddp, "process_group", None) or c10d._get_default_group()
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        get_global_rank = getattr(dist, "get_global_rank", None) or c10d._get_global_rank
        self._root = get_global_rank(self.group, 0)  # broadcast's src is a global rank
        self._ignore = set(getattr(ddp, "parameters_to_ignore", ()))
        self.params = [
            p for n, p in ddp.module.named_parameters() if p.requires_grad and n not in self._ignore
        ]
        # NCCL reduces CUDA tensors only; gloo takes CPU ones.
        nccl = dist.get_backend(self.group) == "nccl"
        self._device = next(ddp.module.parameters()).device if nccl else torch.device("cpu")
        # Found once; whether they train is read every step (train()/eval()).
        self._sync_batch_norms = [
            (path, m) for path, m in ddp.module.named_modules()
            if isinstance(m, torch.nn.SyncBatchNorm)
        ]
        self._steps = 0  # optimizer steps taken: equal on every rank, or replicas differ
        self._sync_pending = False

    # -- the record every rank sends ------------------------------------------------

    def _exchange(self, tag, code, batch, micro, text, mask, doing):
        data = text.encode()[:_TEXT]
        head = torch.tensor([tag, code, batch, micro, self._steps, len(data)], dtype=torch.int64)
        mine = torch.zeros(_HEADER * 8 + _TEXT + len(self.params), dtype=torch.uint8)
        mine[: _HEADER * 8] = head.view(torch.uint8)
        if data:
            text_bytes = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            mine[_HEADER * 8 : _HEADER * 8 + len(data)] = text_bytes
        if mask:
            mine[_HEADER * 8 + _TEXT :] = torch.tensor(mask, dtype=torch.uint8)
        mine = mine.to(self._device)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._collective(doing, lambda: dist.all_gather(every, mine, group=self.group))
        records = []
        for r, t in enumerate(t.cpu() for t in every):
            h = t[: _HEADER * 8].view(torch.int64).tolist()
            if h[0] != tag:
                raise DistributedError(
                    self._where() + f"while {doing}, rank {r} was at another point of the step "
                    f"(the ranks are out of step: a rank caught an error and went on?); "
                    f"restart from a checkpoint"
                )
            text = bytes(t[_HEADER * 8 : _HEADER * 8 + h[5]].tolist()).decode(errors="replace")
            records.append((h[1], h[2], h[3], h[4], text, t[_HEADER * 8 + _TEXT :]))
        return records

    def _where(self):
        return f"[Trainer.step] rank {self.rank} (of {self.world_size} ranks): "

    def _collective(self, doing, fn):
        try:
            return fn()
        except RuntimeError as e:
            raise DistributedError(
                self._where() + f"a collective failed while memfit was {doing}: another "
                f"rank probably died or hung (check its log). {_first_line(e)}"
            ) from e

    def _all_async(self, doing, launches):
        """Start every async collective of `launches`, then wait for all."""

        def run():
            for work in [launch() for launch in launches]:
                work.wait()

        self._collective(doing, run)

    # -- a step ---------------------------------------------------------------------

    def step(self, native, local_batch, signature, chunk_loss, plan=None):
        """One distributed step of the native Trainer; `local_batch` is this
        rank's sample count or the ValueError its batch raised; `plan`, a
        RankPlan (None only with a bad batch)."""
        for path, m in self._sync_batch_norms:
            if m.training:
                # The same model on every rank: the same error, no collective.
                raise ValueError(
                    f"[Trainer.step] {path or 'the model'} is a SyncBatchNorm in training "
                    f"mode: it runs a collective in every forward, so the ranks cannot run "
                    f"their micro-batches independently; use BatchNorm (coupled='allow'), "
                    f"GroupNorm or LayerNorm, or put it in eval mode"
                )
        batches, start = self.agree(native, local_batch, signature, plan)
        try:
            report = native.step(local_batch, chunk_loss)
        except Exception as e:
            self.ddp.module.zero_grad(set_to_none=True)
            self.failed(e)
            raise
        return DistributedStepReport(report, self.rank, self.world_size, batches, start)

    def agree(self, native, local_batch, signature, plan=None):
        """Agree on the micro-batch to start from, planned first on every
        rank when any rank would plan; `local_batch` is this rank's sample
        count or the ValueError it raised. Returns the report's
        (local_batches, start_micro_batch)."""
        bad = isinstance(local_batch, Exception)
        code = _BAD_INPUT if bad else _PLAN if plan is not None and plan.wanted else _OK
        records = self._exchange(
            _AGREE, code, 0 if bad else local_batch, native.micro_batch,
            str(local_batch) if bad else signature, None, "agreeing the micro-batch",
        )
        self._check_records(records, local_batch)
        batches = [rec[1] for rec in records]
        if any(rec[0] == _PLAN for rec in records):
            plan.run(batches)  # every rank, together; raises on every rank alike
            records = self._exchange(_AGREE, _OK, local_batch, native.micro_batch, signature,
                                     None, "agreeing the planned micro-batch")
        wanted = native.micro_batch
        start = min(m if m > 0 else b for b, m in zip(batches, (rec[2] for rec in records)))
        # Whole batch wanted and the whole batch agreed: keep "0" for next time.
        native.set_micro_batch(0 if wanted == 0 and start >= local_batch else start)
        self._broadcast_buffers()
        self._sync_pending = True
        return batches, start

    def _check_records(self, records, local_batch):
        """Raises the same error on every rank when a batch is bad, the
        batches differ in kind, or the ranks are out of step."""
        problems = [f"rank {r}: {rec[4]}" for r, rec in enumerate(records) if rec[0] == _BAD_INPUT]
        if problems:
            error = ValueError(
                f"[Trainer.step] bad local batch on {_plural(len(problems), 'rank')} of "
                f"{self.world_size}; no rank took the step. " + "; ".join(problems)
            )
            raise error from (local_batch if isinstance(local_batch, Exception) else None)
        signatures = [rec[4] for rec in records]
        if len(set(signatures)) > 1:
            raise ValueError(
                "[Trainer.step] the ranks' batches differ in their tensors' dtypes or "
                "dimensions; every rank must pass the same kind of batch. "
                + "; ".join(f"rank {r}: {s}" for r, s in enumerate(signatures))
            )
        steps = [rec[3] for rec in records]
        if len(set(steps)) > 1:
            raise DistributedError(
                self._where() + "the ranks have taken different numbers of optimizer "
                f"steps ({', '.join(f'rank {r}: {s}' for r, s in enumerate(steps))}): an "
                "optimizer step failed on some rank after the gradients were synced, so "
                "the replicas differ; restart from a checkpoint"
            )

    def _broadcast_buffers(self):
        if not getattr(self.ddp, "broadcast_buffers", False):
            return
        buffers = [b for n, b in self.ddp.module.named_buffers() if n not in self._ignore]
        if not buffers:
            return

        with torch.no_grad():
            self._all_async("broadcasting the buffers from rank 0", [
                lambda b=b: dist.broadcast(b, self._root, group=self.group, async_op=True)
                for b in buffers
            ])

    def optimizer_step(self, step):
        """`step` (optimizer.step) preceded by the gradient sync."""

        def synced_step():
            mask = [p.grad is not None for p in self.params]
            self._sync_pending = False  # this rank's one record of the sync, sent or failed
            records = self._exchange(_SYNC, _OK, 0, 0, "", mask, "syncing gradients")
            failed = [f"rank {r}: {rec[4]}" for r, rec in enumerate(records) if rec[0] == _FAILED]
            if failed:
                raise DistributedError(
                    self._where() + f"{_plural(len(failed), 'other rank')} failed this step "
                    f"({'; '.join(failed)}); every rank skipped its optimizer step, so the "
                    "replicas stay equal"
                )
            anywhere = torch.stack([rec[5] for rec in records]).amax(0).tolist()
            grads = []
            for p, has in zip(self.params, anywhere):
                if has:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    grads.append(p.grad)

            self._all_async("syncing gradients", [
                lambda g=g: dist.all_reduce(g, group=self.group, async_op=True) for g in grads
            ])
            with torch.no_grad():
                for g in grads:
                    g.div_(self.world_size)
            step()
            self._steps += 1

        return synced_step

    def failed(self, error):
        """This rank's step failed before the sync: tell the others (so that
        they skip the optimizer step instead of waiting), then let `error` out."""
        if not self._sync_pending:
            return
        self._sync_pending = False
        try:
            self._exchange(
                _SYNC, _FAILED, 0, 0, _first_line(error), None, "reporting this rank's error"
            )
        except DistributedError as e:
            if hasattr(error, "add_note"):  # Python 3.11
                error.add_note(f"memfit could not tell the other ranks either: {e}")
