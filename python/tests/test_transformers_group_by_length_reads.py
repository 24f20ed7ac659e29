"""The Hugging Face FitBatchSize with group_by_length: the Trainer's own
LengthGroupedSampler reads every sample's length each time
get_train_dataloader builds a loader, a pass over the whole dataset (400 s
on a dataset that tokenizes on the fly). The callback builds the Trainer's
own loader once, for its first batch, and reads each sample once more for
the longest one; it built it a second time only to check that the loader
batches by the batch it set, which the Trainer's own always does."""

import pytest
import torch

import memfit
from test_transformers_padded_lengths import LONG, SHORT, VOCAB, arguments, bert, pad

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py
N = 512


class CountedTexts(torch.utils.data.Dataset):
    """Samples of SHORT tokens, the last LONG, made before (a sample read
    under the simulated device costs no tracked tensor), each read counted."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = [torch.randint(2, VOCAB, (LONG if i == N - 1 else SHORT,), generator=g).tolist()
                    for i in range(N)]
        self.reads = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        self.reads += 1
        return {"input_ids": self.ids[i], "labels": i % 2}


def test_the_trainers_own_loader_is_not_built_again_to_check_the_batch(tmp_path):
    args = arguments(tmp_path, 32, 1)
    args.train_sampling_strategy = "group_by_length"
    data = CountedTexts()
    with memfit.simulated_device(16 << 20):
        fit = FitBatchSize()
        transformers.Trainer(model=bert(), args=args, train_dataset=data, data_collator=pad,
                             callbacks=[fit])
    assert args.per_device_train_batch_size != 32  # the batch was set: the check's case
    # One pass for the sampler's lengths and one for the longest sample, and
    # a few batches of 32 read whole (the first, the longest): 1091 reads.
    # A second loader was a third pass: 1606.
    assert data.reads <= 2 * N + 3 * 32, data.reads
