"""The callbacks read the training samples' shapes to fit a padded first
batch at the longest sample (Note [A first batch shorter than the data],
integrations/length_batches.py). They read at most SCANNED samples: past
that, the answer says it did not read them all."""

import torch

from memfit.integrations import length_batches


def pad(samples):
    return torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)


def data(n, longest_at):
    return [torch.ones(64 if i == longest_at else 8, dtype=torch.long) for i in range(n)]


def test_the_longest_read_sample_sets_the_length_and_the_note_says_so():
    batch, note = length_batches.at_longest_sample(data(20, 15), pad, pad(data(2, -1)), "Fit")
    assert batch.shape == (2, 64)
    assert "fitted at 64" in note and "only the first" not in note


def test_a_set_longer_than_the_scan_says_its_unread_samples_may_run_past_the_batch(monkeypatch):
    monkeypatch.setattr(length_batches, "SCANNED", 10)
    # The longest sample is past the scan: the batch stays at 8, and says why.
    batch, note = length_batches.at_longest_sample(data(20, 15), pad, pad(data(2, -1)), "Fit")
    assert batch.shape == (2, 8)
    assert note is not None and "only the first 10 of the 20 training samples" in note
    assert "pass lengths=" in note
    # One longer within the scan: fitted there, and still unsure beyond it.
    batch, note = length_batches.at_longest_sample(data(20, 5), pad, pad(data(2, -1)), "Fit")
    assert batch.shape == (2, 64)
    assert "fitted at 64" in note and "only the first 10" in note
