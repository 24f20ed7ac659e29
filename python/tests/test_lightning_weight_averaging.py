"""Lightning's EMAWeightAveraging updates its average after each step,
outside the step FitBatchSize measures, while the gradients and Adam's
state are alive: decay * ema + (1 - decay) * p makes three temporaries of
the largest weight. FitBatchSize checks that they fit beside what the step
leaves alive, and says so (See Note [An average updated beside the step],
integrations/averaging.py). The truth is Lightning's own loop, with the
callback, on a simulated device of the budget."""

import copy
import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
if not hasattr(pl.callbacks, "EMAWeightAveraging"):
    pytest.skip("this Lightning has no EMAWeightAveraging", allow_module_level=True)
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

X = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (4096,), generator=torch.Generator().manual_seed(1))


class Classifier(setup.Classifier):
    """A 1 MiB weight in the middle: the average's update of it makes 3 MiB."""

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y),
                                           batch_size=self.batch_size, shuffle=True)


def train(budget, batch_size, callbacks=(), steps=3):
    """Lightning's loop with EMAWeightAveraging on a simulated device."""
    gc.collect()
    with memfit.simulated_device(budget):
        module = Classifier(batch_size)
        setup.quiet_trainer(max_steps=steps,
                            callbacks=[*callbacks, pl.callbacks.EMAWeightAveraging()]).fit(module)
    return module


def runs(budget, batch_size):
    try:
        train(budget, batch_size)
        return True
    except torch.OutOfMemoryError:
        return False


def test_the_batch_set_beside_an_ema_callback_runs_lightnings_loop_with_it():
    # The update runs once the step's activations are gone: it does not
    # lower the batch, it only has to fit beside the weights, .grad and
    # Adam's state.
    fit = FitBatchSize()
    batch = train("12MiB", 4, [fit]).batch_size  # FitBatchSize's own run: an OOM would raise
    assert batch == fit.optimal_batch_size > 4
    assert any("EMAWeightAveraging updates its average after each step with 3.00 MiB" in n
               for n in fit.plan.notes), fit.plan.notes
    fit = None  # its trainer and module, on the simulated device, go
    assert runs("12MiB", batch)


def test_where_no_batch_fits_beside_the_update_the_fit_says_so():
    assert not runs("8MiB", 1)  # Lightning's loop, with the callback, at one sample
    with pytest.raises(memfit.DoesNotFit):
        train("8MiB", 4, [FitBatchSize()])


def test_where_the_update_fits_only_beside_a_smaller_batch_the_batch_is_lowered():
    # 8.8 MiB: the step alone fits some 490, and the update beside that
    # batch did not fit: the fit raised where Lightning's loop runs 228.
    def ema_fit(batch_size, callbacks=()):
        gc.collect()
        with memfit.simulated_device(int(8.8 * 2**20) + tracked_live_bytes("cpu")):
            module = Classifier(batch_size)
            setup.quiet_trainer(max_steps=3, callbacks=[
                *callbacks, pl.callbacks.EMAWeightAveraging()]).fit(module)
        return module.batch_size

    fit = FitBatchSize()
    batch = ema_fit(4, [fit])  # Lightning's loop at the batch set: an OOM would raise
    assert batch == fit.optimal_batch_size > 4
    assert any("the batch is lowered to" in n for n in fit.plan.notes), fit.plan.notes
    fit = None
    with pytest.raises(torch.OutOfMemoryError):  # tight: 5% above it runs out
        ema_fit(batch + batch // 20)


TOKENS = [torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(n))
          for n in [4, 8, 12, 16] * 64]


def pad(samples):
    x = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    return x, x.clone()


class Tagger(Classifier):
    """The same weights over tokens, batched by length."""

    def __init__(self, batch_size=4):
        super().__init__(batch_size)
        self.tok = torch.nn.Embedding(10, 64)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(self.tok(x)).flatten(0, 1), y.flatten())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(TOKENS, batch_size=self.batch_size, collate_fn=pad)


def test_batches_by_length_beside_an_ema_callback_are_checked_too():
    def fit_by_length(budget):
        gc.collect()
        with memfit.simulated_device(budget):
            setup.quiet_trainer(max_steps=3,
                                callbacks=[FitBatchSize(seq_dim=1, lengths=[8, 16]),
                                           pl.callbacks.EMAWeightAveraging()]).fit(Tagger())

    with pytest.raises(memfit.DoesNotFit, match=r"^\[FitBatchSize\] EMAWeightAveraging updates"):
        fit_by_length("8MiB")
    fit_by_length("12MiB")  # Lightning's loop, batched by length, with the callback: no OOM


class CopiedOnTheHost(pl.callbacks.StochasticWeightAveraging):
    """StochasticWeightAveraging as on a GPU: its setup copies the module
    before the module moves to the card (in host memory here), and the copy
    moves onto the device at swa_epoch_start (a copy the simulated device
    counts: .to("cpu") would keep the host's)."""

    def setup(self, trainer, pl_module, stage):
        with memfit.host_memory():
            super().setup(trainer, pl_module, stage)

    def on_train_epoch_start(self, trainer, pl_module):
        if not self._initialized and self.swa_start <= trainer.current_epoch <= self.swa_end:
            self._average_model = copy.deepcopy(self._average_model)
        super().on_train_epoch_start(trainer, pl_module)


def _swa_fit(budget, batch_size, callbacks=()):
    """Two epochs of two steps, averaging from the second."""
    gc.collect()
    swa = CopiedOnTheHost(swa_lrs=1e-3, swa_epoch_start=1)
    with memfit.simulated_device(budget + tracked_live_bytes("cpu")):
        module = Classifier(batch_size)
        setup.quiet_trainer(max_epochs=2,
                            limit_train_batches=2, callbacks=[*callbacks, swa]).fit(module)
    return module.batch_size


def test_a_swa_copy_moved_onto_the_device_later_is_kept_free_beside_the_step():
    # Not kept free, the batch was 556 and the second epoch ran out of
    # memory: Lightning's loop runs 369 at most.
    fit = FitBatchSize()
    b = _swa_fit(8 << 20, 4, [fit])  # Lightning's loop at the batch set: an OOM would raise
    assert b == fit.optimal_batch_size > 4
    assert any(n.startswith("the weights' copy CopiedOnTheHost moves onto the device later "
                            "(1.15 MiB)") for n in fit.plan.notes), fit.plan.notes
    fit = None
    with pytest.raises(torch.OutOfMemoryError):  # tight: 3% above it runs out
        _swa_fit(8 << 20, b + max(2, b // 33))
