"""A forward that takes a branch from its batch's values in Python (`if
t.any():`): every probe and the verifying step repeat the example's samples
and take its path, so memfit says it is unsure there, naming the line (Note
[A step that reads its batch's values], _step/host_reads.py). Truth: plain
steps on fresh batches under the simulated device."""

import gc
import inspect

import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import loop_body, plain_steps_run

BUDGET = 6 << 20
L, D = 16, 32


class OutlierPath(torch.nn.Module):
    """A wider path for batches with an outlier value: an 8-sample example
    of values within 3 never takes it; batches of a hundred normal samples
    nearly always do."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                        torch.nn.Linear(4 * D, D))
        self.fix = torch.nn.Sequential(torch.nn.Linear(D, 16 * D), torch.nn.GELU(),
                                       torch.nn.Linear(16 * D, D))
        self.head = torch.nn.Linear(D, 10)

    def forward(self, x):
        h = self.body(x)
        if (x.abs() > 4.0).any():
            h = h + self.fix(x)
        return self.head(h.mean(1))


def _branch_line():
    lines, first = inspect.getsourcelines(OutlierPath.forward)
    return first + next(i for i, s in enumerate(lines) if "if (x.abs()" in s)


def _example():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, L, D, generator=g).clamp(-3, 3), torch.randint(0, 10, (8,), generator=g)


def _fit():
    gc.collect()
    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = OutlierPath()
        x, y = _example()
        return memfit.find_batch_size(model, x, y, loss_fn=F.cross_entropy,
                                      optimizer=torch.optim.Adam(model.parameters()))


def _runs(n):
    """Three iterations of the user's loop on fresh normal batches of n."""
    def build():
        model = OutlierPath()
        return model, torch.optim.Adam(model.parameters()), {}

    def step(model, opt, kept):
        loop_body(model, opt, torch.randn(n, L, D), torch.randint(0, 10, (n,)),
                  F.cross_entropy, kept)
    return plain_steps_run(BUDGET, build, step, steps=3)


def test_a_branch_on_the_batchs_values_is_named_where_the_answer_is_unsure():
    reads_before = {k for k in ("__bool__", "item", "__index__") if k in vars(torch.Tensor)}
    fit = _fit()
    site = f"test_arch_value_reads.py:{_branch_line()}"
    said = [n for n in fit.notes if n.startswith("unsure: the step reads tensor values")]
    # Before the note, the answer (203) was verified and said nothing, where
    # the user's own steps run out above 48.
    assert len(said) == 1 and site in said[0], fit.notes
    assert "above 8 was measured on your 8 samples repeated" in said[0]
    assert fit.max_batch > 8 and not _runs(fit.max_batch)
    # The wrappers that watched the reads are gone.
    assert {k for k in ("__bool__", "item", "__index__") if k in vars(torch.Tensor)} \
        == reads_before


def test_profile_says_so_and_a_step_without_reads_says_nothing():
    torch.manual_seed(0)
    x, y = _example()
    report = memfit.profile(OutlierPath(), x, y, loss_fn=F.cross_entropy, optimizer="adam")
    assert any(n.startswith("unsure: the step reads tensor values into Python at "
                            f"test_arch_value_reads.py:{_branch_line()} ") for n in report.notes)
    # Adam's step reads its step count (.item()): the optimizer's phase is not watched.
    plain = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(L * D, 10))
    report = memfit.profile(plain, x, y, loss_fn=F.cross_entropy,
                            optimizer=torch.optim.Adam(plain.parameters()))
    assert report.value_sized_ops == []
    assert not any("reads tensor values" in n for n in report.notes), report.notes
