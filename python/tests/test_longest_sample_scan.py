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


def collate(samples):
    """Token ids padded to the longest, with their attention_mask."""
    ids = pad(samples)
    mask = pad([torch.ones_like(s) for s in samples])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def test_a_first_batch_without_padding_among_samples_of_several_lengths_is_padded():
    # The first batch: two samples of 64, no padding; the data is padded
    # elsewhere, where Llama's SDPA builds its (batch, 1, L, L) mask (See
    # Note [A mask without padding]: fitted unpadded, 19 answered where
    # padded batches run 18, test_fit_mask_without_padding.py).
    samples = data(20, 15)
    first = collate([samples[15], samples[15]])
    batch, note = length_batches.at_longest_sample(samples, collate, first, "Fit")
    assert batch["attention_mask"][:, -1].tolist() == [0, 0]
    assert batch["attention_mask"][:, :-1].eq(1).all()
    assert "attention_mask has no padding" in note
    assert first["attention_mask"].eq(1).all()  # the loader's batch untouched
    # Samples of one length are never padded: nothing to pad.
    same = [torch.ones(8, dtype=torch.long) for _ in range(20)]
    batch, note = length_batches.at_longest_sample(same, collate, collate(same[:2]), "Fit")
    assert batch["attention_mask"].eq(1).all() and note is None
