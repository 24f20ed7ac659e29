"""Code written for a GPU treats the simulated device's OOM as a CUDA OOM:
Lightning's and accelerate's detectors, and a user's `except` on the text."""

import pytest
import torch

import memfit


def simulated_oom():
    with memfit.simulated_device("1MiB"):
        try:
            torch.empty(1 << 20)  # 4 MiB
        except torch.OutOfMemoryError as e:
            return e
    raise AssertionError("no OOM under a 1 MiB budget")


def test_the_oom_is_torchs_own_class_and_keeps_memfits_figures():
    e = simulated_oom()
    assert isinstance(e, torch.cuda.OutOfMemoryError) and isinstance(e, RuntimeError)
    text = str(e)
    # CUDA's own first words, which the frameworks' detectors read; what
    # fills the device may come between them and the allocator's figures.
    assert text.startswith("CUDA out of memory. "), text
    for part in ("Tried to allocate 4.00 MiB", "memfit simulated cpu device", "budget 1.00 MiB",
                 "already allocated", "free"):
        assert part in text, text


def test_lightning_sees_a_cuda_oom():
    memory = pytest.importorskip("lightning.pytorch.utilities.memory")
    assert memory.is_oom_error(simulated_oom())
    assert not memory.is_oom_error(RuntimeError("shape mismatch"))


def test_accelerate_sees_an_oom_to_back_off_from():
    utils = pytest.importorskip("accelerate.utils.memory")
    assert utils.should_reduce_batch_size(simulated_oom())
    assert not utils.should_reduce_batch_size(RuntimeError("shape mismatch"))


def test_a_users_except_clause_on_the_text_catches_it():
    e = simulated_oom()
    assert "CUDA out of memory" in e.args[0] and len(e.args) == 1
