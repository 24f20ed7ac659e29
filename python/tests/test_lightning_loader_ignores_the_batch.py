"""A train_dataloader that builds its batches whatever the module's
batch_size says: FitBatchSize set batch_size from 4 to 557 and said so,
while Lightning's loop went on training at the loader's 4 (or, with a
loader that doubles it, at twice the batch that fits). It now refuses in one
line naming the loader's batch and what to do, and the module's batch_size
is left as it was."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

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


def _refused(make, said):
    """(the refusal's text, the module it sized) of FitBatchSize on the
    module `make` builds at a batch of 4; the text is one line starting
    with `said`."""
    module = []

    def made(batch_size):
        module.append(make(batch_size))
        return module[0]

    with pytest.raises(ValueError) as error:
        setup.fit_on_device(made, 4, [FitBatchSize()], max_steps=1)
    text = str(error.value)
    assert "\n" not in text and text.startswith(said), text
    return text, module[0]


@pytest.mark.parametrize("make,said", [
    (FixedLoader, "[FitBatchSize] train_dataloader builds batches of 4 with batch_size set to "
                  "557 (4 at 4): "),
    (DoublingLoader, "[FitBatchSize] train_dataloader builds batches of 1114 with batch_size "
                     "set to 557 (8 at 4): "),
], ids=["fixed", "doubled"])
def test_a_loader_that_does_not_batch_by_batch_size_is_refused_in_one_line(make, said):
    text, module = _refused(make, said)
    assert text.endswith("its DataLoader must take batch_size=batch_size, or FitBatchSize sizes "
                         "a batch the loop does not run; 557 fits")
    assert module.batch_size == 4  # as it was


# See Note [The batch the training loader runs] (integrations/lightning.py):
# a batch sampler, a dataset giving whole batches, several loaders.


class Buckets(torch.utils.data.Sampler):
    """Batches of `size` indices in order, whatever the module's batch_size."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __iter__(self):
        return (list(range(i, min(self.n, i + self.size))) for i in range(0, self.n, self.size))

    def __len__(self):
        return -(-self.n // self.size)


class WholeBatches(torch.utils.data.IterableDataset):
    """Yields batches of `size` samples of DATA itself."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        x, y = setup.DATA.tensors
        return ((x[i:i + self.size], y[i:i + self.size]) for i in range(0, len(x), self.size))


class Seen(setup.Classifier):
    """`seen`: the batch each loader gave the last step the loop ran."""

    def training_step(self, batch, batch_idx):
        parts = batch.values() if isinstance(batch, dict) else [batch]
        self.seen = [len(x) for x, _ in parts]
        return sum(super(Seen, self).training_step(b, batch_idx) for b in parts)


class FixedBuckets(Seen):
    def train_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_sampler=Buckets(len(setup.DATA), 16))


class LargeBuckets(Seen):
    def train_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA,
                                           batch_sampler=Buckets(len(setup.DATA), 1500))


class FixedWholeBatches(Seen):
    def train_dataloader(self):
        return torch.utils.data.DataLoader(WholeBatches(16), batch_size=None)


class OneLoaderFixed(Seen):
    def train_dataloader(self):
        return {"a": torch.utils.data.DataLoader(setup.DATA, batch_size=self.batch_size),
                "b": torch.utils.data.DataLoader(setup.DATA, batch_size=32)}


def test_a_batch_sampler_with_buckets_of_its_own_trains_at_them_without_the_callback():
    module = FixedBuckets(557)
    setup.quiet_trainer(max_steps=1).fit(module)
    assert module.seen == [16]  # the truth: the loop runs the sampler's batch
    with pytest.raises(torch.OutOfMemoryError):  # and buckets of 1500 run out
        setup.fit_on_device(LargeBuckets, 4, max_steps=1)


@pytest.mark.parametrize("make,said", [
    (FixedBuckets, "[FitBatchSize] train_dataloader builds batches of 16 with batch_size set to "
                   "557 (16 at 4): its batch_sampler (Buckets) must batch by batch_size, "),
    (LargeBuckets, "[FitBatchSize] train_dataloader builds batches of 1500 with batch_size set "
                   "to 557 (1500 at 4): its batch_sampler (Buckets) must batch by batch_size, "),
    (FixedWholeBatches, "[FitBatchSize] train_dataloader builds batches of 16 with batch_size "
                        "set to 557 (16 at 4): its dataset, which gives whole batches "
                        "(DataLoader(batch_size=None)), must batch by batch_size, "),
    (OneLoaderFixed, "[FitBatchSize] train_dataloader's loaders give batches of different sizes "
                     "with batch_size at 4 (loader 'a': 4, loader 'b': 32): each must batch by "
                     "batch_size, as FitBatchSize sets one batch for all of them"),
], ids=["sampler", "sampler-large", "whole-batches", "dict"])
def test_a_loader_giving_batches_of_its_own_is_refused_in_one_line(make, said):
    text, module = _refused(make, said)
    assert module.batch_size == 4  # as it was


class SamplerByBatchSize(Seen):
    def train_dataloader(self):
        batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(setup.DATA),
                                                self.batch_size, drop_last=False)
        return torch.utils.data.DataLoader(setup.DATA, batch_sampler=batches)


class Data(pl.LightningDataModule):
    """DATA in batches of the datamodule's own batch_size."""

    def __init__(self, batch_size=4):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_size=self.batch_size)


class FromTheDatamodule(Seen):
    """No batch_size of its own: the datamodule's is set."""

    def __init__(self, batch_size=4):
        super().__init__()
        del self.batch_size
        self.data = Data(batch_size)

    def train_dataloader(self):
        raise AssertionError("the datamodule's loader trains")


def _fit(make, batch_size, callbacks=()):
    """Lightning's loop over 2 steps, the datamodule's where the module has one."""
    gc.collect()
    with memfit.simulated_device(setup.BUDGET + tracked_live_bytes("cpu")):
        module = make(batch_size)
        dm = getattr(module, "data", None)
        setup.quiet_trainer(callbacks=list(callbacks), max_steps=2).fit(module, datamodule=dm)
    return module


@pytest.mark.parametrize("make", [SamplerByBatchSize, FromTheDatamodule],
                         ids=["batch-sampler", "datamodule"])
def test_a_loader_batching_by_the_batch_set_trains_there_and_is_tight(make):
    fit = FitBatchSize()
    module = _fit(make, 4, [fit])
    b = module.seen[0]
    assert b == fit.optimal_batch_size == getattr(module, "data", module).batch_size
    with pytest.raises(torch.OutOfMemoryError):  # Lightning's loop 3% above it
        _fit(make, b + max(2, b // 33))


def _two_views(samples):
    """Each sample twice, the second view shifted: 2 rows a sample."""
    x, y = torch.utils.data.default_collate(samples)
    return torch.cat([x, x + 0.1]), torch.cat([y, y])


class TwoViews(Seen):
    def train_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_size=self.batch_size,
                                           collate_fn=_two_views)


def test_a_collate_function_making_two_rows_a_sample_is_set_half_the_rows():
    # See Note [A collate function that makes rows]: 557 set made batches of
    # 1114 rows, and Lightning's loop ran out of memory.
    fit = FitBatchSize()
    module = _fit(TwoViews, 4, [fit])
    b = fit.optimal_batch_size
    assert module.batch_size == b and module.seen == [2 * b] and 2 * b <= 557
    module = None
    with pytest.raises(torch.OutOfMemoryError):  # Lightning's loop 3% above it
        _fit(TwoViews, b + max(2, b // 33))
