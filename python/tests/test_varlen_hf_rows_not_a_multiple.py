"""The Hugging Face FitBatchSize with a data collator that tokenizes texts
into windows of W tokens: texts of W and 2 W characters, one or two rows
each, so the first batch holds 96 rows for 64 texts, not a whole multiple.
The callback took it as one row a text and set the batch to the rows that
fit; the Trainer's own steps at that batch, every text two windows, ran
out of memory. The truth is the Trainer's own steps on a simulated device
of the budget."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_varlen_window_collator_rows import W, set_then_trained  # noqa: E402

transformers.logging.set_verbosity_error()
N = 256
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Texts(torch.utils.data.Dataset):
    """Texts of W characters, every other one 2 W (or every one `only`)."""

    def __init__(self, only=None):
        self.only = only

    def __len__(self):
        return N

    def __getitem__(self, i):
        n = self.only or (2 * W if i % 2 else W)
        return "".join(chr(97 + (i * 7 + j) % 26) for j in range(n))


def windows(texts):
    """Each text's characters as ids, cut into rows of W."""
    rows = [[ord(c) for c in t[j:j + W]] for t in texts for j in range(0, len(t), W)]
    x = torch.tensor([r + [0] * (W - len(r)) for r in rows])
    return {"input_ids": x, "labels": x.clone()}


def test_a_first_batch_of_rows_not_a_multiple_of_its_samples_is_rounded_up(tmp_path):
    # The truth: every text 2 W.
    notes = set_then_trained(tmp_path, Texts(), Texts(only=2 * W), windows)
    assert any("2 rows a sample" in note for note in notes), notes
