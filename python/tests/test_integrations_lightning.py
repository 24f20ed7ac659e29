"""memfit.integrations.lightning with the real Lightning: FitBatchSize sizes
the batch inside Lightning's own fit loop on the simulated device (20 steps,
no OOM, and a batch a little larger runs out of memory there), keeps an
effective batch exactly, follows BatchSizeFinder's attribute conventions;
MemoryReport writes the first step's page; MemoryDoctor reports the loop."""

import gc
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import memfit

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize, MemoryDoctor, MemoryReport  # noqa: E402

BUDGET = "3MiB"
X = torch.randn(1024, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (1024,), generator=torch.Generator().manual_seed(1))


pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class Samples(torch.utils.data.Dataset):
    """X and Y over and over: enough samples for 20 steps at any batch."""

    def __len__(self):
        return 1 << 16

    def __getitem__(self, i):
        return X[i % len(X)], Y[i % len(X)]


class Mlp(pl.LightningModule):
    """64-256-256-10 with Adam over a fixed data set; training_step logs, as
    modules do (a rehearsed step must not fail on self.log)."""

    def __init__(self, batch_size=4, keep_outputs=False):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 10))
        if batch_size is not None:
            self.batch_size = batch_size
        self.keep_outputs = keep_outputs
        self.kept = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        loss = F.cross_entropy(out, y)
        self.log("loss", loss)
        if self.keep_outputs:
            self.kept.append(out)  # a mistake: each step's graph stays alive
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        size = self.hparams.get("batch_size", getattr(self, "batch_size", 4))
        return torch.utils.data.DataLoader(Samples(), batch_size=size, shuffle=True)


class Sizes(pl.Callback):
    """The batch of each training step the fit loop ran (memfit's rehearsed
    steps are not the loop's)."""

    def __init__(self):
        self.sizes = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.sizes.append(batch[0].shape[0])


def trainer(callbacks=(), **kw):
    sizes = Sizes()
    t = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, max_epochs=1000,
                   callbacks=[*callbacks, sizes], **kw)
    t.sizes = sizes.sizes
    return t


def lightning_loop(batch, steps):
    """Lightning's own fit loop at `batch` for `steps` optimizer steps on the
    simulated device."""
    gc.collect()
    with memfit.simulated_device(BUDGET):
        t = trainer(max_steps=steps)
        t.fit(Mlp(batch))
        return t.sizes


