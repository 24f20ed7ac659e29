"""memfit.Trainer on DistributedDataParallel: two real ranks, gloo on CPU."""

import datetime
import multiprocessing
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import memfit

WORLD = 2
LOCAL = 8  # samples per rank


class Net(torch.nn.Module):
    """A small MLP with a buffer, which DDP's semantics take from rank 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )
        self.register_buffer("shift", torch.zeros(8))
        self.double()

    def forward(self, x):
        return self.body(x + self.shift)


class CaptureSGD(torch.optim.SGD):
    """SGD that records the gradients it steps with."""

    def __init__(self, params):
        super().__init__(params, lr=0.1)
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]
        super().step()


def data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (n,), generator=g)


def local(t, rank):
    return t[rank * LOCAL : (rank + 1) * LOCAL]


def reference_gradients(x, y):
    """The unsplit single-process step on the global batch (mean loss)."""
    model = Net()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


# Note [How close the ranks' gradients are to the unsplit batch's]
# Net and data are float64 (u = 2**-53). Each gradient entry is the mean of
# 16 per-sample terms: the reference adds them in one kernel; each rank in
# micro-batches of 3, 3, 2 (each chunk's loss weighted by its share), .grad
# adding the partial sums, then gloo's allreduce over the two ranks (the
# division by 2 is exact). Two orders of one sum of about 20 additions, each
# within gamma_20 sum |t_s| (Higham 4.2), with sum |t_s| / |g| at most 7.3
# (norm-wise, measured on both data seeds): 2 * 20 * 7.3 = 292 u; per-sample
# terms computed in other batch shapes add a few u each (~ 16 u * 7.3).
# 2**-44 (512 u) bounds both; measured at most 2.5 u. What it must catch: a
# sample dropped or counted twice (1/16 of an entry), another rank's buffer,
# any step rounded to fp32 on the way (2**-25 = 2.7e8 u).
def assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert ((g - w).norm() / w.norm()).item() <= 2**-44


def _rank_main(rank, fn, init_file, timeout_s, out_dir):
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=timeout_s))
        result = ("ok", fn(rank))
    except BaseException as e:  # noqa: B902: every failure goes back to the test
        result = ("error", type(e).__name__, str(e))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    os._exit(0)  # no teardown: a dead peer could block it


def run_ranks(tmp_path, fn, timeout_s=10, deadline_s=40, wait_for=(0, 1)):
    """fn(rank) on WORLD forked processes in one gloo group; returns
    ({rank: ("ok", value) | ("error", type, message) | None}, exit codes).
    Ranks still running when those in `wait_for` have ended, or at the
    deadline, are killed."""
    ctx = multiprocessing.get_context("fork")
    args = (fn, str(tmp_path / "pg"), timeout_s, str(tmp_path))
    procs = [ctx.Process(target=_rank_main, args=(r, *args)) for r in range(WORLD)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline_s
    try:
        for r in wait_for:
            procs[r].join(max(0.0, end - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    results = {}
    for r in range(WORLD):
        path = tmp_path / f"rank{r}.pt"
        results[r] = torch.load(path) if path.exists() else None
    return results, [p.exitcode for p in procs]


def ok(result):
    assert result is not None and result[0] == "ok", result
    return result[1]


def test_split_gradients_on_two_ranks_equal_the_unsplit_global_batch(tmp_path):
    x, y = data(WORLD * LOCAL)

    def rank_fn(rank):
        model = DDP(Net())
        if rank == 1:
            model.module.shift.fill_(5.0)  # rank 0's buffer wins, as in DDP
        opt = CaptureSGD(model.parameters())
        t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=3)
        r = t.step(local(x, rank), local(y, rank))
        return dict(grads=opt.grads, chunks=list(r.chunks), ooms=r.ooms_recovered,
                    rank=r.rank, world=r.world_size, batches=r.local_batches,
                    global_batch=r.global_batch, start=r.start_micro_batch,
                    shift=model.module.shift.clone(),
                    params=[p.detach().clone() for p in model.parameters()],
                    grads_after=[p.grad for p in model.parameters()])

    results, _ = run_ranks(tmp_path, rank_fn)
    want = reference_gradients(x, y)
    got = [ok(results[r]) for r in range(WORLD)]
    for rank, g in enumerate(got):
        assert g["chunks"] == [3, 3, 2] and g["ooms"] == 0
        got_shape = (g["rank"], g["world"], g["batches"], g["global_batch"], g["start"])
        assert got_shape == (rank, 2, [8, 8], 16, 3)
        assert torch.equal(g["shift"], torch.zeros(8, dtype=torch.float64))
        assert_close(g["grads"], want)
        assert all(p is None for p in g["grads_after"])
    assert all(torch.equal(a, b) for a, b in zip(got[0]["params"], got[1]["params"]))


def test_oom_on_one_rank_is_recovered_and_both_ranks_shrink_next_step(tmp_path):
    x, y = data(WORLD * LOCAL)
    x2, y2 = data(WORLD * LOCAL, seed=2)

    def rank_fn(rank):
        model = DDP(Net())
        opt = CaptureSGD(model.parameters())
        calls = []

        def loss_fn(out, target):
            if not torch.is_grad_enabled():
                # The Trainer's one check that the loss counts its samples
                # apart: on a slice of the output, without grad.
                return torch.nn.functional.cross_entropy(out, target)
            calls.append(len(out))
            if rank == 1 and len(calls) == 2:  # rank 1's second micro-batch of step 1
                memfit._memfit.fail_allocation_after(1)
            return torch.nn.functional.cross_entropy(out, target)

        t = memfit.Trainer(model, opt, loss_fn, reduction="mean", micro_batch=4)
        r1 = t.step(local(x, rank), local(y, rank))
        grads1, params1 = opt.grads, [p.detach().clone() for p in model.parameters()]
        r2 = t.step(local(x2, rank), local(y2, rank))
        return dict(r1=(list(r1.chunks), r1.ooms_recovered, r1.start_micro_batch),
                    r2=(list(r2.chunks), r2.ooms_recovered, r2.start_micro_batch),
                    grads1=grads1, params1=params1,
                    params2=[p.detach().clone() for p in model.parameters()])

    results, _ = run_ranks(tmp_path, rank_fn)
    r0, r1 = ok(results[0]), ok(results[1])
    assert r0["r1"] == ([4, 4], 0, 4)
    assert r1["r1"] == ([4, 2, 2], 1, 4)  # the OOM halved rank 1's second micro-batch
    # Both start step 2 from rank 1's smaller micro-batch.
    assert r0["r2"] == r1["r2"] == ([2, 2, 2, 2], 0, 2)
    want = reference_gradients(x, y)
    assert_close(r0["grads1"], want)
    assert_close(r1["grads1"], want)
    for key in ("params1", "params2"):
        assert all(torch.equal(a, b) for a, b in zip(r0[key], r1[key]))


@pytest.mark.parametrize("fate", ["dies", "hangs"])
def test_a_dead_or_hung_rank_raises_distributed_error_not_a_hang(tmp_path, fate):
    x, y = data(WORLD * LOCAL)
    timeout_s = 10 if fate == "dies" else 3

    def rank_fn(rank):
        model = DDP(Net())
        calls = []

        def loss_fn(out, target):
            calls.append(1)
            if rank == 1 and len(calls) == 2:  # in the middle of the step
                if fate == "dies":
                    os._exit(1)
                time.sleep(60)
            return torch.nn.functional.cross_entropy(out, target)

        t = memfit.Trainer(model, CaptureSGD(model.parameters()), loss_fn, reduction="mean",
                           micro_batch=3)
        try:
            t.step(local(x, rank), local(y, rank))
        except memfit.DistributedError as e:
            return dict(error=str(e), cause=type(e.__cause__).__name__)
        return dict(error=None)

    # A survivor that hung would be killed at run_ranks' deadline and leave
    # no result: the assertions below fail then, with no wall-time check.
    results, codes = run_ranks(tmp_path, rank_fn, timeout_s=timeout_s, wait_for=(0,))
    survivor = ok(results[0])
    assert survivor["error"] is not None
    for part in ("rank 0 (of 2 ranks)", "syncing gradients", "another rank probably died or hung",
                 "check its log"):
        assert part in survivor["error"]
    assert survivor["cause"] == "RuntimeError"  # gloo's error, chained
    assert results[1] is None and (codes[1] == 1 if fate == "dies" else codes[1] != 0)


def test_bad_local_batch_on_one_rank_gives_every_rank_the_same_error(tmp_path):
    x, y = data(WORLD * LOCAL)

    def rank_fn(rank):
        model = DDP(Net())
        opt = CaptureSGD(model.parameters())
        t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss())
        xs, ys = local(x, rank), local(y, rank)
        errors = []
        bad = [(xs[:0], ys[:0]),  # no sample
               (xs.unsqueeze(1), ys),  # a dimension more
               (xs[:, :5], ys)]  # fails in rank 1's forward only
        for bx, by in bad:
            try:
                t.step(bx if rank == 1 else xs, by if rank == 1 else ys)
                errors.append(None)
            except (ValueError, RuntimeError) as e:
                errors.append((type(e).__name__, str(e)))
        t.step(xs, ys)  # the ranks are still in step
        return dict(errors=errors, params=[p.detach().clone() for p in model.parameters()])

    results, _ = run_ranks(tmp_path, rank_fn)
    r0, r1 = ok(results[0]), ok(results[1])
    (e0, d0, f0), (e1, d1, f1) = r0["errors"], r1["errors"]
    assert e0 == e1 and e0[0] == "ValueError"
    assert "rank 1: [Trainer.step] the batch is empty" in e0[1] and "no rank took the step" in e0[1]
    assert d0 == d1 and d0[0] == "ValueError"
    assert "rank 0: inputs (float64 2-d)" in d0[1] and "rank 1: inputs (float64 3-d)" in d0[1]
    # A failure inside rank 1's micro-batches: its own error there, and the
    # other rank is told instead of left waiting; neither steps.
    assert f1[0] == "RuntimeError" and "size of tensor a (5)" in f1[1]
    assert f0[0] == "DistributedError"
    assert "1 other rank failed this step (rank 1: RuntimeError: The size of tensor a (5)" in f0[1]
    assert "skipped its optimizer step" in f0[1]
    assert all(torch.equal(a, b) for a, b in zip(r0["params"], r1["params"]))


class Branches(torch.nn.Module):
    """Rank 0's samples use `a`, rank 1's use `b`; no sample uses `unused`."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.ones(3))
        self.b = torch.nn.Parameter(torch.ones(3))
        self.unused = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * (self.a if dist.get_rank() == 0 else self.b)


