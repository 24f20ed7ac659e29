"""Each rank's predicted peak under DDP and ZeRO-1 against real runs: two
processes, gloo on CPU, every allocation tracked on each rank."""

import json
import os
import subprocess
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import memfit

BATCH = 32
# (DDP's gradient_as_bucket_view, optimizer): ZeroRedundancyOptimizer is ZeRO-1.
RUNS = [(False, "adam"), (True, "adam"), (False, "zero1"), (True, "zero1")]


def _model():
    torch.manual_seed(0)
    # Uneven layers: ZeroRedundancyOptimizer's ranks hold unequal shares.
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 256, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def _rank(rank, world, init_file, out_dir):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    xs, ys = _batch()
    peaks = []
    for as_view, opt_name in RUNS:
        # The step memfit.profile runs: parameters onto the device, then two
        # iterations of inputs, forward, loss, backward, step, zero_grad; on
        # each rank's own simulated device.
        with memfit.simulated_device("1GiB"), memfit.track() as t:
            ddp = torch.nn.parallel.DistributedDataParallel(
                _model(), gradient_as_bucket_view=as_view)
            if opt_name == "zero1":
                opt = ZeroRedundancyOptimizer(ddp.parameters(),
                                              optimizer_class=torch.optim.Adam, lr=1e-3)
            else:
                opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
            for _ in range(2):
                x, y = xs.clone(), ys.clone()
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del x, y, loss
            del ddp, opt
        peaks.append(t.peak_bytes)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(peaks, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured():
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_rank, args=(2, os.path.join(d, "init"), d), nprocs=2,
                           start_method="spawn")
        ranks = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]
    # The fullest rank is the one that runs out first.
    return [max(r0, r1) for r0, r1 in zip(*ranks)]


@pytest.fixture(scope="module")
def report():
    xs, ys = _batch()
    # The ranks' loop drops the output once the loss exists, as this step.
    return memfit.profile(_model(), xs, ys, optimizer="adam", keep_output=False)


@pytest.mark.slow
@pytest.mark.parametrize("run", range(len(RUNS)))
def test_predicted_rank_peak_within_3_percent(measured, report, run):
    as_view, opt_name = RUNS[run]
    shards = "parameters" if opt_name == "zero1" else "flat"
    peaks = {p.sharding: p for p in report.data_parallel(
        2, gradient_as_bucket_view=as_view, optimizer_shards=shards)}
    predicted = peaks["zero1" if opt_name == "zero1" else "ddp"].peak_bytes
    assert abs(predicted - measured[run]) / measured[run] < 0.03, (predicted, measured[run])


def test_ddp_adds_exactly_the_buckets(measured, report):
    # Measured: DDP's buckets are one copy of the gradients, nothing else.
    grads = sum(p.numel() * 4 for p in _model().parameters())
    assert measured[0] == report.peak_bytes + grads
    # With .grad as bucket views the gradients live in the buckets.
    assert measured[1] == report.peak_bytes


def test_sharding_lowers_the_rank_peak(report):
    peaks = {p.sharding: p.peak_bytes for p in report.data_parallel(4)}
    assert peaks["zero1"] < peaks["ddp"]
    assert peaks["zero2"] < peaks["ddp"]
    assert list(peaks) == ["ddp", "zero1", "zero2", "zero3"]
    assert "data_parallel" in json.loads(report.to_json())
    assert "Per rank on 4 ranks" in report.table()


def test_bad_setups_are_refused(report):
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        report.data_parallel(0)
    with pytest.raises(ValueError, match="optimizer_shards must be 'flat'"):
        report.data_parallel(2, optimizer_shards="even")
    with pytest.raises(ValueError, match="largest_unit must be a module"):
        report.data_parallel(2, largest_unit=-5)


def test_cli_prints_per_rank_peaks():
    exe = os.path.join(os.path.dirname(__file__), "..", "..", "build", "memfit")
    if not os.path.exists(exe):
        pytest.skip("build/memfit not built")
    out = subprocess.run([exe, "profile", "--model", "mlp", "--batch", "8", "--json",
                          "--world-size", "2"], capture_output=True, text=True, check=True)
    dp = json.loads(out.stdout)["data_parallel"]
    assert dp["world_size"] == 2
    assert [r["sharding"] for r in dp["per_rank"]] == ["ddp", "zero1", "zero2", "zero3"]
    assert dp["per_rank"][0]["peak_bytes"] > json.loads(out.stdout)["peak_bytes"]


def _one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "init1"),
                            rank=0, world_size=1)


@pytest.mark.slow
def test_fit_under_ddp_reserves_the_buckets_and_holds(tmp_path):
    budget = 24 << 20
    _one_rank_group(tmp_path)
    try:
        xs, ys = _batch()
        ddp = torch.nn.parallel.DistributedDataParallel(_model())
        fit = memfit.find_batch_size(ddp, xs, ys, optimizer="adam", budget=budget)
        grads = sum(p.numel() * 4 for p in _model().parameters())
        assert fit.budget_bytes == budget - grads
        plain = memfit.find_batch_size(_model(), xs, ys, optimizer="adam", budget=budget)
        assert fit.max_batch < plain.max_batch
        del ddp

        def train(batch):
            # Everything on the simulated card: weights, DDP's buckets, steps.
            with memfit.simulated_device(budget):
                ddp = torch.nn.parallel.DistributedDataParallel(_model())
                opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
                for _ in range(2):
                    x = torch.randn(batch, 256)
                    y = torch.randint(0, 10, (batch,))
                    torch.nn.functional.cross_entropy(ddp(x), y).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

        train(fit.max_batch)  # fits
        with pytest.raises(torch.cuda.OutOfMemoryError):
            train(fit.max_batch + max(8, fit.max_batch // 20))
        with pytest.raises(memfit.DoesNotFit, match="DDP's gradient buckets alone"):
            memfit.find_batch_size(torch.nn.parallel.DistributedDataParallel(_model()),
                                   xs, ys, optimizer="adam", budget=grads)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_cli_fit_ddp_reserves_the_buckets():
    exe = os.path.join(os.path.dirname(__file__), "..", "..", "build", "memfit")
    if not os.path.exists(exe):
        pytest.skip("build/memfit not built")
    fit = [exe, "fit", "--model", "mlp", "--budget", "64MiB", "--json"]
    plain = json.loads(subprocess.run(fit, capture_output=True, text=True, check=True).stdout)
    ddp = json.loads(subprocess.run(fit + ["--ddp"], capture_output=True, text=True,
                                    check=True).stdout)
    mlp_params = (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10) * 4
    assert ddp["budget_bytes"] == (64 << 20) - mlp_params
    assert ddp["max_batch"] < plain["max_batch"]
    small = subprocess.run([exe, "fit", "--model", "mlp", "--budget", "2MiB", "--ddp"],
                           capture_output=True, text=True)
    assert small.returncode == 2
    assert "DDP's gradient buckets alone take 2.55 MiB" in small.stderr