def test_fit_batch_size_trains_lightnings_loop_20_steps_and_is_tight():
    gc.collect()
    with memfit.simulated_device(BUDGET):
        module = Mlp()
        fit = FitBatchSize()
        t = trainer(max_steps=20, callbacks=[fit])
        t.fit(module)
        b = fit.optimal_batch_size
        # Set before the loop started: every step of the loop ran at it, 0 OOMs.
        assert module.batch_size == b and t.sizes == [b] * 20
        assert fit.plan.full_size_steps <= 2
        module = None
    # Tight: a batch 3% larger does not survive Lightning's own loop.
    with pytest.raises(torch.OutOfMemoryError) as e:
        lightning_loop(b + max(2, b // 33), 3)
    # The forward ran out inside optimizer.step(closure): not the optimizer's OOM.
    assert "A smaller batch cannot help" not in str(e.value), str(e.value)


def test_keep_effective_batch_sets_accumulation_so_the_product_is_exact():
    gc.collect()
    with memfit.simulated_device(BUDGET):
        module = Mlp()
        fit = FitBatchSize(keep_effective_batch=1200)
        t = trainer(max_steps=3, callbacks=[fit])
        t.fit(module)
        b, k = fit.optimal_batch_size, t.accumulate_grad_batches
        assert b * k == 1200 and k > 1
        assert t.sizes == [b] * (3 * k)  # 3 optimizer steps of k micro-batches
        module = None


def test_fit_batch_size_says_it_changed_the_batch():
    # Changing the batch is said as a warning, not only in logging.info.
    gc.collect()
    with memfit.simulated_device(BUDGET):
        module = Mlp(batch_size=4)
        fit = FitBatchSize()
        with pytest.warns(UserWarning, match=r"^\[FitBatchSize\] batch 4 -> \d+: the largest "
                          r"batch that fits is \d+ under the budget of .* \(measured in "):
            trainer(max_steps=1, callbacks=[fit]).fit(module)
        assert module.batch_size == fit.optimal_batch_size != 4
        module = None


@pytest.mark.parametrize("make, message", [
    (lambda: FitBatchSize(budget="abc"), r"^\[FitBatchSize\] cannot read 'abc' as a size"),
    (lambda: MemoryReport("page.html", budget="1.5MB"), r"^\[MemoryReport\] 'MB' in '1.5MB'"),
    (lambda: FitBatchSize(target_device="tpu"),
     r"^\[FitBatchSize\] target_device must be 'cpu' or 'cuda'"),
    (lambda: FitBatchSize(batch_dim="x"), r"^\[FitBatchSize\] batch_dim must be an int"),
    (lambda: MemoryReport("page.html", budget=-1), r"^\[MemoryReport\] cannot use -1 as a size"),
])
def test_bad_options_are_refused_when_the_callback_is_made(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_keep_effective_batch_says_why_it_cannot():
    scheduler = pl.callbacks.GradientAccumulationScheduler({0: 2})
    with pytest.raises(ValueError) as e:
        trainer(max_steps=1, callbacks=[FitBatchSize(budget="8MiB", keep_effective_batch=64),
                                        scheduler]).fit(Mlp())
    msg = str(e.value)
    assert msg.startswith("[FitBatchSize] keep_effective_batch=64 sets accumulate_grad_batches, "
                          "but a GradientAccumulationScheduler")
    assert "\n" not in msg


class Data(pl.LightningDataModule):
    def __init__(self, batch_size=4):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Samples(), batch_size=self.batch_size)


class HparamsMlp(Mlp):
    def __init__(self, batch_size=4):
        super().__init__(batch_size=None)
        self.save_hyperparameters()


def test_the_batch_is_set_where_batch_size_finder_would_set_it():
    # hparams of the module
    module = HparamsMlp()
    fit = FitBatchSize(budget="3MiB")
    trainer(max_steps=1, callbacks=[fit]).fit(module)
    assert module.hparams.batch_size == fit.optimal_batch_size > 4
    # a datamodule's attribute (the module has none)
    module, data = Mlp(batch_size=None), Data()
    fit = FitBatchSize(budget="3MiB")
    trainer(max_steps=1, callbacks=[fit]).fit(module, datamodule=data)
    assert data.batch_size == fit.optimal_batch_size > 4
    # neither: the finder's own complaint, in one line
    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] field batch_size not found"):
        trainer(max_steps=1, callbacks=[FitBatchSize(budget="3MiB")]).fit(Mlp(batch_size=None))


def test_memory_report_writes_the_first_steps_page(tmp_path):
    path = tmp_path / "step.html"
    report = MemoryReport(str(path), budget="3MiB", predict=False)
    t = trainer(max_steps=2, callbacks=[report])
    t.fit(Mlp(batch_size=8))
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Mlp" in page
    assert report.report.batch == 8 and report.report.peak_phase
    assert t.sizes == [8, 8]  # the rehearsal is not a step of the loop


def test_memory_doctor_reports_a_graph_kept_across_steps(tmp_path):
    doctor = MemoryDoctor(path=str(tmp_path / "doctor.txt"), trials=False)
    trainer(max_steps=6, callbacks=[doctor]).fit(Mlp(batch_size=32, keep_outputs=True))
    kinds = {f.kind for f in doctor.findings}
    assert kinds & {"graph_kept", "memory_growth", "tensors_kept"}
    assert "memfit doctor" in (tmp_path / "doctor.txt").read_text()
    clean = MemoryDoctor(trials=False)
    trainer(max_steps=6, callbacks=[clean]).fit(Mlp(batch_size=32))
    # Lightning's own order (gradients alive through the forward) is not the user's mistake.
    assert clean.findings == []


def test_import_memfit_imports_no_framework():
    code = ("import sys, memfit, memfit.integrations; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', "
            "'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_env())
    assert out.stdout.strip() == "[]"


def test_the_integration_without_lightning_says_pip_install_lightning():
    code = ("import sys; sys.modules['lightning'] = None; sys.modules['pytorch_lightning'] = None\n"
            "try:\n    import memfit.integrations.lightning\n"
            "except ImportError as e:\n    print(repr(str(e)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_env())
    assert out.stdout.strip() == ("'[memfit.integrations.lightning] Lightning is not installed: "
                                  "pip install lightning'")


def _env():
    import os

    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
