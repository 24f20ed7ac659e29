"""A callback batched by length with a per-input seq_dim (a dict, as an
encoder-decoder's batch takes: its labels have a length of their own)
reads each sample's length along input_ids' entry. It refused every
sample ("cannot read a sample's length along seq_dim={...}: pass
sample_lengths=") though the fit itself takes such a seq_dim."""

import torch

from memfit.integrations.length_batches import sample_lengths

SEQ_DIM = {"input_ids": 1, "attention_mask": 1}


def test_a_per_input_seq_dim_reads_input_ids_entry():
    tensors = [{"input_ids": torch.arange(n), "labels": torch.arange(3)} for n in (5, 40)]
    assert sample_lengths(tensors, SEQ_DIM, None, "FitBatchSize") == [5, 40]
    seq_first = [{"input_ids": torch.zeros(n, 4), "labels": torch.arange(3)} for n in (6, 9)]
    assert sample_lengths(seq_first, {"input_ids": 0}, None, "FitBatchSize",
                          batch_dim=1) == [6, 9]
