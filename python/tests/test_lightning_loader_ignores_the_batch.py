"""A train_dataloader that builds its batches whatever the module's
batch_size says: FitBatchSize set batch_size from 4 to 557 and said so,
while Lightning's loop went on training at the loader's 4 (or, with a
loader that doubles it, at twice the batch that fits). It now refuses in one
line naming the loader's batch and what to do, and the module's batch_size
is left as it was."""

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class FixedLoader(setup.Classifier):
    """Batches of 4 whatever batch_size says; `seen`: the batch trained."""

    def train_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_size=4)

    def training_step(self, batch, batch_idx):
        self.seen = len(batch[0])
        return super().training_step(batch, batch_idx)


class DoublingLoader(setup.Classifier):
    """Two views of each sample: batches of twice batch_size."""

    def train_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_size=2 * self.batch_size)


def test_a_loader_with_a_batch_of_its_own_trains_there_without_the_callback():
    module = FixedLoader(4)
    module.batch_size = 557
    setup.quiet_trainer(max_steps=1).fit(module)
    assert module.seen == 4  # the truth: the loop runs the loader's batch


@pytest.mark.parametrize("make,said", [
    (FixedLoader, "[FitBatchSize] train_dataloader builds batches of 4 with batch_size set to "
                  "557 (4 at 4): "),
    (DoublingLoader, "[FitBatchSize] train_dataloader builds batches of 1114 with batch_size "
                     "set to 557 (8 at 4): "),
], ids=["fixed", "doubled"])
def test_a_loader_that_does_not_batch_by_batch_size_is_refused_in_one_line(make, said):
    module = []

    def made(batch_size):
        module.append(make(batch_size))
        return module[0]

    with pytest.raises(ValueError) as error:
        setup.fit_on_device(made, 4, [FitBatchSize()], max_steps=1)
    text = str(error.value)
    assert "\n" not in text and text.startswith(said), text
    assert text.endswith("its DataLoader must take batch_size=batch_size, or FitBatchSize sizes "
                         "a batch the loop does not run; 557 fits")
    assert module[0].batch_size == 4  # as it was
