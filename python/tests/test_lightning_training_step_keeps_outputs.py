"""A training_step that keeps its outputs for on_train_epoch_end (Lightning's
docs pattern: a list the epoch's end reads and clears): kept per sample,
they pile up over the epoch beside every later step. FitBatchSize said 174
for features kept over 12 batches where Lightning's loop runs 59 (See Note
[What training_step keeps over an epoch], integrations/lightning_rehearsal.py).
The truth is Lightning's own loop on a simulated device of the budget."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class KeepsFeatures(setup.Classifier):
    """Keeps each step's 512-wide features for an epoch-level metric."""

    def __init__(self, batch_size=4):
        super().__init__(batch_size)
        self.features = []

    def training_step(self, batch, batch_idx):
        h = self.net[:4](batch[0])
        self.features.append(h.detach())
        return F.cross_entropy(self.net[4](h), batch[1])

    def on_train_epoch_end(self):
        self.features.clear()


class KeepsThemAtTheBatchEnd(KeepsFeatures):
    """Returns them beside the loss and keeps them in on_train_batch_end:
    556 said, Lightning's loop runs 59."""

    def training_step(self, batch, batch_idx):
        h = self.net[:4](batch[0])
        return {"loss": F.cross_entropy(self.net[4](h), batch[1]), "h": h}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.features.append(outputs["h"])


def train(batch_size, callbacks=(), kind=KeepsFeatures):
    """Lightning's loop over one epoch of 12 batches."""
    return setup.fit_on_device(kind, batch_size, callbacks, max_epochs=1,
                               limit_train_batches=12)


@pytest.mark.parametrize("kind", [KeepsFeatures, KeepsThemAtTheBatchEnd],
                         ids=["in_training_step", "in_on_train_batch_end"])
def test_outputs_kept_over_the_epoch_are_held_beside_each_step(kind):
    fit = FitBatchSize()
    batch = train(4, [fit], kind)  # an OOM in Lightning's loop would raise
    assert batch == fit.optimal_batch_size > 4
    assert any(n.startswith("training_step keeps 2.00 KiB a sample") for n in fit.plan.notes)
    fit = None
    with pytest.raises(torch.OutOfMemoryError):  # tight: 5% above it runs out
        train(batch + max(2, batch // 20), kind=kind)