def test_a_gradient_missing_on_some_ranks_counts_as_zeros_there(tmp_path):
    def rank_fn(rank):
        model = DDP(Branches())
        grads = {}

        class Record(torch.optim.SGD):
            def step(self, closure=None):
                grads.update({n: p.grad for n, p in model.module.named_parameters()})

        t = memfit.Trainer(model, Record(model.parameters(), lr=0.1), lambda out: out.sum(),
                           reduction="sum", micro_batch=2)
        t.step(torch.full((4, 3), float(rank + 1)))
        return grads

    results, _ = run_ranks(tmp_path, rank_fn)
    for r in range(WORLD):
        g = ok(results[r])
        # The mean over ranks of each rank's local gradient: (4 + 0) / 2, (0 + 8) / 2.
        assert torch.equal(g["a"], torch.full((3,), 2.0))
        assert torch.equal(g["b"], torch.full((3,), 4.0))
        assert g["unused"] is None


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, 8)
        self.head = torch.nn.Linear(8, 11)
        self.double()

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def lm_loss(logits, labels):
    """A causal LM's loss: labels shifted, so counted from targets it derives."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11),
                                             labels[:, 1:].reshape(-1), ignore_index=-100)


def lm_data():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 11, (WORLD * LOCAL, 6), generator=g)
    labels = ids.clone()
    labels[LOCAL:, 3:] = -100  # rank 1's samples hold fewer tokens than rank 0's
    return ids, labels


def test_a_token_loss_on_ranks_with_other_token_counts_is_ddps_mean_of_the_ranks(tmp_path):
    # DDP's step: each rank's loss is the mean over its own tokens, and the
    # gradients are the mean of the ranks'. The Trainer divided the synced
    # token sums by each rank's own count after the sync: another gradient on
    # each rank (their replicas drifted apart), 0.16 relative off DDP's.
    ids, labels = lm_data()
    ranks = []
    for rank in range(WORLD):
        model = TinyLM()
        lm_loss(model(local(ids, rank)), local(labels, rank)).backward()
        ranks.append([p.grad for p in model.parameters()])
    want = [sum(g) / WORLD for g in zip(*ranks)]

    def rank_fn(rank):
        model = DDP(TinyLM())
        opt = CaptureSGD(model.parameters())
        memfit.Trainer(model, opt, lm_loss, micro_batch=3).step(local(ids, rank),
                                                               local(labels, rank))
        return dict(grads=opt.grads, params=[p.detach().clone() for p in model.parameters()])

    results, _ = run_ranks(tmp_path, rank_fn)
    got = [ok(results[r]) for r in range(WORLD)]
    for g in got:
        assert_close(g["grads"], want)
    assert all(torch.equal(a, b) for a, b in zip(got[0]["params"], got[1]["params"]))
