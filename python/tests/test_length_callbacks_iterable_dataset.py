"""Batching by length reads every sample's length, so it needs a dataset
with len(): an IterableDataset is refused with what to do, not a bare
"TypeError: object of type ... has no len()"."""

import pytest
import torch

from memfit.integrations.length_batches import sample_lengths


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from (torch.arange(n) for n in (3, 7))


def test_an_iterable_dataset_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"\[FitBatchSize\] lengths= batches the training set "
                                         r"by each sample's length.*\(Stream\) has no len\(\).*"
                                         r"leave lengths= out"):
        sample_lengths(Stream(), 1, None, "FitBatchSize")
